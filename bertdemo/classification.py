"""Text classification on the masked LM's body: the article's downstream recipe, measured.

The article's four differences from pre-training, in code:
1. start from the pre-trained weights: the classifier's body is a *copy* of the model's body
   (the shared model stays bit-identical);
2. a task-specific output layer: `AutoModelForSequenceClassification`'s new head, one output per label;
3. the supervised loss: cross-entropy on the labels;
4. a small learning rate (2e-5) "to avoid catastrophic forgetting": measured by `forgetting` and
   `lr_sweep` as the body's masked-LM loss on fixed masks of the person's text, read through the
   original MLM head, before and after.

Same shape as `training.finetune` (minGPT's trainer): events through `on_step(event)`,
`should_stop()` asked before every step, the same `Limits`, optimizer and schedule.
Story: labelled lines -> checks -> stratified held-out split (seeded) -> tokens ->
DataCollatorWithPadding batches -> AdamW (no decay on biases/LayerNorm) -> linear warmup/decay ->
loop -> held-out loss, accuracy, macro-F1, confusion matrix.
"""
from __future__ import annotations

import copy
import csv
import io
import itertools
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from transformers import AutoModelForSequenceClassification, DataCollatorWithPadding, PreTrainedModel

from . import validate
from .models import LoadedModel
from .training import (Limits, autocast, eval_copies, evaluate, finetune, fixed_rows, linear_schedule,
                       make_optimizer, mlm_collator, pack, save_zip)

LABEL_MAX_CHARS = 64
HELD_OUT_SHARE = 0.2
MAX_TOKENS = 128  # per text; longer texts are cut there (counted in `history.truncated`)
MAX_TEXTS_TO_CLASSIFY = 100
DEFAULT_SWEEP_LRS = (2e-5, 5e-5, 2e-4)
HEADER_TEXT = {"text", "sentence", "example"}  # a first row naming its columns so is a header
HEADER_LABEL = {"label", "class", "category"}
_FORGETTING_SEED_OFFSET = 2_000_003  # masks for the forgetting measure: their own random stream
_FORGETTING_MAX_BLOCKS = 16  # ~2,000 tokens scored at most: a second on bert-base, whatever the data


@dataclass
class ClassifyLimits(Limits):
    """The fine-tune's caps (characters, steps, seconds, batch, lr) plus the number of examples."""

    max_examples: int = 2_000


@dataclass(frozen=True, eq=False)
class Classifier:
    """A sequence classifier and its tokenizer; `labels[i]` is output i (also in config.id2label)."""

    name: str
    tokenizer: object
    model: PreTrainedModel
    device: torch.device
    max_length: int = MAX_TOKENS  # tokens per text (special tokens included); longer ones are cut

    @property
    def labels(self) -> list[str]:
        return [self.model.config.id2label[i] for i in range(self.model.config.num_labels)]


@dataclass
class Split:
    """The stratified split: about 20% of each label held out (at least one), fixed by the seed."""

    train: list[tuple[str, str]]
    held_out: list[tuple[str, str]]


@dataclass
class ClassifyHistory:
    """What a run did. `steps`: {"step", "loss", "lr", "elapsed"} per step; `evals`: {"step",
    "loss", "accuracy", "macro_f1"} on the held-out examples (step 0: the untrained head, chance).
    `predictions` (after training): {"text", "label", "predicted", "probabilities", "correct"} per
    held-out example; `confusion[i][j]`: held-out examples of label i predicted as label j."""

    planned_steps: int
    labels: list[str]
    train_size: int
    held_out_size: int
    steps: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    stopped: str | None = None  # None: all steps ran; else "stopped", "time limit" or "diverged"
    seconds: float = 0.0
    predictions: list[dict] = field(default_factory=list)
    confusion: list[list[int]] = field(default_factory=list)
    truncated: int = 0  # texts longer than MAX_TOKENS, cut there
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


# ---------------------------------------------------------------- checking the request

def check_examples(examples, limits: Limits | None = None) -> list[tuple[str, str]]:
    """`examples` as a list of (text, label) string pairs, stripped; raises InputError (field
    "examples") naming the row at fault and how to fix it."""
    limits = limits or ClassifyLimits()
    if isinstance(examples, (str, bytes)) or not isinstance(examples, (list, tuple)):
        raise validate.InputError("examples", "The examples must be a list of (text, label) pairs.")
    most = getattr(limits, "max_examples", ClassifyLimits.max_examples)
    validate.length_at_most(len(examples), most, "table", "examples", "Use fewer examples.",
                            field="examples")
    pairs = [_check_row(i, row) for i, row in enumerate(examples, start=1)]
    validate.length_at_most(sum(len(t) + len(lab) for t, lab in pairs), limits.max_chars,
                            "table", fix="Use fewer or shorter examples.", field="examples")
    _check_label_counts(pairs)
    return pairs


def _check_row(number: int, row) -> tuple[str, str]:
    if isinstance(row, (str, bytes)) or not isinstance(row, (list, tuple)) or len(row) != 2:
        raise validate.InputError("examples", f"Row {number} is not a (text, label) pair: give "
                                              "each example as two cells, its text and its label.")
    text, label = row
    if not isinstance(text, str) or not text.strip():
        raise validate.InputError("examples", f"Row {number} has no text: write a sentence in "
                                              "its text cell, or delete the row.")
    if isinstance(label, int) and not isinstance(label, bool):
        label = str(label)  # a script's 0/1 labels
    if not isinstance(label, str) or not label.strip():
        raise validate.InputError("examples", f"Row {number} has no label: write its class "
                                              "(e.g. 'sport') in the label cell.")
    if len(label.strip()) > LABEL_MAX_CHARS:
        raise validate.InputError("examples", f"Row {number}'s label has {len(label.strip())} "
                                              f"characters; at most {LABEL_MAX_CHARS} are allowed.")
    return text.strip(), label.strip()


def _check_label_counts(pairs: list[tuple[str, str]]) -> None:
    counts = label_counts(pairs)
    if len(counts) < 2:
        have = f"only the label {next(iter(counts))!r}" if counts else "no examples"
        raise validate.InputError("examples", f"The table has {have}: a classifier needs at least "
                                              "two labels, each with two or more examples.")
    single = [label for label, n in counts.items() if n < 2]
    if single:
        raise validate.InputError("examples", "Each label needs at least two examples (one to "
                                              "train on, one to test on); only one has: "
                                              + ", ".join(repr(s) for s in single[:5]) + ".")


def label_counts(pairs: list[tuple[str, str]]) -> dict[str, int]:
    """{label: examples}, labels in order of first appearance (the order of the outputs)."""
    counts: dict[str, int] = {}
    for _, label in pairs:
        counts[label] = counts.get(label, 0) + 1
    return counts


def check_options(*, epochs=3, lr=2e-5, batch_size=16, seed=0, freeze_body=False,
                  limits: Limits | None = None) -> dict:
    """The run settings, checked and normalised; raises InputError naming the setting."""
    limits = limits or ClassifyLimits()
    if not isinstance(freeze_body, bool):
        raise validate.InputError("freeze body", "Freeze body must be True or False.")
    return {"epochs": validate.whole_number(epochs, "epochs", 1, limits.max_steps),
            "lr": validate.number(lr, "learning rate", 0.0, limits.max_lr, open_low=True),
            "batch_size": validate.whole_number(batch_size, "batch size", 1, limits.max_batch_size),
            "seed": validate.whole_number(seed, "seed", 0, 2**32 - 1),
            "freeze_body": freeze_body}


def check_request(examples, *, limits: Limits | None = None, **options) -> tuple[list, dict, Split, int]:
    """Everything checked before a run starts: (examples, settings, split, steps); raises
    InputError naming the field at fault. `options` are `check_options`'s."""
    limits = limits or ClassifyLimits()
    examples = check_examples(examples, limits)
    opts = check_options(limits=limits, **options)
    split = stratified_split(examples, opts["seed"])
    return examples, opts, split, planned_steps(opts["epochs"], len(split.train), opts["batch_size"], limits)


def planned_steps(epochs: int, train_size: int, batch_size: int, limits: Limits) -> int:
    steps = epochs * math.ceil(train_size / batch_size)
    if steps > limits.max_steps:
        raise validate.InputError("epochs", f"{epochs} epochs of {train_size} training examples in "
                                            f"batches of {batch_size} is {steps} steps; at most "
                                            f"{limits.max_steps} are allowed. Ask for fewer epochs "
                                            "or a larger batch.")
    return steps


# ---------------------------------------------------------------- CSV/TSV text -> examples

def parse_examples(content: str, limits: Limits | None = None) -> list[tuple[str, str]]:
    """Rows of `text,label` (or tab-separated) as (text, label) pairs, unchecked beyond the format.

    A first row naming its columns (text/sentence/example and label/class/category, any order,
    any case) is a header and picks the columns; without one each row is exactly text, label.
    Quote a text that contains the separator: `"Goal, and a win",sport`. Blank lines are skipped.
    """
    limits = limits or ClassifyLimits()
    if not isinstance(content, str):
        raise validate.InputError("file", "The file must be text: UTF-8 CSV or TSV.")
    # Twice the examples' cap: separators, quotes and a header come on top of texts and labels,
    # which `check_examples` then caps exactly.
    validate.length_at_most(len(content), 2 * limits.max_chars, "file", fix="Upload fewer examples.",
                            field="file")
    content = content.lstrip("\ufeff")  # a BOM from Excel is not part of the first cell
    delimiter = "\t" if "\t" in "\n".join(content.splitlines()[:5]) else ","
    reader = csv.reader(io.StringIO(content), delimiter=delimiter, strict=True)
    try:  # (line number, cells) of each non-blank line
        rows = [(reader.line_num, r) for r in reader if any(cell.strip() for cell in r)]
    except csv.Error as err:
        raise validate.InputError("file", f"The file is not valid CSV ({err}); quote a text that "
                                          'contains commas or quotes: "Goal, and a win",sport') from None
    header = _header_columns(rows[0][1]) if rows else None
    text, label = header or (0, 1)
    rows = rows[1:] if header else rows
    for line, cells in rows:  # with a header extra columns are fine; without, exactly two
        if len(cells) <= max(text, label) or (header is None and len(cells) != 2):
            raise validate.InputError("file", f"Line {line} has {len(cells)} cell(s); write "
                                              "text,label on each line (quote a text with commas).")
    if not rows:
        raise validate.InputError("file", "The file has no examples (a header row only?): write "
                                          "one text,label pair per line.")
    return [(cells[text], cells[label]) for _, cells in rows]


def _header_columns(cells: list[str]) -> tuple[int, int] | None:
    """(text column, label column) if `cells` is a header row naming them, else None."""
    names = [cell.strip().lower() for cell in cells]
    text = next((i for i, n in enumerate(names) if n in HEADER_TEXT), None)
    label = next((i for i, n in enumerate(names) if n in HEADER_LABEL), None)
    return None if text is None or label is None else (text, label)


# ---------------------------------------------------------------- split and model

def stratified_split(examples: list[tuple[str, str]], seed: int = 0) -> Split:
    """About HELD_OUT_SHARE of each label held out (at least one, and at least one left to train
    on), chosen by a generator seeded with `seed`; both parts keep the examples' order."""
    generator = torch.Generator().manual_seed(seed)
    held: set[int] = set()
    for label in label_counts(examples):
        indices = [i for i, (_, lab) in enumerate(examples) if lab == label]
        n_held = min(len(indices) - 1, max(1, round(HELD_OUT_SHARE * len(indices))))
        order = torch.randperm(len(indices), generator=generator).tolist()
        held.update(indices[j] for j in order[:n_held])
    return Split([e for i, e in enumerate(examples) if i not in held],
                 [e for i, e in enumerate(examples) if i in held])


def build_classifier(lm: LoadedModel, labels: list[str]) -> Classifier:
    """`AutoModelForSequenceClassification` for `labels` whose body is a copy of `lm`'s body; the
    head (and a pooler, which masked-LM checkpoints drop) is new, drawn from torch's generator.
    id2label/label2id are set, so `save_pretrained` output loads with the Auto class."""
    config = copy.deepcopy(lm.model.config)
    config.id2label = dict(enumerate(labels))  # also sets num_labels
    config.label2id = {label: i for i, label in enumerate(labels)}
    config.problem_type = "single_label_classification"
    config.architectures = None  # save_pretrained writes the classifier's own
    model = AutoModelForSequenceClassification.from_config(config)
    body = lm.model.base_model.state_dict()
    missing, unexpected = model.base_model.load_state_dict(body, strict=False)  # copies the values
    if unexpected or any(not name.startswith("pooler.") for name in missing):
        raise ValueError(f"The model {lm.name!r} has no body a sequence classifier can take.")
    model.to(lm.device)
    return Classifier(f"{lm.name} classifier ({', '.join(labels)})", lm.tokenizer, model, lm.device,
                      min(MAX_TOKENS, lm.max_length))


def body_parameters(classifier: Classifier, lm: LoadedModel) -> list[torch.nn.Parameter]:
    """The classifier's parameters copied from `lm`'s body (what `freeze_body` freezes); the rest
    (pooler, head) are new."""
    copied = set(dict(lm.model.base_model.named_parameters()))
    return [p for name, p in classifier.model.base_model.named_parameters() if name in copied]


def encode(classifier: Classifier, texts: list[str]) -> tuple[list[dict], int]:
    """Token features per text (unpadded, cut at the classifier's `max_length`) and how many
    texts were cut."""
    tokenizer, max_length = classifier.tokenizer, classifier.max_length
    full = tokenizer(texts, truncation=False)["input_ids"]
    cut = tokenizer(texts, truncation=True, max_length=max_length)
    features = [{k: cut[k][i] for k in cut.keys()} for i in range(len(texts))]
    return features, sum(len(ids) > max_length for ids in full)


# ---------------------------------------------------------------- the loop

def train_classifier(lm: LoadedModel, examples, *, epochs: int = 3, lr: float = 2e-5,
                     batch_size: int = 16, seed: int = 0, freeze_body: bool = False,
                     on_step: Callable[[dict], None] | None = None,
                     should_stop: Callable[[], bool] | None = None,
                     limits: Limits | None = None, eval_every: int | None = None,
                     weight_decay: float = 0.01,
                     warmup_ratio: float = 0.1) -> tuple[Classifier, ClassifyHistory]:
    """Train a sequence classifier on a copy of `lm`'s body; returns (classifier, history).

    examples: (text, label) string pairs, at least two labels with two examples each.
    freeze_body: train only the new layers (pooler and head): a linear probe, for comparison.
    on_step(event): {"kind": "step", "step", "steps", "loss", "lr", "elapsed"} after each step and
    {"kind": "eval", "step", "loss", "accuracy", "macro_f1"} on the held-out examples before
    training (step 0, the untrained head), every `eval_every` steps (default: ten times a run) and
    at the end. should_stop(): asked before each step; True ends the run there ("stopped", or its
    `.reason` when it has one, as `runs.StopCheck` has).
    The run also ends at `limits.max_seconds` ("time limit") or on a non-finite loss ("diverged").
    Same seed, examples and settings: same split, head, batches, dropout and history (dropout uses
    torch's global generator, seeded here and restored afterwards).
    """
    limits = limits or ClassifyLimits()
    examples, opts, split, steps = check_request(examples, epochs=epochs, lr=lr, batch_size=batch_size,
                                                 seed=seed, freeze_body=freeze_body, limits=limits)
    labels = list(label_counts(examples))
    history = ClassifyHistory(steps, labels, len(split.train), len(split.held_out),
                              settings={**opts, "steps": steps})
    with torch.random.fork_rng(devices=[lm.device.index or 0] if lm.device.type == "cuda" else []):
        torch.manual_seed(opts["seed"])  # the head's initial weights and dropout
        classifier = build_classifier(lm, labels)
        if opts["freeze_body"]:
            for param in body_parameters(classifier, lm):
                param.requires_grad_(False)
        loop = _Loop(classifier, split, opts, steps, weight_decay, warmup_ratio)
        history.truncated = loop.truncated
        loop.run(history, on_step or (lambda event: None), should_stop, limits.max_seconds,
                 eval_every if eval_every is not None else max(1, steps // 10))
    classifier.model.eval().requires_grad_(False)
    return classifier, history


class _Loop:
    """One classifier's batches, optimizer and schedule; `run` reports through callbacks."""

    def __init__(self, classifier: Classifier, split: Split, opts: dict, steps: int,
                 weight_decay: float, warmup_ratio: float):
        self.classifier, self.model, self.device = classifier, classifier.model, classifier.device
        self.steps = steps
        label_id = classifier.model.config.label2id
        train, cut_train = encode(classifier, [t for t, _ in split.train])
        self.held_out, cut_held = encode(classifier, [t for t, _ in split.held_out])
        self.truncated = cut_train + cut_held
        self.held_out_texts = split.held_out
        self.held_out_ids = torch.tensor([label_id[lab] for _, lab in split.held_out])
        for feature, (_, lab) in zip(train, split.train):
            feature["labels"] = label_id[lab]
        self.collate = DataCollatorWithPadding(classifier.tokenizer)
        loader = DataLoader(train, batch_size=opts["batch_size"], shuffle=True, collate_fn=self.collate,
                            generator=torch.Generator().manual_seed(opts["seed"]))
        self.batches = itertools.chain.from_iterable(itertools.repeat(loader))  # epoch after epoch
        self.model.train()
        self.optimizer = make_optimizer(self.model, opts["lr"], weight_decay, self.device)
        self.scheduler = linear_schedule(self.optimizer, steps, round(warmup_ratio * steps))
        self.params = [p for p in self.model.parameters() if p.requires_grad]

    def train_step(self, batch) -> float:
        batch = batch.to(self.device)
        labels = batch.pop("labels")
        with autocast(self.device):
            logits = self.model(**batch).logits
        loss = F.cross_entropy(logits.float(), labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.item()

    def evaluate(self, step: int, history: ClassifyHistory, emit: Callable) -> torch.Tensor:
        """Held-out loss, accuracy, macro-F1 at `step`; returns the probabilities (N, labels)."""
        probs = probabilities(self.classifier, self.held_out, self.collate)
        result = {"step": step, **scores(probs, self.held_out_ids)}
        history.evals.append(result)
        emit({"kind": "eval", **result})
        return probs

    def run(self, history: ClassifyHistory, emit: Callable, should_stop: Callable | None,
            max_seconds: float, eval_every: int) -> None:
        start = time.perf_counter()
        self.evaluate(0, history, emit)
        for step in range(1, self.steps + 1):
            history.stopped = _why_stop(should_stop, time.perf_counter() - start, max_seconds)
            if history.stopped:
                break
            lr_now = self.scheduler.get_last_lr()[0]
            loss = self.train_step(next(self.batches))
            if not math.isfinite(loss):
                history.stopped = "diverged"
                break
            event = {"step": step, "loss": loss, "lr": lr_now, "elapsed": time.perf_counter() - start}
            history.steps.append(event)
            emit({"kind": "step", "steps": self.steps, **event})
            if eval_every and step % eval_every == 0 and step != self.steps:
                self.evaluate(step, history, emit)
        probs = self.evaluate(len(history.steps), history, emit)
        history.predictions = held_out_predictions(self.held_out_texts, probs, history.labels)
        history.confusion = confusion_matrix(probs.argmax(-1), self.held_out_ids, len(history.labels))
        history.seconds = time.perf_counter() - start
        self.optimizer = self.scheduler = None  # frees the Adam moments (2x the model) now


def _why_stop(should_stop: Callable | None, elapsed: float, max_seconds: float) -> str | None:
    if should_stop is not None and should_stop():
        return getattr(should_stop, "reason", None) or "stopped"  # runs.StopCheck says why
    if elapsed > max_seconds:
        return "time limit"
    return None


# ---------------------------------------------------------------- predictions and scores

@torch.no_grad()
def probabilities(classifier: Classifier, features: list[dict], collate: Callable | None = None,
                  batch_size: int = 64) -> torch.Tensor:
    """Softmax over the labels, (N, labels) float32 on the CPU, in eval mode (no dropout)."""
    model, was_training = classifier.model, classifier.model.training
    model.eval()
    collate = collate or DataCollatorWithPadding(classifier.tokenizer)
    out = []
    for start in range(0, len(features), batch_size):
        batch = collate(features[start:start + batch_size]).to(classifier.device)
        with autocast(classifier.device):
            out.append(model(**batch).logits.float().softmax(-1).cpu())
    model.train(was_training)
    return torch.cat(out)


def scores(probs: torch.Tensor, targets: torch.Tensor) -> dict:
    """Mean cross-entropy, accuracy and macro-F1 of probabilities (N, C) against label ids (N,)."""
    predicted = probs.argmax(-1)
    loss = F.nll_loss(probs.clamp_min(1e-12).log(), targets).item()
    return {"loss": loss, "accuracy": (predicted == targets).float().mean().item(),
            "macro_f1": macro_f1(confusion_matrix(predicted, targets, probs.shape[1]))}


def confusion_matrix(predicted: torch.Tensor, targets: torch.Tensor, n_labels: int) -> list[list[int]]:
    """counts[i][j]: examples of label i predicted as label j."""
    counts = torch.zeros(n_labels, n_labels, dtype=torch.long)
    counts.index_put_((targets, predicted), torch.ones_like(targets), accumulate=True)
    return counts.tolist()


def macro_f1(confusion: list[list[int]]) -> float:
    """Mean over labels of F1 = 2TP / (2TP + FP + FN) (0 for a label never true nor predicted).
    By hand: ten lines do not justify scikit-learn as a dependency (a test checks parity)."""
    counts = torch.tensor(confusion, dtype=torch.float64)
    tp = counts.diag()
    denominator = counts.sum(0) + counts.sum(1)  # 2TP + FP + FN
    f1 = torch.where(denominator > 0, 2 * tp / denominator.clamp_min(1), torch.zeros_like(tp))
    return f1.mean().item()


def held_out_predictions(examples: list[tuple[str, str]], probs: torch.Tensor,
                         labels: list[str]) -> list[dict]:
    """One row per example, mistakes first (the least confident first within each group)."""
    rows = []
    for (text, label), p in zip(examples, probs.tolist()):
        predicted = labels[max(range(len(p)), key=p.__getitem__)]
        rows.append({"text": text, "label": label, "predicted": predicted,
                     "probabilities": dict(zip(labels, p)), "correct": predicted == label})
    return sorted(rows, key=lambda r: (r["correct"], max(r["probabilities"].values())))


def classify(classifier: Classifier, texts: str | list[str]) -> list[dict[str, float]]:
    """One {label: probability} dict per text (a single string counts as one text)."""
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, (list, tuple)) or not texts:
        raise validate.InputError("texts", "Give one or more sentences to classify.")
    texts = [validate.text(t, "sentence to classify", "The match ended in a draw.") for t in texts]
    validate.length_at_most(len(texts), MAX_TEXTS_TO_CLASSIFY, "list", "sentences",
                            "Classify fewer at a time.", field="texts")
    validate.length_at_most(sum(map(len, texts)), ClassifyLimits.max_chars, "sentences",
                            fix="Classify fewer or shorter ones.", field="texts")
    features, _ = encode(classifier, texts)
    probs = probabilities(classifier, features)
    return [dict(zip(classifier.labels, row)) for row in probs.tolist()]


def save_classifier_zip(classifier: Classifier, folder: str | Path) -> Path:
    """`save_pretrained` of the classifier and its tokenizer, zipped as
    `folder/classifier/bertdemo-classifier.zip` (loadable with AutoModelForSequenceClassification)."""
    archive = save_zip(classifier, Path(folder) / "classifier")  # its own folder: save_zip keeps one zip
    return archive.rename(archive.with_name("bertdemo-classifier.zip"))


# ---------------------------------------------------------------- forgetting (the article's point 4)

def forgetting_rows(lm: LoadedModel, texts: list[str], seed: int = 0,
                    mlm_probability: float = 0.15) -> list[dict]:
    """Fixed masks over the texts (as the fine-tune's evaluation draws them, at most
    _FORGETTING_MAX_BLOCKS blocks): the same tokens are hidden before and after, so losses compare."""
    block = min(MAX_TOKENS, lm.max_length) - lm.tokenizer.num_special_tokens_to_add(pair=False)
    blocks = pack(lm, [t for t in texts if t.strip()], block)[:_FORGETTING_MAX_BLOCKS]
    if not blocks:
        raise validate.InputError("examples", "The texts have no tokens the model knows.")
    collate = mlm_collator(lm, mlm_probability, seed + _FORGETTING_SEED_OFFSET)
    return fixed_rows(collate, eval_copies(blocks, mlm_probability))


def mlm_model_on_body(lm: LoadedModel, classifier: Classifier) -> torch.nn.Module:
    """`lm`'s masked-LM model with the classifier's (tuned) body in place of its own: the original
    MLM head reading the tuned body. Shares every tensor (no copy of the weights): a deepcopy whose
    memo maps each body tensor to the classifier's and every other tensor to itself; the output
    embedding stays tied to the (tuned) input embedding, as in the model itself."""
    tuned = {**dict(classifier.model.base_model.named_parameters()),
             **dict(classifier.model.base_model.named_buffers())}
    body = lm.model.base_model
    memo = {id(t): tuned.get(name, t) for name, t in [*body.named_parameters(), *body.named_buffers()]}
    for t in (*lm.model.parameters(), *lm.model.buffers()):
        memo.setdefault(id(t), t)
    return copy.deepcopy(lm.model, memo=memo).eval()


def mlm_loss(lm: LoadedModel, rows: list[dict], classifier: Classifier | None = None) -> dict:
    """Masked-token loss, accuracy, perplexity on fixed-mask `rows` of `lm`'s MLM head, on `lm`'s
    own body or (given a classifier) on the classifier's body."""
    model = lm.model if classifier is None else mlm_model_on_body(lm, classifier)
    return evaluate(model, rows, lm.tokenizer.pad_token_id or 0, lm.device)


def forgetting(lm: LoadedModel, classifier: Classifier, texts: list[str], seed: int = 0) -> dict:
    """{"before": mlm_loss of lm, "after": mlm_loss with the classifier's body}, same masks.
    Meaningful only for a model whose MLM head was trained (bert-base; not a bare body such as
    the bundled MiniLM, whose head is random: its loss is high before and after)."""
    rows = forgetting_rows(lm, texts, seed)
    return {"before": mlm_loss(lm, rows), "after": mlm_loss(lm, rows, classifier)}


def lr_sweep(lm: LoadedModel, examples, lrs=DEFAULT_SWEEP_LRS, *,
             on_step: Callable[[dict], None] | None = None,
             should_stop: Callable[[], bool] | None = None, **settings) -> dict:
    """The same classifier trained at each learning rate (same seed, split, steps): held-out
    accuracy against the body's MLM loss after. Returns {"mlm_before": mlm_loss dict, "points":
    [{"lr", "accuracy", "macro_f1", "mlm_loss", "mlm_accuracy", "steps", "stopped"}, ...],
    "histories": {lr: ClassifyHistory}}. Events carry "run" (the lr). A Stop ends the sweep."""
    limits = settings.get("limits") or ClassifyLimits()
    examples = check_examples(examples, limits)
    settings.pop("lr", None)  # the sweep sets it
    if not isinstance(lrs, (list, tuple)) or not lrs or len(lrs) > 8:
        raise validate.InputError("learning rates", "Give one to eight learning rates to sweep, e.g. "
                                                    "[2e-5, 5e-5, 2e-4].")
    lrs = [validate.number(lr, "learning rate", 0.0, limits.max_lr, open_low=True) for lr in lrs]
    rows = forgetting_rows(lm, [t for t, _ in examples], settings.get("seed", 0))
    sweep = {"mlm_before": mlm_loss(lm, rows), "points": [], "histories": {}}
    for lr in lrs:
        classifier, history = train_classifier(lm, examples, lr=lr, on_step=_tagged(on_step, lr),
                                               should_stop=should_stop, **settings)
        after = mlm_loss(lm, rows, classifier)
        sweep["histories"][lr] = history
        sweep["points"].append({"lr": lr, "accuracy": history.after["accuracy"],
                                "macro_f1": history.after["macro_f1"], "mlm_loss": after["loss"],
                                "mlm_accuracy": after["accuracy"], "steps": len(history.steps),
                                "stopped": history.stopped})
        if history.stopped == "stopped":
            break
    return sweep


def adapt_then_classify(base: LoadedModel, adapted: LoadedModel | None, examples, *,
                        mlm_steps: int = 60, mlm_lr: float = 5e-5,
                        on_step: Callable[[dict], None] | None = None,
                        should_stop: Callable[[], bool] | None = None,
                        **settings) -> dict[str, ClassifyHistory]:
    """The same classifier (seed, split, head initialisation, batches, steps) trained from the
    base body and from an MLM-adapted body: does masked-LM training on the domain before the task
    help (Gururangan et al. 2020, *Don't Stop Pretraining*)? `adapted`: e.g. `finetune`'s output on
    domain text; None adapts a copy of `base` on the examples' own texts first (`mlm_steps` MLM
    steps at `mlm_lr`: the paper's task-adaptive pretraining). Returns {"base": ClassifyHistory,
    "adapted": ClassifyHistory} (fewer if stopped); events carry "run" ("adapting", "base",
    "adapted")."""
    limits = settings.get("limits") or ClassifyLimits()
    examples = check_examples(examples, limits)
    if adapted is None:
        adapted, mlm = finetune(base, [t for t, _ in examples], steps=min(mlm_steps, limits.max_steps),
                                lr=mlm_lr, seed=settings.get("seed", 0), limits=limits,
                                on_step=_tagged(on_step, "adapting"), should_stop=should_stop)
        if mlm.stopped:
            return {}
    elif (base.tokenizer is not adapted.tokenizer
          and base.tokenizer.get_vocab() != adapted.tokenizer.get_vocab()):
        raise ValueError("The adapted model has another vocabulary than the base: adapt the same "
                         "base model you classify with.")
    histories = {}
    for run, lm in (("base", base), ("adapted", adapted)):
        _, histories[run] = train_classifier(lm, examples, on_step=_tagged(on_step, run),
                                             should_stop=should_stop, **settings)
        if histories[run].stopped == "stopped":
            break
    return histories


def _tagged(on_step: Callable | None, run) -> Callable[[dict], None]:
    return lambda event: on_step({**event, "run": run}) if on_step is not None else None
