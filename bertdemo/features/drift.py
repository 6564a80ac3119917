"""What a fine-tune changed at a layer, seen through the base model's dictionary: per feature, how
often it fires (its firing share) and how strongly (its mean activation where it fires) on the same
text in the base and the tuned model, each change a column of its own (a share and an activation
are two units: never added), and how well the base dictionary still explains the tuned model's
layer (FVU).

    drift = tuning_drift(base, tuned, lines, layer=3)                     # sorted by the change of share
    drift = tuning_drift(base, tuned, lines, layer=3, sort_by="activation")
"""
from __future__ import annotations

import numpy as np
import torch

from .. import validate
from ..model.loading import LoadedModel
from .data import Lines, hidden_at
from . import quality
from .store import FeatureStore
from .labels import labelled
from .views import MAX_TOP, load_features

SORTS = {"share": "the change of firing share", "activation": "the change of mean activation"}


@torch.no_grad()
def tuning_drift(base: LoadedModel, tuned: LoadedModel, text: str | list[str], layer: int, top: int = 10,
                 store: FeatureStore | None = None, sort_by: str = "share") -> dict:
    """The features of `base`'s dictionary of `layer` whose firing changed most on `text` in `tuned`.

    Per feature and model: its firing share (the share of the text's kept tokens it fires on) and its
    mean activation where it fires (None where it never fires). `share_change` = tuned - base share;
    `activation_change` = tuned - base mean activation (None unless it fires in both). The `top`
    features with the largest change in size of the one `sort_by` names ("share" or "activation";
    a feature without that change comes last).

    Returns {"layer", "tokens", "sort_by", "fvu": {"base", "tuned"}, "features": [{"feature",
    "label", "label_f1", "label_kind" (`labels.label_fit`), "density_base", "density_tuned",
    "share_change", "mean_base", "mean_tuned", "activation_change"}]}."""
    dictionary = load_features(base, layer, store)
    top = validate.whole_number(top, "number of features", 1, MAX_TOP, field="top")
    if sort_by not in SORTS:
        raise validate.InputError("sort_by", f"Sort by one of {', '.join(map(repr, SORTS))} ("
                                             f"{'; '.join(SORTS.values())}), got {validate.shown(sort_by)}.")
    lines = Lines(base, text.splitlines() if isinstance(text, str) else list(text))
    fired, summed, fvu, tokens = {}, {}, {}, 0
    for name, lm in (("base", base), ("tuned", tuned)):
        fired[name], summed[name], fvu[name], tokens = _firing(lm, dictionary, lines)
    share = {name: fired[name] / max(tokens, 1) for name in fired}
    mean = {name: summed[name] / fired[name].clamp(min=1) for name in fired}
    share_change = share["tuned"] - share["base"]
    both = (fired["base"] > 0) & (fired["tuned"] > 0)
    activation_change = torch.where(both, mean["tuned"] - mean["base"], torch.nan)
    key = (share_change if sort_by == "share" else activation_change).abs().nan_to_num(-1.0)
    order = key.argsort(descending=True, stable=True)[:top].tolist()

    def mean_of(name: str, f: int) -> float | None:
        return float(mean[name][f]) if fired[name][f] > 0 else None
    return {"layer": dictionary.layer, "tokens": tokens, "sort_by": sort_by, "fvu": fvu, "features": [
        {"feature": f, **labelled(base, dictionary, f), "density_base": float(share["base"][f]),
         "density_tuned": float(share["tuned"][f]), "share_change": float(share_change[f]),
         "mean_base": mean_of("base", f), "mean_tuned": mean_of("tuned", f),
         "activation_change": None if not both[f] else float(activation_change[f])} for f in order]}


def _firing(lm: LoadedModel, dictionary, lines: Lines) -> tuple[torch.Tensor, torch.Tensor, float, int]:
    """(firings per feature (F,), activation summed where it fires (F,), the dictionary's FVU, kept
    tokens) on `lm`'s activations of `lines`, plain, at the dictionary's layer."""
    fired = torch.zeros(dictionary.latents)
    total = torch.zeros(dictionary.latents)
    error = squared = 0.0
    mean_sum, n = torch.zeros(dictionary.width, dtype=torch.float64), 0
    for batch in lines.batches(lm, seed=0, masked_share=0.0, order=np.arange(len(lines)), endless=False):
        x = hidden_at(lm, batch, [dictionary.layer])[dictionary.layer]
        dense = dictionary.dense(x)
        fired += (dense > 0).float().sum(0)
        total += dense.sum(0)
        error += float((x - dictionary.decode(*dictionary.encode(x))).pow(2).sum())
        squared += float(x.double().pow(2).sum())
        mean_sum += x.double().sum(0)
        n += x.shape[0]
    return fired, total, float(quality.fvu(error, squared, mean_sum.numpy(), n)), n
