"""Text classification on the masked LM's body: the article's downstream recipe, measured.

The article's four differences from pre-training, in code:
1. start from the pre-trained weights: the classifier's body is a *copy* of the model's body
   (the shared model stays bit-identical);
2. a task-specific output layer: `AutoModelForSequenceClassification`'s new head, one output per label;
3. the supervised loss: cross-entropy on the labels;
4. a small learning rate (2e-5) "to avoid catastrophic forgetting": measured in forgetting.py
   (`forgetting`, and `lr_sweep` across learning rates) as the body's masked-LM loss on fixed masks
   of the person's text, read through the original MLM head, before and after.

The loop is `loop.train`, as for the fine-tune; this module supplies the classifier's batches,
loss and evaluation (`ClassifierTask`). A request is checked once into a `ClassifierPlan` (examples,
split, tokens, settings), which `run_classifier` runs; `train_classifier(lm, examples, ...)` does both.
Story: labelled lines -> checks -> stratified held-out split (seeded) -> tokens ->
DataCollatorWithPadding batches -> the loop -> held-out loss, accuracy, macro-F1, confusion matrix.
"""
from __future__ import annotations

import copy
import dataclasses
import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from transformers import AutoModelForSequenceClassification, DataCollatorWithPadding, PreTrainedModel

from .. import validate
from ..config import Limits
from ..forward import anatomy
from ..labelled import MAX_TOKENS, Split, check_examples, label_counts, stratified_split, table_examples
from ..model.caches import ModelCaches
from ..model.loading import LoadedModel
from .fine_tuning import FinetunePlan, plan_finetune, run_finetune, save_zip
from .loop import Evaluation, RunHistory, autocast, seeded, train

MAX_TEXTS_TO_CLASSIFY = 100
ADAPT_MLM_STEPS = 60  # MLM steps that adapt a copy of the base on the examples' texts, when there is no tuned model


@dataclass(frozen=True, eq=False)
class Classifier:
    """A sequence classifier and its tokenizer; `labels[i]` is output i (also in config.id2label)."""

    name: str
    tokenizer: object
    model: PreTrainedModel
    device: torch.device
    max_length: int = MAX_TOKENS  # tokens per text (special tokens included); longer ones are cut
    base_weights: str | None = None  # the weights digest of the model its body was copied from (its [CLS] dictionary's)
    caches: ModelCaches | None = field(default=None, repr=False, compare=False)  # that model's (its stores)

    @property
    def labels(self) -> list[str]:
        return [self.model.config.id2label[i] for i in range(self.model.config.num_labels)]


@dataclass
class ClassifierHistory(RunHistory):
    """A classifier's `RunHistory`: steps, and evaluations on the held-out examples (step 0: the
    untrained head, chance). `predictions` (after training): {"text", "label", "predicted",
    "probabilities", "correct"} per held-out example; `confusion[i][j]`: held-out examples of
    label i predicted as label j."""

    labels: list[str] = field(default_factory=list)
    train_size: int = 0
    held_out_size: int = 0
    predictions: list[dict] = field(default_factory=list)
    confusion: list[list[int]] = field(default_factory=list)
    truncated: int = 0  # texts longer than MAX_TOKENS, cut there


# ---------------------------------------------------------------- the request, checked once

@dataclass(frozen=True)
class ClassifierSettings:
    """A classifier run's settings, checked (`plan_classifier`)."""

    epochs: int = 3
    learning_rate: float = 2e-5
    batch_size: int = 16
    seed: int = 0
    freeze_body: bool = False  # train only the new layers (pooler and head): a linear probe


@dataclass(frozen=True)
class ClassifierPlan:
    """A checked classifier run: the model whose body is copied, the examples split and
    tokenized once, the settings and the number of steps they make, the caps."""

    lm: LoadedModel
    examples: list[tuple[str, str]]
    split: Split
    settings: ClassifierSettings
    steps: int
    limits: Limits
    train_features: list[dict]  # tokenizer output per training example, with "labels"
    held_out_features: list[dict]
    truncated: int  # texts cut at MAX_TOKENS

    @property
    def labels(self) -> list[str]:
        return list(label_counts(self.examples))

    def on(self, lm: LoadedModel) -> "ClassifierPlan":
        """The same run on another model with the same tokenizer (an MLM-adapted body)."""
        return dataclasses.replace(self, lm=lm)

    def with_learning_rate(self, learning_rate: float) -> "ClassifierPlan":
        return dataclasses.replace(self, settings=dataclasses.replace(self.settings, learning_rate=learning_rate))


def plan_classifier(lm: LoadedModel, examples, *, epochs=3, learning_rate=2e-5, batch_size=16, seed=0,
                    freeze_body=False, limits: Limits | None = None) -> ClassifierPlan:
    """Check a classifier run on `lm`'s body and prepare its data: (text, label) pairs (at least
    two labels with two examples each), split and tokenized. Raises `validate.InputError` naming
    the field at fault (`.field`: these parameters' names)."""
    limits = limits or Limits()
    examples = check_examples(examples, limits)
    if not isinstance(freeze_body, bool):
        raise validate.InputError("freeze_body", "Freeze body must be True or False.")
    settings = ClassifierSettings(
        epochs=validate.whole_number(epochs, "epochs", 1, limits.max_steps, field="epochs"),
        learning_rate=validate.number(learning_rate, "learning rate", 0.0, limits.max_learning_rate,
                                      open_low=True, field="learning_rate"),
        batch_size=validate.whole_number(batch_size, "batch size", 1, limits.max_batch_size, field="batch_size"),
        seed=validate.whole_number(seed, "seed", 0, 2**32 - 1, field="seed"), freeze_body=freeze_body)
    split = stratified_split(examples, settings.seed)
    steps = planned_steps(settings.epochs, len(split.train), settings.batch_size, limits)
    label_id = {label: i for i, label in enumerate(label_counts(examples))}
    max_length = min(MAX_TOKENS, lm.max_length)
    train_features, cut_train = encode(lm.tokenizer, [t for t, _ in split.train], max_length)
    held_out, cut_held = encode(lm.tokenizer, [t for t, _ in split.held_out], max_length)
    for feature, (_, label) in zip(train_features, split.train):
        feature["labels"] = label_id[label]
    return ClassifierPlan(lm, examples, split, settings, steps, limits, train_features, held_out,
                          cut_train + cut_held)


@dataclass(frozen=True)
class ClassifierForm:
    """A classifier run as the page and its API ask for it (the endpoint's parameters): the
    table as Gradio sends it, and the settings."""

    examples: object
    epochs: int
    learning_rate: float
    batch_size: int
    freeze_body: bool
    seed: int

    def plan(self, lm: LoadedModel, limits: Limits) -> ClassifierPlan:
        return plan_classifier(lm, table_examples(self.examples), **self._settings(), limits=limits)

    def adaptation(self, base: LoadedModel, adapted: LoadedModel | None, limits: Limits) -> "AdaptPlan":
        """The same run from `base`'s body and from `adapted`'s (None: one MLM-tuned first)."""
        return plan_adaptation(base, adapted, table_examples(self.examples), **self._settings(), limits=limits)

    def _settings(self) -> dict:
        return dict(epochs=self.epochs, learning_rate=self.learning_rate, batch_size=self.batch_size,
                    freeze_body=self.freeze_body, seed=self.seed)


def planned_steps(epochs: int, train_size: int, batch_size: int, limits: Limits) -> int:
    steps = epochs * math.ceil(train_size / batch_size)
    if steps > limits.max_steps:
        raise validate.InputError("epochs", f"{epochs} epochs of {train_size} training examples in "
                                            f"batches of {batch_size} is {steps} steps; at most "
                                            f"{limits.max_steps} are allowed. Ask for fewer epochs "
                                            "or a larger batch.")
    return steps


# ---------------------------------------------------------------- the model

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
    anatomy.fit_inputs(model)  # a family whose forward takes one length (Nystromformer's landmarks)
    return Classifier(f"{lm.name} classifier ({', '.join(labels)})", lm.tokenizer, model, lm.device,
                      min(MAX_TOKENS, lm.max_length), lm.weights_digest, lm.caches)


def body_parameters(classifier: Classifier, lm: LoadedModel) -> list[torch.nn.Parameter]:
    """The classifier's parameters copied from `lm`'s body (what `freeze_body` freezes); the rest
    (pooler, head) are new."""
    copied = set(dict(lm.model.base_model.named_parameters()))
    return [p for name, p in classifier.model.base_model.named_parameters() if name in copied]


def encode(tokenizer, texts: list[str], max_length: int) -> tuple[list[dict], int]:
    """Token features per text (unpadded, cut at `max_length` tokens) and how many texts were cut."""
    full = tokenizer(texts, truncation=False)["input_ids"]
    cut = tokenizer(texts, truncation=True, max_length=max_length)
    features = [{k: cut[k][i] for k in cut.keys()} for i in range(len(texts))]
    return features, sum(len(ids) > max_length for ids in full)


# ---------------------------------------------------------------- the classifier's run

class ClassifierTask:
    """What the training loop needs from a classifier's run: shuffled padded batches epoch after
    epoch, cross-entropy on the labels, and evaluation on the held-out examples (whose last
    probabilities it keeps, for the predictions and the confusion matrix)."""

    def __init__(self, classifier: Classifier, plan: ClassifierPlan):
        self.classifier, self.model, self.device = classifier, classifier.model, classifier.device
        label_id = classifier.model.config.label2id
        self.held_out_ids = torch.tensor([label_id[label] for _, label in plan.split.held_out])
        self.collate = DataCollatorWithPadding(classifier.tokenizer)
        self.loader = DataLoader(plan.train_features, batch_size=plan.settings.batch_size, shuffle=True,
                                 collate_fn=self.collate,
                                 generator=torch.Generator().manual_seed(plan.settings.seed))
        self.held_out = plan.held_out_features
        self.last_probabilities: torch.Tensor | None = None  # (held out, labels)

    def batches(self) -> Iterator:
        return itertools.chain.from_iterable(itertools.repeat(self.loader))  # epoch after epoch

    def loss(self, batch) -> torch.Tensor:
        batch = batch.to(self.device)
        labels = batch.pop("labels")
        with autocast(self.device):
            logits = self.model(**batch).logits
        return F.cross_entropy(logits.float(), labels)

    def evaluate(self, step: int) -> Evaluation:
        """Held-out loss, accuracy, macro-F1 at `step`."""
        self.last_probabilities = probabilities(self.classifier, self.held_out, self.collate)
        return Evaluation(step, **scores(self.last_probabilities, self.held_out_ids))


def run_classifier(plan: ClassifierPlan, *, on_event: Callable | None = None,
                   should_stop: Callable[[], bool] | None = None, eval_every: int | None = None,
                   weight_decay: float = 0.01, warmup_ratio: float = 0.1,
                   run: str | None = None) -> tuple[Classifier, ClassifierHistory]:
    """Train a sequence classifier on a copy of `plan.lm`'s body; returns (classifier, history).

    The loop is `loop.train`: its events (`Step`, `Evaluation` with macro-F1, tagged with `run`)
    go to `on_event`; `should_stop()`, the plan's time limit and a non-finite loss end it early.
    The same plan gives the same split, head, batches, dropout and history (dropout and the head's
    initial weights use torch's global generator, seeded here and restored afterwards).
    """
    s = plan.settings
    history = ClassifierHistory(plan.steps, {**dataclasses.asdict(s), "steps": plan.steps},
                                labels=plan.labels, train_size=len(plan.split.train),
                                held_out_size=len(plan.split.held_out), truncated=plan.truncated)
    with seeded(s.seed, plan.lm.device):  # the head's initial weights and dropout
        classifier = build_classifier(plan.lm, plan.labels)
        if s.freeze_body:
            for param in body_parameters(classifier, plan.lm):
                param.requires_grad_(False)
        classifier.model.train()
        task = ClassifierTask(classifier, plan)
        train(classifier.model, task.batches(), task.loss, task.evaluate, history,
              learning_rate=s.learning_rate, max_seconds=plan.limits.max_seconds, eval_every=eval_every,
              weight_decay=weight_decay, warmup_ratio=warmup_ratio, on_event=on_event,
              should_stop=should_stop, run=run)
    probs = task.last_probabilities  # of the final evaluation
    history.predictions = held_out_predictions(plan.split.held_out, probs, history.labels)
    history.confusion = confusion_matrix(probs.argmax(-1), task.held_out_ids, len(history.labels))
    classifier.model.eval().requires_grad_(False)
    return classifier, history


def train_classifier(lm: LoadedModel, examples, *, on_event: Callable | None = None,
                     should_stop: Callable[[], bool] | None = None, eval_every: int | None = None,
                     **settings) -> tuple[Classifier, ClassifierHistory]:
    """Train a sequence classifier on a copy of `lm`'s body; returns (classifier, history).

    examples: (text, label) string pairs, at least two labels with two examples each.
    settings: `plan_classifier`'s (epochs, learning_rate, batch_size, seed, freeze_body, limits).
    """
    return run_classifier(plan_classifier(lm, examples, **settings), on_event=on_event,
                          should_stop=should_stop, eval_every=eval_every)


# ---------------------------------------------------------------- predictions and scores

@torch.no_grad()
def probabilities(classifier: Classifier, features: list[dict], collate: Callable | None = None,
                  batch_size: int = 64) -> torch.Tensor:
    """Softmax over the labels, (N, labels) float32 on the CPU, in eval mode (no dropout)."""
    model, was_training = classifier.model, classifier.model.training
    model.eval()
    collate = collate or DataCollatorWithPadding(classifier.tokenizer)
    out: list = [None] * len(features)
    # padded together, or one length per forward where the family's answer depends on the padding
    for group in anatomy.batches(model, [len(f["input_ids"]) for f in features], batch_size):
        batch = collate([features[i] for i in group]).to(classifier.device)
        with autocast(classifier.device):
            for i, row in zip(group, model(**batch).logits.float().softmax(-1).cpu()):
                out[i] = row
    model.train(was_training)
    return torch.stack(out)


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
    validate.length_at_most(sum(map(len, texts)), Limits.max_chars, "sentences",
                            fix="Classify fewer or shorter ones.", field="texts")
    features, _ = encode(classifier.tokenizer, texts, classifier.max_length)
    probs = probabilities(classifier, features)
    return [dict(zip(classifier.labels, row)) for row in probs.tolist()]


def save_classifier_zip(classifier: Classifier, folder: str | Path) -> Path:
    """`save_pretrained` of the classifier and its tokenizer, zipped as
    `folder/classifier/bertdemo-classifier.zip` (loadable with AutoModelForSequenceClassification)."""
    archive = save_zip(classifier, Path(folder) / "classifier")  # its own folder: save_zip keeps one zip
    return archive.rename(archive.with_name("bertdemo-classifier.zip"))


@dataclass(frozen=True)
class AdaptPlan:
    """A checked "adapt, then classify": the classifier plan on the base body, the adapted model
    (None: `adapting` makes one first, MLM-tuning a copy of the base on the examples' texts)."""

    plan: ClassifierPlan
    adapted: LoadedModel | None
    adapting: FinetunePlan | None


def plan_adaptation(base: LoadedModel, adapted: LoadedModel | None, examples, *, mlm_steps: int = ADAPT_MLM_STEPS,
                    mlm_learning_rate: float = 5e-5, **settings) -> AdaptPlan:
    """Check an adaptation run; `settings` are `plan_classifier`'s. ValueError if `adapted` has
    another vocabulary than `base`."""
    plan = plan_classifier(base, examples, **settings)
    if adapted is not None and (base.tokenizer is not adapted.tokenizer
                                and base.tokenizer.get_vocab() != adapted.tokenizer.get_vocab()):
        raise ValueError("The adapted model has another vocabulary than the base: adapt the same "
                         "base model you classify with.")
    adapting = None if adapted is not None else plan_finetune(
        base, [t for t, _ in plan.examples], training_length=min(mlm_steps, plan.limits.max_steps),
        learning_rate=mlm_learning_rate, seed=plan.settings.seed, limits=plan.limits,
        keep_best=False)  # adapted for a fixed number of steps, as the page says
    return AdaptPlan(plan, adapted, adapting)


def run_adaptation(adapt: AdaptPlan, *, on_event: Callable | None = None,
                   should_stop: Callable[[], bool] | None = None) -> dict[str, ClassifierHistory]:
    """The same classifier (seed, split, head initialisation, batches, steps) trained from the
    base body and from an MLM-adapted body: does masked-LM training on the domain before the task
    help (Gururangan et al. 2020, *Don't Stop Pretraining*)? Returns {"base": ClassifierHistory,
    "adapted": ClassifierHistory} (fewer if stopped); events carry `run` ("adapting", "base",
    "adapted")."""
    adapted = adapt.adapted
    if adapted is None:
        adapted, mlm = run_finetune(adapt.adapting, on_event=on_event, should_stop=should_stop, run="adapting")
        if mlm.stopped:
            return {}
    histories = {}
    for run, lm in (("base", adapt.plan.lm), ("adapted", adapted)):
        _, histories[run] = run_classifier(adapt.plan.on(lm), on_event=on_event, should_stop=should_stop,
                                           run=run)
        if histories[run].stopped == "stopped":
            break
    return histories


def adapt_then_classify(base: LoadedModel, adapted: LoadedModel | None, examples, *,
                        on_event: Callable | None = None, should_stop: Callable[[], bool] | None = None,
                        **settings) -> dict[str, ClassifierHistory]:
    """`run_adaptation(plan_adaptation(base, adapted, examples, **settings))`: `adapted` is e.g.
    `finetune`'s output on domain text; None adapts a copy of `base` on the examples' own texts
    first (`mlm_steps` MLM steps at `mlm_learning_rate`: the paper's task-adaptive pretraining)."""
    return run_adaptation(plan_adaptation(base, adapted, examples, **settings), on_event=on_event,
                          should_stop=should_stop)
