"""A short masked-LM fine-tune on pasted text, shaped like minGPT's trainer.

The loop knows nothing about the UI: it emits events through `on_step(event)` and asks
`should_stop()` before every step, so a caller can draw live curves and stop it within one step.
The base model is never touched: training runs on a deep copy, returned as a new `LoadedModel`.

Story: text -> lines/sentences -> held-out part -> tokens packed into blocks ->
`DataCollatorForLanguageModeling` masks (static: drawn once; dynamic: fresh per batch) ->
AdamW (no decay on biases/LayerNorm) -> linear warmup/decay -> loop -> eval with fixed masks.
"""
from __future__ import annotations

import copy
import math
import re
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence
from transformers import DataCollatorForLanguageModeling

from . import validate
from .fillmask import fill_mask, mask_word, split_words
from .models import LoadedModel, mlm_logits

MASKINGS = ("static", "dynamic")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")
_MAX_LOSS_FOR_EXP = 50.0  # exp(50) ~ 5e21: a perplexity past that means "the model knows nothing"
_EVAL_SEED_OFFSET = 1_000_003  # eval masks come from their own stream, never the training one


@dataclass
class Limits:
    """Caps on one run; the app sets them from flags. Every cap is checked before training starts."""

    max_chars: int = 20_000  # pasted text size
    max_steps: int = 300
    max_seconds: float = 120.0  # wall clock per run: the loop stops cleanly at this time
    max_batch_size: int = 64
    max_lr: float = 1e-2


class SettingError(validate.InputError):
    """A ValueError that names the setting at fault ("text", "steps", "learning rate", ...), so a
    form can show the message beside that field (`.setting`, `.field`)."""


@dataclass
class TextData:
    """Pasted text ready to train on: packed token blocks (lists of ids) for training and eval."""

    train: list[dict]  # {"input_ids": [...], "special_tokens_mask": [...]} per block
    eval: list[dict]
    train_lines: int
    eval_lines: int
    eval_on_train: bool  # too few lines to hold any out: eval uses the training lines
    train_tokens: int


@dataclass
class History:
    """What a run did. `steps`: {"step", "loss", "lr", "tokens_per_s", "elapsed"} per step;
    `evals`: {"step", "loss", "accuracy", "perplexity", "masked"} (step 0 is before training)."""

    planned_steps: int
    steps: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    stopped: str | None = None  # None: all steps ran; else "stopped", "time limit" or "diverged"
    seconds: float = 0.0
    eval_on_train: bool = False
    train_lines: int = 0
    eval_lines: int = 0
    train_blocks: int = 0
    settings: dict = field(default_factory=dict)

    @property
    def before(self) -> dict:
        return self.evals[0]

    @property
    def after(self) -> dict:
        return self.evals[-1]

    @property
    def completed(self) -> bool:
        return self.stopped is None

    @property
    def tokens_per_s(self) -> float:
        """Mean training throughput over the run (tokens with attention, padding excluded)."""
        busy = sum(s["tokens"] / s["tokens_per_s"] for s in self.steps if s["tokens_per_s"] > 0)
        return sum(s["tokens"] for s in self.steps) / busy if busy else 0.0

    def as_dict(self) -> dict:
        return {**asdict(self), "before": self.before, "after": self.after}


# ---------------------------------------------------------------- checking the request

def check_settings(*, steps=None, epochs=None, lr=5e-5, batch_size=8, mlm_probability=0.15,
                   masking="dynamic", seed=0, max_length=128, limits: Limits | None = None) -> dict:
    """Validate and normalise the run settings; raises ValueError saying how to fix them."""
    limits = limits or Limits()
    if (steps is None) == (epochs is None):
        raise SettingError("steps", "Give the training length as steps or as epochs (one of them).")
    out = {"lr": validate.number(lr, "learning rate", 0.0, limits.max_lr, open_low=True),
           "batch_size": _whole("batch size", batch_size, 1, limits.max_batch_size),
           "mlm_probability": validate.number(mlm_probability, "mask probability", 0.0, 1.0, open_low=True),
           "seed": _whole("seed", seed, 0, 2**32 - 1),
           "max_length": _whole("block length", max_length, 8, 8192)}
    if steps is not None:
        out["steps"] = _whole("steps", steps, 1, limits.max_steps)
    else:
        out["epochs"] = validate.number(epochs, "epochs", 0.0, float(limits.max_steps), open_low=True)
    if masking not in MASKINGS:
        raise SettingError("masking", f"masking must be 'static' or 'dynamic', got {masking!r}.")
    out["masking"] = masking
    return out


def _whole(name: str, value, low: int, high: int) -> int:
    """Range first, so "at most 300" is what a too-large step count hears; then integrality."""
    validate.number(value, name, low, high)
    return validate.whole_number(value, name, low, high)


# ---------------------------------------------------------------- text -> blocks

def split_units(texts: str | list[str]) -> list[str]:
    """Lines, each cut into sentences; blank ones dropped."""
    if isinstance(texts, str):
        texts = texts.splitlines()
    if not isinstance(texts, (list, tuple)) or not all(isinstance(t, str) for t in texts):
        raise SettingError("text", "The text must be a string (or a list of strings), one "
                                   "sentence or paragraph per line.")
    return [s.strip() for line in texts for s in _SENTENCE_END.split(line) if s.strip()]


def prepare_text(lm: LoadedModel, texts: str | list[str], max_length: int = 128,
                 limits: Limits | None = None) -> TextData:
    """Split, hold out about 1 line in 10 (at least one), and pack each part into token blocks.

    With fewer than 4 lines nothing can be held out and still leave enough to learn from:
    evaluation then uses the training lines (with their own fixed masks) and says so.
    """
    limits = limits or Limits()
    size = len(texts) if isinstance(texts, str) else sum(len(t) for t in texts or [] if isinstance(t, str))
    if size > limits.max_chars:
        raise SettingError("text", f"The text has {size:,} characters; at most "
                                   f"{limits.max_chars:,} are allowed. Paste less text.")
    units = split_units(texts)
    if not units:
        raise SettingError("text", "The text is empty: paste a few sentences to fine-tune on, "
                                   "one per line.")
    train_units, eval_units = _hold_out(units)
    block = min(int(max_length), lm.max_length) - lm.tokenizer.num_special_tokens_to_add(pair=False)
    train = pack(lm, train_units, block)
    evals = pack(lm, eval_units, block) if eval_units else train
    if not train:
        raise SettingError("text", "The text has no tokens the model knows: paste some sentences.")
    return TextData(train, evals, len(train_units), len(eval_units) or len(train_units),
                    not eval_units, sum(len(b["input_ids"]) for b in train))


def _hold_out(units: list[str]) -> tuple[list[str], list[str]]:
    """Every k-th line goes to eval (spread over the text, independent of the seed)."""
    if len(units) < 4:
        return units, []
    n_eval = max(1, len(units) // 10)
    k = len(units) // n_eval
    held = set(range(k - 1, len(units), k)[:n_eval])
    return ([u for i, u in enumerate(units) if i not in held],
            [u for i, u in enumerate(units) if i in held])


def pack(lm: LoadedModel, units: list[str], block: int) -> list[dict]:
    """Greedily pack whole sentences into blocks of at most `block` tokens (longer ones are cut),
    then add the model's special tokens: less padding than one sentence per row."""
    blocks, current = [], []
    for ids in lm.tokenizer(units, add_special_tokens=False)["input_ids"]:
        if len(current) + len(ids) > block and current:
            blocks.append(current)
            current = []
        while len(ids) > block:
            blocks.append(ids[:block])
            ids = ids[block:]
        current = current + ids
    if current:
        blocks.append(current)
    prefix, suffix = special_tokens_around(lm.tokenizer)
    return [{"input_ids": prefix + b + suffix,
             "special_tokens_mask": [1] * len(prefix) + [0] * len(b) + [1] * len(suffix)}
            for b in blocks]


def special_tokens_around(tokenizer) -> tuple[list[int], list[int]]:
    """The ids the tokenizer puts before and after one sequence ([CLS] / [SEP], <s> / </s>),
    read off a tokenized word: transformers 5 tokenizers have no build_inputs_with_special_tokens."""
    core = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a")["input_ids"]
    start = next(i for i in range(len(full)) if full[i:i + len(core)] == core)
    return full[:start], full[start + len(core):]


# ---------------------------------------------------------------- masking

def mlm_collator(lm: LoadedModel, mlm_probability: float = 0.15,
                 seed: int | None = None) -> DataCollatorForLanguageModeling:
    """transformers' own MLM collator (80/10/10 corruption, labels -100 except at masked tokens),
    with its own seeded generator so runs repeat. Any callable with the same shape
    (`examples -> {"input_ids", "attention_mask", "labels"}`) can be passed to `finetune` as
    `collate_fn`, e.g. the article's buggy `mask_tokens`."""
    return DataCollatorForLanguageModeling(lm.tokenizer, mlm_probability=mlm_probability, seed=seed)


def _collate_with_labels(collate: Callable, examples: list[dict], tries: int = 100) -> dict:
    """Draw masks until at least one token has a label: short text at a low probability can
    draw none, and a batch without targets has no loss."""
    for _ in range(tries):
        batch = collate(examples)
        if (batch["labels"] != -100).any():
            return batch
    raise ValueError("No token was chosen for masking in 100 draws: raise the mask probability "
                     "or paste longer text.")


def fixed_rows(collate: Callable, examples: list[dict]) -> list[dict]:
    """Masks drawn once per block (each with at least one target), as 1-D tensors, for reuse:
    static masking's training rows and the eval set's fixed masks."""
    rows = []
    for example in examples:
        batch = _collate_with_labels(collate, [example])
        rows.append({k: batch[k][0] for k in ("input_ids", "attention_mask", "labels")})
    return rows


def eval_copies(examples: list[dict], mlm_probability: float, target: int = 200,
                most: int = 32) -> list[dict]:
    """The eval blocks repeated so that about `target` tokens get masked (each copy with its own
    fixed masks): one held-out line at 15% masks 1 or 2 tokens, an accuracy of 0% or 100%."""
    tokens = sum(len(e["input_ids"]) - sum(e["special_tokens_mask"]) for e in examples)
    copies = min(most, max(1, math.ceil(target / (mlm_probability * max(tokens, 1)))))
    return examples * copies


def stack_rows(rows: list[dict], pad_id: int) -> dict:
    """Pad 1-D rows into a (B, T) batch (labels padded with -100, attention with 0)."""
    pads = {"input_ids": pad_id, "attention_mask": 0, "labels": -100}
    return {k: pad_sequence([r[k] for r in rows], batch_first=True, padding_value=v)
            for k, v in pads.items()}


# ---------------------------------------------------------------- loss and evaluation

def masked_logits(model, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits (N, V) float32 and targets (N,) at the N labelled positions of a (B, T) batch.

    The LM head runs only there: at 15% masking that skips most of the (T, H) x (H, V) matmul.
    Same loss as `model(**batch).loss` (a test checks it).
    """
    labels = batch["labels"]
    rows, cols = (labels != -100).nonzero(as_tuple=True)
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    logits, _ = mlm_logits(model, inputs, rows, cols)
    return logits.float(), labels[rows, cols]


@torch.no_grad()
def evaluate(model, rows: list[dict], pad_id: int, device: torch.device,
             batch_size: int = 64) -> dict:
    """Masked-token loss, accuracy and perplexity = exp(loss) (capped) on fixed-mask rows."""
    was_training = model.training
    model.eval()
    total, correct, count = 0.0, 0, 0
    for start in range(0, len(rows), batch_size):
        batch = _to(stack_rows(rows[start:start + batch_size], pad_id), device)
        with autocast(device):
            logits, targets = masked_logits(model, batch)
        total += F.cross_entropy(logits, targets, reduction="sum").item()
        correct += int((logits.argmax(-1) == targets).sum())
        count += len(targets)
    model.train(was_training)
    loss = total / count
    return {"loss": loss, "accuracy": correct / count,
            "perplexity": math.exp(min(loss, _MAX_LOSS_FOR_EXP)), "masked": count}


def autocast(device: torch.device):
    """bf16 autocast on CUDA; on CPU a no-op, so the same code runs in float32."""
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16,
                          enabled=device.type == "cuda")


def _to(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


# ---------------------------------------------------------------- optimisation

def make_optimizer(model, lr: float, weight_decay: float, device: torch.device):
    """AdamW without weight decay on biases and LayerNorm weights (as BERT and run_mlm do).

    The fused kernel wherever torch has one, CPU included: on MiniLM-L6 it took 0.02 s per step
    against 0.10 s for the default, more than the forward and backward of a short batch.
    """
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (no_decay if param.ndim < 2 or "norm" in name.lower() else decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    try:
        return torch.optim.AdamW(groups, lr=lr, fused=True)
    except RuntimeError:  # no fused kernel for this device or dtype
        return torch.optim.AdamW(groups, lr=lr)


def linear_schedule(optimizer, steps: int, warmup: int):
    """Linear warmup then linear decay. Unlike get_linear_schedule_with_warmup the first step
    already has a non-zero rate: in a 20-step run, a wasted step is 5% of the training."""
    def factor(s: int) -> float:
        return min((s + 1) / (warmup + 1), (steps - s) / max(steps - warmup, 1))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _batch_order(n: int, batch_size: int, generator: torch.Generator):
    """Endless batches of block indices: a fresh shuffle each epoch, the last batch may be short."""
    while True:
        order = torch.randperm(n, generator=generator).tolist()
        for start in range(0, n, batch_size):
            yield order[start:start + batch_size]


# ---------------------------------------------------------------- the loop

def finetune(lm: LoadedModel, texts: str | list[str], *, steps: int | None = None,
             epochs: float | None = None, lr: float = 5e-5, batch_size: int = 8,
             mlm_probability: float = 0.15, masking: str = "dynamic", seed: int = 0,
             max_length: int = 128, weight_decay: float = 0.01, warmup_ratio: float = 0.1,
             eval_every: int | None = None, on_step: Callable[[dict], None] | None = None,
             should_stop: Callable[[], bool] | None = None, collate_fn: Callable | None = None,
             limits: Limits | None = None) -> tuple[LoadedModel, History]:
    """Fine-tune a copy of `lm` with masked-LM loss on `texts`; returns (tuned model, history).

    masking: "dynamic" draws fresh masks for every batch; "static" draws them once per block
    (seeded) and reuses them every epoch, as the original BERT did.
    on_step(event): called with {"kind": "step", "step", "steps", "loss", "lr", "tokens_per_s",
    "tokens", "elapsed"} after each step and {"kind": "eval", "step", "loss", "accuracy",
    "perplexity", "masked"} before training (step 0), every `eval_every` steps (default: ten
    times a run; 0: never) and at the end.
    should_stop(): asked before each step; True ends the run there (history.stopped="stopped", or
    its `.reason` when it has one, as `runs.StopCheck` has: "time limit").
    collate_fn: replaces the standard MLM collator for training (the eval masks stay standard),
    e.g. to train with the article's labelling; same input/output as `mlm_collator`.
    The run also ends at `limits.max_seconds` ("time limit") or on a non-finite loss ("diverged").
    The same seed, data and settings give the same history (on the same machine and threads, and
    with no other fine-tune running in the process at the same time: dropout uses torch's global
    generator, seeded here and restored afterwards).
    """
    limits = limits or Limits()
    opts = check_settings(steps=steps, epochs=epochs, lr=lr, batch_size=batch_size,
                          mlm_probability=mlm_probability, masking=masking, seed=seed,
                          max_length=max_length, limits=limits)
    data = prepare_text(lm, texts, opts["max_length"], limits)
    steps = opts.get("steps") or _steps_for_epochs(opts["epochs"], len(data.train),
                                                   opts["batch_size"], limits)
    history = History(steps, eval_on_train=data.eval_on_train, train_lines=data.train_lines,
                      eval_lines=data.eval_lines, train_blocks=len(data.train),
                      settings={**opts, "steps": steps})
    # The shared base stays untouched; a bfloat16 base (--dtype) trains in float32, since
    # AdamW's small updates vanish in bf16 weights.
    model = copy.deepcopy(lm.model).float()
    model.requires_grad_(True).train()
    with torch.random.fork_rng(devices=_cuda_indices(lm.device)):
        torch.manual_seed(opts["seed"])  # dropout; restored for everyone else afterwards
        trainer = _Trainer(lm, model, data, opts, steps, collate_fn, weight_decay, warmup_ratio)
        trainer.run(history, on_step or (lambda event: None), should_stop, limits.max_seconds,
                    eval_every if eval_every is not None else max(1, steps // 10))
    model.eval().requires_grad_(False)
    return LoadedModel(f"{lm.name} (fine-tuned)", lm.tokenizer, model, lm.device, caches=lm.caches), history


class _Trainer:
    """minGPT's trainer shape: owns the batches, optimizer and schedule for one model copy;
    `run` loops and reports through callbacks, knowing nothing of who listens."""

    def __init__(self, lm: LoadedModel, model, data: TextData, opts: dict, steps: int,
                 collate_fn: Callable | None, weight_decay: float, warmup_ratio: float):
        self.model, self.device, self.data, self.steps = model, lm.device, data, steps
        self.pad_id = lm.tokenizer.pad_token_id or 0
        p, seed = opts["mlm_probability"], opts["seed"]
        self.eval_rows = fixed_rows(mlm_collator(lm, p, seed + _EVAL_SEED_OFFSET),
                                    eval_copies(data.eval, p))
        self.collate = collate_fn or mlm_collator(lm, p, seed)
        self.static_rows = fixed_rows(self.collate, data.train) if opts["masking"] == "static" else None
        self.order = _batch_order(len(data.train), opts["batch_size"], torch.Generator().manual_seed(seed))
        self.optimizer = make_optimizer(model, opts["lr"], weight_decay, self.device)
        self.scheduler = linear_schedule(self.optimizer, steps, round(warmup_ratio * steps))
        self.params = [q for q in model.parameters() if q.requires_grad]

    def next_batch(self) -> dict:
        """(B, T) tensors on the CPU: static rows reused, or fresh masks from the collator."""
        indices = next(self.order)
        if self.static_rows is not None:
            return stack_rows([self.static_rows[i] for i in indices], self.pad_id)
        return _collate_with_labels(self.collate, [self.data.train[i] for i in indices])

    def train_step(self, batch: dict) -> float:
        with autocast(self.device):
            logits, targets = masked_logits(self.model, _to(batch, self.device))
        loss = F.cross_entropy(logits, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.item()  # also waits for the GPU, so the step time is honest

    def evaluate(self, step: int, history: History, emit: Callable) -> None:
        result = {"step": step, **evaluate(self.model, self.eval_rows, self.pad_id, self.device)}
        history.evals.append(result)
        emit({"kind": "eval", **result})

    def run(self, history: History, emit: Callable, should_stop: Callable | None,
            max_seconds: float, eval_every: int) -> None:
        start = time.perf_counter()
        self.evaluate(0, history, emit)
        for step in range(1, self.steps + 1):
            history.stopped = self._why_stop(should_stop, time.perf_counter() - start, max_seconds)
            if history.stopped:
                break
            tick = time.perf_counter()
            batch = self.next_batch()
            lr_now = self.scheduler.get_last_lr()[0]
            loss = self.train_step(batch)
            if not math.isfinite(loss):
                history.stopped = "diverged"
                break
            tokens, seconds = int(batch["attention_mask"].sum()), time.perf_counter() - tick
            event = {"step": step, "loss": loss, "lr": lr_now, "tokens": tokens,
                     "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
                     "elapsed": time.perf_counter() - start}
            history.steps.append(event)
            emit({"kind": "step", "steps": self.steps, **event})
            if eval_every and step % eval_every == 0 and step != self.steps:
                self.evaluate(step, history, emit)
        if history.evals[-1]["step"] != len(history.steps):
            self.evaluate(len(history.steps), history, emit)
        history.seconds = time.perf_counter() - start
        self.optimizer = self.scheduler = None  # frees the Adam moments (2x the model) now

    @staticmethod
    def _why_stop(should_stop: Callable | None, elapsed: float, max_seconds: float) -> str | None:
        if should_stop is not None and should_stop():
            return getattr(should_stop, "reason", None) or "stopped"  # runs.StopCheck says why
        if elapsed > max_seconds:
            return "time limit"
        return None


def _steps_for_epochs(epochs: float, n_blocks: int, batch_size: int, limits: Limits) -> int:
    steps = max(1, math.ceil(epochs * math.ceil(n_blocks / batch_size)))
    if steps > limits.max_steps:
        raise SettingError("epochs", f"{epochs:g} epochs of this text is {steps} steps; at most "
                                     f"{limits.max_steps} are allowed. Ask for fewer epochs.")
    return steps


def _cuda_indices(device: torch.device) -> list[int]:
    return [device.index or 0] if device.type == "cuda" else []


# ---------------------------------------------------------------- static vs dynamic

def compare_masking(lm: LoadedModel, texts: str | list[str], *,
                    on_step: Callable[[dict], None] | None = None,
                    should_stop: Callable[[], bool] | None = None, **settings) -> dict[str, History]:
    """Run the same fine-tune with static and with dynamic masking (same seed, data, steps and
    eval masks); returns {"static": History, "dynamic": History}. Events carry "run"."""
    settings.pop("masking", None)
    histories = {}
    for masking in MASKINGS:
        def tagged(event, masking=masking):
            if on_step is not None:
                on_step({**event, "run": masking})
        _, histories[masking] = finetune(lm, texts, masking=masking, on_step=tagged,
                                         should_stop=should_stop, **settings)
        if histories[masking].stopped == "stopped":
            break
    return histories


# ---------------------------------------------------------------- probes and export

def default_probes(texts: str | list[str], n: int = 3) -> list[str]:
    """Up to `n` lines of the person's text, each with its longest word masked (a content word
    is more telling than 'the')."""
    probes = []
    for unit in split_units(texts):
        words = [(w, i) for i, (w, _, _) in enumerate(split_words(unit)) if w.isalpha()]
        if len(words) < 3 or len(words) > 40:
            continue
        _, index = max(words, key=lambda wi: len(wi[0]))
        probes.append(mask_word(unit, index))
        if len(probes) == n:
            break
    return probes


def compare_probes(before: LoadedModel, after: LoadedModel, probes: list[str], top_k: int = 3,
                   max_masks: int = 10) -> list[dict]:
    """Fill-mask top-k of each probe with both models: [{"probe", "before", "after"}], where
    before/after are `fill_mask` outputs (a list per mask)."""
    probes = [p.strip() for p in probes if p and p.strip()]
    if not probes:
        raise ValueError("No probe sentences: write one or more sentences with [MASK], one per line.")
    if len(probes) > 10:
        raise ValueError(f"{len(probes)} probe sentences given; at most 10 at a time.")
    return [{"probe": p, "before": fill_mask(before, p, top_k, max_masks=max_masks),
             "after": fill_mask(after, p, top_k, max_masks=max_masks)} for p in probes]


def save_zip(lm: LoadedModel, folder: str | Path, name: str = "bertdemo-tuned-model") -> Path:
    """`save_pretrained` of model and tokenizer, zipped into `folder` as `name`.zip; returns its
    path. An earlier zip of that name is replaced (other files in the folder are left alone)."""
    folder = Path(folder)
    staging = folder / f"{name}-staging"
    shutil.rmtree(staging, ignore_errors=True)
    (folder / f"{name}.zip").unlink(missing_ok=True)
    lm.model.save_pretrained(staging)
    lm.tokenizer.save_pretrained(staging)
    archive = shutil.make_archive(str(folder / name), "zip", staging)
    shutil.rmtree(staging, ignore_errors=True)
    return Path(archive)
