"""What requests reuse between them, kept per model and freed with it (`ModelCaches`)."""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Callable, Hashable

import torch

from ..forward import lean_forward
from . import digest as digests


class ModelCaches:
    """What requests reuse between them, whoever sends them, kept per model and freed with it:

    - `packed`: linear weights packed for oneDNN (`lean_forward.PackedWeights`), per weight tensor;
    - `twin(model, make)`: a companion of the model made once, e.g. its eager-attention twin;
    - `remember(model, key, value)` / `recall(model, key)`: the last `recent` results per model,
      e.g. the first step of a joint fill, as the fill-mask forward saw it;
    - `set_onnx(model, encoder)` / `onnx_for(model)`: its ONNX Runtime forward
      (`onnx_engine.OnnxMaskedLM`), only while it computes the model as it is now;
    - `digest(model)`: its weights digest (`digest.weights_digest`), remembered while none of its
      weights changes in place (an optimizer step bumps a tensor's version);
    - `shared(name, make)`: what every model of these caches shares, made once: the feature and
      transcoder stores (`features.store.shared_store`), in `disk`, the holder's disk cache.

    An `engine.Engine` holds one for every model it serves (its `disk` the engine's); a model made in
    code gets its own (`disk` None: the default disk cache).
    """

    def __init__(self, recent: int = 256, disk=None):
        self.packed = lean_forward.PackedWeights()
        self.recent = recent
        self.disk = disk  # a `disk.DiskCache`: the engine's; None, the default one
        self._shared: dict[str, object] = {}
        self._twins: "weakref.WeakKeyDictionary[torch.nn.Module, torch.nn.Module]" = weakref.WeakKeyDictionary()
        self._results: "weakref.WeakKeyDictionary[torch.nn.Module, OrderedDict]" = weakref.WeakKeyDictionary()
        self._onnx: "weakref.WeakKeyDictionary[torch.nn.Module, object]" = weakref.WeakKeyDictionary()
        self._digests: "weakref.WeakKeyDictionary[torch.nn.Module, tuple]" = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def set_onnx(self, model: torch.nn.Module, encoder) -> None:
        with self._lock:
            self._onnx[model] = encoder

    def onnx_for(self, model: torch.nn.Module):
        """`model`'s ONNX Runtime forward if it has one that matches its weights now, else None."""
        with self._lock:
            encoder = self._onnx.get(model)
        return encoder if encoder is not None and encoder.matches(model) else None

    def digest(self, model: torch.nn.Module) -> str:
        """`model`'s weights digest, hashed again only when a weight has changed since."""
        now = lean_forward.stamp(model.parameters())
        with self._lock:
            known = self._digests.get(model)
        if known is not None and known[0] == now:
            return known[1]
        value = digests.weights_digest(model)  # outside the lock: it reads every weight
        with self._lock:
            self._digests[model] = (now, value)
        return value

    def shared(self, name: str, make: Callable[[], object]):
        """`make()`, made once for every model of these caches (under a lock: concurrent first
        callers share one)."""
        with self._lock:
            if name not in self._shared:
                self._shared[name] = make()
            return self._shared[name]

    def twin(self, model: torch.nn.Module, make: Callable[[torch.nn.Module], torch.nn.Module]):
        """`make(model)`, made once per model (under a lock: concurrent first callers share one)."""
        with self._lock:
            if model not in self._twins:
                self._twins[model] = make(model)
            return self._twins[model]

    def remember(self, model: torch.nn.Module, key: Hashable, value) -> None:
        with self._lock:
            kept = self._results.setdefault(model, OrderedDict())
            kept[key] = value
            kept.move_to_end(key)
            while len(kept) > self.recent:
                kept.popitem(last=False)

    def recall(self, model: torch.nn.Module, key: Hashable):
        """What `remember` kept for `model` under `key`, or None."""
        with self._lock:
            return self._results.get(model, {}).get(key)
