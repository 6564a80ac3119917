"""The residual stream at a layer's output, read and edited per request: the splice point.

Layer N is the N-th layer's output, 0 being the embeddings as the first layer receives them (after
any projection to the hidden size: ALBERT's and ELECTRA's embeddings are narrower), counted as the
rest of the page counts. Which modules those are comes from the model anatomy (`anatomy.of(model)
.layers`): a forward pre-hook on the first layer reads and edits its input (layer 0), a forward
hook on every layer its output (layers 1..L). A module the encoder calls at several layers
(ALBERT's shared layer) is told apart by counting its calls within the block, as `hooks` does.

A served model is shared by every visitor, so the hooks are registered once per model and act only
inside `spliced(...)`, in the thread (or task) that opened it: everyone else's forward is the
model's own. An edit may also end the forward early (`Enough`): a view that only reads layer 3
never runs layers 4..L.

For a pre-LayerNorm family the last layer's output is before the final norm, where the next layer
would have read it; `hidden_states[L]` of transformers includes that norm.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import threading
from dataclasses import dataclass, field
from typing import Callable

import torch

from .. import validate
from . import anatomy

Edit = Callable[[torch.Tensor], "torch.Tensor | None"]  # (B, T, H) -> edited (B, T, H), or None: unchanged


class Enough(Exception):
    """Raised by an edit to end the forward where it stands (everything needed has been read)."""


@dataclass
class _Splice:
    edits: dict[int, Edit]  # layer (0 = embeddings) -> edit
    seen: dict[int, int] = field(default_factory=dict)  # module id -> calls so far in this block


_ACTIVE: contextvars.ContextVar[_Splice | None] = contextvars.ContextVar("bertdemo_splice", default=None)
_LOCK = threading.Lock()


def layer_count(model, view: str = "Features") -> int:
    """L, the number of layers (so layers 0..L can be spliced). ValueError naming what the model
    lacks when the anatomy does not know its layer stack as a residual stream."""
    found = anatomy.of(model)
    family = found.family
    if family is None or not found.layers:
        raise ValueError(f"{view} is not available for this model ({found.name}): its layers are not a "
                         "layout the views know")
    found.require("stream", view)  # Funnel pools its sequence between blocks
    found.require("splice", view)  # a fixed-length model's layers see its padding
    return len(found.layers)


def check_layer(model, layer, view: str = "Features") -> int:
    """`layer` as an int in 0..L, else a ValueError saying the range (0 = the embeddings)."""
    count = layer_count(model, view)
    return validate.whole_number(layer, "layer", 0, count, " (0 = the embeddings, "
                                 f"{count} = the last layer)", field="layer")


@contextlib.contextmanager
def spliced(model, edits: dict[int, Edit]):
    """Inside this block, forwards of `model` in this thread pass layer N's output through
    `edits[N]` (B, T, H) -> (B, T, H) before the next layer reads it. An edit that returns None
    leaves the state as it is (it only read it); one that raises `Enough` ends the forward, and
    the block swallows it: code after the forward's call, inside the block, does not run."""
    _instrument(model)
    token = _ACTIVE.set(_Splice(dict(edits)))
    try:
        yield
    except Enough:
        pass
    finally:
        _ACTIVE.reset(token)


def read(model, inputs: dict, layers: list[int], base=None) -> dict[int, torch.Tensor]:
    """{layer: (B, T, H)} for each layer asked, from one forward of `model.base_model` (or `base`,
    a module that takes `inputs`) that stops after the last of them."""
    seen: dict[int, torch.Tensor] = {}
    last = max(layers)

    def keep(layer):
        def edit(hidden):
            seen[layer] = hidden
            if layer == last:
                raise Enough
        return edit
    with spliced(model, {layer: keep(layer) for layer in layers}):
        (base or model.base_model)(**inputs)
    return seen


def _instrument(model) -> None:
    """Register the pre-hook on the first layer and a hook on every distinct layer module, once."""
    layers = anatomy.of(model).layers
    with _LOCK:
        if model.__dict__.get("_bertdemo_spliced"):
            return
        calls: dict[int, list[int]] = {}
        for index, module in enumerate(layers):
            calls.setdefault(id(module), []).append(index + 1)
        for module in {id(m): m for m in layers}.values():
            module.register_forward_hook(functools.partial(_after_layer, layers=calls[id(module)]))
        layers[0].register_forward_pre_hook(_before_first, with_kwargs=True)
        model.__dict__["_bertdemo_spliced"] = True


def _before_first(module, args, kwargs):
    splice = _ACTIVE.get()
    if splice is None or 0 not in splice.edits or splice.seen.get(-id(module)):
        return None
    splice.seen[-id(module)] = 1  # a shared first layer is called again at later layers
    if args:
        edited = splice.edits[0](args[0])
        return None if edited is None else ((edited, *args[1:]), kwargs)
    edited = splice.edits[0](kwargs["hidden_states"])
    return None if edited is None else (args, {**kwargs, "hidden_states": edited})


def _after_layer(module, args, output, *, layers: list[int]):
    splice = _ACTIVE.get()
    if splice is None:
        return None
    count = splice.seen.get(id(module), 0)
    splice.seen[id(module)] = count + 1
    layer = layers[count % len(layers)]
    if layer not in splice.edits:
        return None
    hidden = output[0] if isinstance(output, tuple) else output
    edited = splice.edits[layer](hidden)
    if edited is None:
        return None
    return (edited, *output[1:]) if isinstance(output, tuple) else edited
