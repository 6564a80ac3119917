"""Transcoders: the shipped ones' quality per layer and with every layer replaced at once, and their size.

Goals (the bundled model's shipped transcoders, assets/bundled/transcoders; held-out lines of its
corpus that neither training nor the statistics saw):
- each layer: FVU of the feed-forward block's output <= 0.2, dead <= 10%, loss recovered (that
  layer's block output replaced by its transcoder's at every counted position, against
  zero-ablating it) >= 0.85;
- all six replaced at once: the masked-LM cross-entropy against the clean model's, and the KL of
  their predicted distributions, stated;
- <= 40 MB on disk (float16).
The figures are the ones `python -m bertdemo train-transcoders` measured and wrote into each
record; `--measure` measures them again from the files (as shipped, float16) and prints both.
Run: python bench/bench_transcoders.py [--measure] [--corpus DIR] [--statistics-lines N] [--quality-lines N]
"""
import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import bertdemo  # noqa: E402
from bertdemo.circuits.transcoders import SHIPPED, replaced_quality, transcoders_for  # noqa: E402
from bertdemo.features import making, quality  # noqa: E402
from bertdemo.features.store import FeatureStore  # noqa: E402
from common import machine  # noqa: E402

GOALS = dict(fvu=0.2, dead=0.10, loss_recovered=0.85, megabytes=40.0)


def row(layer, q: dict) -> str:
    ce, recovered = q["cross_entropy"], q["loss_recovered"]
    figure = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    marks = [q["fvu"] <= GOALS["fvu"], q["dead"] <= GOALS["dead"],
             recovered["zero"] is not None and recovered["zero"] >= GOALS["loss_recovered"]]
    return (f"| {layer} | {q['fvu']:.3f} | {q['dead']:.1%} | {q['l0']:.1f} | {ce['clean']:.2f} / {ce['spliced']:.2f} / "
            f"{ce['zero']:.2f} / {ce['mean']:.2f} | {figure(recovered['zero'])} / {figure(recovered['mean'])} | "
            f"{'yes' if all(marks) else 'no'} |")


def table(per_layer: dict, together: dict) -> str:
    lines = ["| layer | FVU | dead | L0 | cross-entropy clean / replaced / zero-ablated / mean-ablated "
             "| loss recovered (zero / mean) | goals met |", "| --- | --- | --- | --- | --- | --- | --- |"]
    lines += [row(layer, q) for layer, q in sorted(per_layer.items())]
    ce = together["cross_entropy"]
    lines.append(f"\nAll {len(together['layers'])} layers replaced at once: cross-entropy {ce['clean']:.3f} clean, "
                 f"{ce['replaced']:.3f} replaced (+{ce['replaced'] - ce['clean']:.3f}); KL(clean || replaced) "
                 f"{together['kl']:.3f} nats per masked token ({together['targets']:,} masked tokens).")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure", action="store_true", help="measure again from the shipped files")
    parser.add_argument("--corpus", default=str(Path.home() / ".cache" / "bertdemo-bundled" / "corpus"))
    parser.add_argument("--statistics-lines", type=int, default=6000, help="as train-transcoders was given")
    parser.add_argument("--quality-lines", type=int, default=2000, help="as train-transcoders was given")
    args = parser.parse_args()
    torch.set_num_threads(2)
    record = json.loads((SHIPPED / "training.json").read_text(encoding="utf-8"))
    size = sum(f.stat().st_size for f in SHIPPED.rglob("*") if f.is_file()) / 1e6
    first = " (the first run)" if "per_layer" in record else ""
    print(f"# Shipped transcoders ({machine()}): {size:.1f} MB (goal <= {GOALS['megabytes']:.0f}); trained on "
          f"{record['tokens']:,} tokens a layer in {record['minutes']} min{first}, statistics and quality "
          f"{record.get('minutes_statistics')} min more")
    for layer, how in sorted((record.get("per_layer") or {}).items(), key=lambda item: int(item[0])):
        settings = how["settings"]
        print(f"layer {layer}: {settings['latents'] or '8 x hidden'} latents, k {settings['k']}, "
              f"{how['tokens']:,} tokens" + (f" ({how['resumed_from']['tokens']:,} of them before it went on at "
                                             f"these settings)" if "resumed_from" in how else "")
              + (f"; then the {how['pruned']['removed']} latents that never fired over "
                 f"{how['pruned']['never_fired_over']['tokens']:,} training tokens removed "
                 f"({how['pruned']['latents_before'] - how['pruned']['removed']} left)" if "pruned" in how else ""))
    recorded = {int(k): v for k, v in record["quality"].items() if k != "all_layers"}
    print("\nAs recorded:\n" + table(recorded, record["quality"]["all_layers"]))
    if args.measure:
        lm = bertdemo.load_bundled("cpu")
        found = transcoders_for(lm, FeatureStore(Path("/tmp/bench-transcoders-cache"), shipped=SHIPPED,
                                                 kind="transcoders"))
        _, held_out = making.shipped_lines(lm, Path(args.corpus), args.statistics_lines, args.quality_lines)
        started = time.perf_counter()
        measured = {layer: quality.measure(lm, transcoder, held_out) for layer, transcoder in found.items()}
        together = replaced_quality(lm, found, held_out)
        print(f"\nMeasured again ({time.perf_counter() - started:.0f} s):\n" + table(measured, together))
    return 0


if __name__ == "__main__":
    sys.exit(main())
