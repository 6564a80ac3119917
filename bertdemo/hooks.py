"""Per-request hooks on a shared model: attention heads switched off, one layer's queries and keys read.

A served model is shared by every visitor, so nothing here changes it for anyone else. The hooks
are registered once per module tree (`instrument`) and read what to do from a ContextVar that only
`probed(...)` sets, in the thread (or task) that asked and only for the duration of its block: in
every other request, and outside the block, each hook returns at once and the forward is the
model's own.

- On each layer's attention output projection (BERT's `attention.output.dense`, DistilBERT's
  `out_lin`) a forward pre-hook multiplies each head's slice of its input, the heads' outputs side
  by side (B, T, heads * head_dim), by a factor, 0 for a head switched off: what transformers'
  `head_mask=0` did. Factors may differ per batch row, so one batch can hold copies of a sentence
  with different heads off (`heads.head_importance`).
- On each layer's query and key projections a forward hook keeps their outputs (B, T, heads *
  head_dim) for the layer asked (`heads.neuron_view`).

The lean forward (`lean_forward.hidden_at`) calls the linear kernels itself, past these hooks, so
it steps aside while a probe is active (`active`).
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import threading
from dataclasses import dataclass, field

import torch

FAMILIES = "BERT, DistilBERT and RoBERTa-style models"


@dataclass(frozen=True)
class AttentionLayer:
    """The modules of one layer's self-attention that the hooks act on, and its shape."""

    query: torch.nn.Linear
    key: torch.nn.Linear
    output: torch.nn.Linear  # the projection after the heads: its input is the heads side by side
    heads: int
    head_dim: int


def layer_stack(model) -> torch.nn.ModuleList:
    """The encoder's layers of a *ForMaskedLM, each called as `layer(hidden (B, T, H), mask)`.
    ValueError for an architecture whose attention these hooks do not know."""
    base = getattr(model, "base_model", model)
    for parent in ("encoder", "transformer"):  # BERT, RoBERTa, XLM-R, ELECTRA; DistilBERT
        stack = getattr(getattr(base, parent, None), "layer", None)
        if isinstance(stack, torch.nn.ModuleList) and len(stack):
            return stack
    raise ValueError(f"{type(model).__name__} has no layers the heads views know: use one of the {FAMILIES}.")


def attention_layers(model) -> list[AttentionLayer]:
    """Per layer, its query, key and output projections and its heads. ValueError for other
    architectures."""
    found = []
    for layer in layer_stack(model):
        attention = getattr(layer, "attention", None)
        inner = getattr(attention, "self", None)
        if inner is not None and hasattr(attention, "output"):  # BertAttention and its copies
            found.append(AttentionLayer(inner.query, inner.key, attention.output.dense,
                                        inner.num_attention_heads, inner.attention_head_size))
        elif hasattr(attention, "q_lin"):  # DistilBertSelfAttention
            found.append(AttentionLayer(attention.q_lin, attention.k_lin, attention.out_lin,
                                        attention.n_heads, attention.attention_head_size))
        else:
            raise ValueError(f"{type(model).__name__}'s attention is not one the heads views know: "
                             f"use one of the {FAMILIES}.")
    return found


@dataclass
class _Probe:
    off: dict[int, torch.Tensor]  # layer -> factors (B or 1, heads) on each head's output
    capture: int | None  # the layer whose query and key projections are kept
    captured: dict[str, torch.Tensor] = field(default_factory=dict)


_ACTIVE: contextvars.ContextVar[_Probe | None] = contextvars.ContextVar("bertdemo_probe", default=None)
_LOCK = threading.Lock()


def active() -> bool:
    """Whether this thread (or task) is inside `probed`: the forward must call the hooked modules."""
    return _ACTIVE.get() is not None


@contextlib.contextmanager
def probed(model, off: dict[int, torch.Tensor] | None = None, capture: int | None = None):
    """Inside this block, forwards of `model` in this thread switch heads off by the factors in
    `off` ({layer: (B or 1, heads)}: 0 switches a head off, 1 keeps it) and keep layer `capture`'s
    query and key projections in the dict it yields ({"query", "key"}: (B, T, heads * head_dim))."""
    instrument(model)
    probe = _Probe(off or {}, capture)
    token = _ACTIVE.set(probe)
    try:
        yield probe.captured
    finally:
        _ACTIVE.reset(token)


def factors(heads, layers: list[AttentionLayer], device, rows: int = 1) -> dict[int, torch.Tensor]:
    """{layer: (rows, heads) ones with a 0 for each (layer, head) in `heads`}, for the layers
    that have one."""
    off: dict[int, torch.Tensor] = {}
    for layer, head in heads:
        off.setdefault(layer, torch.ones(rows, layers[layer].heads, device=device))[:, head] = 0.0
    return off


def switched_off(lm, model=None):
    """The block in which `model` (default `lm.model`) runs with the view's heads switched off
    (`lm.heads_off`, from `heads.heads_off`); nothing at all for a model with every head on."""
    if not lm.heads_off:
        return contextlib.nullcontext()
    model = lm.model if model is None else model
    return probed(model, factors(lm.heads_off, attention_layers(model), lm.device))


def instrument(model) -> None:
    """Register the hooks on `model`'s attention modules, once per module tree (a deep
    copy, such as the attention views' eager twin, keeps them). They do nothing outside `probed`."""
    layers = attention_layers(model)
    with _LOCK:
        if any(getattr(h, "func", None) is _scale_heads for h in layers[0].output._forward_pre_hooks.values()):
            return
        for i, layer in enumerate(layers):
            scale = functools.partial(_scale_heads, layer=i, head_dim=layer.head_dim)
            layer.output.register_forward_pre_hook(scale)
            layer.query.register_forward_hook(functools.partial(_keep, layer=i, kind="query"))
            layer.key.register_forward_hook(functools.partial(_keep, layer=i, kind="key"))


def _scale_heads(module, args, *, layer: int, head_dim: int):
    probe = _ACTIVE.get()
    if probe is None or layer not in probe.off:
        return None
    heads = args[0]  # (B, T, heads * head_dim)
    scale = probe.off[layer].to(heads.dtype).repeat_interleave(head_dim, dim=-1)  # (B or 1, heads * head_dim)
    return (heads * scale[:, None, :], *args[1:])


def _keep(module, args, output, *, layer: int, kind: str):
    probe = _ACTIVE.get()
    if probe is not None and probe.capture == layer:
        probe.captured[kind] = output.detach()
