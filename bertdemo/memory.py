"""The C allocator's share of the server's memory, kept in check.

A run trains in a worker thread of its own (`runs.Run`). glibc's malloc gives each new thread an
arena of its own (up to 8 per core) and keeps what is freed there for that arena's next use: a
fine-tune's activations and optimizer state, freed when it ends, stay resident. With requests
served meanwhile by other threads, every run lands in a different arena and the server's memory
climbs run after run (a soak: 1 GB -> 4 GB in 4 minutes, fine-tunes and traffic together). Two
arenas and a trim after each run keep it level; neither changes what any request computes.

    cap_arenas()   # at startup, before threads start (app.py); MALLOC_ARENA_MAX in the env wins
    trim()         # after a run: freed memory of every arena back to the system

Both do nothing where the C library is not glibc (musl, macOS, Windows).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os

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
