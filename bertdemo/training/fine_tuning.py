"""A short masked-LM fine-tune on pasted text: the task the training loop runs for the Fine-tune tab.

The base model is never touched: training runs on a deep copy, returned as a new `LoadedModel`.
A request is checked once into a `FinetunePlan` (settings checked, text tokenized and packed),
which `run_finetune` runs; `finetune(lm, text, ...)` does both.

Story: text -> lines/sentences -> held-out part -> tokens packed into blocks ->
`DataCollatorForLanguageModeling` masks (static: drawn once; dynamic: fresh per batch) ->
`loop.train` (AdamW, warmup/decay, Stop, time limit) -> eval with fixed masks.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch
import torch.nn.functional as F

from .. import validate
from ..config import Limits
from ..forward import anatomy
from ..model.loading import LoadedModel
from ..model.logits import mlm_logits
from ..views.fillmask import mask_word, split_words
from .loop import Evaluation, RunHistory, autocast, seeded, stream_seed, to_device, train
from .mlm_data import (TextData, collate_with_labels, eval_copies, fixed_rows, mlm_collator, padded_by_torch,
                       padded_to, prepare_text, split_units, stack_rows)

MASKINGS = ("static", "dynamic")
LENGTH_UNITS = ("steps", "epochs")
_MAX_LOSS_FOR_EXP = 50.0  # exp(50) ~ 5e21: a perplexity past that means "the model knows nothing"


@dataclass
class MLMHistory(RunHistory):
    """A fine-tune's `RunHistory` (steps, masked-token evaluations), and the text it ran on."""

    eval_on_train: bool = False
    train_lines: int = 0
    eval_lines: int = 0
    train_blocks: int = 0


# ---------------------------------------------------------------- the request, checked once

@dataclass(frozen=True)
class FinetuneSettings:
    """A fine-tune's settings, checked (`plan_finetune`), under the Fine-tune form's names (the
    same in run.json and the exported script). `steps` is derived, not asked: the training length
    resolved to optimizer steps (epochs counted over the packed blocks)."""

    training_length: float  # as asked, in `length_unit`
    steps: int  # derived: the steps the run makes (training_length itself when counted in steps)
    length_unit: str = "steps"  # "steps" or "epochs"
    learning_rate: float = 5e-5
    batch_size: int = 8
    mask_probability: float = 0.15  # transformers' collator calls it mlm_probability
    masking: str = "dynamic"  # "static": masks drawn once per block; "dynamic": fresh per batch
    seed: int = 0
    block_length: int = 128  # tokens per packed block, special tokens included
    keep_best: bool = True  # return the weights of the evaluation with the lowest held-out loss


@dataclass(frozen=True)
class FinetunePlan:
    """A checked fine-tune: the model, its settings, the text tokenized and packed, the caps."""

    lm: LoadedModel
    settings: FinetuneSettings
    data: TextData
    limits: Limits

    def with_masking(self, masking: str) -> "FinetunePlan":
        """This plan with `masking`; its model is not kept, so neither are its best weights."""
        return dataclasses.replace(self, settings=dataclasses.replace(self.settings, masking=masking,
                                                                      keep_best=False))


def plan_finetune(lm: LoadedModel, texts: str | list[str], *, training_length=None, length_unit="steps",
                  learning_rate=5e-5, batch_size=8, block_length=128, mask_probability=0.15, masking="dynamic",
                  seed=0, keep_best=True, limits: Limits | None = None) -> FinetunePlan:
    """Check a fine-tune of `lm` on `texts` and prepare its data; raises `validate.InputError`
    (a ValueError) naming the setting at fault (`.field`: these parameters' names, which are the
    Fine-tune form's) and saying how to fix it. The training length is `training_length` steps, or
    epochs over the packed blocks (`length_unit`). `keep_best`: the run returns the weights of its
    evaluation with the lowest held-out loss (not the last ones once it overfits), as Trainer's
    `load_best_model_at_end`."""
    limits = limits or Limits()
    if training_length is None:
        raise validate.InputError("training_length", "Give the training length (training_length), as steps "
                                                     "or as epochs (length_unit).")
    if length_unit not in LENGTH_UNITS:
        raise validate.InputError("length_unit", "Count the training length in 'steps' or 'epochs'.")
    if masking not in MASKINGS:
        raise validate.InputError("masking", f"masking must be 'static' or 'dynamic', got {masking!r}.")
    checked = dict(
        learning_rate=validate.number(learning_rate, "learning rate", 0.0, limits.max_learning_rate,
                                      open_low=True, field="learning_rate"),
        batch_size=_whole("batch size", batch_size, 1, limits.max_batch_size, "batch_size"),
        mask_probability=validate.number(mask_probability, "mask probability", 0.0, 1.0, open_low=True,
                                         field="mask_probability"),
        seed=_whole("seed", seed, 0, 2**32 - 1, "seed"),
        block_length=_whole("block length", block_length, 8, 8192, "block_length"), masking=masking)
    if length_unit == "steps":
        training_length = _whole("steps", training_length, 1, limits.max_steps, "training_length")
    else:
        training_length = validate.number(training_length, "epochs", 0.0, float(limits.max_steps), open_low=True,
                                          field="training_length")
    data = prepare_text(lm, texts, checked["block_length"], limits)
    steps = (training_length if length_unit == "steps"
             else _steps_for_epochs(training_length, len(data.train), checked["batch_size"], limits))
    return FinetunePlan(lm, FinetuneSettings(training_length, steps, length_unit, keep_best=bool(keep_best),
                                             **checked), data, limits)


@dataclass(frozen=True)
class FinetuneForm:
    """A fine-tune as the page and its API ask for it: these fields are the endpoint's parameters,
    and `plan_finetune`'s under the same names."""

    text: str
    training_length: float
    length_unit: str  # "steps" or "epochs"
    learning_rate: float
    batch_size: int
    block_length: int
    mask_probability: float
    masking: str
    seed: int

    def plan(self, lm: LoadedModel, limits: Limits, **more) -> FinetunePlan:
        """`plan_finetune` of this form (and `more` of its parameters)."""
        settings = {f.name: getattr(self, f.name) for f in dataclasses.fields(FinetuneForm) if f.name != "text"}
        return plan_finetune(lm, self.text, **settings, limits=limits, **more)


def _whole(name: str, value, low: int, high: int, field: str) -> int:
    """Range first, so "at most 300" is what a too-large step count hears; then integrality."""
    validate.number(value, name, low, high, field=field)
    return validate.whole_number(value, name, low, high, field=field)


def _steps_for_epochs(epochs: float, n_blocks: int, batch_size: int, limits: Limits) -> int:
    steps = max(1, math.ceil(epochs * math.ceil(n_blocks / batch_size)))
    if steps > limits.max_steps:
        raise validate.InputError("training_length", f"{epochs:g} epochs of this text is {steps} steps; at "
                                                     f"most {limits.max_steps} are allowed. Ask for fewer epochs.")
    return steps


# ---------------------------------------------------------------- loss and evaluation

def masked_logits(model, batch: dict, device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits (N, V) float32 and targets (N,) at the N labelled positions of a (B, T) batch,
    computed on `device` (default: where the batch is).

    The LM head runs only there: at 15% masking that skips most of the (T, H) x (H, V) matmul.
    Same loss as `model(**batch).loss` (a test checks it). The positions, and whether there is
    padding at all, are found where the batch is, before it moves: on a CPU batch bound for a GPU
    that spares syncs per step.
    """
    labels, device = batch["labels"], device or batch["labels"].device
    rows, cols = (labels != -100).nonzero(as_tuple=True)
    moved = to_device({**model_inputs(batch, device), "rows": rows, "cols": cols, "targets": labels[rows, cols]},
                      device)
    rows, cols, targets = moved.pop("rows"), moved.pop("cols"), moved.pop("targets")
    logits, _ = mlm_logits(model, moved, rows, cols)
    return logits.float(), targets


def model_inputs(batch: dict, device: torch.device) -> dict:
    """The batch's model inputs (all but "labels"). A CPU batch bound for a GPU without padding
    leaves out its attention mask: transformers would ask the GPU whether the mask has any
    padding (a sync per forward, which stalls the training loop's queue of kernels), and no mask
    means every token is real."""
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    mask = inputs.get("attention_mask")
    if device.type == "cuda" and mask is not None and mask.device.type == "cpu" and bool(mask.all()):
        del inputs["attention_mask"]
    return inputs


@torch.no_grad()
def evaluate(model, rows: list[dict], pad_id: int, device: torch.device,
             batch_size: int = 64) -> Evaluation:
    """Masked-token loss, accuracy and perplexity = exp(loss) (capped) on fixed-mask rows (step 0:
    the caller says which step it was)."""
    was_training = model.training
    model.eval()
    total, correct, count = 0.0, 0, 0
    for start in range(0, len(rows), batch_size):
        batch = stack_rows(rows[start:start + batch_size], pad_id)
        with autocast(device):
            logits, targets = masked_logits(model, batch, device)
        total += F.cross_entropy(logits, targets, reduction="sum").item()
        correct += int((logits.argmax(-1) == targets).sum())
        count += len(targets)
    model.train(was_training)
    loss = total / count
    return Evaluation(0, loss, correct / count, perplexity=math.exp(min(loss, _MAX_LOSS_FOR_EXP)),
                      masked=count)


def _batch_order(n: int, batch_size: int, generator: torch.Generator) -> Iterator[list[int]]:
    """Endless batches of block indices: a fresh shuffle each epoch, the last batch may be short."""
    while True:
        order = torch.randperm(n, generator=generator).tolist()
        for start in range(0, n, batch_size):
            yield order[start:start + batch_size]


class MaskedLMTask:
    """What the training loop needs from a fine-tune of `model` (a copy of `lm.model`): batches
    of masked blocks (static masks reused, or fresh ones per batch), the masked-token loss, and
    evaluation on fixed masks drawn once from the seed (so before, during and after compare)."""

    def __init__(self, lm: LoadedModel, model, plan: FinetunePlan, collate_fn: Callable | None = None):
        self.model, self.device, self.data = model, lm.device, plan.data
        self.pad_id = lm.tokenizer.pad_token_id or 0
        s = plan.settings
        # On a GPU every training batch has one length, the longest block's: its attention
        # kernels are planned per shape (cuDNN's SDPA), and batches padded to their own longest
        # row made a new plan on many steps. On a CPU padding is only extra work.
        self.length = max(len(b["input_ids"]) for b in plan.data.train) if lm.device.type == "cuda" else None
        self.eval_rows = fixed_rows(mlm_collator(lm, s.mask_probability, stream_seed(s.seed, "eval")),
                                    eval_copies(plan.data.eval, s.mask_probability))
        self.collate = collate_fn or padded_by_torch(mlm_collator(lm, s.mask_probability, s.seed))
        self.static_rows = fixed_rows(self.collate, plan.data.train) if s.masking == "static" else None
        self.order = _batch_order(len(plan.data.train), s.batch_size, torch.Generator().manual_seed(s.seed))

    def batches(self) -> Iterator[dict]:
        """(B, T) tensors on the CPU, endlessly."""
        for indices in self.order:
            if self.static_rows is not None:
                batch = stack_rows([self.static_rows[i] for i in indices], self.pad_id)
            else:
                batch = collate_with_labels(self.collate, [self.data.train[i] for i in indices])
            yield padded_to(batch, self.length, self.pad_id)

    def loss(self, batch: dict) -> torch.Tensor:
        with autocast(self.device):
            logits, targets = masked_logits(self.model, batch, self.device)
        return F.cross_entropy(logits, targets)

    def evaluate(self, step: int) -> Evaluation:
        scores = evaluate(self.model, self.eval_rows, self.pad_id, self.device)
        return dataclasses.replace(scores, step=step)


# ---------------------------------------------------------------- the fine-tune

def run_finetune(plan: FinetunePlan, *, on_event: Callable | None = None,
                 should_stop: Callable[[], bool] | None = None, collate_fn: Callable | None = None,
                 eval_every: int | None = None, weight_decay: float = 0.01, warmup_ratio: float = 0.1,
                 run: str | None = None) -> tuple[LoadedModel, MLMHistory]:
    """Fine-tune a copy of `plan.lm` with masked-LM loss on the plan's text; returns (tuned
    model, history). The loop is `loop.train`: its events (`Step`, `Evaluation`, tagged with
    `run`) go to `on_event`; `should_stop()`, the plan's time limit and a non-finite loss end it
    early (`history.stopped`). With the plan's `keep_best` the model returned has the weights of
    the best evaluation (`history.kept`, None when that was the last).

    collate_fn: replaces the standard MLM collator for training (the eval masks stay standard),
    e.g. to train with the article's labelling; same input/output as `mlm_collator`.
    The same plan gives the same history (on the same machine and threads, and with no other
    fine-tune running in the process at the same time: dropout uses torch's global generator,
    seeded here and restored afterwards).
    """
    lm, s = plan.lm, plan.settings
    history = MLMHistory(s.steps, dataclasses.asdict(s), eval_on_train=plan.data.eval_on_train,
                         train_lines=plan.data.train_lines, eval_lines=plan.data.eval_lines,
                         train_blocks=len(plan.data.train))
    # The shared base stays untouched; a bfloat16 base (--dtype) trains in float32, since
    # AdamW's small updates vanish in bf16 weights.
    model = copy.deepcopy(lm.model).float()
    model.requires_grad_(True).train()
    with seeded(s.seed, lm.device):  # dropout
        task = MaskedLMTask(lm, model, plan, collate_fn)
        train(model, task.batches(), task.loss, task.evaluate, history, learning_rate=s.learning_rate,
              max_seconds=plan.limits.max_seconds, eval_every=eval_every, weight_decay=weight_decay,
              warmup_ratio=warmup_ratio, on_event=on_event, should_stop=should_stop, run=run,
              keep_best=s.keep_best)
    model.eval().requires_grad_(False)
    return LoadedModel(f"{lm.name} (fine-tuned)", lm.tokenizer, model, lm.device, caches=lm.caches), history


@anatomy.guarded("Fine-tuning")
def finetune(lm: LoadedModel, texts: str | list[str], *, on_event: Callable | None = None,
             should_stop: Callable[[], bool] | None = None, collate_fn: Callable | None = None,
             eval_every: int | None = None, weight_decay: float = 0.01, warmup_ratio: float = 0.1,
             **settings) -> tuple[LoadedModel, MLMHistory]:
    """Fine-tune a copy of `lm` with masked-LM loss on `texts`; returns (tuned model, history).

    settings: `plan_finetune`'s (training_length and length_unit, learning_rate, batch_size,
    block_length, mask_probability, masking, seed, keep_best, limits); the rest as `run_finetune`.
    """
    return run_finetune(plan_finetune(lm, texts, **settings), on_event=on_event, should_stop=should_stop,
                        collate_fn=collate_fn, eval_every=eval_every, weight_decay=weight_decay,
                        warmup_ratio=warmup_ratio)


# ---------------------------------------------------------------- the Fine-tune button

@dataclass(frozen=True)
class TuningRequest(FinetuneForm):
    """The Fine-tune button's request: the form, and what the run leaves."""

    keep_partial: bool = False  # keep the model of a stopped or timed-out run
    probes: str = ""  # sentences with [MASK], one per line, predicted before and after
    keep_best: bool = True  # the model of the best evaluation, not the last step's (`plan_finetune`)

    def plan(self, lm: LoadedModel, limits: Limits) -> "TuningPlan":
        """The fine-tune's plan, and the probes (default: lines of the text, a word masked)."""
        plan = super().plan(lm, limits, keep_best=self.keep_best)
        probes = [p.strip() for p in (self.probes or "").splitlines() if p.strip()] or default_probes(self.text)
        if not probes:
            raise validate.InputError("probes", "No probe sentences: write one or more with [MASK], one per line.")
        return TuningPlan(plan, bool(self.keep_partial), probes, self.text)


@dataclass(frozen=True)
class TuningPlan:
    finetune: FinetunePlan
    keep_partial: bool
    probes: list[str]
    text: str  # as the request gave it: what an exported run trains on


def run_tuning(plan: TuningPlan, *, on_event: Callable | None = None,
               should_stop: Callable[[], bool] | None = None) -> tuple[LoadedModel, MLMHistory]:
    """The plan's fine-tune (`run_finetune`)."""
    return run_finetune(plan.finetune, on_event=on_event, should_stop=should_stop)


# ---------------------------------------------------------------- static vs dynamic

def run_masking_comparison(plan: FinetunePlan, *, on_event: Callable | None = None,
                           should_stop: Callable[[], bool] | None = None) -> dict[str, MLMHistory]:
    """The plan's fine-tune with static and with dynamic masking (same seed, data, steps and eval
    masks); returns {"static": history, "dynamic": history}; events carry the masking as `run`.
    A Stop ends the comparison."""
    histories = {}
    for masking in MASKINGS:
        _, histories[masking] = run_finetune(plan.with_masking(masking), on_event=on_event,
                                             should_stop=should_stop, run=masking)
        if histories[masking].stopped == "stopped":
            break
    return histories


def compare_masking(lm: LoadedModel, texts: str | list[str], *, on_event: Callable | None = None,
                    should_stop: Callable[[], bool] | None = None, **settings) -> dict[str, MLMHistory]:
    """`run_masking_comparison` of `plan_finetune(lm, texts, **settings)` (its masking is ignored)."""
    return run_masking_comparison(plan_finetune(lm, texts, **settings), on_event=on_event,
                                  should_stop=should_stop)


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
