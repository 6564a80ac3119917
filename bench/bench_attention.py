"""Attention tab payload and build time for a bert-base-sized model, at 12 and 128 tokens.

For each length: the forward pass (`bertdemo.attention`), then what the page is sent: the bertviz
iframe with the default selection (rounded to 3 decimals, 2 past 100k weights; layers/heads
filtered to ~200k weights),
the same view unfiltered as bertviz makes it (all 12x12, full floats), and one heatmap figure.
Goal: the default view stays under 1 MB and builds in well under a second at 128 tokens.
Then head importance at 12 tokens (`bertdemo.head_importance`: all 12 x 12 heads off one at a time,
in batched forwards) against what one would write instead, one forward per head with that head off
(12 of the 144 timed, scaled up), and the neuron view. Goal: head importance under 2 s on 2 cores.
Run: python bench/bench_attention.py
"""
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from bertviz import head_view  # noqa: E402

import bertdemo  # noqa: E402
from bertdemo import plots  # noqa: E402
from bertdemo.config import cpu_model  # noqa: E402
from bertdemo.views.fillmask import encode, logits_at  # noqa: E402
from bertdemo.views.attention_views import (bertviz_html, default_selection, srcdoc_iframe,  # noqa: E402
                                view, view_height)
from bertdemo.ui.tabs.attention_tab import served_urls  # noqa: E402
from common import load_bert_base, sentence_of  # noqa: E402


def timed(fn, repeats: int = 5):
    """(median seconds, last result) over `repeats` calls after one warm-up."""
    result = fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def page_view(att, kind: str) -> str:
    """The iframe the tab puts in the page for bertviz view `kind`, default selection."""
    layers, heads = default_selection(att, kind)
    document = bertviz_html(att, kind, layers, heads, script_urls=served_urls())
    return srcdoc_iframe(document, view_height(att, kind, len(layers)))


def main() -> None:
    lm = load_bert_base()
    print(f"model: bert-base-sized BertForMaskedLM (12 layers x 12 heads), {torch.get_num_threads()} "
          f"threads, device {lm.device}, CPU {cpu_model()}")
    print(f"{'tokens':>6} {'what':<44} {'ms':>8} {'payload':>10}")
    for n_tokens in (12, 128):
        text = sentence_of(lm, n_tokens, 1)
        ms, att = timed(lambda: bertdemo.attention(lm, text))
        print(f"{n_tokens:>6} {'forward pass (attention + mask predictions)':<44} {ms * 1e3:8.1f} {'':>10}")
        ms, _ = timed(lambda: bertdemo.fill_mask(lm, text))  # the same forward on the sdpa path
        print(f"{n_tokens:>6} {'  for scale: fill_mask on the same text':<44} {ms * 1e3:8.1f} {'':>10}")
        for kind in ("head", "model"):
            layers, heads = default_selection(att, kind)
            ms, frame = timed(lambda: page_view(att, kind))
            what = f"{kind} view, default: {len(layers)} layers"
            what += f" x {len(heads)} heads" if kind == "model" else ""
            print(f"{n_tokens:>6} {what:<44} {ms * 1e3:8.1f} {len(frame.encode()) / 1e6:8.2f} MB")
        weights = [torch.from_numpy(w[None]) for w in att.weights]  # bertviz as-is: all, full floats
        ms, full = timed(lambda: head_view(weights, att.tokens, html_action="return").data, repeats=1)
        print(f"{n_tokens:>6} {'head view, bertviz as-is (all layers, floats)':<44} {ms * 1e3:8.1f} "
              f"{len(full.encode()) / 1e6:8.2f} MB")
        shown = view(att, "head", 11, 0)
        ms, fig = timed(lambda: plots.attention_heatmap(shown.labels, shown.matrix, shown.title).to_json())
        print(f"{n_tokens:>6} {'heatmap figure (one head), plotly JSON':<44} {ms * 1e3:8.1f} "
              f"{len(fig.encode()) / 1e6:8.2f} MB")
    heads_timing(lm)


def heads_timing(lm, n_tokens: int = 12) -> None:
    """Head importance (one call) vs one forward per head switched off, and the neuron view."""
    text = sentence_of(lm, n_tokens, 1)
    ms, result = timed(lambda: bertdemo.head_importance(lm, text), repeats=3)
    n_heads = result["layers"] * result["heads"]
    print(f"{n_tokens:>6} {f'head importance, {n_heads} heads (goal < 2 s)':<44} {ms * 1e3:8.1f}")
    enc = encode(lm, text)
    cols = torch.tensor(enc.mask_positions)
    views = [bertdemo.heads_off(lm, [(layer, 0)]) for layer in range(result["layers"])]  # 12 of the 144
    one, _ = timed(lambda: [logits_at(v, enc.inputs, torch.zeros_like(cols), cols) for v in views], repeats=3)
    per_head = one / len(views)
    print(f"{n_tokens:>6} {f'  one forward per head off, x {n_heads} (scaled)':<44} {per_head * n_heads * 1e3:8.1f}"
          f"   ratio {per_head * n_heads / ms:.1f}x")
    ms, _ = timed(lambda: bertdemo.neuron_view(lm, text, layer=result["layers"] - 1, head=0, token=1))
    print(f"{n_tokens:>6} {'neuron view (one layer, head, token)':<44} {ms * 1e3:8.1f}")


if __name__ == "__main__":
    main()
