"""The one training loop, shaped like minGPT's trainer: it knows nothing of masked LMs or classifiers.

A task supplies its batches, `loss(batch)` (a scalar tensor) and `evaluate(step) -> Evaluation`;
`train` runs the optimizer steps, asks `should_stop()` before each, evaluates before training
(step 0), along the way and at the end, records everything in a `RunHistory` and reports each
step and evaluation as a typed event (`Step`, `Evaluation`) through `on_event`. The MLM fine-tune
(`fine_tuning.py`) and the classifier (`classification.py`) differ only in those three things.

    history = RunHistory(planned_steps=30)
    train(model, batches, loss, evaluate, history, learning_rate=5e-5, on_event=print)

Optimisation, as BERT and run_mlm do it: AdamW without weight decay on biases and LayerNorm,
gradients clipped at 1.0, linear warmup then linear decay. Runs repeat: `seeded(seed, device)`
seeds torch's global generator (dropout, new heads) and restores it afterwards, and each random
stream a run needs (eval masks, ...) has a seed of its own (`stream_seed`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Union

import torch

from .. import memory

STOP_REASONS = ("stopped", "time limit", "diverged", "shutdown", "closed")  # RunHistory.stopped, when not None
_STREAM_OFFSETS = {  # seed + offset: random streams apart from the training one, the same every run;
    # one offset per stream, a million apart (tests/training/test_finetune.py checks): the training stream's
    # seeds (seed + rank, templates/train_mlm.py) never reach the next stream
    "eval": 1_000_003,  # the fine-tune's fixed eval masks (train_mlm.py's EVAL_SEED_OFFSET)
    "forgetting": 2_000_003,  # the classifier's measure of the body's MLM loss
    "hidden": 3_000_003,  # the labelling experiment's all-[MASK] eval masks
}


# ---------------------------------------------------------------- events and history

@dataclass(frozen=True)
class Step:
    """One optimizer step done: its loss, the learning rate it used, how far the run is."""

    step: int  # from 1
    steps: int  # planned in this run
    loss: float
    learning_rate: float
    elapsed: float  # seconds since the run started
    seconds: float = 0.0  # this step's own time (batch, forward, backward, update)
    tokens: int = 0  # tokens in the batch, padding excluded
    # which training run of a job that holds several ("static", "2e-05", ...): a label, not a result
    run: str | None = field(default=None, compare=False)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class Evaluation:
    """Scores on held-out data at `step` (0: before training). The masked LM fills `perplexity`
    (exp(loss), capped) and `masked` (tokens scored); the classifier fills `macro_f1`."""

    step: int
    loss: float
    accuracy: float
    perplexity: float | None = None
    masked: int | None = None
    macro_f1: float | None = None
    run: str | None = field(default=None, compare=False)  # as `Step.run`


Event = Union[Step, Evaluation]


@dataclass
class RunHistory:
    """What one training run did: every step and evaluation, and why it ended. `stopped` is None
    when every planned step ran, else one of `STOP_REASONS`."""

    planned_steps: int
    settings: dict = field(default_factory=dict)  # what it ran with (JSON-ready)
    steps: list[Step] = field(default_factory=list)
    evals: list[Evaluation] = field(default_factory=list)
    stopped: str | None = None
    seconds: float = 0.0
    kept: Evaluation | None = None  # the evaluation whose weights the run returned, when not the last

    @property
    def before(self) -> Evaluation:
        return self.evals[0]

    @property
    def after(self) -> Evaluation:
        return self.evals[-1]

    @property
    def returned(self) -> Evaluation:
        """The evaluation of the weights the run returned: the kept best one, else the last."""
        return self.kept or self.after

    @property
    def completed(self) -> bool:
        return self.stopped is None

    @property
    def tokens_per_s(self) -> float:
        """Mean training throughput over the run (tokens with attention, padding excluded)."""
        busy = sum(s.seconds for s in self.steps)
        return sum(s.tokens for s in self.steps) / busy if busy else 0.0


class EventLog:
    """A job's events as they arrive, per training run (a job such as the static-vs-dynamic
    comparison holds several, each event tagged with its `run`): what live curves and progress
    bars are drawn from."""

    def __init__(self):
        self.runs: dict[str | None, RunHistory] = {}  # in the order they started
        self.current: str | None = None

    def add(self, event: Event) -> None:
        self.current = event.run
        history = self.runs.setdefault(event.run, RunHistory(planned_steps=0))
        if isinstance(event, Step):
            history.planned_steps = event.steps
            history.steps.append(event)
        else:
            history.evals.append(event)

    @property
    def latest(self) -> RunHistory:
        """The training run the last event came from (empty before any event)."""
        return self.runs.get(self.current) or RunHistory(planned_steps=0)


# ---------------------------------------------------------------- overfitting

def best_evaluation(evals: list[Evaluation]) -> Evaluation | None:
    """The evaluation with the lowest held-out loss among those after training began (step 0 is
    the model before training, which keeping "the best" must not hand back); None before any."""
    trained = [e for e in evals if e.step > 0]
    return min(trained, key=lambda e: e.loss) if trained else None


def overfitting(evals: list[Evaluation], patience: int = 2) -> Evaluation | None:
    """The best evaluation (`best_evaluation`) when held-out loss has risen past it for `patience`
    evaluations in a row (every one since is higher): the run now learns its training text by
    heart. None while the loss still falls, or has risen for fewer evaluations."""
    best = best_evaluation(evals)
    return best if best is not None and evals.index(best) <= len(evals) - 1 - patience else None


class _BestWeights:
    """A copy of the weights at the best evaluation so far (as Trainer's `load_best_model_at_end`
    keeps its best checkpoint), kept on the model's device and overwritten in place when a later
    evaluation beats it; `restore()` puts them back in the model."""

    def __init__(self, model: torch.nn.Module):
        self.model, self.evaluation, self.saved = model, None, None

    def _tensors(self) -> dict[str, torch.Tensor]:  # tied weights once
        return {**dict(self.model.named_parameters()), **dict(self.model.named_buffers())}

    @torch.no_grad()
    def offer(self, evaluation: Evaluation) -> None:
        if evaluation.step == 0 or (self.evaluation is not None and evaluation.loss >= self.evaluation.loss):
            return
        if self.saved is None:
            self.saved = {k: v.detach().clone() for k, v in self._tensors().items()}
        else:
            for k, v in self._tensors().items():
                self.saved[k].copy_(v)
        self.evaluation = evaluation

    @torch.no_grad()
    def restore(self) -> None:
        for k, v in self._tensors().items():
            v.copy_(self.saved[k])
        self.saved = None


# ---------------------------------------------------------------- the loop

def train(model: torch.nn.Module, batches: Iterator[dict], loss: Callable[[dict], torch.Tensor],
          evaluate: Callable[[int], Evaluation], history: RunHistory, *, learning_rate: float,
          max_seconds: float = math.inf, eval_every: int | None = None, weight_decay: float = 0.01,
          warmup_ratio: float = 0.1, on_event: Callable[[Event], None] | None = None,
          should_stop: Callable[[], bool] | None = None, run: str | None = None,
          rate_scale: Callable[[str], float] | None = None, keep_best: bool = False) -> RunHistory:
    """`history.planned_steps` optimizer steps of `model` on `loss(next(batches))`.

    `evaluate(step)` runs before training (step 0), every `eval_every` steps (default: ten times
    a run; 0: only before and after) and after the last step. Each `Step` and `Evaluation`
    (tagged with `run`) is appended to `history` and sent to `on_event`. Before each step the run
    ends if `should_stop()` (`history.stopped` is "stopped", or the callable's `.reason` when it
    has one: `runs.slots.StopCheck` says "time limit"), or after `max_seconds` ("time limit"); a
    non-finite loss ends it too ("diverged"). Batches are dicts of (B, ...) tensors;
    `batch["attention_mask"]`, when present, counts the step's tokens. `rate_scale`: see
    `make_optimizer` (the steps report the base rate). `keep_best`: at the end the model gets
    back the weights of its evaluation with the lowest loss (`best_evaluation`), as Trainer's
    `load_best_model_at_end` does, and `history.kept` names it (None when the last was the best).
    """
    steps = history.planned_steps
    eval_every = max(1, steps // 10) if eval_every is None else eval_every
    emit = on_event or (lambda event: None)
    optimizer = make_optimizer(model, learning_rate, weight_decay, rate_scale)
    scheduler = linear_schedule(optimizer, steps, round(warmup_ratio * steps))
    params = [p for p in model.parameters() if p.requires_grad]
    start = time.perf_counter()

    best = _BestWeights(model) if keep_best else None

    def record(event: Event) -> None:
        (history.steps if isinstance(event, Step) else history.evals).append(event)
        if best is not None and isinstance(event, Evaluation):
            best.offer(event)
        emit(event)

    record(dataclasses.replace(evaluate(0), run=run))
    lagged = reads_late(model)
    log = _StepLog(steps, start, record, run)
    with memory.pages_kept():  # each step's freed memory reused, not faulted in anew (memory.py)
        batch, unread = None, []  # unread: steps launched whose loss is not read yet
        for step in range(1, steps + 1):
            history.stopped = stop_reason(should_stop, time.perf_counter() - start, max_seconds)
            if history.stopped:
                break
            tick, rate = time.perf_counter(), learning_rate * scheduler.lr_lambdas[0](step - 1)
            batch = next(batches) if batch is None else batch
            unread.append(_Launched(step, _optimizer_step(loss(batch), params, optimizer, scheduler), rate, tick,
                                    _tokens(batch)))
            # drawn while a GPU still runs this step's kernels (collating 256 x 128 tokens: ~20 ms)
            batch = next(batches) if step < steps else None
            evaluating = eval_every and step % eval_every == 0 and step != steps
            # read late, the newest step stays queued; every step is read before an evaluation
            ready = len(unread) - (1 if lagged and not evaluating else 0)
            if not log.read(unread[:ready]):
                history.stopped, unread = "diverged", []  # a step queued after it is not reported
                break
            unread = unread[ready:]
            if evaluating:
                record(dataclasses.replace(evaluate(step), run=run))
        if not log.read(unread):
            history.stopped = "diverged"
    if history.evals[-1].step != len(history.steps):
        record(dataclasses.replace(evaluate(len(history.steps)), run=run))
    if best is not None and best.evaluation is not None and best.evaluation is not history.evals[-1]:
        best.restore()
        history.kept = best.evaluation
    history.seconds = time.perf_counter() - start
    return history  # the optimizer goes with this frame: its moments (2x the model) are freed now


def reads_late(model: torch.nn.Module) -> bool:
    """Whether `train` reads a step's loss only after queuing the next step: on a GPU, so that
    the host queues kernels while the device still runs the last ones (at 256 x 128 tokens the
    two took turns before). On a CPU the loss is there already: read at once, so that events and
    stops are not a step late."""
    return next(model.parameters()).device.type == "cuda"


@dataclass(frozen=True)
class _Launched:
    """A step whose kernels are queued: its loss (a tensor, maybe still being computed) and what
    its `Step` event will say."""

    step: int
    loss: torch.Tensor
    learning_rate: float
    tick: float  # when the step began
    tokens: int


class _StepLog:
    """Reads launched steps' losses, in order, and records their `Step` events."""

    def __init__(self, steps: int, start: float, record: Callable, run: str | None):
        self.steps, self.start, self.record, self.run = steps, start, record, run
        self.last = start  # when the last step was read

    def read(self, launched: list[_Launched]) -> bool:
        """Wait for the loss of each step given and record it; False at the first loss that is
        not finite. A step's time runs from its start, or from the step before it was read if
        later (a step queued behind another)."""
        for one in launched:
            value = one.loss.item()  # waits for the GPU, so the step time is honest
            if not math.isfinite(value):
                return False
            now = time.perf_counter()
            self.record(Step(one.step, self.steps, value, one.learning_rate, now - self.start,
                             now - max(one.tick, self.last), one.tokens, self.run))
            self.last = now
        return True


def _optimizer_step(loss: torch.Tensor, params: list, optimizer, scheduler) -> torch.Tensor:
    """Backward, clip, update; returns the loss, detached (on a GPU, still being computed)."""
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def stop_reason(should_stop: Callable | None, elapsed: float, max_seconds: float) -> str | None:
    """Why a run ends before its next step, or None: the one stop rule of every training loop (this
    one, the features' and transcoders'). `should_stop()` first, with its reason when it has one,
    then the wall clock past `max_seconds`; one of `STOP_REASONS`."""
    if should_stop is not None and should_stop():
        return getattr(should_stop, "reason", None) or "stopped"  # runs.slots.StopCheck says why
    if elapsed > max_seconds:
        return "time limit"
    return None


def _tokens(batch) -> int:
    mask = batch.get("attention_mask") if hasattr(batch, "get") else None
    return int(mask.sum()) if mask is not None else 0


# ---------------------------------------------------------------- optimisation

def make_optimizer(model: torch.nn.Module, learning_rate: float, weight_decay: float = 0.01,
                   rate_scale: Callable[[str], float] | None = None):
    """AdamW without weight decay on biases and LayerNorm weights (as BERT and run_mlm do), over
    the parameters that require grad. `rate_scale(name)`: a parameter's learning rate as a multiple
    of `learning_rate` (e.g. a new head faster than a pretrained body); default 1 for all.

    The fused kernel wherever torch has one, CPU included: on MiniLM-L6 it took 0.02 s per step
    against 0.10 s for the default, more than the forward and backward of a short batch.
    """
    groups: dict[tuple[bool, float], list] = {}
    for name, param in model.named_parameters():
        if param.requires_grad:
            decays = not (param.ndim < 2 or "norm" in name.lower())
            groups.setdefault((decays, rate_scale(name) if rate_scale else 1.0), []).append(param)
    groups = [{"params": params, "weight_decay": weight_decay if decays else 0.0, "lr": learning_rate * scale}
              for (decays, scale), params in sorted(groups.items(), key=lambda kv: (not kv[0][0], kv[0][1]))]
    try:
        return torch.optim.AdamW(groups, lr=learning_rate, fused=True)
    except RuntimeError:  # no fused kernel for this device or dtype
        return torch.optim.AdamW(groups, lr=learning_rate)


def linear_schedule(optimizer, steps: int, warmup: int):
    """Linear warmup then linear decay. Unlike get_linear_schedule_with_warmup the first step
    already has a non-zero rate: in a 20-step run, a wasted step is 5% of the training."""
    def factor(s: int) -> float:
        return min((s + 1) / (warmup + 1), (steps - s) / max(steps - warmup, 1))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def autocast(device: torch.device):
    """bf16 autocast on CUDA; on CPU a no-op, so the same code runs in float32."""
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16,
                          enabled=device.type == "cuda")


def to_device(batch: dict, device: torch.device) -> dict:
    """The batch's tensors on `device`. CPU tensors bound for a GPU go through pinned memory:
    a copy from ordinary memory waits for every kernel queued before it, and the training loop
    queues the next step while the last one runs."""
    if device.type != "cuda":
        return {k: v.to(device) for k, v in batch.items()}
    return {k: (v.pin_memory() if v.device.type == "cpu" else v).to(device, non_blocking=True)
            for k, v in batch.items()}


# ---------------------------------------------------------------- repeatable runs

@contextlib.contextmanager
def seeded(seed: int, device: torch.device):
    """Torch's global generator (CPU, and the GPU the run uses) seeded with `seed` inside, restored
    after: dropout and newly initialised layers repeat, and nobody else's draws change."""
    with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        yield


def stream_seed(seed: int, stream: str) -> int:
    """The seed of a run's random stream `stream` (see `_STREAM_OFFSETS`): apart from the
    training stream `seed`, and the same every time the run is repeated."""
    return seed + _STREAM_OFFSETS[stream]
