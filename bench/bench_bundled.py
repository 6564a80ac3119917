"""How good the bundled model is: held-out masked tokens, everyday content words, probes.

Goals: content-word top-5 on everyday sentences (assets/bundled/everyday.tsv, written for this, not
from the corpus) at least 20%, and at least 8 of the 20 probes (assets/bundled/probes.tsv) with a
right word in the top 5. The held-out lines are the corpus' (built from packages as
`python -m bertdemo train-bundled` builds it, reused when it is there); for scale, a unigram
baseline (always the most frequent training tokens) and the MiniLM body with an untrained head.
Run: python bench/bench_bundled.py [--corpus DIR] [--model DIR]
"""
import argparse
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import bertdemo  # noqa: E402
from bertdemo.model import bundled  # noqa: E402
from bertdemo.build import bundled_corpus  # noqa: E402
from bertdemo.build.bundled_training import measure  # noqa: E402
from bertdemo.config import cpu_model  # noqa: E402
from bertdemo.model.loading import minilm_path  # noqa: E402

DEFAULT_CORPUS = Path.home() / ".cache" / "bertdemo-bundled" / "corpus"


def unigram_baseline(lm, corpus: Path, held_out: list[str]) -> dict:
    """Top-1/top-5 of always guessing the 5 most frequent word pieces of the training text."""
    counts = collections.Counter()
    for line in (corpus / "train.txt").read_text(encoding="utf-8").splitlines()[:100_000]:
        counts.update(lm.tokenizer(line, add_special_tokens=False)["input_ids"])
    top = [token for token, _ in counts.most_common(5)]
    ids = [i for line in held_out for i in lm.tokenizer(line, add_special_tokens=False)["input_ids"]]
    return {"top1": sum(i == top[0] for i in ids) / len(ids), "top5": sum(i in top for i in ids) / len(ids)}


def row(name: str, scores: dict) -> str:
    held, everyday, probes = scores["held_out"], scores["everyday"], scores["probes"]
    return (f"{name:34s} {held['top1']:8.1%} {held['top5']:8.1%} {held['loss']:8.2f} "
            f"{everyday['content_top5']:12.1%} {probes['hits']:4d}/{probes['probes']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default=str(DEFAULT_CORPUS), help="the built corpus (built there if missing)")
    parser.add_argument("--model", default=None, help="a bundled-model folder (default: assets/bundled)")
    parser.add_argument("--lines", type=int, default=3000, help="held-out lines scored")
    args = parser.parse_args()
    corpus = Path(args.corpus)
    if not (corpus / "sources.json").is_file():
        bundled_corpus.build(corpus, corpus.parent / "packages", tokenizer_file=minilm_path() / "tokenizer.json")
    held_out = (corpus / "heldout.txt").read_text(encoding="utf-8").splitlines()[:args.lines]
    lm = bundled.load_bundled("cpu", folder=Path(args.model) if args.model else None)
    print(f"CPU: {cpu_model()}, {torch.get_num_threads()} threads; {len(held_out)} held-out lines")
    print(f"{'model':34s} {'top-1':>8s} {'top-5':>8s} {'loss':>8s} {'everyday top-5':>12s} probes")
    scores = measure(lm, held_out, eval_lines=args.lines)
    print(row("bundled", scores))
    untrained = bertdemo.Engine().load_minilm("cpu")
    print(row("MiniLM body, untrained head", measure(untrained, held_out, eval_lines=args.lines)))
    base = unigram_baseline(lm, corpus, held_out)
    print(f"{'unigram (5 most frequent pieces)':34s} {base['top1']:8.1%} {base['top5']:8.1%}")
    everyday, probes = scores["everyday"]["content_top5"], scores["probes"]["hits"]
    print(f"goals: everyday content top-5 {everyday:.1%} (>= 20%: {'met' if everyday >= 0.2 else 'NOT met'}), "
          f"probes {probes}/20 (>= 8: {'met' if probes >= 8 else 'NOT met'})")
    for name in ("everyday", "probes"):
        print(f"\n{name}:")
        for r in scores[name]["rows"]:
            right = r.get("word") or ",".join(r["right"])
            hit = (r.get("word") in r["top5"]) if "word" in r else r["hit"]
            print(f"  {'HIT ' if hit else '    '}{r['sentence']}  [{right}] -> {' '.join(r['top5'])}")


if __name__ == "__main__":
    main()
