"""The feed-forward block of each layer, read and edited per request: what a transcoder reads and writes.

Which modules make the block comes from the model anatomy (`Anatomy.wiring.mlp`: BERT's
`intermediate` then `output.dense`, ModernBERT's `mlp`): a forward pre-hook on the first reads the
block's input, a forward hook on the last reads (and may replace) its output, before the residual
add. As in `splice`, the hooks are registered once per model and act only inside `reading(...)` /
`edited(...)` in the thread that opened them: every other visitor's forward is the model's own.

    inputs, outputs = read(model, batch_inputs, [2, 3])   # {layer: (B, T, H)} each, layers counted from 1
    with edited(model, {3: lambda out, x: out + delta}):   # layer 3's block output replaced
        logits = model(**batch_inputs).logits

Layers are counted as the page counts them: layer N is the N-th layer (1..L), whose block reads
the state after its attention.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import threading
from dataclasses import dataclass, field
from typing import Callable

import torch

from . import anatomy

Edit = Callable[[torch.Tensor, torch.Tensor], "torch.Tensor | None"]  # (output, input) (B, T, H) -> output, or None


@dataclass
class _Points:
    inputs: dict[int, torch.Tensor] = field(default_factory=dict)
    outputs: dict[int, torch.Tensor] = field(default_factory=dict)
    read: frozenset = frozenset()
    edits: dict[int, Edit] = field(default_factory=dict)
    last: int | None = None  # end the forward once this layer's block output is read


class _Enough(Exception):
    pass


_ACTIVE: contextvars.ContextVar[_Points | None] = contextvars.ContextVar("bertdemo_mlp_points", default=None)
_LOCK = threading.Lock()


def check(model, view: str = "Circuits") -> int:
    """L, the number of layers whose block can be read; ValueError naming what the model lacks."""
    found = anatomy.of(model)
    wiring = found.wiring
    if any(found.part(i, path) is None for i in range(len(found.layers)) for path in wiring.mlp):
        raise ValueError(f"{view} is not available for this model ({found.name}): its feed-forward blocks are not "
                         f"where {found.name} keeps them")
    if len({id(layer) for layer in found.layers}) != len(found.layers):
        raise ValueError(f"{view} is not available for this model ({found.name}): its layers share one "
                         "feed-forward block, so a transcoder per layer has nothing of its own to replace")
    return len(found.layers)


def read(model, inputs: dict, layers: list[int], base=None) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]:
    """({layer: block input (B, T, H)}, {layer: block output (B, T, H)}) for each layer asked
    (1..L), from one forward of `model.base_model` (or `base`) that stops after the last of them."""
    points = _Points(read=frozenset(layers), last=max(layers))
    with _active(model, points):
        try:
            (base or model.base_model)(**inputs)
        except _Enough:
            pass
    return points.inputs, points.outputs


@contextlib.contextmanager
def edited(model, edits: dict[int, Edit]):
    """Inside this block, forwards of `model` in this thread pass layer N's block output through
    `edits[N](output, block input)` before the residual add."""
    with _active(model, _Points(edits=dict(edits))):
        yield


@contextlib.contextmanager
def _active(model, points: _Points):
    _instrument(model)
    token = _ACTIVE.set(points)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def _instrument(model) -> None:
    found = anatomy.of(model)
    check(model)
    with _LOCK:
        if model.__dict__.get("_bertdemo_mlp_points"):
            return
        for index, layer in enumerate(found.layers, start=1):
            first, last = found.part(index - 1, found.wiring.mlp[0]), found.part(index - 1, found.wiring.mlp[-1])
            first.register_forward_pre_hook(functools.partial(_before, layer=index))
            last.register_forward_hook(functools.partial(_after, layer=index))
        model.__dict__["_bertdemo_mlp_points"] = True


def _before(module, args, *, layer: int):
    points = _ACTIVE.get()
    if points is not None and (layer in points.read or layer in points.edits):
        points.inputs[layer] = args[0]


def _after(module, args, output, *, layer: int):
    points = _ACTIVE.get()
    if points is None:
        return None
    if layer in points.read:
        points.outputs[layer] = output
        if layer == points.last:
            raise _Enough
    edit = points.edits.get(layer)
    return None if edit is None else edit(output, points.inputs[layer])
