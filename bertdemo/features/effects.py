"""What a feature promotes through the real model: the change in the MLM head's logits at a [MASK]
when its decoder direction is added there. A card asks for one feature's (`output_effects`); a
statistics build computes every feature's top words once (`promoted_ids`) and keeps them beside the
dictionary, so the build (`making`) needs no page view. Imports the model layers and this
package's dictionary, data and quality modules only.
"""
from __future__ import annotations

import torch

from ..model.loading import LoadedModel
from ..views.fillmask import encode
from .data import point_of
from .dictionary import Dictionary
from .quality import logits_at

# A feature's effect on the output is measured at the [MASK] of these sentences, averaged.
EFFECT_CONTEXTS = ("The [MASK] was on the table.", "She said that [MASK] would come tomorrow.",
                   "It was a very [MASK] day.", "They went to the [MASK] after school.",
                   "He [MASK] the door and left.", "I think the [MASK] is right.",
                   "We saw [MASK] in the park.", "The old man [MASK] slowly.")


@torch.no_grad()
def output_effects(lm: LoadedModel, dictionary: Dictionary, features: list[int], chunk: int = 64) -> torch.Tensor:
    """(len(features), V): the change in the MLM head's logits at a [MASK] when each feature's
    decoder direction, times its mean activation, is added there at the dictionary's layer (to what
    it writes: the residual stream, or a transcoder's feed-forward output), averaged over
    EFFECT_CONTEXTS. Measured by running the rest of the model and its own head (transform,
    LayerNorm, decoder), not by a product of matrices that skips them; the clean rows ride in the
    same batch as the first chunk's."""
    contexts = [encode(lm, text) for text in EFFECT_CONTEXTS]
    inputs, masks = _stacked(lm, contexts)
    count = len(contexts)
    mean = dictionary.stats["mean"] if dictionary.stats is not None else None
    clean, out = None, []
    for start in range(0, len(features), chunk):
        part = features[start:start + chunk]
        strength = torch.tensor([float(mean[f]) if mean is not None and mean[f] > 0 else 1.0 for f in part])
        added = (dictionary.coder.W_dec[part] * strength[:, None]).repeat_interleave(count, dim=0)  # (S * C, H)
        if clean is None:  # the first chunk also runs the contexts as they are
            added = torch.cat([torch.zeros(count, added.shape[1]), added])
        rows = added.shape[0] // count
        batch = {k: v.repeat(rows, 1) for k, v in inputs.items()}
        all_rows = torch.arange(rows * count, device=lm.device)
        cols = masks.repeat(rows)
        added = added.to(lm.device)

        def add(hidden, read=None, added=added, all_rows=all_rows, cols=cols):
            hidden = hidden.clone()
            hidden[all_rows, cols] += added.to(hidden.dtype)
            return hidden
        point = point_of(dictionary)
        logits = logits_at(lm, batch, all_rows, cols, {dictionary.layer: point.edit(add)}, point)
        logits = logits.float().view(rows, count, -1)
        if clean is None:
            clean, logits = logits[0], logits[1:]
        out.append((logits - clean[None]).mean(1))
    return torch.cat(out)


def _stacked(lm: LoadedModel, encs) -> tuple[dict, torch.Tensor]:
    """One-mask sentences padded into one batch; (inputs, each row's mask column)."""
    longest = max(e.input_ids.shape[1] for e in encs)
    pad = lm.tokenizer.pad_token_id or 0
    ids = torch.full((len(encs), longest), pad, dtype=torch.long)
    attention = torch.zeros((len(encs), longest), dtype=torch.long)
    for row, e in enumerate(encs):
        ids[row, :e.input_ids.shape[1]] = e.input_ids[0]
        attention[row, :e.input_ids.shape[1]] = 1
    return ({"input_ids": ids.to(lm.device), "attention_mask": attention.to(lm.device)},
            torch.tensor([e.mask_positions[0] for e in encs], device=lm.device))


def promoted_ids(lm: LoadedModel, dictionary: Dictionary, keep: int = 3, chunk: int = 64) -> torch.Tensor:
    """(F, keep) the token ids each feature raises most at a [MASK] (`output_effects`), for every
    feature: a corpus-scale pass, done once for shipped dictionaries."""
    rows = []
    for start in range(0, dictionary.latents, chunk):
        features = list(range(start, min(start + chunk, dictionary.latents)))
        rows.append(output_effects(lm, dictionary, features, chunk).topk(keep, dim=-1).indices)
    from .stats import index_dtype

    return torch.from_numpy(torch.cat(rows).numpy().astype(index_dtype(lm.model.config.vocab_size)))
