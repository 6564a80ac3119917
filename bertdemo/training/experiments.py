"""Experiments that train: what the article's labelling does to a fine-tune.

`masking.py` shows how MLM corrupts its input without training anything; the experiments here
run the fine-tune (`fine_tuning.run_finetune`) on top of it, so the import graph runs one way:
experiments -> fine_tuning, masking -> models.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from transformers.data.data_collator import pad_without_fast_tokenizer_warning

from .. import validate
from ..config import Limits
from ..views.masking import LossFn, Rates, article_mask_tokens, check_seed
from .fine_tuning import FinetunePlan, MLMHistory, evaluate, plan_finetune, run_finetune
from .loop import Evaluation, stream_seed
from .mlm_data import eval_copies, fixed_rows, mlm_collator

MAX_CONSEQUENCE_STEPS = 60  # steps per run of `labelling_consequence` (it runs two)


# ---------------------------------------------------------------- a loss for the hook

def model_loss(lm) -> LossFn:
    """A `loss_fn` for `article_comparison`: the loss of `lm` as it is (no training) on a batch."""
    def loss(batch: dict) -> float:
        if batch["input_ids"].shape[1] > lm.max_length:
            raise ValueError(f"The padded text is {batch['input_ids'].shape[1]} tokens; {lm.name} "
                             f"takes at most {lm.max_length}: lower max_length.")
        with torch.inference_mode():
            out = lm.model(**{k: v.to(lm.device) for k, v in batch.items()})
        return float(out.loss)
    return loss


# ---------------------------------------------------------------- the article's labelling, trained

def article_collator(tokenizer, seed: int) -> Callable[[list[dict]], dict]:
    """A `finetune` collate_fn that labels the article's way, seeded.

    `examples` are `finetune`'s blocks ({"input_ids": [...], ...}); they are padded as
    `DataCollatorForLanguageModeling` pads them, then go through `article_mask_tokens`, which
    ignores their special-tokens mask as the article does. Returns (B, T) "input_ids",
    "attention_mask" and "labels": -100 exactly at the masked tokens, the original id everywhere
    else (padding included, as in the article).
    """
    generator = torch.Generator().manual_seed(check_seed(seed))

    def collate(examples: list[dict]) -> dict:
        batch = pad_without_fast_tokenizer_warning(
            tokenizer, [{"input_ids": e["input_ids"]} for e in examples], return_tensors="pt")
        inputs, labels = article_mask_tokens({"input_ids": batch["input_ids"]}, tokenizer, generator)
        return {"input_ids": inputs["input_ids"], "attention_mask": batch["attention_mask"],
                "labels": labels}
    return collate


@dataclass
class Consequence:
    """What `labelling_consequence` measured.

    runs: {"article": MLMHistory, "collator": MLMHistory}: each training loss is its own
    labelling's; the evaluations (step 0 = before) are the standard ones, the same for both:
    masked-token loss/accuracy on fixed 80/10/10 masks, where a model that copies its input still
    gets the 10% kept tokens right. hidden: {"before", "article", "collator"}: `Evaluation`s on
    fixed masks where *every* chosen token is the mask token: only filling a gap scores there.
    """

    runs: dict[str, MLMHistory]
    hidden: dict[str, Evaluation]


@dataclass(frozen=True)
class LabellingPlan:
    """A checked labelling experiment: the fine-tune both runs share (text tokenized once) and
    its all-[MASK] eval rows."""

    plan: FinetunePlan
    hidden_rows: list[dict]


def plan_labelling(lm, texts: str | list[str], steps: int = 30, seed: int = 0,
                   learning_rate: float = 5e-5, batch_size: int = 8, block_length: int = 128,
                   limits: Limits | None = None) -> LabellingPlan:
    """Check the experiment (at most MAX_CONSEQUENCE_STEPS steps per run, and the limits'); InputError
    naming the field at fault (`.field`: these parameters' names, the form's)."""
    limits = limits or Limits()
    steps = validate.whole_number(steps, "Steps", 1, min(MAX_CONSEQUENCE_STEPS, limits.max_steps), field="steps")
    seed = check_seed(seed)
    plan = plan_finetune(lm, texts, training_length=steps, learning_rate=learning_rate, batch_size=batch_size,
                         seed=seed, block_length=block_length, limits=limits,
                         keep_best=False)  # each labelling's last model is what the experiment compares
    return LabellingPlan(plan, hidden_eval_rows(lm, plan.data.eval, seed))


@dataclass(frozen=True)
class LabellingForm:
    """The experiment as the page and its API ask for it (the endpoint's parameters)."""

    text: str
    seed: int
    steps: int
    learning_rate: float

    def plan(self, lm, limits: Limits) -> LabellingPlan:
        return plan_labelling(lm, self.text, self.steps, self.seed, self.learning_rate, limits=limits)


def run_labelling(labelling: LabellingPlan, *, on_event: Callable | None = None,
                  should_stop: Callable[[], bool] | None = None) -> Consequence:
    """Two short fine-tunes of the plan's model with the same seed, data, steps and eval masks:
    one labelled by the article's `mask_tokens`, one by transformers' collator (15%, 80/10/10).

    The article's training loss scores the *visible* tokens, so it falls fast (copying is easy);
    the evaluations show what each run learnt about filling masks. Each run evaluates about 4 times
    (not `finetune`'s 11: each eval runs the model on up to 32 masked copies of the text, more
    work than a training step on one block). Events carry the labelling as `run`.
    """
    plan, rows = labelling.plan, labelling.hidden_rows
    lm, seed = plan.lm, plan.settings.seed
    collates = {"article": article_collator(lm.tokenizer, seed),
                "collator": mlm_collator(lm, 0.15, seed)}  # the article's rate, 15%
    result = Consequence({}, {"before": _evaluate(lm, lm.model, rows)})
    for run, collate in collates.items():
        tuned, result.runs[run] = run_finetune(plan, collate_fn=collate, on_event=on_event,
                                               eval_every=max(1, plan.settings.steps // 3),
                                               should_stop=should_stop, run=run)
        result.hidden[run] = _evaluate(lm, tuned.model, rows)
        if result.runs[run].stopped == "stopped":
            break
    return result


def labelling_consequence(lm, texts: str | list[str], steps: int = 30, seed: int = 0,
                          learning_rate: float = 5e-5, *, on_event: Callable | None = None,
                          should_stop: Callable[[], bool] | None = None, **settings) -> Consequence:
    """`run_labelling(plan_labelling(lm, texts, steps, seed, learning_rate, **settings))`."""
    return run_labelling(plan_labelling(lm, texts, steps, seed, learning_rate, **settings),
                         on_event=on_event, should_stop=should_stop)


def hidden_eval_rows(lm, blocks: list[dict], seed: int) -> list[dict]:
    """Fixed eval rows of the fine-tune's eval blocks with every chosen token replaced by the mask
    token (mask_replace_prob=1), from a seed stream of their own."""
    collate = Rates(0.15, 1.0, 0.0).collator(lm.tokenizer, stream_seed(seed, "hidden"))
    return fixed_rows(collate, eval_copies(blocks, 0.15))


def _evaluate(lm, model, rows: list[dict]) -> Evaluation:
    return evaluate(model, rows, lm.tokenizer.pad_token_id or 0, lm.device)
