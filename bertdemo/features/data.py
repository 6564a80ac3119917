"""What a dictionary is trained and measured on: corpus lines as the model sees them in this demo,
plain and with ~15% of their word pieces masked as transformers' MLM collator masks them, and the
activations at the kept positions (every real token and every [MASK]; never [CLS], [SEP] or
padding), at the coder's `Point`: the residual stream at a layer's output for a dictionary
(`RESIDUAL`), the feed-forward block's input and output for a transcoder (`FEED_FORWARD`).

    lines = Lines(lm, texts)                                   # tokenized once, cut at 64 tokens
    for batch in lines.batches(lm, batch_tokens=4096, seed=0):  # endless, as a stream
        states = hidden_at(lm, batch, [3])[3]                   # (N, H): the kept positions only
        x, y = pairs_at(lm, batch, [3], FEED_FORWARD)[3]        # (N, H) each: block input, block output

Nothing holds more than one batch of activations: a corpus of any length streams through.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import torch

from .. import validate
from ..forward import anatomy, mlp_points, splice
from ..model.loading import LoadedModel
from ..training.mlm_data import mlm_collator, padded_by_torch, special_tokens_around

MAX_LENGTH = 64  # word pieces per line, special tokens included: the demo's sentences are short
MASKED_SHARE = 0.5  # of the lines drawn, this share is masked (the rest plain)
MASK_PROBABILITY = 0.15


@dataclass(frozen=True)
class TokenBatch:
    """A padded batch of corpus lines: `inputs` for the model ({"input_ids", "attention_mask"},
    (B, T) each), `keep` (B, T) bool: the positions every statistic counts, `lines` (B,): the
    corpus line of each row, and `labels` (B, T): the original token at each masked position,
    -100 elsewhere (plain rows have none)."""

    inputs: dict
    keep: torch.Tensor
    lines: np.ndarray
    labels: torch.Tensor

    @property
    def tokens(self) -> int:
        return int(self.keep.sum())


class Lines:
    """Corpus lines tokenized once, without special tokens, each cut to fit `max_length` with them."""

    def __init__(self, lm: LoadedModel, texts: list[str], max_length: int = MAX_LENGTH):
        self.texts = [t.strip() for t in texts if t and t.strip()]
        if not self.texts:
            raise ValueError("The corpus has no text: paste some sentences, one per line.")
        self.prefix, self.suffix = special_tokens_around(lm.tokenizer)
        room = max(1, min(max_length, lm.max_length) - len(self.prefix) - len(self.suffix))
        fast = getattr(lm.tokenizer, "is_fast", False)
        encoded = lm.tokenizer(self.texts, add_special_tokens=False, truncation=False, return_offsets_mapping=fast)
        self.ids = [row[:room] for row in encoded["input_ids"]]
        if fast:  # a cut line is kept as far as the model reads it: what a card shows is what it read
            self.texts = [text if len(row) <= room else text[:offsets[room - 1][1]]
                          for text, row, offsets in zip(self.texts, encoded["input_ids"], encoded["offset_mapping"])]
        self.lengths = np.array([len(row) for row in self.ids])

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def tokens(self) -> int:
        """Kept positions in one pass over the corpus."""
        return int(self.lengths.sum())

    def example(self, line: int) -> dict:
        """Line `line` with the model's special tokens: {"input_ids", "special_tokens_mask"}."""
        body = self.ids[line]
        return {"input_ids": self.prefix + body + self.suffix,
                "special_tokens_mask": [1] * len(self.prefix) + [0] * len(body) + [1] * len(self.suffix)}

    def batches(self, lm: LoadedModel, *, batch_tokens: int = 4096, seed: int = 0, masked_share: float = MASKED_SHARE,
                mask_probability: float = MASK_PROBABILITY, order: np.ndarray | None = None,
                endless: bool = True) -> Iterator[TokenBatch]:
        """Batches of at most `batch_tokens` padded tokens. Each pass visits every line once in a
        seeded random order (or in `order`), lines of similar length batched together; a line is
        masked with probability `masked_share` (fresh masks every pass). Endless unless `endless`
        is False (then one pass)."""
        rng = np.random.default_rng(seed)
        collate = padded_by_torch(mlm_collator(lm, mask_probability, seed=seed))
        while True:
            visit = rng.permutation(len(self.ids)) if order is None else np.asarray(order)
            lengths = self.lengths + len(self.prefix) + len(self.suffix)
            for group in _groups(visit, lengths, batch_tokens):
                for part in anatomy.batches(lm.model, lengths[group]):  # one length per batch where padding matters
                    yield self._batch(lm, group[part], rng.random(len(part)) < masked_share, collate)
            if not endless:
                return

    def _batch(self, lm: LoadedModel, group: np.ndarray, masked: np.ndarray, collate) -> TokenBatch:
        examples = [self.example(int(i)) for i in group]
        batch = collate(examples)  # masks every row; plain rows take their ids back below
        plain = _padded([e["input_ids"] for e in examples], lm.tokenizer.pad_token_id)
        rows = torch.as_tensor(masked)[:, None]
        ids = torch.where(rows, batch["input_ids"], plain)
        attention = batch["attention_mask"]
        return TokenBatch({"input_ids": ids, "attention_mask": attention},
                          kept_positions(lm, plain, attention), group, torch.where(rows, batch["labels"], -100))


def _groups(order: np.ndarray, lengths: np.ndarray, batch_tokens: int) -> Iterator[np.ndarray]:
    """`order` cut into groups of at most `batch_tokens` padded tokens, lines sorted by length
    within windows of 64 batches' worth (little padding, order still random across windows)."""
    window = max(1, 64 * batch_tokens // max(1, int(lengths.mean())))
    for start in range(0, len(order), window):
        chunk = order[start:start + window]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        current, longest = [], 0
        for i in chunk:
            longest_with = max(longest, int(lengths[i]))
            if current and longest_with * (len(current) + 1) > batch_tokens:
                yield np.array(current)
                current, longest_with = [], int(lengths[i])
            current.append(i)
            longest = longest_with
        if current:
            yield np.array(current)


def _padded(rows: list[list[int]], value: int) -> torch.Tensor:
    return torch.nn.utils.rnn.pad_sequence([torch.tensor(r) for r in rows], batch_first=True, padding_value=value)


@dataclass(frozen=True)
class Point:
    """Where a coder reads (x) and what it writes (y), layer by layer, in any family (through the
    anatomy). `read(model, inputs, layers)`: ({layer: x (B, T, H)}, {layer: y (B, T, H)}) from one
    forward that stops after the deepest layer; `edited(model, edits)`: the context in which each
    layer's y passes through `edits[layer]`, in the point's own form (the splice's `edit(hidden)`,
    the block's `edit(output, input)`; `edit(fn)` makes one from `fn(y, x)`); `check_layer(model,
    layer)`: the layer as an int, else a ValueError saying the range. `transcode`: y is not x."""

    name: str
    read: Callable
    edited: Callable
    edit: Callable[[Callable], Callable]
    check_layer: Callable[[torch.nn.Module, int], int]
    transcode: bool


def _residual_read(model, inputs: dict, layers: list[int]):
    states = splice.read(model, inputs, layers)
    return states, states


def _check_block(model, layer) -> int:
    count = mlp_points.check(model, "Transcoders")
    return validate.whole_number(layer, "layer", 1, count, f" (each of the {count} layers' feed-forward block)",
                                 field="layer")


RESIDUAL = Point("residual stream", _residual_read, splice.spliced, lambda fn: lambda hidden: fn(hidden, hidden),
                 splice.check_layer, transcode=False)
FEED_FORWARD = Point("feed-forward block", mlp_points.read, mlp_points.edited, lambda fn: fn, _check_block,
                     transcode=True)


def point_of(dictionary) -> Point:
    """Where a `Dictionary` reads and writes: the feed-forward block for a transcoder, else the
    residual stream."""
    return FEED_FORWARD if dictionary.coder.cfg.transcode else RESIDUAL


@torch.no_grad()
def pairs_at(lm: LoadedModel, batch: TokenBatch, layers: list[int], point: Point = RESIDUAL,
             device: torch.device | str = "cpu") -> dict[int, tuple[torch.Tensor, torch.Tensor | None]]:
    """{layer: (x, y)}, (N, H) float32 each on `device`: what a coder at `point` reads and what it
    writes at the batch's kept positions (y None where it is x: a dictionary's), from one forward
    that stops after the deepest layer asked."""
    inputs = {k: v.to(lm.device) for k, v in batch.inputs.items()}
    read, written = point.read(lm.model, inputs, layers)
    keep = batch.keep.to(lm.device)
    kept = lambda states, layer: states[layer][keep].float().to(device)  # noqa: E731
    return {layer: (kept(read, layer), kept(written, layer) if point.transcode else None) for layer in layers}


def hidden_at(lm: LoadedModel, batch: TokenBatch, layers: list[int], device: torch.device | str = "cpu") -> dict[int, torch.Tensor]:
    """{layer: (N, H) float32 on `device`}: the residual stream at each layer's output at the
    batch's kept positions, from one forward that stops after the deepest layer asked."""
    return {layer: x for layer, (x, _) in pairs_at(lm, batch, layers, RESIDUAL, device).items()}


def kept_positions(lm: LoadedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: the positions a coder reads and writes (every real token and every [MASK]; not
    [CLS], [SEP], <s>, </s> or padding). The one rule of which positions count, used by everything
    that codes a sentence: the training batches and statistics (`TokenBatch.keep`, from the ids
    before masking), the quality's splice, every view (a sentence's features, steer, the features
    behind a prediction, contrast: elsewhere the hidden state passes through untouched) and the
    circuits' transcoders (`circuits.attribution.coded_positions`). A coder never saw the framing
    tokens in training: there its reconstruction is not to be trusted."""
    tokenizer = lm.tokenizer
    framing = {tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id,
               tokenizer.pad_token_id} - {None}
    framed = torch.isin(input_ids, torch.tensor(sorted(framing), dtype=input_ids.dtype))
    return attention_mask.bool() & ~framed
