"""Which model each browser session sees: the shared base model unless it switched to its own.

A session may hold one fine-tuned model. At most `max_tuned` stay in memory across all sessions:
adding one past the cap evicts the least recently used (another session's), which then falls
back to the base. A session also holds its fine-tune run's stop flag (one run at a time) and a
temp folder for downloads; `drop` frees all of it when the browser tab closes.
"""
from __future__ import annotations

import shutil
import tempfile
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from .models import LoadedModel

DEFAULT_MAX_TUNED = 8


@dataclass
class _Session:
    tuned: LoadedModel | None = None
    use_tuned: bool = False
    evicted: bool = False  # its tuned model was evicted to make room for another's
    stop: threading.Event | None = None  # the stop flag of its reserved or running fine-tune
    folder: Path | None = None  # its downloads


class ModelStore:
    """The base model (shared, read-only) plus per-session tuned models, keyed by session id."""

    def __init__(self, base: LoadedModel | None, load_error: str | None = None,
                 max_tuned: int = DEFAULT_MAX_TUNED):
        if max_tuned < 1:
            raise ValueError(f"max_tuned must be at least 1, got {max_tuned}.")
        self.base = base
        self.load_error = load_error  # why `base` is None, shown in the page
        self.max_tuned = max_tuned
        self._sessions: OrderedDict[str, _Session] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()
        self._root: Path | None = None  # temp area for every session's downloads

    # ------------------------------------------------------------ which model
    def for_session(self, session_id: str | None) -> LoadedModel:
        """The model this session uses now. Raises ValueError if no model could be loaded."""
        with self._lock:
            entry = self._sessions.get(session_id) if session_id else None
            if entry is not None and entry.use_tuned and entry.tuned is not None:
                self._sessions.move_to_end(session_id)  # recently used: evicted last
                return entry.tuned
        return self.require_base()

    def require_base(self) -> LoadedModel:
        if self.base is None:
            raise ValueError(self.load_error or "No model is loaded: start the app with --model.")
        return self.base

    def tuned(self, session_id: str | None) -> LoadedModel | None:
        """This session's tuned model, whether or not it is in use; None if it has none."""
        with self._lock:
            entry = self._sessions.get(session_id) if session_id else None
            return entry.tuned if entry else None

    def using_tuned(self, session_id: str | None) -> bool:
        with self._lock:
            entry = self._sessions.get(session_id) if session_id else None
            return bool(entry and entry.use_tuned and entry.tuned is not None)

    def was_evicted(self, session_id: str | None) -> bool:
        with self._lock:
            entry = self._sessions.get(session_id) if session_id else None
            return bool(entry and entry.evicted)

    @property
    def tuned_count(self) -> int:
        with self._lock:
            return sum(e.tuned is not None for e in self._sessions.values())

    def put_tuned(self, session_id: str, lm: LoadedModel) -> list[str]:
        """Keep `lm` as this session's tuned model (replacing its earlier one). Returns the
        sessions whose models were evicted to stay within `max_tuned`."""
        with self._lock:
            entry = self._entry(session_id)
            entry.tuned, entry.evicted = lm, False
            self._sessions.move_to_end(session_id)
            return self._evict_beyond_cap(keep=session_id)

    def _evict_beyond_cap(self, keep: str) -> list[str]:
        evicted = []
        holders = [sid for sid, e in self._sessions.items() if e.tuned is not None and sid != keep]
        while len(holders) + 1 > self.max_tuned:
            sid = holders.pop(0)  # least recently used
            entry = self._sessions[sid]
            entry.tuned, entry.use_tuned, entry.evicted = None, False, True
            evicted.append(sid)
        return evicted

    def use_tuned(self, session_id: str | None) -> LoadedModel:
        """Switch this session's tabs to its tuned model; ValueError if it has none."""
        with self._lock:
            entry = self._sessions.get(session_id) if session_id else None
            if entry is None or entry.tuned is None:
                why = (" It was freed to make room for other visitors' models (the demo keeps "
                       f"{self.max_tuned} at most): fine-tune again." if entry and entry.evicted
                       else " Run a fine-tune first.")
                raise ValueError("You have no tuned model." + why)
            entry.use_tuned = True
            self._sessions.move_to_end(session_id)
            return entry.tuned

    def use_base(self, session_id: str | None) -> LoadedModel:
        """Switch this session back to the shared base model (its tuned model is kept)."""
        with self._lock:
            entry = self._sessions.get(session_id) if session_id else None
            if entry is not None:
                entry.use_tuned = False
        return self.require_base()

    # ------------------------------------------------------------ one fine-tune at a time
    def reserve_run(self, session_id: str | None) -> threading.Event:
        """Claim this session's single fine-tune slot (when the request is queued); returns
        the run's stop flag. ValueError if a run is already queued or running for it."""
        with self._lock:
            entry = self._entry(session_id)
            if entry.stop is not None:
                raise ValueError("A fine-tune of yours is already running or waiting in the queue: "
                                 "wait for it to finish, or press Stop.")
            entry.stop = threading.Event()
            return entry.stop

    def run_flag(self, session_id: str | None) -> threading.Event:
        """The stop flag of this session's reserved run, reserving one if none is."""
        with self._lock:
            entry = self._entry(session_id)
            if entry.stop is None:
                entry.stop = threading.Event()
            return entry.stop

    def finish_run(self, session_id: str | None, flag: threading.Event) -> None:
        """Free the slot held by the run with stop flag `flag` (no-op if it was dropped)."""
        with self._lock:
            entry = self._sessions.get(session_id) if session_id else None
            if entry is not None and entry.stop is flag:
                entry.stop = None

    def request_stop(self, session_id: str | None) -> bool:
        """Ask this session's run to stop after its current step. False if nothing runs."""
        with self._lock:
            entry = self._sessions.get(session_id) if session_id else None
            if entry is None or entry.stop is None:
                return False
            entry.stop.set()
            return True

    # ------------------------------------------------------------ files and cleanup
    def session_dir(self, session_id: str | None) -> Path:
        """A temp folder for this session's downloads, removed by `drop`."""
        with self._lock:
            entry = self._entry(session_id)
            if entry.folder is None:
                if self._root is None:
                    self._root = Path(tempfile.mkdtemp(prefix="bertdemo-"))
                entry.folder = Path(tempfile.mkdtemp(dir=self._root))
            return entry.folder

    def drop(self, session_id: str | None) -> None:
        """Forget everything of a session (called when its browser tab closes): stop its run,
        free its tuned model, delete its files."""
        with self._lock:
            entry = self._sessions.pop(session_id, None)
        if entry is None:
            return
        if entry.stop is not None:
            entry.stop.set()  # the worker ends within one step
        if entry.folder is not None:
            shutil.rmtree(entry.folder, ignore_errors=True)

    def _entry(self, session_id: str | None) -> _Session:
        """The session's record, created on first use. Caller holds the lock."""
        if not session_id:
            raise ValueError("This needs a browser session: open the demo in a browser or use "
                             "gradio_client.")
        if session_id not in self._sessions:
            self._sessions[session_id] = _Session()
        return self._sessions[session_id]
