"""Training dictionaries: a plain loop around sparsify's `SparseCoder`, fed activations computed here.

sparsify's own `Trainer` hooks `model.base_model`'s layers and runs unpadded chunks of a token
stream with no attention mask, as a causal LM can; an encoder reads its whole padded sentence, so
its activations come from our padded batches (`data.pairs_at`, through the model anatomy's splice
point). The step is sparsify's, unchanged: the coder's forward (TopK, FVU, AuxK against dead
latents), unit-norm decoder rows with the gradient parallel to them removed, and its default
optimizer, sign-SGD under schedule-free averaging with its learning rate for the width
(5e-3 / sqrt(latents / 2^14)). Differences, and why:
- dead latents: a latent that has not fired for `dead_tokens` tokens (100k by default, not
  sparsify's 10M: a live run here sees one to a few million tokens, and AuxK revives only latents
  counted dead) gets AuxK's gradient at `auxk_alpha` 1/32, computed on the dead latents alone
  (`auxk_loss`);
- the coder's step runs in chunks of `chunk_tokens` with one optimizer step, each chunk's loss over
  the whole batch's variance, as sparsify's `micro_acc_steps` does: its fused encoder's backward
  holds tokens x k x hidden floats;
- several layers can train from one forward (`train(lm, [1, 2, 3], ...)`): the forward is most of
  a small model's cost;
- a run stops where it stands (the token limit, then `training.loop.stop_reason`: the one stop rule) and
  returns what it trained so far, which can be resumed (`start_from`).

A transcoder is trained by the same loop (`point=data.FEED_FORWARD`): its coder reads x (the
feed-forward block's input) and is scored on y (the block's output), as sparsify's trainer does in
transcode mode: the encoder's bias starts at -W_enc mean(x) and b_dec at mean(y), the decoder starts
at zeros and is never normalised (sparsify normalises it, and removes the gradient parallel to it,
only when autoencoding), FVU and AuxK are over y.

    dictionaries, history = train(lm, [3], lines, FeatureSettings(max_tokens=2_000_000))
    transcoders, history = train(lm, [1, 2], lines, FeatureSettings(skip_connection=True), point=FEED_FORWARD)
"""
from __future__ import annotations

import math
import platform
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch
from schedulefree import ScheduleFreeWrapper

from ..model.loading import LoadedModel
from ..training.loop import stop_reason
from .data import RESIDUAL, Lines, Point, pairs_at
from .dictionary import K, Dictionary, SignSGD, new_coder  # sparsify through dictionary: its decoder switch


@dataclass(frozen=True)
class FeatureSettings:
    """How a dictionary is trained. `latents` None: 8 x the hidden size."""

    latents: int | None = None
    k: int = K
    max_tokens: int = 2_000_000  # kept positions seen, summed over steps
    max_seconds: float = 120.0
    batch_tokens: int = 4096  # padded tokens per forward; the step sees the kept ones
    chunk_tokens: int = 1024  # the coder's forward and backward in chunks (one optimizer step): bounds memory
    auxk_alpha: float = 1 / 32
    dead_tokens: int = 100_000
    learning_rate: float | None = None  # None: sparsify's for the width, times `rate_scale`
    rate_scale: float = 1.0  # a transcoder's best is half sparsify's (docs/features.md#the-shipped-transcoders)
    seed: int = 0
    pause: float = 0.002  # seconds between steps: a served page's forwards get the cores meanwhile
    skip_connection: bool = False  # a transcoder's linear skip path (W_skip); a dictionary has none


@dataclass(frozen=True)
class FeatureStep:
    """One step done, for every layer trained: FVU and dead share per layer (same order as the
    run's layers), tokens so far, and where the time went."""

    step: int
    tokens: int  # kept positions seen so far
    fvu: tuple[float, ...]
    dead: tuple[float, ...]  # share of latents not fired for `dead_tokens` tokens
    elapsed: float
    forward_seconds: float  # this step's model forward
    coder_seconds: float  # this step's coder forward, backward and update, all layers

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.elapsed if self.elapsed > 0 else 0.0


@dataclass
class FeatureHistory:
    """What a training run did: its layers, every step, and why it ended (None: its token limit; else
    one of `training.loop.STOP_REASONS`, by the loops' one stop rule `loop.stop_reason`)."""

    layers: list[int]
    steps: list[FeatureStep] = field(default_factory=list)
    stopped: str | None = None

    @property
    def tokens(self) -> int:
        return self.steps[-1].tokens if self.steps else 0

    @property
    def seconds(self) -> float:
        return self.steps[-1].elapsed if self.steps else 0.0


class CoderTraining:
    """One coder in training (a layer's, or the [CLS] dictionary's): its optimizer and its dead-latent counts."""

    def __init__(self, width: int, settings: FeatureSettings, start: Dictionary | None, device: torch.device,
                 transcode: bool = False):
        self.coder = new_coder(width, settings.latents, settings.k, device,  # on the model's device: a GPU's when lent
                               transcode=transcode, skip_connection=transcode and settings.skip_connection)
        if start is not None:
            self.coder.load_state_dict(start.coder.state_dict())
        self.coder.requires_grad_(True).train()
        rate = settings.learning_rate or settings.rate_scale * 5e-3 / math.sqrt(self.coder.num_latents / 2 ** 14)
        self.optimizer = ScheduleFreeWrapper(SignSGD([{"params": self.coder.parameters(), "lr": rate}]), momentum=0.95)
        self.optimizer.train()
        self.since_fired = torch.zeros(self.coder.num_latents, dtype=torch.long, device=device)
        self.started = start is not None

    def step(self, x: torch.Tensor, settings: FeatureSettings, y: torch.Tensor | None = None) -> tuple[float, float]:
        """One optimizer step on activations x (N, H), scored on the target y (N, H) (a
        transcoder's; None: x itself, a dictionary's); returns (FVU of y, dead share)."""
        coder = self.coder
        transcode = coder.cfg.transcode
        target = x if y is None else y
        if not self.started:  # centre the preactivations at the data's mean and b_dec at the target's (as sparsify)
            if transcode:
                coder.encoder.bias.data = -x.mean(0) @ coder.encoder.weight.data.T
            coder.b_dec.data = target.mean(0)
            self.started = True
        if not transcode:  # sparsify keeps a dictionary's decoder rows at unit norm, never a transcoder's
            coder.set_decoder_norm_to_unit_norm()
        dead = self.since_fired > settings.dead_tokens
        fired = torch.zeros_like(dead)
        total_variance = (target - target.mean(0)).pow(2).sum()  # every chunk's loss is over the whole batch's
        fvu = 0.0
        for chunk, aim in zip(x.split(settings.chunk_tokens), target.split(settings.chunk_tokens)):  # sparsify's
            out = coder(chunk, aim if transcode else None, total_variance=total_variance)  # micro-batches: N x k x H
            loss = out.fvu
            if settings.auxk_alpha > 0 and dead.any():
                loss = loss + settings.auxk_alpha * auxk_loss(coder, chunk, out.sae_out, dead, total_variance, aim)
            loss.backward()
            fvu += out.fvu.item()
            fired[out.latent_indices[out.latent_acts > 0]] = True
        if not transcode:
            coder.remove_gradient_parallel_to_decoder_directions()
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.since_fired += x.shape[0]
        self.since_fired[fired] = 0
        return fvu, dead.float().mean().item()

    def finished(self) -> torch.nn.Module:
        """The coder at schedule-free's averaged weights (what it evaluates with), frozen, on the CPU
        (where the views encode: a sentence's codes are a few rows)."""
        self.optimizer.eval()
        if not self.coder.cfg.transcode:
            self.coder.set_decoder_norm_to_unit_norm()
        return self.coder.cpu().eval().requires_grad_(False)


def auxk_loss(coder, x: torch.Tensor, reconstruction: torch.Tensor, dead: torch.Tensor,
              total_variance: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
    """sparsify's AuxK loss (`SparseCoder.forward` with a `dead_mask`; Gao et al., appendix B.1): the
    top k_aux = min(H / 2, dead) dead latents are asked to reconstruct the residual the live ones
    leave (of the target y, a transcoder's; None: of x), scaled by min(dead / k_aux, 1), over the
    target's total variance. The latents read x as `encode` does (a transcoder's x as it is, a
    dictionary's minus b_dec). Computed here on the
    dead latents' columns only: sparsify's own call ranks all F latents per token with the live ones
    at -inf and decodes through a sparse gather whose backward sorts N x k_aux indices, which on a
    CPU doubled the step's time. Same loss, same gradient on the decoder; unlike sparsify's, whose
    fused encoder drops the gradient of its pre-activations, the dead latents' encoder rows get
    theirs too, as in the paper: that is what makes a dead latent fire again."""
    target = x if y is None else y
    columns = dead.nonzero().flatten()  # (D,)
    k_aux = min(target.shape[-1] // 2, len(columns))
    scale = min(len(columns) / (target.shape[-1] // 2), 1.0)
    read = x if coder.cfg.transcode else x - coder.b_dec.detach()
    pre = torch.relu(torch.nn.functional.linear(read, coder.encoder.weight[columns],
                                                coder.encoder.bias[columns]))  # (N, D)
    acts, picked = pre.topk(k_aux, sorted=False)  # (N, k_aux)
    chosen = torch.zeros_like(pre).scatter(1, picked, acts)  # (N, D): the rest zero
    estimate = chosen @ coder.W_dec[columns]  # (N, H)
    residual = (target - reconstruction).detach()
    return scale * (estimate - residual).pow(2).sum() / total_variance


def train(lm: LoadedModel, layers: list[int], lines: Lines, settings: FeatureSettings = FeatureSettings(), *,
          point: Point = RESIDUAL, on_event: Callable[[FeatureStep], None] | None = None,
          should_stop: Callable[[], bool] | None = None,
          start_from: dict[int, Dictionary] | None = None) -> tuple[dict[int, Dictionary], FeatureHistory]:
    """Train one coder per layer in `layers` at `point` (a dictionary of the residual stream; a
    transcoder of the feed-forward block) on `lines` until `settings.max_tokens` kept positions or
    `settings.max_seconds`, or `should_stop()` (asked before each step; its reason, when it has
    one, is the history's `stopped`). `start_from`: {layer: Dictionary} to resume from. Returns
    ({layer: Dictionary}, history); the dictionaries carry a training record and no statistics yet
    (`making.finish`)."""
    layers = [point.check_layer(lm.model, layer) for layer in layers]
    width = lm.model.config.hidden_size
    torch.manual_seed(settings.seed)
    coders = {layer: CoderTraining(width, settings, (start_from or {}).get(layer), lm.device, point.transcode)
              for layer in layers}
    history = FeatureHistory(layers)
    tokens, started = 0, time.perf_counter()
    for step, batch in enumerate(lines.batches(lm, batch_tokens=settings.batch_tokens, seed=settings.seed), 1):
        if tokens >= settings.max_tokens:  # every planned token: a whole run
            break
        history.stopped = stop_reason(should_stop, time.perf_counter() - started, settings.max_seconds)
        if history.stopped is not None:
            break
        t0 = time.perf_counter()
        states = pairs_at(lm, batch, layers, point, lm.device)
        t1 = time.perf_counter()
        if settings.pause:
            time.sleep(settings.pause)
        results = [coders[layer].step(states[layer][0], settings, states[layer][1]) for layer in layers]
        tokens += batch.tokens
        event = FeatureStep(step, tokens, tuple(r[0] for r in results), tuple(r[1] for r in results),
                            time.perf_counter() - started, t1 - t0, time.perf_counter() - t1)
        history.steps.append(event)
        if on_event is not None:
            on_event(event)
    return {layer: _dictionary(lm, layer, coders[layer], settings, history, start_from, point, lines)
            for layer in layers}, history


def _dictionary(lm: LoadedModel, layer: int, trained: CoderTraining, settings: FeatureSettings, history: FeatureHistory,
                start_from: dict[int, Dictionary] | None, point: Point, lines: Lines) -> Dictionary:
    before = (start_from or {}).get(layer)
    earlier = before.record.get("training", {}) if before is not None else {}
    tokens = history.tokens + earlier.get("tokens", 0)
    record = {"model": lm.name, "layer": layer, "point": point.name, "training": {
        "tokens": tokens, "text": {"lines": len(lines), "tokens": lines.tokens},
        "passes": tokens / max(1, lines.tokens),  # times it went through its training text
        "minutes": round(history.seconds / 60 + earlier.get("minutes", 0.0), 3),
        "steps": len(history.steps) + earlier.get("steps", 0),
        "stopped": history.stopped, "machine": machine(),
        "settings": asdict(settings),
        "final_fvu": history.steps[-1].fvu[history.layers.index(layer)] if history.steps else None}}
    return Dictionary(trained.finished(), layer, None, record)


def machine() -> str:
    """e.g. "2 CPU threads (AMD EPYC 7B13)" or "NVIDIA H100 80GB HBM3"."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"{torch.get_num_threads()} CPU threads ({cpu_model()})"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
