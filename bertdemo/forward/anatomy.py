"""The model anatomy: what each loaded model's parts are, read through its family's declaration.

Each family's layers, attention and MLM head are declared once, in `families.py`.

Every view reads a model through `of(model)`; this is the one module that names a family's
internals (`encoder.layer`, `attention.self`, `cls.predictions`, `lm_head` ...). A family is one
`Family` declaration in `families.FAMILIES`; a BERT-like model that is not declared is discovered from its
modules (`discover`); where neither works, a view that needs the missing part is refused with a
ValueError naming it (`Anatomy.require`).

What an `Anatomy` gives, for a loaded *ForMaskedLM:
- `layers`: the layer modules in the order the encoder calls them (ALBERT's shared layer unrolled
  into its calls, so `layers[5]` is its sixth call), and per layer the attention's parts
  (`AttentionParts`): the output projection (its input is the heads side by side, where a head is
  switched off), the query and key as the model scores them, the head count and size;
- `head`: the MLM head as a function of hidden states (N, H) -> logits (N, V);
- `final_norm`: the norm a pre-LayerNorm model applies after its last layer (identity elsewhere);
- `lean`: whether the model has BERT's layer layout (`bert_layer_parts`), so the lean forward and
  the ONNX Runtime export serve it; `padding_sensitive`: whether its output at a token depends on
  the padding after the sentence (such a model never shares a padded batch: `batches` says which
  sentences may share a forward); `fixed_length`: the one input length a family's forward takes
  (Nystromformer's landmarks), its inputs padded to it by `fit_inputs`.

Attention scores are read on the attention views' twin (`attention_twin`): models that dispatch
through transformers' attention interface run `bertdemo_attention` there (the eager formula,
with the queries and keys as the model passes them, after any rotary encoding); the others run
their own eager attention and declare how their scores are formed (`ScoreCapture`).
"""
from __future__ import annotations

import copy
import functools
import logging
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from .families import (FAMILIES, Family, ScoreCapture, Wiring, bert_layer_parts, discover, embeddings,  # noqa: E402,F401
                       head_module, part_at)  # the declarations: every module path a family has is named there

PROBE_ATTENTION = "bertdemo_attention"  # the attention twin's implementation (registered below)


# ---------------------------------------------------------------- a loaded model's anatomy

@dataclass(frozen=True)
class AttentionParts:
    """One layer's self-attention as the views need it."""

    module: torch.nn.Module  # computes the scores (the attention interface's `module`, or its own)
    output: torch.nn.Linear  # its input (B, T, heads * head_dim) is the heads side by side
    heads: int
    head_dim: int


@dataclass(frozen=True, eq=False)
class Anatomy:
    """`family`'s parts found in one model (see the module doc)."""

    model_type: str
    family: Family | None
    layers: tuple = ()  # layer modules in calling order
    attention: tuple[AttentionParts, ...] = ()  # per layer, where the layout is known
    head_parts: tuple | None = None  # (transform, decoder)
    missing: dict = field(default_factory=dict)  # part -> why it is missing, in words
    fixed_length: int | None = None  # the one input length its forward takes (`fit_inputs`), None: any

    @property
    def name(self) -> str:
        return self.family.name if self.family else f"{self.model_type} (a family this demo has not declared)"

    @property
    def lean(self) -> bool:
        return bool(self.family and self.family.lean)

    @property
    def padding_sensitive(self) -> bool:
        return bool(self.family and self.family.padding_sensitive)

    @property
    def wiring(self) -> Wiring:
        """How its layers are wired (`Wiring`); ValueError naming the family where it is not declared."""
        if self.family is None or self.family.wiring is None or not self.layers:
            raise ValueError(f"Circuits are not available for this model ({self.name}): its layers' attention, "
                             "norms and feed-forward block are not declared part by part, so they cannot be frozen")
        return self.family.wiring

    def part(self, layer: int, path: str) -> torch.nn.Module:
        """The module at `path` within layer `layer` (a `Wiring` path)."""
        return part_at(self.layers[layer], path)

    def model_part(self, model, path: str | None, base: bool = True):
        """The module at `path` from the base model (`base`) or the *ForMaskedLM, None if absent."""
        return part_at(model.base_model if base else model, path)

    @property
    def scores(self) -> ScoreCapture | None:
        return self.family.scores if self.family else None

    @property
    def through_interface(self) -> bool:
        """Whether the attention runs through transformers' attention interface (its twin then
        runs `bertdemo_attention`)."""
        return self.scores is None

    def batches(self, lengths, most: int = 10**9) -> list[list[int]]:
        """Which of the sentences of `lengths` (their token counts) share a forward: lists of their
        indices, at most `most` each, every index once, in order of first appearance. Sentences of
        any length share a padded forward, except that a padding-sensitive family shares one only
        between sentences of one length (no padding, so each answer equals the answer alone)."""
        if not self.padding_sensitive:
            return [list(range(start, min(start + most, len(lengths)))) for start in range(0, len(lengths), most)]
        by_length: dict[int, list[int]] = {}
        for i, length in enumerate(lengths):
            by_length.setdefault(int(length), []).append(i)
        return [same[start:start + most] for same in by_length.values() for start in range(0, len(same), most)]

    def require(self, part: str, view: str) -> None:
        """ValueError saying `view` needs `part`, which this model lacks."""
        if part in self.missing:
            raise ValueError(f"{view} is not available for this model ({self.name}): {self.missing[part]}")


class _Kept:
    """A model's anatomy, held by the model itself (`of`). A deep copy of the model (a tuned model,
    the attention twin) gets none, so it finds its own modules, not the original's."""

    def __init__(self, anatomy: Anatomy):
        self.anatomy = anatomy

    def __deepcopy__(self, memo) -> None:
        return None

    def __reduce__(self):
        return type(None), ()


def of(model) -> Anatomy:
    """`model`'s anatomy, found once per model object and kept on it (two threads asking at once may
    both find it: the same parts)."""
    kept = model.__dict__.get("_bertdemo_anatomy")
    if kept is None:
        kept = model.__dict__["_bertdemo_anatomy"] = _Kept(_find(model))
    return kept.anatomy


def _find(model) -> Anatomy:
    model_type = getattr(model.config, "model_type", type(model).__name__)
    family = FAMILIES.get(model_type) or discover(model)
    if family is None:
        return Anatomy(model_type, None, missing={
            "layers": f"its layers are not a layout the views know ({type(model).__name__}): only fill "
                      "mask and the views built on whole forwards work",
            "head": "its MLM head is not one the views know, so it cannot be applied at each layer"})
    base = model.base_model
    missing = {}
    layers = tuple(family.unroll(model) if family.unroll else (part_at(base, family.layers) or ()))
    attention = tuple(_attention_parts(model, layer, family) for layer in layers)
    if not layers or any(a is None for a in attention):
        missing["layers"] = f"its layers do not have the parts declared for {family.name}"
        attention = ()
    elif not family.head_views:
        missing["layers"] = family.notes
        attention = ()
    if not family.attention_weights:
        missing["attention"] = family.notes
    if not family.residual_stream:
        missing["stream"] = family.notes
    fixed = family.fixed_length(model.config) if family.fixed_length else None
    if fixed is not None:  # its attention goes through landmarks: no token-to-token weights to show
        missing["attention"] = missing["layers"] = (
            f"with {model.config.num_landmarks} landmarks for {model.config.segment_means_seq_len} positions "
            "its attention is the Nystrom approximation, not token-to-token weights or scores")
        missing["splice"] = (f"every input is padded to {fixed} positions inside its forward, so its layers' "
                             "states are not the sentence's alone")
        attention = ()
    head = family.head(model)
    if head is None:
        missing["head"] = f"its MLM head is not where {family.name} keeps it"
    return Anatomy(model_type, family, layers, attention, head, missing, fixed)


def _attention_parts(model, layer, family: Family) -> AttentionParts | None:
    module, output = part_at(layer, family.attention), part_at(layer, family.output)
    if module is None or not isinstance(output, torch.nn.Linear):
        return None
    config = model.config
    heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_heads", None)
    if not heads or output.in_features % heads:
        return None
    return AttentionParts(module, output, heads, output.in_features // heads)


# ---------------------------------------------------------------- what the views call

def mlm_head(model, linear: Callable | None = None):
    """The MLM head as a function of hidden states (N, H) -> logits (N, V), or None where unknown.
    `linear(decoder, x)` runs the decoder when it is one Linear (the lean forward's fast rows)."""
    parts = of(model).head_parts
    if parts is None:
        return None
    transform, decoder = parts
    if linear is not None and isinstance(decoder, torch.nn.Linear):
        return lambda hidden: linear(decoder, transform(hidden))
    return lambda hidden: decoder(transform(hidden))


def final_norm(model) -> Callable[[torch.Tensor], torch.Tensor]:
    """The norm a pre-LayerNorm model applies after its last layer, identity elsewhere: what a
    hidden state between layers needs before the MLM head."""
    family = of(model).family
    norm = part_at(model.base_model, family.final_norm) if family else None
    return norm if norm is not None else (lambda hidden: hidden)


def shape(model, view: str = "This view") -> tuple[int, int]:
    """(layers, heads per layer). ValueError naming what the model lacks."""
    anatomy = of(model)
    anatomy.require("layers", view)
    return len(anatomy.attention), anatomy.attention[0].heads


def calls(model) -> dict[int, list[int]]:
    """{id of a module: the layers at which the encoder calls it, in order}: one layer each,
    except a module shared across layers (ALBERT's), called once per layer that uses it."""
    found: dict[int, list[int]] = {}
    for index, parts in enumerate(of(model).attention):
        for module in {id(parts.module): parts.module, id(parts.output): parts.output}.values():
            found.setdefault(id(module), []).append(index)
    return found


def score_modules(model, index: int) -> tuple:
    """For a family with its own attention: layer `index`'s (query, key) projection modules."""
    capture = of(model).scores
    layer = of(model).layers[index]
    return part_at(layer, capture.query), part_at(layer, capture.key)


def bert_layers(model):
    """The layer list of a `lean` (BERT-layout) model."""
    return of(model).layers


# ---------------------------------------------------------------- the attention twin

def attention_twin(model) -> torch.nn.Module:
    """A copy of `model` over the same tensors (no second copy of the weights) whose attention
    gives its weights: `bertdemo_attention` for models that use transformers' attention interface,
    eager for the rest. The copy has its own config, so switching its attention never races with
    the shared model's requests."""
    shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
    twin = copy.deepcopy(model, memo=shared)
    twin.set_attn_implementation(PROBE_ATTENTION if of(model).through_interface else "eager")
    return twin


def bertdemo_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Eager attention, as every family's own `eager_attention_forward` computes it (grouped keys
    repeated, softmax in float32): query (B, heads, T, d), key and value (B, kv_heads, T, d),
    attention_mask additive (B, 1, T, T) or None -> ((B, T, heads, d), weights (B, heads, T, T)).
    `hooks`' watcher, on a module it reads, sees the queries and keys as the model scored them,
    after any rotary encoding."""
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scaling = query.size(-1) ** -0.5 if scaling is None else scaling
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask[..., :key.shape[-2]]
    weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = F.dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights, value).transpose(1, 2).contiguous()
    watch = module.__dict__.get("_bertdemo_watch")  # `hooks`' reader of the scores, on a module it reads
    if watch is not None:
        watch(module, query, key, attention_mask, scaling)
    return output, weights


AttentionInterface.register(PROBE_ATTENTION, bertdemo_attention)
AttentionMaskInterface.register(PROBE_ATTENTION, eager_mask)  # additive float masks, as eager's


def batches(model, lengths, most: int = 10**9) -> list[list[int]]:
    """`Anatomy.batches` of `model`: which sentences (by token count) may share one forward."""
    return of(model).batches(lengths, most)


# ---------------------------------------------------------------- a fixed input length

def fit_inputs(model) -> None:
    """For a family whose forward takes one fixed length (`Anatomy.fixed_length`): every call of its
    base model gets its inputs padded to that length (attention mask 0 on the padding, token ids or
    embeddings of the padding token) and its states cut back to the input's length, so every view
    calls it as any other model; where the family's forward mixed a batch's rows (`Family.rows_apart`),
    no more, so a sentence's answer in any batch is its answer alone. Once per model (`loading.load`);
    copies keep the hooks."""
    found = of(model)
    base = model.base_model
    if found.fixed_length is None or getattr(base, "_bertdemo_fixed_length", None) is not None:
        return
    base._bertdemo_fixed_length = found.fixed_length
    base.register_forward_pre_hook(_padded_to_fixed, with_kwargs=True)
    base.register_forward_hook(_cut_to_input, with_kwargs=True)
    if found.family.rows_apart is not None:
        found.family.rows_apart(found.layers)


def _padded_to_fixed(module, args, kwargs):
    import inspect

    given = inspect.signature(module.forward).bind_partial(*args, **kwargs).arguments
    given = {**given.pop("kwargs", {}), **given}
    ids, embeds = given.get("input_ids"), given.get("inputs_embeds")
    batch, length = (ids if ids is not None else embeds).shape[:2]
    fixed = module._bertdemo_fixed_length
    if length > fixed:
        raise ValueError(f"This model ({module.config.model_type}) reads at most {fixed} tokens (its landmarks "
                         f"cover a fixed length) and the input has {length}: shorten the text.")
    extra = fixed - length
    device = (ids if ids is not None else embeds).device
    pad_id = getattr(module.config, "pad_token_id", None) or 0
    mask = given.get("attention_mask")
    mask = torch.ones(batch, length, dtype=torch.long, device=device) if mask is None else mask
    # additive (B, 1, 1, fixed), as transformers 4 extended it: its landmark scores (B, heads, landmarks,
    # fixed) add it, where transformers 5's own (B, 1, fixed, fixed) mask does not broadcast
    keep = F.pad(mask, (0, extra), value=0)[:, None, None, :].to(module.dtype)
    given["attention_mask"] = (1.0 - keep) * torch.finfo(module.dtype).min
    given["attention_mask"]._bertdemo_length = length  # read back by `_cut_to_input`
    if ids is not None:
        given["input_ids"] = F.pad(ids, (0, extra), value=pad_id)
    else:
        padding = module.get_input_embeddings().weight[pad_id].to(embeds.dtype)
        given["inputs_embeds"] = torch.cat([embeds, padding.expand(batch, extra, -1)], 1)
    if given.get("token_type_ids") is not None:
        given["token_type_ids"] = F.pad(given["token_type_ids"], (0, extra), value=0)
    if given.get("position_ids") is not None:
        after = given["position_ids"][:, -1:] + torch.arange(1, extra + 1, device=device)
        given["position_ids"] = torch.cat([given["position_ids"], after], 1)
    return (), given


def _cut_to_input(module, args, kwargs, output):
    length = getattr(kwargs.get("attention_mask"), "_bertdemo_length", None)
    if length is None or not hasattr(output, "last_hidden_state"):
        return None
    output.last_hidden_state = output.last_hidden_state[:, :length]
    if output.get("hidden_states") is not None:
        output.hidden_states = tuple(h[:, :length] for h in output.hidden_states)
    return output


def declared(model) -> bool:
    """Whether `model`'s family is declared in `FAMILIES` (its views are tested against it)."""
    return getattr(model.config, "model_type", None) in FAMILIES


def guarded(view: str):
    """Decorate a service function `f(lm, ...)`: for a model whose family is not declared, any
    failure inside becomes a ValueError naming the view, the model's family and the cause (the
    visitor's to read; the log keeps the traceback). For declared families a failure is a fault
    and propagates as it is."""
    def decorate(function):
        @functools.wraps(function)
        def run(lm, *args, **kwargs):
            try:
                return function(lm, *args, **kwargs)
            except ValueError:
                raise
            except Exception as err:
                model = getattr(lm, "model", None)
                if model is None or declared(model):
                    raise
                logging.getLogger("bertdemo").warning("%s failed on %s", view, lm.name, exc_info=True)
                cause = (str(err).strip().splitlines() or [type(err).__name__])[0]
                raise ValueError(f"{view} does not work on {lm.name} ({of(model).name}; its family is not "
                                 f"declared in this demo): {type(err).__name__}: {cause}") from err
        return run
    return decorate


_VIEWS_NEEDING = {"layers": "no neuron view, heads off or head importance",
                  "attention": "no attention weights",
                  "stream": "no logit lens, corpus search or features",
                  "splice": "no features",
                  "head": "no logit lens or head importance"}


def views_line(model) -> str:
    """The views a model supports, in words, for the model card: "ModernBERT: every view", or
    what it lacks and why."""
    anatomy = of(model)
    if not anatomy.missing:
        return f"{anatomy.name}: every view"
    lacking = "; ".join(f"{_VIEWS_NEEDING[part]} ({why})" for part, why in anatomy.missing.items())
    return f"{anatomy.name}: every other view; {lacking}"

