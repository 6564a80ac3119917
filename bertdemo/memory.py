"""The C allocator's share of the server's memory, kept in check.

A run trains in a worker thread of its own (`runs.Run`). glibc's malloc gives each new thread an
arena of its own (up to 8 per core) and keeps what is freed there for that arena's next use: a
fine-tune's activations and optimizer state, freed when it ends, stay resident. With requests
served meanwhile by other threads, every run lands in a different arena and the server's memory
climbs run after run (a soak: 1 GB -> 4 GB in 4 minutes, fine-tunes and traffic together). Two
arenas and a trim after each run slow the climb but do not stop it (bert-base-sized 4 layers,
300 s: +80 to +120 MB per fine-tune between runs). jemalloc (Debian's libjemalloc2) returns freed
pages on its own and keeps it level (same soak: flat between runs). So `python app.py` runs under
jemalloc where it is installed, and falls back to glibc with the cap and trims where it is not;
none of this changes what any request computes.

    exec_with_jemalloc(argv)   # first thing in app.py: re-exec under jemalloc (same pid) if found
    cap_arenas()               # then, before threads start; MALLOC_ARENA_MAX in the env wins
    trim()                     # after a run: freed memory of every glibc arena back to the system

BERTDEMO_MALLOC=glibc keeps glibc's malloc. The glibc calls do nothing where the C library is not
glibc (musl, macOS, Windows), and are harmless under jemalloc. Only the standard library is
imported here: app.py loads this file before torch.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys

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
