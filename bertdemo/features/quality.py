"""How far to trust a dictionary, measured on held-out text: the share of the layer it explains and
what the masked LM loses when the layer is replaced by its reconstruction.

- FVU: sum of squared error over sum of squared deviation from the mean, over held-out tokens
  (plain and masked lines, as trained);
- dead: the share of latents that never fire over that window; L0: latents active per token;
- masked-LM cross-entropy on held-out lines with ~15% masked (fixed masks): clean; with the layer's
  output replaced by its reconstruction at every position but [CLS], [SEP] and padding (spliced);
  with those positions set to zero (zero-ablated) or to their mean (mean-ablated); and the loss
  recovered, (ablated - spliced) / (ablated - clean), against each ablation.

A transcoder is measured alike at its own point (`data.FEED_FORWARD`): FVU of the feed-forward
block's output predicted from its input, and that output replaced by the transcoder's, zeroed or
set to its mean at the kept positions.

    report = measure(lm, dictionary, held_out_lines)   # {"fvu": 0.18, "dead": 0.04, ...}
"""
from __future__ import annotations

import contextlib

import numpy as np
import torch
import torch.nn.functional as F

from ..forward import lean_forward
from ..model.logits import mlm_head
from ..model.loading import LoadedModel
from .data import RESIDUAL, Lines, Point, TokenBatch, pairs_at, point_of
from .dictionary import Dictionary

SEED = 7  # the held-out masks: the same every measurement
VARIANTS = ("clean", "spliced", "zero", "mean")


@torch.no_grad()
def measure(lm: LoadedModel, dictionary: Dictionary, lines: Lines, batch_tokens: int = 4096) -> dict:
    """The quality figures of `dictionary` on `lines` (see the module doc), at its point."""
    layer, point = dictionary.layer, point_of(dictionary)
    order = np.arange(len(lines))
    squared = error = 0.0
    total = torch.zeros(dictionary.width, dtype=torch.float64)
    count = active = 0
    fired = torch.zeros(dictionary.latents, dtype=torch.bool)
    for batch in lines.batches(lm, batch_tokens=batch_tokens, seed=SEED, order=order, endless=False):
        x, y = pairs_at(lm, batch, [layer], point)[layer]
        y = x if y is None else y
        acts, indices = dictionary.encode(x)
        error += float((y - dictionary.output(x, (acts, indices))).pow(2).sum())
        squared += float(y.double().pow(2).sum())
        total += y.double().sum(0)
        count += y.shape[0]
        active += int((acts > 0).sum())
        fired[indices[acts > 0]] = True
    if count == 0:
        raise ValueError("The held-out text has no tokens to measure on.")
    mean = total / count
    variance = squared - count * float(mean.pow(2).sum())
    losses = masked_losses(lm, dictionary, lines, mean.float(), batch_tokens)
    return {"layer": layer, "tokens": count, "fvu": error / variance, "dead": 1 - float(fired.float().mean()),
            "l0": active / count, "cross_entropy": losses,
            "loss_recovered": {ablation: _recovered(losses, ablation) for ablation in ("zero", "mean")}}


def _recovered(losses: dict, ablation: str) -> float | None:
    gap = losses[ablation] - losses["clean"]
    return (losses[ablation] - losses["spliced"]) / gap if gap > 0 else None


@torch.no_grad()
def masked_losses(lm: LoadedModel, dictionary: Dictionary, lines: Lines, mean: torch.Tensor,
                  batch_tokens: int = 4096) -> dict[str, float]:
    """Mean masked-LM cross-entropy over the held-out masks for each of VARIANTS."""
    sums = dict.fromkeys(VARIANTS, 0.0)
    targets = 0
    point = point_of(dictionary)
    for batch in masked_batches(lm, lines, batch_tokens):
        for variant in VARIANTS:
            edit = replacement(variant, dictionary, mean, batch.keep.to(lm.device))
            loss, n = batch_loss(lm, batch, {dictionary.layer: point.edit(edit)} if edit else {}, point)
            sums[variant] += loss
        targets += n
    if targets == 0:
        raise ValueError("The held-out text is too short to mask: paste more text.")
    return {variant: total / targets for variant, total in sums.items()}


def masked_batches(lm: LoadedModel, lines: Lines, batch_tokens: int = 4096):
    """The held-out lines, every one masked with the fixed masks (SEED), in batches that have a target."""
    for batch in lines.batches(lm, batch_tokens=batch_tokens, seed=SEED, masked_share=1.0,
                               order=np.arange(len(lines)), endless=False):
        if (batch.labels != -100).any():
            yield batch


def replacement(variant: str, dictionary: Dictionary, mean: torch.Tensor, keep: torch.Tensor):
    """`edit(y, x)` that puts `variant` at the kept positions (B, T) of what the coder writes (y,
    (B, T, H)), from what it reads there (x), or None for the clean model; `Point.edit` puts it in
    the point's own form."""
    if variant == "clean":
        return None

    def edit(written, read):  # (B, T, H) each
        written = written.clone()
        if variant == "spliced":
            written[keep] = dictionary.output(read[keep].float()).to(written.device, written.dtype)
        elif variant == "zero":
            written[keep] = 0
        else:
            written[keep] = mean.to(written.dtype)
        return written
    return edit


def batch_loss(lm: LoadedModel, batch: TokenBatch, edits: dict, point: Point = RESIDUAL) -> tuple[float, int]:
    """(summed cross-entropy, targets) of the batch's labels, with `edits` at `point`."""
    inputs = {k: v.to(lm.device) for k, v in batch.inputs.items()}
    labels = batch.labels.to(lm.device)
    rows, cols = (labels != -100).nonzero(as_tuple=True)
    logits = logits_at(lm, inputs, rows, cols, edits, point)
    return float(F.cross_entropy(logits.float(), labels[rows, cols], reduction="sum")), len(rows)


def logits_at(lm: LoadedModel, inputs: dict, rows: torch.Tensor, cols: torch.Tensor, edits: dict,
              point: Point = RESIDUAL) -> torch.Tensor:
    """MLM logits (N, V) at positions (rows, cols) of the batch, with `edits` ({layer: edit}, in
    `point`'s form) in its forward: for the residual stream, the lean forward where it serves the
    model (BERT's layout, no grad, the edits inside it), else the base forward with the edits at
    the point (the anatomy's splice point, or its feed-forward blocks); then the model's own head at
    those positions (the whole forward for a model whose head the anatomy does not know)."""
    head = mlm_head(lm.model, lm.caches.packed)  # the served head: its decoder fast at a few rows
    if head is not None and point is RESIDUAL:  # BERT's layout, no grad: the lean forward, with the edits in it
        hidden = lean_forward.hidden_at(lm.model, inputs, rows, cols, lm.caches.packed, edits=edits)
        if hidden is not None:
            return head(hidden)
    with point.edited(lm.model, edits) if edits else contextlib.nullcontext():
        if head is None:
            return lm.model(**inputs).logits[rows, cols]
        out = lm.model.base_model(**inputs)
    return head(out.last_hidden_state[rows, cols])
