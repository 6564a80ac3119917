"""Which model each browser session sees: the shared base model unless it switched to its own.

A session may hold one fine-tuned model. At most `max_tuned` stay in memory across all sessions:
adding one past the cap evicts the least recently used (another session's), which then falls
back to the base. A session may also pick its own base model among those the operator offers
(`choose_base`); its tuned model, while in use, still wins. A session also holds its fine-tune
run's stop flag (one run at a time) and a temp folder for downloads, kept under a size cap by
deleting the least recently used sessions' files; `drop` frees all of it when the browser tab closes.
"""
from __future__ import annotations

import shutil
import tempfile
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass
from pathlib import Path

from .models import LoadedModel

DEFAULT_MAX_TUNED = 8
DEFAULT_MAX_DOWNLOAD_BYTES = 2048 * 2**20
_REMEMBERED_CLOSED = 10_000  # closed sessions remembered, so a run ending after its tab closed keeps nothing


@dataclass
class _Session:
    tuned: LoadedModel | None = None
    use_tuned: bool = False
    evicted: bool = False  # its tuned model was evicted to make room for another's
    stop: threading.Event | None = None  # the stop flag of its reserved or running fine-tune
    folder: Path | None = None  # its downloads
    base: LoadedModel | None = None  # the base model it picked; None: the app's


class SessionStore:
    """The base model (shared, read-only) plus per-session tuned models, keyed by session id."""

    def __init__(self, base: LoadedModel | None, load_error: str | None = None,
                 max_tuned: int = DEFAULT_MAX_TUNED, max_download_bytes: int = DEFAULT_MAX_DOWNLOAD_BYTES):
        if max_tuned < 1:
            raise ValueError(f"max_tuned must be at least 1, got {max_tuned}.")
        self.base = base
        self.load_error = load_error  # why `base` is None, shown in the page
        self.max_tuned = max_tuned
        self.max_download_bytes = max_download_bytes
        self._sessions: OrderedDict[str, _Session] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()
        self._root: Path | None = None  # temp area for every session's downloads
        self._closed: deque[str] = deque(maxlen=_REMEMBERED_CLOSED)  # dropped sessions, newest last

    # ------------------------------------------------------------ which model
    def for_session(self, session_id: str | None) -> LoadedModel:
        """The model this session uses now. Raises ValueError if no model could be loaded."""
        with self._lock:
            entry = self._sessions.get(session_id) if session_id else None
            if entry is not None and entry.use_tuned and entry.tuned is not None:
                self._sessions.move_to_end(session_id)  # recently used: evicted last
                return entry.tuned
            if entry is not None and entry.base is not None:
                return entry.base
        return self.require_base()

    def base_for(self, session_id: str | None) -> LoadedModel:
        """This session's base model: the one it picked, else the app's (ValueError if none)."""
        with self._lock:
            entry = self._sessions.get(session_id) if session_id else None
            if entry is not None and entry.base is not None:
                return entry.base
        return self.require_base()

    def choose_base(self, session_id: str | None, lm: LoadedModel) -> None:
        """Make `lm` this session's base model. Its tuned model, while in use, still wins until
        `use_base`. Load `lm` with `models.load_allowed`: the store does not check the allowlist."""
        with self._lock:
            entry = self._entry(session_id)
            entry.base = None if lm is self.base else lm

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
        sessions whose models were evicted to stay within `max_tuned`. A session that has
        closed keeps nothing: its run may end just after the tab closed."""
        with self._lock:
            if session_id in self._closed:
                return []
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
        """Switch this session back to its base model (its tuned model is kept)."""
        with self._lock:
            entry = self._sessions.get(session_id) if session_id else None
            if entry is not None:
                entry.use_tuned = False
        return self.base_for(session_id)

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
        """A temp folder for this session's downloads, removed by `drop`. Before handing it out,
        the other sessions' downloads are deleted, least recently used first, until all of them
        together fit `max_download_bytes` (sessions of scripts never close, so never `drop`)."""
        with self._lock:
            entry = self._entry(session_id)
            if entry.folder is None:
                entry.folder = Path(tempfile.mkdtemp(dir=self.temp_root))
            self._sessions.move_to_end(session_id)  # a download is a use: its files go last
            self._make_room(keep=session_id)
            return entry.folder

    @property
    def temp_root(self) -> Path:
        """This store's own temp area: every session's download folder is inside it."""
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="bertdemo-"))
        return self._root

    def download_bytes(self) -> int:
        """Bytes of all sessions' downloads on disk now."""
        return sum(_folder_bytes(e.folder) for e in list(self._sessions.values()) if e.folder)

    def _make_room(self, keep: str) -> None:
        """Caller holds the lock."""
        sizes = {sid: _folder_bytes(e.folder) for sid, e in self._sessions.items() if e.folder}
        total = sum(sizes.values())
        for sid, size in sizes.items():  # least recently used first
            if total <= self.max_download_bytes:
                return
            if sid != keep:
                shutil.rmtree(self._sessions[sid].folder, ignore_errors=True)
                self._sessions[sid].folder = None
                total -= size

    def drop(self, session_id: str | None) -> None:
        """Forget everything of a session (called when its browser tab closes): stop its run,
        free its tuned model, delete its files."""
        with self._lock:
            entry = self._sessions.pop(session_id, None)
            if session_id:
                self._closed.append(session_id)
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


def _folder_bytes(folder: Path | None) -> int:
    total = 0
    for file in folder.rglob("*") if folder is not None else []:
        try:
            total += file.stat().st_size if file.is_file() else 0
        except OSError:  # removed while we looked (a download being rewritten)
            continue
    return total
