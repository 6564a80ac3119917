"""One thread that runs the served models' forwards on a CPU: loading, warm-up, every micro-batch.

Why a thread of its own: torch runs its CPU operations on OpenMP (GNU libgomp in the PyPI wheels),
and libgomp gives each thread that calls torch a team of worker threads of its own. Between two
operations of a forward the workers spin (a few ms) while no more threads than cores belong to
teams; once more do, they go to sleep at once and every operation pays for waking them. The web
server hands each request to one of its worker threads, so forwards run from whichever thread
led a batch left a team in each, and every forward after ran that slower way. Run from one
thread, they keep one team. Measured on an AMD EPYC (2 vCPUs), bert-base, the same forwards
interleaved in one process: one sentence of 9 tokens 23.4 ms from one thread against 28.9 ms from
16 threads in turn, four short sentences 47.6 against 53.9 ms. ONNX Runtime keeps its own pool
and does not care which thread calls it.

Only what the engine runs goes here (`Engine`: loading a model, its warm-up, the micro-batcher's
forwards, torch's side of the ONNX Runtime timing); a view that runs its own forward (attention,
attributions, a fine-tune's thread) still makes a team of its own, for as long as its thread
lives (the web server's idle worker threads end after a few seconds). Calls run one at a time,
as the micro-batcher already ran its batches; a call made from the thread itself runs at once.
Written by hand: a one-worker `ThreadPoolExecutor` plus that re-entry, nothing more.

Kept spinning, the workers also spin after a forward's last operation, ~3 ms by libgomp's default,
taking a core from what comes next: the web server's answers, or an ONNX Runtime forward (one
sentence) right after a torch one (a crowd). `short_openmp_spin` sets `GOMP_SPINCOUNT` to 30,000
(~0.3 ms), long enough to bridge the Python between two operations of a forward: measured on an AMD
EPYC (2 vCPUs), bert-base, four sentences 47.9-48.3 ms against 47.6-48.2 in one process; in the app
(`bench/bench_viewers.py`) the gradio_client crowd, which mixes both forwards, 0.81x and 0.95x the
time of `--no-onnx` against 1.15x, 1.12x and 1.00x without it, and the server's CPU per light crowd
147-151 ms against 154-162. libgomp reads it once, when torch is loaded: app.py sets it first.
"""
from __future__ import annotations

import os
import threading
from collections.abc import MutableMapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

OPENMP_SPIN = "30000"  # GOMP_SPINCOUNT: ~0.3 ms of spinning after an operation instead of ~3 ms


def short_openmp_spin(environ: MutableMapping[str, str] = os.environ) -> None:
    """Before torch is loaded: its OpenMP workers spin `OPENMP_SPIN` iterations after an operation
    (see the module doc), unless the environment already says how long."""
    environ.setdefault("GOMP_SPINCOUNT", OPENMP_SPIN)


class ComputeThread:
    """Runs callables on one long-lived thread, started at the first call (see the module doc)."""

    def __init__(self, name: str = "bertdemo-compute"):
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._ident: int | None = None

    def run(self, fn: Callable[..., Any], *args, **kwargs) -> Any:
        """`fn(*args, **kwargs)` on the compute thread, waiting for it; what it raises is raised
        here. From the compute thread itself (a forward that asks for another), at once."""
        if threading.get_ident() == self._ident:
            return fn(*args, **kwargs)
        return self._executor.submit(self._called, fn, args, kwargs).result()

    def submit(self, fn: Callable[..., Any], *args, **kwargs) -> Future:
        """`fn(*args, **kwargs)` on the compute thread, without waiting: its Future."""
        return self._executor.submit(self._called, fn, args, kwargs)

    def _called(self, fn, args, kwargs):
        self._ident = threading.get_ident()
        return fn(*args, **kwargs)

    def close(self) -> None:
        """End the thread once what was asked of it is done."""
        self._executor.shutdown(wait=False)
