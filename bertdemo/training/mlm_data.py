"""Text to masked-LM batches: lines cut into sentences, a held-out part, tokens packed into blocks,
transformers' collator masking them (80/10/10; padded by torch), and fixed masks for evaluation.
What the fine-tune, the experiments, forgetting and the bundled model's training all read."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence
from transformers import DataCollatorForLanguageModeling

from .. import validate
from ..config import Limits
from ..model.loading import LoadedModel

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")


@dataclass
class TextData:
    """Pasted text ready to train on: packed token blocks (lists of ids) for training and eval."""

    train: list[dict]  # {"input_ids": [...], "special_tokens_mask": [...]} per block
    eval: list[dict]
    train_lines: int
    eval_lines: int
    eval_on_train: bool  # too few lines to hold any out: eval uses the training lines
    train_tokens: int


# ---------------------------------------------------------------- text -> blocks

def split_units(texts: str | list[str]) -> list[str]:
    """Lines, each cut into sentences; blank ones dropped."""
    if isinstance(texts, str):
        texts = texts.splitlines()
    if not isinstance(texts, (list, tuple)) or not all(isinstance(t, str) for t in texts):
        raise validate.InputError("text", "The text must be a string (or a list of strings), one "
                                   "sentence or paragraph per line.")
    return [s.strip() for line in texts for s in _SENTENCE_END.split(line) if s.strip()]


def prepare_text(lm: LoadedModel, texts: str | list[str], block_length: int = 128,
                 limits: Limits | None = None) -> TextData:
    """Split, hold out about 1 line in 10 (at least one), and pack each part into blocks of at
    most `block_length` tokens (special tokens included; capped at the model's maximum).

    With fewer than 4 lines nothing can be held out and still leave enough to learn from:
    evaluation then uses the training lines (with their own fixed masks) and says so.
    """
    limits = limits or Limits()
    size = len(texts) if isinstance(texts, str) else sum(len(t) for t in texts or [] if isinstance(t, str))
    if size > limits.max_chars:
        raise validate.InputError("text", f"The text has {size:,} characters; at most "
                                   f"{limits.max_chars:,} are allowed. Paste less text.")
    units = split_units(texts)
    if not units:
        raise validate.InputError("text", "The text is empty: paste a few sentences to fine-tune on, "
                                   "one per line.")
    train_units, eval_units = _hold_out(units)
    block = min(int(block_length), lm.max_length) - lm.tokenizer.num_special_tokens_to_add(pair=False)
    train = pack(lm, train_units, block)
    evals = pack(lm, eval_units, block) if eval_units else train
    if not train:
        raise validate.InputError("text", "The text has no tokens the model knows: paste some sentences.")
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
    then add the model's special tokens: less padding than one sentence per row.

    templates/train_mlm.py holds a copy, on purpose: the exported script runs where bertdemo is not
    installed, so it cannot import this. tests/training/test_export.py checks both give the same loss."""
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


def padded_by_torch(collator: DataCollatorForLanguageModeling) -> Callable[[list[dict]], dict]:
    """`collator` on packed blocks ({"input_ids", "special_tokens_mask"} lists), padded by torch:
    its own `tokenizer.pad` walks every token id in Python (at 256 x 128 tokens tens of ms a
    batch, longer than a GPU's training step). The masking is still the collator's own
    `torch_mask_tokens`; same tensors and random draws (a test checks it). A collator set up
    otherwise (whole words, padding to a multiple, left padding) is returned as it is."""
    tokenizer = collator.tokenizer
    if not (type(collator) is DataCollatorForLanguageModeling and collator.mlm and not collator.whole_word_mask
            and collator.pad_to_multiple_of is None and tokenizer.padding_side == "right"):
        return collator

    def collate(examples: list[dict]) -> dict:
        if any(set(e) != {"input_ids", "special_tokens_mask"} for e in examples):
            return collator(examples)
        if collator.seed is not None and collator.generator is None:
            collator.create_rng()  # as the collator's own call does first

        def padded(key, value):
            return pad_sequence([torch.tensor(e[key]) for e in examples], batch_first=True, padding_value=value)
        special = padded("special_tokens_mask", 1)
        attention = pad_sequence([torch.ones(len(e["input_ids"]), dtype=torch.long) for e in examples],
                                 batch_first=True)
        ids, labels = collator.torch_mask_tokens(padded("input_ids", tokenizer.pad_token_id), special_tokens_mask=special)
        return {"input_ids": ids, "attention_mask": attention, "labels": labels}
    return collate


def collate_with_labels(collate: Callable, examples: list[dict], tries: int = 100) -> dict:
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
        batch = collate_with_labels(collate, [example])
        rows.append({k: batch[k][0] for k in ("input_ids", "attention_mask", "labels")})
    return rows


def eval_copies(examples: list[dict], mlm_probability: float, target: int = 200,
                most: int = 32) -> list[dict]:
    """The eval blocks repeated so that about `target` tokens get masked (each copy with its own
    fixed masks): one held-out line at 15% masks 1 or 2 tokens, an accuracy of 0% or 100%."""
    tokens = sum(len(e["input_ids"]) - sum(e["special_tokens_mask"]) for e in examples)
    copies = min(most, max(1, math.ceil(target / (mlm_probability * max(tokens, 1)))))
    return examples * copies


_PADS = {"attention_mask": 0, "labels": -100}  # and input_ids: the tokenizer's pad id


def stack_rows(rows: list[dict], pad_id: int) -> dict:
    """Pad 1-D rows into a (B, T) batch (labels padded with -100, attention with 0)."""
    pads = {**_PADS, "input_ids": pad_id}
    return {k: pad_sequence([r[k] for r in rows], batch_first=True, padding_value=v)
            for k, v in pads.items()}


def padded_to(batch: dict, length: int | None, pad_id: int) -> dict:
    """A (B, T) batch padded on the right to (B, length) (labels with -100, attention with 0);
    as it is when `length` is None or not longer."""
    extra = (length or 0) - batch["input_ids"].shape[1]
    if extra <= 0:
        return batch
    pads = {**_PADS, "input_ids": pad_id}
    return {k: F.pad(v, (0, extra), value=pads.get(k, 0)) for k, v in batch.items()}
