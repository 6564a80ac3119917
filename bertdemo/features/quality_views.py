"""How far to trust a layer's dictionary, as the API, the page and the model card say it: the
figures `quality.measure` recorded when it was made, the splice's cost first (the cross-entropy it
adds, the perplexity ratio, KL), then FVU, dead, L0 and the loss recovered; and in words, how much
text they rest on (held-out tokens, their intervals, the window "dead" is counted over, the passes
over the training text) and whether it learnt its training text by heart.

    feature_quality(lm, 3)      # {"splice_cost": {...}, "fvu", ..., "training": {...}, "notes": [...]}
    quality_line(figures)       # "Layer 3: replacing it adds 0.094 nats of cross-entropy (perplexity x1.10, ..."
    quality_summary(lm)         # the model card's paragraph, a line per layer
"""
from __future__ import annotations

import math

from ..model.loading import LoadedModel
from .making import HELD_OUT_SHARE, HELD_OUT_TOKENS
from .quality import overfitting
from .store import FeatureStore, shared_store
from .views import load_features

INTERVALS = {"fvu": "FVU", "spliced_cross_entropy": "cross-entropy spliced (nats)",
             "added_cross_entropy": "added", "kl": "KL"}


def feature_quality(lm: LoadedModel, layer: int, store: FeatureStore | None = None) -> dict:
    """The dictionary's quality as measured when it was made (`quality.measure`: "splice_cost"
    {"added_cross_entropy", "perplexity_ratio", "kl"}, then "fvu", "dead" over "dead_window" tokens,
    "l0", "loss_recovered" {"zero", "mean"}, "cross_entropy", "held_out", "interval", and for a
    dictionary measured against its training text "training_fvu"), its training record ("training":
    tokens, passes over its text, minutes, machine), and "notes": the same in words."""
    dictionary = load_features(lm, layer, store)
    figures = {"layer": dictionary.layer, "folder": str(dictionary.folder) if dictionary.folder else None,
               "latents": dictionary.latents, "k": dictionary.k, **dictionary.record.get("quality", {}),
               "training": dictionary.record.get("training", {})}
    figures["splice_cost"] = splice_cost(figures)
    return {**figures, "overfitting": overfitting(figures), "notes": quality_notes(figures)}


def splice_cost(figures: dict) -> dict | None:
    """{"added_cross_entropy", "perplexity_ratio", "kl"} as recorded; for a record made before KL was
    measured, the first two from its cross-entropies and "kl" None; None without cross-entropies."""
    if figures.get("splice_cost"):
        return figures["splice_cost"]
    ce = figures.get("cross_entropy") or {}
    if "clean" not in ce or "spliced" not in ce:
        return None
    added = ce["spliced"] - ce["clean"]
    return {"added_cross_entropy": added, "perplexity_ratio": math.exp(added), "kl": None}


def quality_line(figures: dict) -> str:
    """One line of a layer's quality, the splice's cost first, e.g. "Layer 3: 3,072 features, 32
    active per token; replacing the layer by its reconstruction adds 0.094 nats of cross-entropy
    (perplexity x1.10, KL 0.082 nats); FVU 0.16, dead 2.7%, L0 32.0, loss recovered 98% / 98%
    (zero / mean-ablated)."."""
    parts = [f"Layer {figures['layer']}: {figures['latents']:,} features, {figures['k']} active per token"]
    cost = splice_cost(figures)
    if cost is not None:
        kl = f", KL {cost['kl']:.3f} nats" if cost.get("kl") is not None else ""
        added = cost["added_cross_entropy"]
        change = (f"adds {added:.3f} nats of cross-entropy" if added >= 0
                  else f"lowers the cross-entropy by {-added:.3f} nats")
        parts.append(f"replacing the layer by its reconstruction {change} "
                     f"(perplexity ×{cost['perplexity_ratio']:.2f}{kl})")
    rest = []
    if "fvu" in figures:
        rest.append(f"FVU {figures['fvu']:.2f}")
    if "dead" in figures:
        rest.append(f"dead {figures['dead']:.1%}")
    if "l0" in figures:
        rest.append(f"L0 {figures['l0']:.1f}")
    recovered = figures.get("loss_recovered") or {}
    if recovered.get("zero") is not None:
        mean = f" / {recovered['mean']:.0%}" if recovered.get("mean") is not None else ""
        rest.append(f"loss recovered {recovered['zero']:.0%}{mean} (zero{' / mean' if mean else ''}-ablated)")
    return "; ".join(parts + ([", ".join(rest)] if rest else [])) + "."


def quality_notes(figures: dict) -> list[str]:
    """What the figures rest on, in words: the held-out text (and how few tokens, under
    HELD_OUT_TOKENS), the intervals, the window "dead" counts, the passes over the training text,
    and overfitting when the training and held-out FVU part (`quality.overfitting`)."""
    notes = []
    held = figures.get("held_out") or ({"tokens": figures["tokens"]} if "tokens" in figures else None)
    if held:
        lines = f" ({held['lines']:,} lines)" if "lines" in held else ""
        note = f"Measured on {held['tokens']:,} held-out tokens{lines}, never trained on."
        if held["tokens"] < HELD_OUT_TOKENS:
            note += (f" That is fewer than the {HELD_OUT_TOKENS:,} wanted: its corpus allowed no more (at most "
                     f"{HELD_OUT_SHARE:.0%} of it is held out), so read the figures with their intervals.")
        notes.append(note)
    interval = figures.get("interval")
    spans = [f"{name} {_span(interval[key])}" for key, name in INTERVALS.items() if (interval or {}).get(key)]
    if spans and "level" in interval:
        notes.append(f"{interval['level']:.0%} intervals ({interval['resamples']} bootstrap resamples of the held-out "
                     f"lines): " + ", ".join(spans) + ".")
    if "dead_window" in figures:
        notes.append(f"Dead: the share of its features that never fired in {figures['dead_window']:,} tokens "
                     "(the held-out text and the statistics' pass).")
    elif held and "dead" in figures:
        notes.append(f"Dead: the share of its features that never fired in the {held['tokens']:,} held-out tokens.")
    training = figures.get("training") or {}
    text = training.get("text")
    if text and training.get("passes") is not None:
        notes.append(f"Trained on {training['tokens']:,} tokens: {training['passes']:.1f} passes over its "
                     f"{text['tokens']:,}-token training text ({text['lines']:,} lines).")
    warning = overfitting_warning(figures)
    if warning:
        notes.append(warning)
    elif (figures.get("training_fvu") or {}).get("fvu") is not None:
        notes.append(f"FVU {figures['training_fvu']['fvu']:.3f} on as much of its training text, "
                     f"{figures['fvu']:.3f} held out: no sign of learning the training text by heart.")
    return notes


def overfitting_warning(figures: dict) -> str | None:
    """The page's words when the training and held-out FVU part (as the fine-tune says it)."""
    if not overfitting(figures):
        return None
    trained = figures["training_fvu"]["fvu"]
    passes = (figures.get("training") or {}).get("passes")
    after = f" after {passes:.0f} passes over it" if passes else ""
    return (f"⚠️ **Overfitting**: FVU is {trained:.3f} on its training text and {figures['fvu']:.3f} on held-out "
            f"text (interval {_span(figures['interval']['fvu'])}): the dictionary has learnt its training text by "
            f"heart{after}. Trust the held-out figures; train on more text (or for less time) for a better one.")


def quality_summary(lm: LoadedModel, store: FeatureStore | None = None) -> str | None:
    """The model card's paragraph: which layers have dictionaries and how far to trust each, the
    splice's cost first; None for a model with none."""
    store = store or shared_store(lm.caches)
    layers = store.layers(lm)
    if not layers:
        return None
    rows = [quality_line(feature_quality(lm, layer, store)) for layer in layers]
    return ("**Feature dictionaries** (the Features tab), each measured on held-out text: what replacing the "
            "layer by its reconstruction costs the masked LM, then how much of the layer it explains.\n"
            + "\n".join(f"- {row}" for row in rows))


def _span(pair) -> str:
    return f"{pair[0]:.3f}–{pair[1]:.3f}"
