"""Forgetting, measured (the article's point 4): the body's masked-LM loss on fixed masks of the
person's text, read through the original MLM head, before and after a classifier tuned the body."""
from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import torch

from .. import validate
from ..labelled import MAX_TOKENS
from ..model.loading import LoadedModel
from .fine_tuning import evaluate
from .loop import Evaluation, stream_seed
from .mlm_data import eval_copies, fixed_rows, mlm_collator, pack

if TYPE_CHECKING:  # a classifier is only read here (its body); classification.py imports this module
    from .classification import Classifier

MAX_BLOCKS = 16  # ~2,000 tokens scored at most: a second on bert-base, whatever the data


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
