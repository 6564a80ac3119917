"""Per-request hooks on a shared model: attention heads switched off, one layer's scores read.

A served model is shared by every visitor, so nothing here changes it for anyone else. The hooks
are registered once per module tree (`instrument`) and read what to do from a ContextVar that only
`probed(...)` sets, in the thread (or task) that asked and only for the duration of its block: in
every other request, and outside the block, each hook returns at once and the forward is the
model's own. Which modules they sit on comes from the model anatomy (`anatomy`):

- On each layer's attention output projection a forward pre-hook multiplies each head's slice of
  its input, the heads' outputs side by side (B, T, heads * head_dim), by a factor, 0 for a head
  switched off: what transformers' `head_mask=0` did. Factors may differ per batch row, so one
  batch can hold copies of a sentence with different heads off (`heads.head_importance`).
- For the layer asked, the queries and keys as the model scores them (B, heads, T, head_dim),
  the scale on their products, any further score term (B, heads, T, T) and the additive mask:
  read inside `anatomy.bertdemo_attention` on the attention twin for families that use
  transformers' attention interface, from the projections and the attention module's call for
  the others (`anatomy.ScoreCapture`).

A module the encoder calls at several layers (ALBERT shares one layer) is told apart by counting
its calls within the block: its n-th call is the n-th layer that uses it.

The lean forward (`lean_forward.hidden_at`) calls the linear kernels itself, past these hooks, so
it steps aside while a probe is active (`active`).
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import threading
from dataclasses import dataclass, field

import torch

from . import anatomy


@dataclass
class _Probe:
    off: dict[int, torch.Tensor]  # layer -> factors (B or 1, heads) on each head's output
    capture: int | None  # the layer whose scores are kept
    captured: dict = field(default_factory=dict)
    seen: dict[tuple[int, str], int] = field(default_factory=dict)  # (module id, role) -> calls so far

    def layer_of(self, module, role: str, layers: list[int]) -> int:
        """Which layer this call of `module` is: its n-th call within the block is layers[n]."""
        key = (id(module), role)
        count = self.seen.get(key, 0)
        self.seen[key] = count + 1
        return layers[count % len(layers)]


_ACTIVE: contextvars.ContextVar[_Probe | None] = contextvars.ContextVar("bertdemo_probe", default=None)
_LOCK = threading.Lock()


def active() -> bool:
    """Whether this thread (or task) is inside `probed`: the forward must call the hooked modules."""
    return _ACTIVE.get() is not None


@contextlib.contextmanager
def probed(model, off: dict[int, torch.Tensor] | None = None, capture: int | None = None):
    """Inside this block, forwards of `model` in this thread switch heads off by the factors in
    `off` ({layer: (B or 1, heads)}: 0 switches a head off, 1 keeps it) and keep layer `capture`'s
    scores in the dict it yields: {"query", "key": (B, heads, T, d) as scored, "scale": float,
    "extra": (B, heads, T, T) or None, "mask": additive (B, 1, T, T) or None}."""
    instrument(model)
    probe = _Probe(off or {}, capture)
    token = _ACTIVE.set(probe)
    try:
        yield probe.captured
    finally:
        _ACTIVE.reset(token)


def factors(heads, model, device, rows: int = 1) -> dict[int, torch.Tensor]:
    """{layer: (rows, heads) ones with a 0 for each (layer, head) in `heads`}, for the layers
    that have one."""
    parts = anatomy.of(model).attention
    off: dict[int, torch.Tensor] = {}
    for layer, head in heads:
        off.setdefault(layer, torch.ones(rows, parts[layer].heads, device=device))[:, head] = 0.0
    return off


def switched_off(lm, model=None):
    """The block in which `model` (default `lm.model`) runs with the view's heads switched off
    (`lm.heads_off`, from `heads.heads_off`); nothing at all for a model with every head on."""
    if not lm.heads_off:
        return contextlib.nullcontext()
    model = lm.model if model is None else model
    return probed(model, factors(lm.heads_off, model, lm.device))


def instrument(model) -> None:
    """Register the hooks on `model`'s attention modules, once per module tree. They do nothing
    outside `probed`. ValueError for a model whose layers the anatomy does not know."""
    found = anatomy.of(model)
    found.require("layers", "Switching heads off or reading a head's scores")
    with _LOCK:
        if model.__dict__.get("_bertdemo_hooked"):
            return
        calls = anatomy.calls(model)
        outputs = {id(p.output): p for p in found.attention}
        for part in outputs.values():
            part.output.register_forward_pre_hook(functools.partial(
                _scale_heads, layers=calls[id(part.output)], head_dim=part.head_dim))
        if found.through_interface:
            modules = {id(p.module): p.module for p in found.attention}
            for module in modules.values():
                module.__dict__["_bertdemo_layers"] = calls[id(module)]
                module.__dict__["_bertdemo_watch"] = _watch_interface  # anatomy.bertdemo_attention calls it
        else:
            _hook_own_attention(model, found, calls)
        model.__dict__["_bertdemo_hooked"] = True


def _hook_own_attention(model, found: anatomy.Anatomy, calls: dict[int, list[int]]) -> None:
    """Forward hooks on each layer's query and key projections and a pre-hook on its attention
    module (whose call's arguments carry position terms), for families with their own attention."""
    for index, part in enumerate(found.attention):
        query, key = anatomy.score_modules(model, index)
        query.register_forward_hook(functools.partial(_keep, layer=index, kind="query"))
        key.register_forward_hook(functools.partial(_keep, layer=index, kind="key"))
        signature = inspect.signature(part.module.forward)
        part.module.register_forward_pre_hook(functools.partial(_keep_call, layer=index, signature=signature),
                                              with_kwargs=True)


def _scale_heads(module, args, *, layers: list[int], head_dim: int):
    probe = _ACTIVE.get()
    if probe is None:
        return None
    layer = probe.layer_of(module, "output", layers)
    if layer not in probe.off:
        return None
    heads = args[0]  # (B, T, heads * head_dim)
    scale = probe.off[layer].to(heads.dtype).repeat_interleave(head_dim, dim=-1)  # (B or 1, heads * head_dim)
    return (heads * scale[:, None, :], *args[1:])


def _keep(module, args, output, *, layer: int, kind: str):
    probe = _ACTIVE.get()
    if probe is not None and probe.capture == layer:  # the first call: DeBERTa projects positions too
        probe.captured.setdefault(kind, output.detach())


def _keep_call(module, args, kwargs, *, layer: int, signature):
    probe = _ACTIVE.get()
    if probe is not None and probe.capture == layer:
        bound = signature.bind_partial(*args, **kwargs)
        probe.captured.setdefault("call", (module, dict(bound.arguments)))


def _watch_interface(module, query, key, mask, scaling) -> None:
    """Inside `anatomy.bertdemo_attention`: keep the asked layer's queries and keys as scored."""
    probe = _ACTIVE.get()
    layers = module.__dict__.get("_bertdemo_layers")
    if probe is None or layers is None:
        return
    if probe.layer_of(module, "scores", layers) == probe.capture:
        probe.captured.update(query=query.detach(), key=key.detach(), scale=float(scaling), extra=None,
                              mask=None if mask is None else mask.detach())


def scores_of(model, captured: dict) -> dict:
    """The captured layer's {"query", "key": (B, heads, T, d), "scale", "extra", "mask"}, for a
    family with its own attention put in the form `_watch_interface` keeps."""
    if "scale" in captured:
        return captured
    capture = anatomy.of(model).scores
    if capture is None or not {"call", "query", "key"} <= captured.keys():
        raise ValueError(f"{anatomy.of(model).name} computed this layer's scores where the views cannot read "
                         "them, so the neuron view cannot show them.")
    module, arguments = captured["call"]
    heads = next(p.heads for p in anatomy.of(model).attention if p.module is module)
    split = lambda x: x.view(*x.shape[:2], heads, -1).transpose(1, 2)  # noqa: E731 - (B, T, h*d) -> (B, h, T, d)
    query, key = split(captured["query"]), split(captured["key"])
    if capture.prepare is not None:
        query, key = capture.prepare(module, arguments, query, key)
    extra = capture.extra(module, arguments, query, key) if capture.extra is not None else None
    return {"query": query, "key": key, "scale": capture.scale(module, query.shape[-1]),
            "extra": None if extra is None else extra.detach(), "mask": None}
