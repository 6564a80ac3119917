"""Labels with a score and a card with the whole range (`features/stats.py`, `features/views.py`),
bundled model, the shipped dictionaries.

Figures (2 CPU threads):
- every shipped layer's labels scored as detectors on the 4,000 held-out lines (62,310 tokens) of
  its statistics: the median F1 over the features that fired there, the share above 0.5 (word
  features), the median precision and recall, and the share of labels with no clear output;
- a card with its bands, random firings and [MASK] words <= 300 ms (goal): median of interleaved
  cards of layer 3 (its output effects measured through the model each time, timed alone too; the
  rest read from the statistics).
Run: python bench/bench_labels.py [--repeats 9] [--threads 2]
"""
import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import bertdemo  # noqa: E402
from bertdemo.features import effects  # noqa: E402
from bertdemo.features import stats as statistics  # noqa: E402
from bertdemo.features.store import FeatureStore  # noqa: E402
from common import interleaved_medians, machine  # noqa: E402

THREADS = 2
LAYER = 3
CARDS = (0, 300, 1265, 2100)  # the layer's features carded in turn


def scores(lm, store: FeatureStore) -> None:
    print("labels as detectors on held-out lines (features that fired there):")
    print(f"  {'layer':6s} {'scored':>7s} {'median F1':>10s} {'F1 > 0.5':>9s} {'median precision':>17s} "
          f"{'median recall':>14s} {'no clear output':>16s}")
    for layer in range(1, lm.model.config.num_hidden_layers + 1):
        stats = store.get(lm, layer).stats
        if not stats.has("label_f1"):
            print(f"  {layer:<6d} not scored: statistics made before labels were scored (train-features --labels-only)")
            continue
        fired = stats["label_fires"] > 0
        f1, precision, recall = (stats[name][fired] for name in ("label_f1", "label_precision", "label_recall"))
        unclear = (stats["promoted"][:, 0] < 0).float().mean().item() if stats.has("noise_per_unit") else float("nan")
        print(f"  {layer:<6d} {int(fired.sum()):7,d} {f1.median().item():10.3f} "
              f"{(f1 > statistics.WORD_F1).float().mean().item():9.1%} {precision.median().item():17.3f} "
              f"{recall.median().item():14.3f} {unclear:16.1%}")
    tokens = int(stats["detection_tokens"][0]) if stats.has("detection_tokens") else 0
    print(f"  (held-out tokens: {tokens:,}; a word feature: F1 >= {statistics.WORD_F1})")


def card(lm, store: FeatureStore, repeats: int) -> None:
    dictionary = store.get(lm, LAYER)
    fns = {f"card of feature {f}": (lambda f=f: bertdemo.feature_card(lm, LAYER, f, store)) for f in CARDS}
    fns["its output effects alone"] = lambda: effects.output_effects(lm, dictionary, [CARDS[0]])
    medians = interleaved_medians(fns, repeats=repeats, warmup=1)
    shown = bertdemo.feature_card(lm, LAYER, CARDS[0], store)
    print(f"\nmedians of {repeats} interleaved cards, layer {LAYER}, {torch.get_num_threads()} threads (goal <= 300 ms; "
          f"feature {CARDS[0]}: {len(shown['bands'])} bands, {len(shown['random_firings'])} random firings, "
          f"{len(shown['at_mask']['words'])} [MASK] words)")
    for name, seconds in medians.items():
        print(f"  {name:26s} {seconds * 1e3:8.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=THREADS, help="torch's threads (1 where other work holds "
                        "the cores: OpenMP's threads wait on each other then)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{machine()}, {args.threads} threads; load average {os.getloadavg()[0]:.2f} at start")
    lm = bertdemo.load_bundled("cpu")
    store = FeatureStore(tempfile.mkdtemp(prefix="bench-labels-"))
    scores(lm, store)
    card(lm, store, args.repeats)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
