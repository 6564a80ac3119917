"""Forgetting, measured (the article's point 4): the body's masked-LM loss on fixed masks of the
person's text, read through the original MLM head, before and after a classifier tuned the body;
and across learning rates (`lr_sweep`: the same classifier trained at each, its accuracy against
the body's loss after). Built on classification.py's recipe, which knows nothing of this module."""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import torch

from .. import validate
from ..config import Limits
from ..labelled import MAX_TOKENS, table_examples
from ..model.loading import LoadedModel
from .classification import Classifier, ClassifierPlan, plan_classifier, run_classifier
from .fine_tuning import evaluate
from .loop import Evaluation, stream_seed
from .mlm_data import eval_copies, fixed_rows, mlm_collator, pack

MAX_BLOCKS = 16  # ~2,000 tokens scored at most: a second on bert-base, whatever the data
DEFAULT_SWEEP_LRS = (2e-5, 5e-5, 2e-4)


def forgetting_rows(lm: LoadedModel, texts: list[str], seed: int = 0,
                    mlm_probability: float = 0.15) -> list[dict]:
    """Fixed masks over the texts (as the fine-tune's evaluation draws them, at most
    MAX_BLOCKS blocks): the same tokens are hidden before and after, so losses compare."""
    block = min(MAX_TOKENS, lm.max_length) - lm.tokenizer.num_special_tokens_to_add(pair=False)
    blocks = pack(lm, [t for t in texts if t.strip()], block)[:MAX_BLOCKS]
    if not blocks:
        raise validate.InputError("examples", "The texts have no tokens the model knows.")
    collate = mlm_collator(lm, mlm_probability, stream_seed(seed, "forgetting"))
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


def mlm_loss(lm: LoadedModel, rows: list[dict], classifier: Classifier | None = None) -> Evaluation:
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


# ---------------------------------------------------------------- across learning rates

@dataclass(frozen=True)
class SweepForm:
    """The learning-rate sweep as the page and its API ask for it (the rates are `DEFAULT_SWEEP_LRS`)."""

    examples: object
    epochs: int
    batch_size: int
    seed: int

    def plan(self, lm: LoadedModel, limits: Limits) -> "SweepPlan":
        return plan_sweep(lm, table_examples(self.examples), epochs=self.epochs, batch_size=self.batch_size,
                          seed=self.seed, limits=limits)


@dataclass(frozen=True)
class SweepPlan:
    """A checked learning-rate sweep: one classifier plan, the rates, and the fixed MLM masks of
    the examples' texts on which the body's forgetting is measured."""

    plan: ClassifierPlan
    learning_rates: tuple[float, ...]
    mlm_rows: list[dict]


def plan_sweep(lm: LoadedModel, examples, learning_rates=DEFAULT_SWEEP_LRS, **settings) -> SweepPlan:
    """Check a sweep; `settings` are `plan_classifier`'s (its learning_rate is the sweep's)."""
    settings.pop("learning_rate", None)
    plan = plan_classifier(lm, examples, **settings)
    if not isinstance(learning_rates, (list, tuple)) or not learning_rates or len(learning_rates) > 8:
        raise validate.InputError("learning_rates", "Give one to eight learning rates to sweep, e.g. "
                                                    "[2e-5, 5e-5, 2e-4].")
    rates = tuple(validate.number(rate, "learning rate", 0.0, plan.limits.max_learning_rate, open_low=True,
                                  field="learning_rates") for rate in learning_rates)
    return SweepPlan(plan, rates, forgetting_rows(lm, [t for t, _ in plan.examples], plan.settings.seed))


def run_sweep(sweep: SweepPlan, *, on_event: Callable | None = None,
              should_stop: Callable[[], bool] | None = None) -> dict:
    """The same classifier trained at each learning rate (same seed, split, steps): held-out
    accuracy against the body's MLM loss after. Returns {"mlm_before": Evaluation, "points":
    [{"learning_rate", "accuracy", "macro_f1", "mlm_loss", "mlm_accuracy", "steps", "stopped"}, ...],
    "histories": {rate: ClassifierHistory}}. Events carry the rate as `run` (e.g. "2e-05"). A Stop
    ends the sweep."""
    lm = sweep.plan.lm
    result = {"mlm_before": mlm_loss(lm, sweep.mlm_rows), "points": [], "histories": {}}
    for rate in sweep.learning_rates:
        classifier, history = run_classifier(sweep.plan.with_learning_rate(rate), on_event=on_event,
                                             should_stop=should_stop, run=f"{rate:g}")
        after = mlm_loss(lm, sweep.mlm_rows, classifier)
        result["histories"][rate] = history
        result["points"].append({"learning_rate": rate, "accuracy": history.after.accuracy,
                                 "macro_f1": history.after.macro_f1, "mlm_loss": after.loss,
                                 "mlm_accuracy": after.accuracy, "steps": len(history.steps),
                                 "stopped": history.stopped})
        if history.stopped == "stopped":
            break
    return result


def lr_sweep(lm: LoadedModel, examples, learning_rates=DEFAULT_SWEEP_LRS, *, on_event: Callable | None = None,
             should_stop: Callable[[], bool] | None = None, **settings) -> dict:
    """`run_sweep(plan_sweep(lm, examples, learning_rates, **settings))`."""
    return run_sweep(plan_sweep(lm, examples, learning_rates, **settings), on_event=on_event,
                     should_stop=should_stop)
