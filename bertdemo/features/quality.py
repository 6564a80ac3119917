"""How far to trust a dictionary, measured on held-out text: what the masked LM pays when the layer
is replaced by its reconstruction, and how much of the layer it explains.

- The splice's cost, first: the masked-LM cross-entropy added (spliced - clean, in nats), the
  perplexity ratio exp(added), and KL(clean || spliced), the divergence of the spliced model's
  predicted distribution from the clean one's, each a mean over the held-out masked positions
  (~15% of every held-out line's word pieces, fixed masks), the layer's output replaced by its
  reconstruction at every kept position (`data.kept_positions`: never [CLS], [SEP] or padding);
- FVU: sum of squared error over sum of squared deviation from the mean, over held-out tokens
  (plain and masked lines, as trained); L0: latents active per token;
- dead: the share of latents that never fire over a stated window: the held-out tokens, plus the
  statistics' pass when the dictionary has statistics (`dead_window`, in tokens);
- the cross-entropy clean, spliced, zero-ablated and mean-ablated (those positions set to zero or to
  their mean), and the loss recovered, (ablated - spliced) / (ablated - clean), against each;
- a bootstrap interval (95%, `RESAMPLES` resamples of the held-out *lines*, the unit the text
  comes in) on FVU, on the spliced cross-entropy, on the cross-entropy added and on KL;
- given the training text, FVU on a sample of it as large as the held-out text: where it parts
  from the held-out FVU, the dictionary learnt its training text by heart (`overfitting`).

A transcoder is measured alike at its own point (`data.FEED_FORWARD`): FVU of the feed-forward
block's output predicted from its input, and that output replaced by the transcoder's, zeroed or
set to its mean at the kept positions.

    report = measure(lm, dictionary, held_out_lines)   # {"splice_cost": {...}, "fvu": 0.18, ...}
"""
from __future__ import annotations

import contextlib
import hashlib
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..forward import lean_forward
from ..model.logits import mlm_head
from ..model.loading import LoadedModel
from .data import RESIDUAL, Lines, Point, pairs_at, point_of
from .dictionary import Dictionary

SEED = 7  # the held-out masks: the same every measurement
VARIANTS = ("clean", "spliced", "zero", "mean")
RESAMPLES = 200  # bootstrap resamples of the held-out lines
LEVEL = 0.95  # the intervals' coverage
OVERFIT_RATIO = 1.1  # held-out FVU past training FVU by this factor, and outside its interval: overfitting


@torch.no_grad()
def measure(lm: LoadedModel, dictionary: Dictionary, lines: Lines, batch_tokens: int = 4096, *,
            training: Lines | None = None, resamples: int = RESAMPLES) -> dict:
    """The quality figures of `dictionary` on the held-out `lines` (see the module doc), at its
    point; with `training` (its training text), also its FVU on a sample of that text."""
    layer = dictionary.layer
    fit = reconstruction(lm, dictionary, lines, batch_tokens)
    if fit.count == 0:
        raise ValueError("The held-out text has no tokens to measure on.")
    fired, window = fit.fired, fit.count
    if dictionary.stats is not None:  # the statistics' pass: a longer window for "never fired"
        fired, window = fired | (dictionary.stats["density"] > 0), window + dictionary.stats.tokens
    losses = masked_pass(lm, dictionary, lines, fit.mean.float(), batch_tokens)
    ce = {variant: losses.mean(variant) for variant in VARIANTS}
    added = ce["spliced"] - ce["clean"]
    report = {"layer": layer, "tokens": fit.count,
              "held_out": {"lines": len(lines), "tokens": fit.count, "targets": int(losses.targets.sum())},
              "splice_cost": {"added_cross_entropy": added, "perplexity_ratio": math.exp(added),
                              "kl": losses.mean("kl")},
              "fvu": fit.fvu(), "dead": 1 - float(fired.float().mean()), "dead_window": window,
              "l0": fit.active / fit.count, "cross_entropy": ce,
              "loss_recovered": {ablation: _recovered(ce, ablation) for ablation in ("zero", "mean")},
              "interval": intervals(fit, losses, resamples)}
    if training is not None:
        sample = training_sample(lm, training, fit.count)
        report["training_fvu"] = {"fvu": reconstruction(lm, dictionary, sample, batch_tokens).fvu(),
                                  "tokens": sample.tokens, "lines": len(sample)}
    return report


def _recovered(losses: dict, ablation: str) -> float | None:
    gap = losses[ablation] - losses["clean"]
    return (losses[ablation] - losses["spliced"]) / gap if gap > 0 else None


@dataclass
class Fit:
    """A coder's reconstruction of `lines`, summed per line (the bootstrap's unit): squared error,
    squared target and target (L, H) and kept tokens per line; which latents fired and how many
    were active in all."""

    error: np.ndarray
    squared: np.ndarray
    total: np.ndarray
    tokens: np.ndarray
    fired: torch.Tensor
    active: int

    @property
    def count(self) -> int:
        return int(self.tokens.sum())

    @property
    def mean(self) -> torch.Tensor:
        return torch.from_numpy(self.total.sum(0) / max(1, self.count))

    def fvu(self, weights: np.ndarray | None = None) -> float | np.ndarray:
        """FVU over every line (`weights` None) or per resample, each line counted `weights` (R, L) times."""
        if weights is None:
            return float(fvu(self.error.sum(), self.squared.sum(), self.total.sum(0), self.count))
        return fvu(weights @ self.error, weights @ self.squared, weights @ self.total, weights @ self.tokens)


def fvu(error, squared, total, count):
    """The fraction of variance unexplained, from sums over `count` tokens: the squared error over the
    sum of squared deviations from the mean, the latter from the sum of squares `squared` and the
    sum of values `total` (..., H). The one FVU of every measure (this module's, the drift's);
    arrays give one per row (the bootstrap's resamples)."""
    return error / (squared - (np.asarray(total) ** 2).sum(-1) / np.maximum(count, 1))


@torch.no_grad()
def reconstruction(lm: LoadedModel, dictionary: Dictionary, lines: Lines, batch_tokens: int = 4096) -> Fit:
    """`dictionary`'s reconstruction of `lines` (plain and masked lines, SEED's masks, at its point),
    summed per line."""
    point = point_of(dictionary)
    count = len(lines)
    error, squared, tokens = (torch.zeros(count, dtype=torch.float64) for _ in range(3))
    total = torch.zeros(count, dictionary.width, dtype=torch.float64)
    fired = torch.zeros(dictionary.latents, dtype=torch.bool)
    active = 0
    for batch in lines.batches(lm, batch_tokens=batch_tokens, seed=SEED, order=np.arange(count), endless=False):
        x, y = pairs_at(lm, batch, [dictionary.layer], point)[dictionary.layer]
        y = (x if y is None else y).double()
        acts, indices = dictionary.encode(x)
        line = torch.from_numpy(batch.lines)[batch.keep.nonzero()[:, 0]]  # each kept token's line
        out = dictionary.output(x, (acts, indices)).double()
        error.index_add_(0, line, (y - out).pow(2).sum(1))
        squared.index_add_(0, line, y.pow(2).sum(1))
        total.index_add_(0, line, y)
        tokens.index_add_(0, line, torch.ones(len(line), dtype=torch.float64))
        active += int((acts > 0).sum())
        fired[indices[acts > 0]] = True
    return Fit(error.numpy(), squared.numpy(), total.numpy(), tokens.numpy(), fired, active)


@dataclass
class Losses:
    """The masked pass, summed per line (L,): each variant's cross-entropy, KL(clean || spliced), targets."""

    sums: dict[str, np.ndarray]
    targets: np.ndarray

    def mean(self, name: str, weights: np.ndarray | None = None) -> float | np.ndarray:
        if weights is None:
            return float(self.sums[name].sum() / self.targets.sum())
        return (weights @ self.sums[name]) / np.maximum(weights @ self.targets, 1)


@torch.no_grad()
def masked_pass(lm: LoadedModel, dictionary: Dictionary, lines: Lines, mean: torch.Tensor,
                batch_tokens: int = 4096) -> Losses:
    """Every held-out line masked with the fixed masks (SEED): per line, the masked-LM cross-entropy
    of each of VARIANTS and KL(clean || spliced) of the predicted distributions, summed over its
    masked positions, and their count."""
    sums = {name: np.zeros(len(lines)) for name in (*VARIANTS, "kl")}
    targets = np.zeros(len(lines))
    point = point_of(dictionary)
    for batch in masked_batches(lm, lines, batch_tokens):
        inputs = {k: v.to(lm.device) for k, v in batch.inputs.items()}
        labels = batch.labels.to(lm.device)
        rows, cols = (labels != -100).nonzero(as_tuple=True)
        line = batch.lines[rows.cpu().numpy()]
        keep = batch.keep.to(lm.device)
        log_probs = {}
        for variant in VARIANTS:
            edit = replacement(variant, dictionary, mean, keep)
            edits = {dictionary.layer: point.edit(edit)} if edit else {}
            log_probs[variant] = logits_at(lm, inputs, rows, cols, edits, point).float().log_softmax(-1)
            loss = F.nll_loss(log_probs[variant], labels[rows, cols], reduction="none")
            np.add.at(sums[variant], line, loss.double().cpu().numpy())
        kl = F.kl_div(log_probs["spliced"], log_probs["clean"], log_target=True, reduction="none").sum(-1)
        np.add.at(sums["kl"], line, kl.double().cpu().numpy())
        np.add.at(targets, line, 1)
    if targets.sum() == 0:
        raise ValueError("The held-out text is too short to mask: paste more text.")
    return Losses(sums, targets)


def masked_batches(lm: LoadedModel, lines: Lines, batch_tokens: int = 4096):
    """The held-out lines, every one masked with the fixed masks (SEED), in batches that have a target."""
    for batch in lines.batches(lm, batch_tokens=batch_tokens, seed=SEED, masked_share=1.0,
                               order=np.arange(len(lines)), endless=False):
        if (batch.labels != -100).any():
            yield batch


def intervals(fit: Fit, losses: Losses, resamples: int = RESAMPLES, seed: int = 0) -> dict:
    """The bootstrap's intervals ({"level", "resamples", "fvu", "spliced_cross_entropy",
    "added_cross_entropy", "kl"}: [low, high] each): `resamples` draws of the held-out lines with
    replacement, as many as there are, every figure recomputed from the drawn lines' sums."""
    weights = resampled(len(fit.tokens), resamples, seed)
    added = Losses({"added": losses.sums["spliced"] - losses.sums["clean"]}, losses.targets)
    figures = {"fvu": fit.fvu(weights), "spliced_cross_entropy": losses.mean("spliced", weights),
               "added_cross_entropy": added.mean("added", weights), "kl": losses.mean("kl", weights)}
    tail = (1 - LEVEL) / 2 * 100
    return {"level": LEVEL, "resamples": resamples, "unit": "held-out lines",
            **{name: [float(np.percentile(values, tail)), float(np.percentile(values, 100 - tail))]
               for name, values in figures.items()}}


def resampled(lines: int, resamples: int, seed: int = 0) -> np.ndarray:
    """(resamples, lines): how many times each line is drawn in each bootstrap resample."""
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, lines, size=(resamples, lines))
    return np.stack([np.bincount(row, minlength=lines) for row in draws]).astype(np.float64)


def training_sample(lm: LoadedModel, training: Lines, tokens: int) -> Lines:
    """Lines of the training text, chosen by a hash of each (the same whatever their order), until
    about `tokens` tokens: the training FVU is measured on as much text as the held-out FVU."""
    order = sorted(range(len(training)), key=lambda i: hashlib.sha1(training.texts[i].encode()).hexdigest())
    chosen, count = [], 0
    for i in order:
        if count >= tokens:
            break
        chosen.append(training.texts[i])
        count += int(training.lengths[i])
    return Lines(lm, chosen)


def overfitting(quality: dict) -> bool:
    """Whether the training FVU and the held-out FVU part: the held-out FVU is `OVERFIT_RATIO` times
    the training FVU or more, and the training FVU lies below the held-out FVU's interval."""
    trained = (quality.get("training_fvu") or {}).get("fvu")
    low = (quality.get("interval") or {}).get("fvu", [None])[0]
    if trained is None or low is None or "fvu" not in quality:
        return False
    return quality["fvu"] >= OVERFIT_RATIO * trained and trained < low


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
