"""Where dictionaries are kept: the ones shipped for the bundled model, and the ones trained here,
on disk under the model's weights digest and layer, within a disk budget. Transcoders are kept
the same way, by a store of kind "transcoders" (`bertdemo/circuits/transcoders.py`).

    assets/bundled/features/layer_0 ... layer_6     shipped (training.json names the weights digest)
    ~/.cache/bertdemo/features/<digest>/layer_3     trained here (`disk.folder_of("features")`)
    assets/bundled/transcoders/layer_1 ... layer_6  the transcoders, shipped
    ~/.cache/bertdemo/transcoders/<digest>/layer_3  and trained here (`disk.folder_of("transcoders")`)

A model finds its dictionaries by its weights' digest (`LoadedModel.weights_digest`), so a restart
finds them, every visitor of that model is offered them, and a tuned model (other weights) does not
see its base's. The
dictionaries trained here are entries of the server's disk cache (`disk.DiskCache`: one budget for
every cache, least recently used out first); one being written has a temporary name until whole,
and a start removes any a killed process left.
"""
from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Callable, Hashable

from .. import disk
from ..model.caches import ModelCaches
from ..model.loading import LoadedModel
from . import dictionary as files
from .dictionary import Dictionary

SHIPPED = Path(__file__).resolve().parents[2] / "assets" / "bundled" / "features"


def shared_store(caches: ModelCaches, kind: str = "features", shipped: Path | None = SHIPPED) -> "FeatureStore":
    """The store of `kind` that every model of `caches` shares, made there once: an engine's caches
    hold the app's (the shipped dictionaries, and those trained here in the engine's disk cache); a
    model loaded in code has caches of its own, with a store in the default disk cache. What every
    call without a store uses (`shared_store(lm.caches)`)."""
    return caches.shared(kind, lambda: FeatureStore(shipped=shipped, cache=caches.disk, kind=kind))


class FeatureStore:
    """The dictionaries a server offers (see the module doc); loaded ones are kept in memory."""

    def __init__(self, folder: Path | str | None = None, shipped: Path | str | None = SHIPPED,
                 budget_mb: float | None = None, cache: disk.DiskCache | None = None, kind: str = "features"):
        """`cache`: the server's disk cache (an engine's); else one of its own in `folder` (default
        the disk cache's folder of `kind`) with `budget_mb` (default the disk cache's budget).
        `kind`: the disk cache's kind of entry ("features"; "transcoders" for the transcoders)."""
        if cache is None:
            cache = disk.DiskCache.of_kind(kind, folder, budget_mb)
            cache.remove_leftovers()
        self.cache = cache
        self.kind = kind
        self.folder = cache.folder(kind)
        cache.on_evict(self._forget)
        self.shipped = Path(shipped) if shipped is not None else None
        self._loaded: dict[tuple[str, int], Dictionary] = {}
        self._others: dict[Hashable, tuple[Path, object]] = {}  # other kinds, by key: (folder, loaded)
        self._lock = threading.Lock()

    def shipped_for(self, lm: LoadedModel) -> Path | None:
        """The shipped folder, when its dictionaries belong to `lm`'s weights."""
        record = self.shipped / "training.json" if self.shipped is not None else None
        if record is None or not record.is_file():
            return None
        return self.shipped if json.loads(record.read_text(encoding="utf-8")).get("weights") == lm.weights_digest else None

    def is_shipped(self, lm: LoadedModel, layer: int) -> bool:
        """Whether `lm`'s dictionary of `layer` is a shipped one (read-only, what every visitor reads)."""
        shipped = self.shipped_for(lm)
        return shipped is not None and (shipped / f"layer_{layer}" / "cfg.json").is_file()

    def folder_for(self, lm: LoadedModel, layer: int) -> Path:
        """Where `lm`'s dictionary of `layer` is or would be: shipped, else in the cache."""
        if self.is_shipped(lm, layer):
            return self.shipped_for(lm) / f"layer_{layer}"
        return self.folder / lm.weights_digest / f"layer_{layer}"

    def get(self, lm: LoadedModel, layer: int) -> Dictionary | None:
        """`lm`'s dictionary of `layer`, or None when it has none."""
        key = (lm.weights_digest, layer)
        with self._lock:
            found = self._loaded.get(key)
        if found is None:
            folder = self.folder_for(lm, layer)
            if not (folder / "cfg.json").is_file():
                return None
            try:
                found = files.load(folder)
            except FileNotFoundError:  # evicted while read: as if it had never been trained
                return None
            with self._lock:
                self._loaded[key] = found
        self._used(found.folder)
        return found

    def _used(self, folder: Path | None) -> None:
        """Mark a cached folder recently used (the budget keeps it longer); never the shipped ones,
        whose folder may be read-only (a Docker image's)."""
        if folder is not None and self.folder in folder.parents:
            self.cache.touch(folder)

    def layers(self, lm: LoadedModel) -> list[int]:
        """The layers `lm` has a dictionary of."""
        folders = [p for p in (self.shipped_for(lm), self.folder / lm.weights_digest) if p is not None]
        return sorted({int(p.name.split("_")[1]) for folder in folders  # one may be evicted meanwhile
                       for p in disk.matching(folder, "layer_*") if (p / "cfg.json").is_file()})

    def put(self, lm: LoadedModel, dictionary: Dictionary) -> Dictionary:
        """Save `dictionary` as `lm`'s of its layer (replacing one trained here before), then keep
        the cache within its budget. Returns it with its folder."""
        target = self.folder / lm.weights_digest / f"layer_{dictionary.layer}"
        saved = files.save(dictionary, target)
        with self._lock:
            self._loaded[(lm.weights_digest, dictionary.layer)] = saved
        self.cache.trim(keep=(target,))
        return saved

    def kept(self, key: Hashable, find: Callable[[], Path | None], load: Callable[[Path], object]):
        """A dictionary of another kind than a layer's (the [CLS] one, `cls_features`), kept as a layer's
        is: the first call finds its folder (`find()`, None: there is none, and nothing is kept) and
        loads it (`load(folder)`); later ones return it without touching the disk, until `keep`
        replaces it or the cache evicts its folder."""
        with self._lock:
            found = self._others.get(key)
        if found is None:
            folder = find()
            if folder is None:
                return None
            found = (folder, load(folder))
            with self._lock:
                self._others[key] = found
        self._used(found[0])
        return found[1]

    def keep(self, key: Hashable, folder: Path, value) -> None:
        """Keep `value`, just saved in `folder`, under `key` (what `kept` returns from now on)."""
        with self._lock:
            self._others[key] = (folder, value)

    def _forget(self, folder: Path) -> None:
        """The cache evicted `folder`: drop its loaded dictionary (one in a visitor's hands stays usable)."""
        with self._lock:
            self._loaded = {k: v for k, v in self._loaded.items() if v.folder != folder}
            self._others = {k: v for k, v in self._others.items() if v[0] != folder}
