"""Attention heads, deeper: one head's query against every key (the neuron view), heads switched
off, and how much each head matters to a prediction.

Every function reads the model's own projections through `hooks`' hooks, which act only inside
the request that asked, so the shared model serves everyone else unchanged. For BERT, DistilBERT
and RoBERTa-style models; ValueError saying how to fix bad input.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import torch

from .. import validate
from ..forward import anatomy, hooks, lean_forward
from ..model.loading import USER_MASK, LoadedModel
from ..model.logits import required_head
from .attention_views import eager_twin, encode_input
from .explain import target_token
from .fillmask import DEFAULT_MAX_MASKS, encode

TOKENS_PER_BATCH = 4096  # rows x tokens per batched forward of head_importance's copies: bounds memory
_PAIR = re.compile(r"^(\d{1,6}|\*)\s*:\s*(\d{1,6}|\*)$")


def shape(lm: LoadedModel, view: str = "Switching heads off") -> tuple[int, int]:
    """(layers, heads per layer) of `lm`'s attention (`anatomy.shape`). ValueError naming what a
    model the views do not know lacks."""
    return anatomy.shape(lm.model, view)


# ---------------------------------------------------------------- heads switched off

@anatomy.guarded("Switching heads off")
def heads_off(lm: LoadedModel, heads) -> LoadedModel:
    """A view of `lm` with the listed (layer, head) pairs switched off (both counted from 0): each
    head's slice of its layer's attention output is set to zero before the output projection, as
    transformers' `head_mask=0` did.

    The view shares the model, its weights and caches; `lm` itself, and every other visitor's
    requests, are unchanged (the zeroing happens in the view's own requests only, `hooks`). Every
    service function takes it: fill_mask, fill_jointly, score_candidates, sentence_score,
    attention, layer_predictions, saliency, head_importance, neuron_view. A view of a view has the
    heads of both off. Switching off every head of every layer is allowed (each layer's attention
    then adds only its output bias). ValueError for an empty list or a pair out of range.
    """
    n_layers, n_heads = shape(lm)
    return without(lm, HeadsOff(check_heads(heads, n_layers, n_heads), n_layers, n_heads))


@dataclass(frozen=True)
class HeadsOff:
    """Heads to switch off, read and checked once against the model's shape (`read_heads`,
    `check_heads`): the (layer, head) pairs, and the layers and heads per layer they were checked
    against. What the views take; none of them reads or checks the heads again."""

    pairs: frozenset[tuple[int, int]]
    layers: int
    heads: int

    @property
    def total(self) -> int:
        """Every head of the model: layers x heads per layer."""
        return self.layers * self.heads


def read_heads(lm: LoadedModel, text, required: bool, first_layer: int = 0, first_head: int = 0) -> HeadsOff:
    """The heads a visitor wrote ("0:1, 3:*", `parse_heads`; None is empty), read and checked once
    against `lm`'s shape. `required`: an empty text is refused, saying which heads there are.
    `first_layer`, `first_head`: the numbers the text gives the first layer and a layer's first head
    (the page's 1 and 1); the pairs count from 0."""
    n_layers, n_heads = shape(lm)
    pairs = parse_heads(text if text is not None else "", n_layers, n_heads, first_layer, first_head)
    if required and not pairs:
        raise validate.InputError("heads", _none_to_switch_off(n_layers, n_heads, first_layer, first_head))
    return HeadsOff(pairs, n_layers, n_heads)


def without(lm: LoadedModel, off: HeadsOff) -> LoadedModel:
    """The view of `lm` with `off`'s heads switched off too (see `heads_off`; `off` is already
    checked); `lm` itself when `off` names none."""
    return dataclasses.replace(lm, heads_off=lm.heads_off | off.pairs) if off.pairs else lm


def _none_to_switch_off(n_layers: int, n_heads: int, first_layer: int = 0, first_head: int = 0) -> str:
    return (f"No heads to switch off: list (layer, head) pairs, layers {first_layer} to "
            f"{n_layers - 1 + first_layer} and heads {first_head} to {n_heads - 1 + first_head}.")


def check_heads(heads, n_layers: int, n_heads: int) -> frozenset[tuple[int, int]]:
    """`heads`, an iterable of (layer, head) pairs, as a frozenset; ValueError naming the ranges."""
    ranges = f"layers 0 to {n_layers - 1} and heads 0 to {n_heads - 1}"
    if isinstance(heads, (str, bytes)) or not hasattr(heads, "__iter__"):
        raise validate.InputError("heads", f"Give the heads as (layer, head) pairs, {ranges}, e.g. [(0, 1)].")
    pairs = []
    for pair in heads:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise validate.InputError("heads", f"{validate.shown(pair)} is not a (layer, head) pair: "
                                               f"{ranges}.")
        pairs.append((validate.whole_number(pair[0], "layer", 0, n_layers - 1, field="heads"),
                      validate.whole_number(pair[1], "head", 0, n_heads - 1, field="heads")))
    if not pairs:
        raise validate.InputError("heads", _none_to_switch_off(n_layers, n_heads))
    return frozenset(pairs)


def parse_heads(text: str, n_layers: int, n_heads: int, first_layer: int = 0,
                first_head: int = 0) -> frozenset[tuple[int, int]]:
    """Heads written as text, "layer:head" separated by commas or spaces ("0:1, 11:3"); `*`
    stands for every layer or head ("3:*" is all of layer 3, "*:*" every head). An empty text is
    the empty set; ValueError for anything else it cannot read or that is out of range. The text
    numbers the first layer `first_layer` and a layer's first head `first_head` (the page's 1 and 1);
    the pairs returned count from 0."""
    ranges = (f"layers {first_layer} to {n_layers - 1 + first_layer}, heads {first_head} to "
              f"{n_heads - 1 + first_head}")
    example = f"'{first_layer}:{first_head + 1}, {first_layer + 1}:*'"
    if not isinstance(text, str):
        raise validate.InputError("heads", f"Write the heads as text, layer:head, e.g. {example} ({ranges}).")
    pairs = set()
    for item in (part for part in re.split(r"[,;\s]+", text.strip()) if part):
        match = _PAIR.match(item)
        if match is None:
            raise validate.InputError("heads", f"Could not read {validate.shown(item)} as layer:head: "
                                               f"write e.g. {example} ({ranges}).")
        layer, head = (range(size) if part == "*" else [_in_range(int(part), size, what, first) - first]
                       for part, size, what, first in zip(match.groups(), (n_layers, n_heads), ("layer", "head"),
                                                          (first_layer, first_head)))
        pairs.update((x, y) for x in layer for y in head)
    return frozenset(pairs)


def _in_range(value: int, size: int, what: str, first: int = 0) -> int:
    return validate.whole_number(value, what, first, size - 1 + first, f" (counted from {first})", field="heads")


def format_heads(heads, first_layer: int = 0, first_head: int = 0) -> str:
    """The pairs as `parse_heads` reads them (with the same `first_layer`, `first_head`), in order:
    "0:1, 11:3"."""
    return ", ".join(f"{layer + first_layer}:{head + first_head}" for layer, head in sorted(heads))


# ---------------------------------------------------------------- how much each head matters

@anatomy.guarded("Head importance")
def head_importance(lm: LoadedModel, text: str, *, mask: int = 0, target: str | None = None,
                    max_masks: int = DEFAULT_MAX_MASKS, first: int = 0) -> dict:
    """For every head, how much switching it off alone changes log p(target) at one [MASK].

    `mask`: which [MASK], counted from `first` (0; the page counts from 1, and its number is
    checked here, once); `target`: the word scored (its first piece), None for
    the model's top prediction with every head on. Returns {"target": {"token", "token_id",
    "word", "pieces"}, "log_prob": log p(target) with every head on, "delta": layers x heads, log
    p(target | that head off) - log p(target), "tokens", "mask", "position", "layers", "heads",
    "heads_off": the view's own heads already off (their delta is 0)}.

    All L x H copies in batched forwards (`TOKENS_PER_BATCH` tokens each), not one call per head:
    switching off a head of layer l changes nothing below l, so each copy starts at its own layer
    from the hidden states of the one full forward, and the copies of the layers above join it
    there. Equal to L x H separate forwards of `heads_off(lm, [(l, h)])` up to float rounding.
    """
    enc = encode(lm, text, max_masks=max_masks)
    mask = validate.whole_number(mask, "mask" if first == 0 else "mask number", first,
                                 first + len(enc.mask_positions) - 1, f" ({first} = the first {USER_MASK})",
                                 field="mask") - first
    n_layers, n_heads = shape(lm, "Head importance")
    head = required_head(lm, "Head importance")
    position = enc.mask_positions[mask]
    with torch.inference_mode():
        with hooks.switched_off(lm):
            out = lm.model.base_model(**enc.inputs, output_hidden_states=True)
        log_probs = head(out.last_hidden_state[0, [position]]).float().log_softmax(-1)[0]  # (V,)
        chosen = target_token(lm, text, mask, target, int(log_probs.argmax()))
        base = float(log_probs[chosen["token_id"]])
        if lean_forward.supports(lm.model):
            ablated = _ablated(lm, out.hidden_states, position, chosen["token_id"])  # (L * H,)
        else:
            ablated = _ablated_by_forwards(lm, enc, position, chosen["token_id"])
    delta = [[ablated[layer * n_heads + h] - base for h in range(n_heads)] for layer in range(n_layers)]
    return {"target": chosen, "log_prob": base, "delta": delta,
            "tokens": lm.tokenizer.convert_ids_to_tokens(enc.input_ids[0].tolist()), "mask": mask,
            "position": position, "layers": n_layers, "heads": n_heads, "heads_off": sorted(lm.heads_off)}


def _ablated_by_forwards(lm: LoadedModel, enc, position: int, token_id: int) -> list[float]:
    """log p(token_id at position) with each head off in turn, in (layer, head) order, for any
    family: copies of the sentence in batched whole forwards (the model's own, final norm
    included), each row with its head off (`hooks` scales per row) and the view's heads off."""
    n_layers, n_heads = shape(lm)
    pairs = [(layer, h) for layer in range(n_layers) for h in range(n_heads)]
    head = required_head(lm, "Head importance")
    results: list[float] = []
    step = max(1, TOKENS_PER_BATCH // enc.input_ids.shape[1])
    for start in range(0, len(pairs), step):
        chunk = pairs[start:start + step]
        off = hooks.factors(lm.heads_off, lm.model, lm.device, rows=len(chunk))
        for row, (layer, h) in enumerate(chunk):
            off.setdefault(layer, torch.ones(len(chunk), n_heads, device=lm.device))[row, h] = 0.0
        inputs = {name: value.expand(len(chunk), -1) for name, value in enc.inputs.items()}
        with hooks.probed(lm.model, off):
            final = lm.model.base_model(**inputs).last_hidden_state[:, position]  # (rows, H)
        results += head(final).float().log_softmax(-1)[:, token_id].tolist()
    return results


def _ablated(lm: LoadedModel, states: tuple, position: int, token_id: int) -> list[float]:
    """log p(token_id at position) with each head off in turn, in (layer, head) order, for a
    model the lean forward serves (BERT's layer layout, no final norm).

    `states[l]` (1, T, H) is the input of layer l with every head on (the view's off). A copy for
    (l, h) joins the batch at layer l from states[l]; at each layer the rows that join have their
    head's factor 0 there, every row has the view's heads off. Each layer runs through the lean
    forward (packed weights, the last layer at `position` only)."""
    n_layers, n_heads = shape(lm)
    head, last = required_head(lm, "Head importance"), n_layers - 1
    length = states[0].shape[1]
    pairs = [(layer, h) for layer in range(n_layers) for h in range(n_heads)]
    view = hooks.factors(lm.heads_off, lm.model, lm.device)
    results: list[float] = []
    step = max(1, TOKENS_PER_BATCH // length)
    for start in range(0, len(pairs), step):
        chunk = pairs[start:start + step]
        hidden = states[0].new_empty(0, *states[0].shape[1:])  # (rows so far, T, H)
        for layer in range(chunk[0][0], n_layers):
            joining = [h for at, h in chunk if at == layer]
            if joining:
                hidden = torch.cat([hidden, states[layer].expand(len(joining), -1, -1)])
            scale = view.get(layer, torch.ones(1, n_heads, device=lm.device)).repeat(len(hidden), 1)
            if joining:
                scale[torch.arange(len(hidden) - len(joining), len(hidden)), joining] = 0.0
            hidden = lean_forward.layer_rows(lm.model, layer, hidden, scale, lm.caches.packed,
                                             at=position if layer == last else None)
        results += head(hidden).float().log_softmax(-1)[:, token_id].tolist()  # hidden: (rows, H)
    return results


# ---------------------------------------------------------------- the neuron view

@anatomy.guarded("The neuron view")
def neuron_view(lm: LoadedModel, text: str, *, layer: int, head: int, token: int,
                text_b: str | None = None) -> dict:
    """How one head of one layer weighs every key for one token's query (bertviz's neuron view).

    From the model's own query and key projections (read by hooks during one forward): `query`
    (head_dim,) is the token's query in that head, `keys` (T, head_dim) every token's key,
    `products` (T, head_dim) query * key per dimension, `scores` (T,) their sums / sqrt(head_dim),
    `weights` (T,) the softmax of the scores with the attention mask added as the model adds it:
    equal to the model's `output_attentions[layer][0, head, token]`. `layer`, `head` and `token`
    (an index into `tokens`, [CLS] = 0) count from 0; `text_b` makes a pair, as in `attention`.
    Returns those with "tokens", "layer", "head", "token", "head_dim", "sentence_b_start".
    """
    inputs, meta = encode_input(lm, text, text_b)
    n_layers, n_heads = shape(lm, "The neuron view")
    layer = validate.whole_number(layer, "layer", 0, n_layers - 1, " (counted from 0)", field="layer")
    head = validate.whole_number(head, "head", 0, n_heads - 1, " (counted from 0)", field="head")
    n_tokens = len(meta["tokens"])
    token = validate.whole_number(token, "token", 0, n_tokens - 1, f" (its index among the {n_tokens} "
                                  "tokens, the first is 0)", field="token")
    twin = eager_twin(lm)  # scores are read where the model computes them, as its attention view does
    view = hooks.factors(lm.heads_off, twin, lm.device)
    with torch.inference_mode(), hooks.probed(twin, view, capture=layer) as captured:
        twin.base_model(**inputs)
        scored = hooks.scores_of(twin, captured)
    query = scored["query"][0, head, token].double()  # (d,)
    keys = scored["key"][0, head].double()  # (T, d)
    products = query * keys  # (T, d)
    scores = products.sum(-1) * scored["scale"]  # (T,)
    position = None if scored["extra"] is None else scored["extra"][0, head, token].double()  # (T,)
    total = scores if position is None else scores + position
    weights = (total + _mask_row(scored, inputs, token)).softmax(-1)  # as the model adds the mask
    sentence_b = next((i for i, s in enumerate(meta["sequence_ids"]) if s == 1), None)
    return {"tokens": meta["tokens"], "layer": layer, "head": head, "token": token,
            "head_dim": int(query.shape[0]), "query": query.tolist(), "keys": keys.tolist(),
            "products": products.tolist(), "scores": total.tolist(),
            "position_scores": None if position is None else position.tolist(),
            "scale": scored["scale"], "weights": weights.tolist(), "sentence_b_start": sentence_b}


def _mask_row(scored: dict, inputs: dict, token: int) -> torch.Tensor:
    """What the model adds to `token`'s scores (T,) before the softmax: its own additive mask
    where it passed one (padding, ModernBERT's local window), else minus the largest float at
    the keys the attention mask hides."""
    if scored["mask"] is not None:
        mask = scored["mask"][0]  # (1 or heads, T, T)
        return mask[0, token].double() if mask.dtype != torch.bool else \
            (~mask[0, token]).double() * torch.finfo(torch.float32).min
    padding = (inputs["attention_mask"][0] == 0).double()  # 1 at keys the mask hides
    return padding * torch.finfo(torch.float32).min
