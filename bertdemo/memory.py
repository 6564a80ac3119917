"""The C allocator's share of the server's memory, kept in check.

A run trains in a worker thread of its own (`runs.life.Run`). glibc's malloc gives each new thread an
arena of its own (up to 8 per core) and keeps what is freed there for that arena's next use: a
fine-tune's activations and optimizer state, freed when it ends, stay resident. With requests
served meanwhile by other threads, every run lands in a different arena and the server's memory
climbs run after run (a soak: 1 GB -> 4 GB in 4 minutes, fine-tunes and traffic together). Two
arenas and a trim after each run slow the climb but do not stop it (bert-base-sized 4 layers,
300 s: +80 to +120 MB per fine-tune between runs). jemalloc (Debian's libjemalloc2) returns freed
pages on its own and keeps it level (same soak: flat between runs). So `python app.py` runs under
jemalloc where it is installed, and falls back to glibc with the cap and trims where it is not;
none of this changes what any request computes.

Python's own cyclic collector at start: importing torch, transformers and Gradio makes some 570,000
objects that live as long as the server, and each full collection walks all of them again: 11 while
app.py imports (1.2-1.5 s of its 5.7 s of CPU on an AMD EPYC), then one every so often while it
serves (0.3-0.4 s each, in some request's way). app.py holds the collector off while it starts
(`hold_gc`), then collects once and freezes what is left (`freeze_started`): the frozen objects are
never walked again (`gc.freeze`), and everything made later is collected as before.

    exec_with_jemalloc(argv)   # first thing in app.py: re-exec under jemalloc (same pid) if found
    hold_gc()                  # then, before the imports; freeze_started() once the app is built
    cap_arenas()               # then, before threads start; MALLOC_ARENA_MAX in the env wins
    trim()                     # after a run: freed memory of every glibc arena back to the system
    with pages_kept(): ...     # a training run: jemalloc keeps its freed pages until the block ends,
                               # then hands them all back (purge)

BERTDEMO_MALLOC=glibc keeps glibc's malloc. The glibc calls do nothing where the C library is not
glibc (musl, macOS, Windows), and are harmless under jemalloc. Only the standard library is
imported here: app.py imports it before torch (the package loads its modules lazily).
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import glob
import os
import sys
import threading

M_ARENA_MAX = -8  # glibc's malloc.h
DEFAULT_ARENAS = 2
_libc = None


def _glibc():
    """glibc's handle, or None elsewhere (looked up once)."""
    global _libc
    if _libc is None:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _libc = libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else False
        except OSError:
            _libc = False
    return _libc or None


def cap_arenas(arenas: int = DEFAULT_ARENAS, environ: dict | None = None) -> int | None:
    """Let malloc use at most `arenas` arenas from now on; returns the cap in force, or None where
    it cannot be set. An operator's MALLOC_ARENA_MAX (read by glibc at startup) is left alone."""
    environ = os.environ if environ is None else environ
    if environ.get("MALLOC_ARENA_MAX"):
        return int(environ["MALLOC_ARENA_MAX"])
    libc = _glibc()
    if libc is None or libc.mallopt(M_ARENA_MAX, arenas) != 1:
        return None
    return arenas


def trim() -> bool:
    """Give the memory freed in every arena back to the system (glibc's malloc_trim: a few ms).
    True if some was released."""
    libc = _glibc()
    return bool(libc is not None and libc.malloc_trim(0))


# ---------------------------------------------------------------- Python's collector at start

def hold_gc() -> None:
    """No cyclic collection from now until `freeze_started`: the imports and the start only make
    objects the server keeps, and each full collection would walk every one made so far."""
    gc.disable()


def freeze_started() -> None:
    """Once the app is built: collect what its start left in cycles (once), move every object that
    survives out of the collector's sight for good (`gc.freeze`: modules, classes, the app, the
    base model; all kept till the process ends), and let the collector run again for what comes."""
    gc.collect()
    gc.freeze()
    gc.enable()


# ---------------------------------------------------------------- jemalloc

JEMALLOC_GLOBS = ("/usr/lib/*-linux-gnu/libjemalloc.so.2", "/usr/lib64/libjemalloc.so.2",
                  "/usr/local/lib/libjemalloc.so.2", "/opt/homebrew/lib/libjemalloc.2.dylib")


def jemalloc_library() -> str | None:
    """Path of an installed jemalloc (Debian/Ubuntu: libjemalloc2), or None."""
    for pattern in JEMALLOC_GLOBS:
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


def allocator() -> str:
    """The malloc this process runs on: "jemalloc" if it is mapped in, else "glibc" (or the
    platform's)."""
    try:
        maps = open("/proc/self/maps").read()
    except OSError:
        return "system"
    return "jemalloc" if "libjemalloc" in maps else "glibc"


def jemalloc_environ(environ: dict, library: str | None) -> dict | None:
    """The environment to re-exec with so that `library` (jemalloc) is preloaded, or None when
    nothing is to be done: no library, already preloaded, or BERTDEMO_MALLOC=glibc."""
    if library is None or environ.get("BERTDEMO_MALLOC", "").lower() in ("glibc", "system"):
        return None
    preloaded = environ.get("LD_PRELOAD", "")
    if "libjemalloc" in preloaded:
        return None
    return {**environ, "LD_PRELOAD": f"{library} {preloaded}".strip(), "BERTDEMO_MALLOC": "jemalloc"}


def exec_with_jemalloc(argv: list[str]) -> None:
    """Replace this process (same pid, same arguments) by one with jemalloc preloaded, when one is
    installed and not in use yet; returns only when nothing is to be done. Call it before anything
    else is loaded: the preload must come before the first malloc of the new process, and the
    exec throws away whatever this one loaded."""
    if allocator() == "jemalloc":
        return
    environ = jemalloc_environ(dict(os.environ), jemalloc_library())
    if environ is not None and environ.get("BERTDEMO_MALLOC") == "jemalloc" and "BERTDEMO_REEXECED" not in environ:
        environ["BERTDEMO_REEXECED"] = "1"  # never twice, even if the preload did not take
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable, *argv], environ)


# ---------------------------------------------------------------- a training run's pages

_DECAYS = ("dirty_decay_ms", "muzzy_decay_ms")
ALL_ARENAS = 4096  # jemalloc's MALLCTL_ARENAS_ALL: "arena.4096.purge" purges every arena
_kept_lock = threading.Lock()
_kept_runs = 0
_kept_saved: dict[str, int] = {}


def _mallctl():
    """jemalloc's `mallctl` when this process runs on jemalloc, else None."""
    if allocator() != "jemalloc":
        return None
    try:
        return ctypes.CDLL(None).mallctl  # the preloaded library's symbols are global
    except (OSError, AttributeError):
        return None


def _decay_names(mallctl) -> list[str]:
    """The decay settings of every arena there is, and the default for arenas made later."""
    count, size = ctypes.c_uint(0), ctypes.c_size_t(ctypes.sizeof(ctypes.c_uint))
    if mallctl(b"arenas.narenas", ctypes.byref(count), ctypes.byref(size), None, 0) != 0:
        return []
    return [f"arenas.{d}" for d in _DECAYS] + [f"arena.{i}.{d}" for i in range(count.value) for d in _DECAYS]


def _swap_decay(mallctl, name: str, value: int) -> int | None:
    """Set one decay setting; its old value, or None where it does not exist (an arena not made)."""
    old, size = ctypes.c_ssize_t(0), ctypes.c_size_t(ctypes.sizeof(ctypes.c_ssize_t))
    new = ctypes.c_ssize_t(value)
    if mallctl(name.encode(), ctypes.byref(old), ctypes.byref(size), ctypes.byref(new), ctypes.sizeof(new)) != 0:
        return None
    return old.value


@contextlib.contextmanager
def pages_kept():
    """Inside the block, jemalloc keeps the pages that are freed (its decay set to -1) and hands
    them out again; when the last such block ends the old decay comes back and every unused page
    goes back to the system at once (`purge`). A training step frees and allocates its activations
    and gradients (GBs) anew: with jemalloc's default decay, and its arena for large sizes purging
    at once, each step paid a page fault per fresh page (bert-base, 8 x 128 on 2 vCPUs: 300
    tokens/s against 400 with pages kept). Does nothing under glibc.

    The purge matters for runs back to back: restoring the decay alone returns the kept pages only
    over the next ~10 s (jemalloc's dirty decay), so a run starting within seconds set the decay
    to -1 again while the last run's pages were still held, in its arena or (its thread a new one)
    in another, and the traffic's pages with them: the server's memory stayed at its high-water
    mark and climbed as runs landed in other arenas."""
    global _kept_runs
    mallctl = _mallctl()
    if mallctl is None:
        yield
        return
    with _kept_lock:
        _kept_runs += 1
        if _kept_runs == 1:
            for name in _decay_names(mallctl):
                old = _swap_decay(mallctl, name, -1)
                if old is not None:
                    _kept_saved[name] = old
    try:
        yield
    finally:
        with _kept_lock:
            _kept_runs -= 1
            if _kept_runs == 0:
                for name, old in _kept_saved.items():
                    _swap_decay(mallctl, name, old)
                _kept_saved.clear()
                purge(mallctl)


def purge(mallctl=None) -> bool:
    """Return every unused page of every jemalloc arena to the system now (tens of ms per GB);
    False under glibc."""
    mallctl = mallctl or _mallctl()
    return mallctl is not None and mallctl(f"arena.{ALL_ARENAS}.purge".encode(), None, None, None, 0) == 0
