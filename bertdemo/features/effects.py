"""What a feature promotes through the real model: the change in the MLM head's logits at a [MASK]
when its decoder direction is added there. A card asks for one feature's (`output_effects`); a
statistics build computes every feature's top words once (`promoted`) and keeps them beside the
dictionary, so the build (`making`) needs no page view.

A word counts as promoted only where its raise clears the noise: a random direction as large as a
feature's, added at the same [MASK]s, raises some word of a 30,000-word vocabulary by 0.12-0.21 logits
per unit added over the average word (the bundled layer 3, 64 directions) while features' top words
are raised 0.15-0.34: below the random directions' NOISE_QUANTILE a feature's top word is not told
apart from chance, and its label says "no clear output". (The spread of a word's raise across the
contexts is no test: a random direction's top word is 7-15 standard errors above 0 as well.) Imports the model layers and this
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
RANDOM_DIRECTIONS = 32  # random directions whose largest raise of a word is the noise a promoted word must clear
NOISE_QUANTILE = 0.95  # of their largest raises


def output_effects(lm: LoadedModel, dictionary: Dictionary, features: list[int], chunk: int = 64) -> torch.Tensor:
    """(len(features), V): the change in the MLM head's logits at a [MASK] when each feature's
    decoder direction, times its mean activation, is added there at the dictionary's layer (to what
    it writes: the residual stream, or a transcoder's feed-forward output), averaged over
    EFFECT_CONTEXTS. Measured by running the rest of the model and its own head (transform,
    LayerNorm, decoder), not by a product of matrices that skips them; the clean rows ride in the
    same batch as the first chunk's."""
    return torch.cat([changes.mean(1) for changes in _per_context(lm, dictionary, features, chunk)])


def relative(change: torch.Tensor) -> torch.Tensor:
    """(..., V) logit changes less their mean over the vocabulary: a shift of every logit alike
    changes no probability, so a word is raised by what it gains over the average word."""
    return change - change.mean(-1, keepdim=True)


def added_norm(dictionary: Dictionary, features: list[int] | torch.Tensor) -> torch.Tensor:
    """(n,) the size of what `output_effects` adds for each feature: its mean activation (1 where
    it never fired) times its decoder row's norm."""
    mean = dictionary.stats["mean"][features] if dictionary.stats is not None else torch.ones(len(features))
    return torch.where(mean > 0, mean, 1.0) * dictionary.coder.W_dec[features].detach().norm(dim=1)


@torch.no_grad()
def noise_per_unit(lm: LoadedModel, dictionary: Dictionary, directions: int = RANDOM_DIRECTIONS,
                   seed: int = 0) -> float:
    """The noise a promoted word must clear, per unit of what is added: random directions as large
    as the dictionary's typical feature's (`added_norm`, median) added as `output_effects` adds a
    feature's, over the same contexts; each one's largest raise of any word (`relative`), divided
    by their size; the NOISE_QUANTILE of those. Any direction raises some word of a large vocabulary
    this much: a feature's word below it is not told apart from that."""
    size = float(added_norm(dictionary, list(range(dictionary.latents))).median())
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randn(directions, dictionary.width, generator=generator)
    rows = rows / rows.norm(dim=1, keepdim=True) * size
    top = torch.cat([relative(changes.mean(1)).max(-1).values
                     for changes in _per_context(lm, dictionary, rows, chunk=directions)])
    return float(torch.quantile(top, NOISE_QUANTILE)) / size


@torch.no_grad()
def _per_context(lm: LoadedModel, dictionary: Dictionary, features: list[int] | torch.Tensor, chunk: int):
    """Per chunk of `features` (ids, or (n, H) directions added as they are), (n, C, V): each one's
    logit change in each of EFFECT_CONTEXTS."""
    contexts = [encode(lm, text) for text in EFFECT_CONTEXTS]
    inputs, masks = _stacked(lm, contexts)
    count = len(contexts)
    mean = dictionary.stats["mean"] if dictionary.stats is not None else None
    clean = None
    for start in range(0, len(features), chunk):
        part = features[start:start + chunk]
        if isinstance(part, torch.Tensor):  # directions, as they are
            added = part.float().repeat_interleave(count, dim=0)
        else:
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
        yield logits - clean[None]


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


def promoted(lm: LoadedModel, dictionary: Dictionary, keep: int = 3, chunk: int = 64) -> dict[str, torch.Tensor]:
    """For every feature the `keep` words it raises most at a [MASK] (`output_effects`, `relative`),
    those that clear the noise (`noise_per_unit` x its `added_norm`) alone: a corpus-scale pass,
    done once per dictionary. {"promoted" (F, keep) ids, -1 where the word does not clear it,
    "promoted_change" (F, keep) their raise over the average word, "noise_per_unit" (1,)}."""
    from .stats import index_dtype

    per_unit = noise_per_unit(lm, dictionary)
    ids, changes = [], []
    for start in range(0, dictionary.latents, chunk):
        features = list(range(start, min(start + chunk, dictionary.latents)))
        top = relative(output_effects(lm, dictionary, features, chunk)).topk(keep, dim=-1)
        cleared = top.values > per_unit * added_norm(dictionary, features)[:, None]
        ids.append(torch.where(cleared, top.indices, -1))
        changes.append(top.values)
    return {"promoted": torch.from_numpy(torch.cat(ids).numpy().astype(index_dtype(lm.model.config.vocab_size))),
            "promoted_change": torch.cat(changes).half(), "noise_per_unit": torch.tensor([per_unit])}
