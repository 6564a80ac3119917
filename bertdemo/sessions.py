"""Everything one browser session (a visitor) holds, and the one policy that frees it.

Per session: the base model it picked, its models by kind ("tuned" from the fine-tune, "classifier"
from the Classify tab, ...), which of them its tabs use, its run slot (`store.runs`, a
`runs.slots.RunSlots`), small results kept between events (e.g. the attention tab's last query), and a
temp folder for its downloads and exports. Keyed by Gradio's session hash; a script's `gradio_client` session is one too.

The cleanup policy, in one place:
- session end: `drop` (the page's unload event) frees all of it at once and stops its run;
- size: at most `max_models[kind]` models of each kind across all sessions (adding one past the cap
  evicts the least recently used session's, which falls back to the base); downloads and exports
  together within `max_download_bytes` on disk and kept results within `max_result_bytes` in
  memory, the least recently used sessions' deleted first;
- age: a session unused for `max_idle_s` is freed as if dropped (scripts' sessions never end), unless
  its run is still going: `sweep`, which the sweeper thread that app.py starts
  (`start_sweeper`, stopped by `close`) calls every minute. Reading or adding a session starts no thread.

Per-session models by kind: `put_model(session, kind, model)`, `model(session, kind)`; the "tuned"
kind also has `use_tuned`/`use_base` (the other tabs switch to it). A new kind needs nothing
registered: its cap is `max_models.get(kind, max_tuned)`.
"""
from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
import weakref
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import disk
from .model.loading import LoadedModel
from .runs.slots import RunSlots

log = logging.getLogger(__name__)
DEFAULT_MAX_TUNED = 8
DEFAULT_MAX_DOWNLOAD_BYTES = 2048 * 2**20
DEFAULT_MAX_RESULT_BYTES = 64 * 2**20
DEFAULT_MAX_IDLE_S = 3600
SWEEP_EVERY_S = 60.0  # the sweeper's period: a session is freed at most this long after max_idle_s
_REMEMBERED_CLOSED = 10_000  # closed sessions remembered, so a run ending after its tab closed keeps nothing


@dataclass
class _Session:
    models: dict[str, Any] = field(default_factory=dict)  # kind -> its model ("tuned", "classifier")
    use_tuned: bool = False
    evicted: set[str] = field(default_factory=set)  # kinds whose model was evicted for another's
    folder: Path | None = None  # its downloads and exports
    files: dict[str, tuple[Callable, Path]] = field(default_factory=dict)  # name -> (owner ref, file)
    results: dict[str, tuple[Any, int]] = field(default_factory=dict)  # name -> (value, bytes)
    base: LoadedModel | None = None  # the base model it picked; None: the app's
    used: float = field(default_factory=time.monotonic)


class SessionStore:
    """The base model (shared, read-only) plus everything each session holds, keyed by session id."""

    def __init__(self, base: LoadedModel | None, load_error: str | None = None, notice: str | None = None,
                 max_tuned: int = DEFAULT_MAX_TUNED, max_download_bytes: int = DEFAULT_MAX_DOWNLOAD_BYTES,
                 max_models: dict[str, int] | None = None, max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
                 max_idle_s: float = DEFAULT_MAX_IDLE_S):
        self.max_models = {"tuned": max_tuned, **(max_models or {})}
        if min(self.max_models.values()) < 1:
            raise ValueError(f"max_tuned must be at least 1, got {min(self.max_models.values())}.")
        self.base = base
        self.load_error = load_error  # why `base` is None, shown in the page
        self.notice = notice  # why `base` is not the model asked for (the bundled one served instead)
        self.max_tuned = max_tuned
        self.max_download_bytes = max_download_bytes
        self.max_result_bytes = max_result_bytes
        self.max_idle_s = max_idle_s
        self._sessions: OrderedDict[str, _Session] = OrderedDict()  # least recently used first
        self._lock = threading.RLock()
        self._root: Path | None = None  # temp area for every session's files
        self._closed: deque[str] = deque(maxlen=_REMEMBERED_CLOSED)  # dropped sessions, newest last
        self._sweeper: tuple[threading.Thread, threading.Event] | None = None  # start_sweeper's
        self.runs = RunSlots()  # each session's one run slot (runs/slots.py)

    # ------------------------------------------------------------ which model
    def for_session(self, session_id: str | None) -> LoadedModel:
        """The model this session uses now. Raises ValueError if no model could be loaded."""
        with self._lock:
            entry = self._get(session_id)
            if entry is not None:
                entry.used = time.monotonic()  # for the age policy; the eviction order follows
            if entry is not None and entry.use_tuned and "tuned" in entry.models:  # models in use
                self._touch(session_id)  # recently used: evicted last
                return entry.models["tuned"]
            if entry is not None and entry.base is not None:
                return entry.base
        return self.require_base()

    def base_for(self, session_id: str | None) -> LoadedModel:
        """This session's base model: the one it picked, else the app's (ValueError if none)."""
        with self._lock:
            entry = self._get(session_id)
            if entry is not None and entry.base is not None:
                return entry.base
        return self.require_base()

    def choose_base(self, session_id: str | None, lm: LoadedModel) -> None:
        """Make `lm` this session's base model. Its tuned model, while in use, still wins until
        `use_base`. Load `lm` with `Engine.load_allowed`: the store does not check the allowlist."""
        with self._lock:
            entry = self._entry(session_id)
            entry.base = None if lm is self.base else lm

    def require_base(self) -> LoadedModel:
        if self.base is None:
            raise ValueError(self.load_error or "No model is loaded: start the app with --model.")
        return self.base

    # ------------------------------------------------------------ models by kind
    def model(self, session_id: str | None, kind: str):
        """This session's model of `kind`, whether or not it is in use; None if it has none."""
        with self._lock:
            entry = self._get(session_id)
            return entry.models.get(kind) if entry else None

    def reopen(self, session_id: str | None) -> None:
        """This session, taken as closed (`drop`), asks for a new run: it is evidently alive (a
        script whose heartbeat stream timed out goes on sending requests), so what that run makes
        is kept again. Runs that were going when it closed still keep nothing."""
        with self._lock:
            if session_id in self._closed:
                self._closed.remove(session_id)

    def put_model(self, session_id: str | None, kind: str, model) -> list[str]:
        """Keep `model` as this session's model of `kind` (replacing its earlier one). Returns the
        sessions whose models of that kind were evicted to stay within the kind's cap. A session
        that has closed keeps nothing: its run may end just after the tab closed."""
        with self._lock:
            if session_id in self._closed:
                return []
            entry = self._entry(session_id)
            entry.models[kind] = model
            entry.evicted.discard(kind)
            self._touch(session_id)
            return self._evict_beyond_cap(kind, keep=session_id)

    def _evict_beyond_cap(self, kind: str, keep: str) -> list[str]:
        evicted = []
        holders = [sid for sid, e in self._sessions.items() if kind in e.models and sid != keep]
        while len(holders) + 1 > self.max_models.get(kind, self.max_tuned):
            sid = holders.pop(0)  # least recently used
            entry = self._sessions[sid]
            del entry.models[kind]
            entry.evicted.add(kind)
            entry.use_tuned = entry.use_tuned and kind != "tuned"
            evicted.append(sid)
        return evicted

    def model_count(self, kind: str) -> int:
        with self._lock:
            return sum(kind in e.models for e in self._sessions.values())

    def was_evicted(self, session_id: str | None, kind: str = "tuned") -> bool:
        with self._lock:
            entry = self._get(session_id)
            return bool(entry and kind in entry.evicted)

    # the fine-tune's kind, by its older names
    def tuned(self, session_id: str | None) -> LoadedModel | None:
        """This session's tuned model, whether or not it is in use; None if it has none."""
        return self.model(session_id, "tuned")

    def using_tuned(self, session_id: str | None) -> bool:
        with self._lock:
            entry = self._get(session_id)
            return bool(entry and entry.use_tuned and "tuned" in entry.models)

    def use_tuned(self, session_id: str | None) -> LoadedModel:
        """Switch this session's tabs to its tuned model; ValueError if it has none."""
        with self._lock:
            entry = self._get(session_id)
            if entry is None or "tuned" not in entry.models:
                why = (" It was freed to make room for other visitors' models (the demo keeps "
                       f"{self.max_tuned} at most): fine-tune again." if entry and "tuned" in entry.evicted
                       else " Run a fine-tune first.")
                raise ValueError("You have no tuned model." + why)
            entry.use_tuned = True
            self._touch(session_id)
            return entry.models["tuned"]

    def use_base(self, session_id: str | None) -> LoadedModel:
        """Switch this session back to its base model (its tuned model is kept)."""
        with self._lock:
            entry = self._get(session_id)
            if entry is not None:
                entry.use_tuned = False
        return self.base_for(session_id)

    # ------------------------------------------------------------ small results between events
    def keep_result(self, session_id: str | None, name: str, value, nbytes: int) -> None:
        """Keep `value` (about `nbytes` in memory) for this session under `name`, replacing the
        earlier one; other sessions' results are freed, least recently used first, past
        `max_result_bytes`. Keep compact things here (a query to recompute, not its tensors)."""
        with self._lock:
            entry = self._entry(session_id)
            entry.results[name] = (value, int(nbytes))
            self._touch(session_id)
            total = self.result_bytes()
            for sid, other in list(self._sessions.items()):  # least recently used first
                if total <= self.max_result_bytes:
                    break
                if sid != session_id:
                    total -= sum(size for _, size in other.results.values())
                    other.results.clear()

    def result(self, session_id: str | None, name: str):
        """What `keep_result` kept for this session under `name`, or None."""
        with self._lock:
            entry = self._get(session_id)
            found = entry.results.get(name) if entry else None
            if found is not None:
                self._touch(session_id)
            return found[0] if found else None

    def result_bytes(self) -> int:
        """Bytes of all sessions' kept results (as their keepers counted them)."""
        with self._lock:
            return sum(size for e in self._sessions.values() for _, size in e.results.values())

    # ------------------------------------------------------------ files and cleanup
    def session_dir(self, session_id: str | None) -> Path:
        """A temp folder for this session's downloads and exports, removed by `drop`. Before
        handing it out, the other sessions' files are deleted, least recently used first, until all
        of them together fit `max_download_bytes` (sessions of scripts never close, so never `drop`)."""
        with self._lock:
            entry = self._entry(session_id)
            if entry.folder is None or not entry.folder.exists():
                entry.folder = Path(tempfile.mkdtemp(dir=self.temp_root))
                entry.files.clear()
            self._touch(session_id)  # a download is a use: its files go last
            self._make_room(keep=session_id)
            return entry.folder

    def cached_file(self, session_id: str | None, name: str, owner, make: Callable[[Path], Path]) -> Path:
        """This session's file `name` made from `owner` by `make(session folder)`, made once per
        owner: the same path while `owner` is the same object and the file still exists."""
        folder = self.session_dir(session_id)
        with self._lock:
            made = self._entry(session_id).files.get(name)
        if made is not None and made[0]() is owner and made[1].exists():
            return made[1]
        path = Path(make(folder))
        with self._lock:
            self._entry(session_id).files[name] = (weakref.ref(owner), path)
        return path

    @property
    def temp_root(self) -> Path:
        """This store's own temp area: every session's folder is inside it."""
        if self._root is None:
            self._root = disk.process_temp("sessions")  # a start after a kill removes it
        return self._root

    def download_bytes(self) -> int:
        """Bytes of all sessions' downloads and exports on disk now."""
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
                self._sessions[sid].files.clear()
                total -= size

    def drop(self, session_id: str | None) -> None:
        """Forget everything of a session (called when its browser tab closes): stop its run,
        free its models and results, delete its files."""
        with self._lock:
            entry = self._sessions.pop(session_id, None)
            if session_id:
                self._closed.append(session_id)
        self.runs.drop(session_id)
        _free(entry)

    def close(self) -> None:
        """The server is stopping: stop the sweeper, forget every session and delete this store's
        temp area (every download and export). Stop the runs first (`runs.stop_all`,
        `runs.wait_idle`): a run still going may write a file after this."""
        self.stop_sweeper()
        with self._lock:
            entries = list(self._sessions.values())
            self._sessions.clear()
            root, self._root = self._root, None
        for entry in entries:
            _free(entry)
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)

    def sweep(self, now: float | None = None) -> list[str]:
        """Free the sessions unused for `max_idle_s` (not those whose run is still going), as
        `drop` would; returns their ids. The sweeper (`start_sweeper`) calls it; so may a test."""
        now = time.monotonic() if now is None else now
        with self._lock:
            idle = [sid for sid, e in self._sessions.items()
                    if now - e.used > self.max_idle_s and not self.runs.busy(sid)]
            entries = [self._sessions.pop(sid) for sid in idle]
        for entry in entries:
            _free(entry)
        return idle

    def start_sweeper(self, every_s: float = SWEEP_EVERY_S) -> threading.Thread:
        """Start the age policy: a thread of the store's own calls `sweep` every `every_s` seconds
        until `stop_sweeper` (or `close`). The app's owner starts it (app.py); a second call
        returns the running thread."""
        with self._lock:
            if self._sweeper is not None:
                return self._sweeper[0]
            stop = threading.Event()
            thread = threading.Thread(target=self._sweep_until, args=(stop, every_s), daemon=True,
                                      name="bertdemo-session-sweeper")
            self._sweeper = (thread, stop)
        thread.start()
        return thread

    def stop_sweeper(self) -> None:
        """Stop the thread `start_sweeper` started, if any, and wait for it (a sweep is short)."""
        with self._lock:
            sweeper, self._sweeper = self._sweeper, None
        if sweeper is not None:
            thread, stop = sweeper
            stop.set()
            if thread is not threading.current_thread():
                thread.join(timeout=5.0)

    def _sweep_until(self, stop: threading.Event, every_s: float) -> None:
        while not stop.wait(every_s):
            try:
                self.sweep()
            except Exception:  # one bad sweep must not end the age policy for the server's life
                log.exception("sweeping idle sessions failed; trying again in %.0f s", every_s)

    def __contains__(self, session_id) -> bool:
        with self._lock:
            return session_id in self._sessions

    def _get(self, session_id: str | None) -> _Session | None:
        """The session's record if it has one. Caller holds the lock."""
        return self._sessions.get(session_id) if session_id else None

    def _touch(self, session_id: str) -> None:
        """Mark a use: the session goes last in every least-recently-used order. Caller holds the lock."""
        self._sessions[session_id].used = time.monotonic()
        self._sessions.move_to_end(session_id)

    def _entry(self, session_id: str | None) -> _Session:
        """The session's record, created on first use. Caller holds the lock."""
        if not session_id:
            raise ValueError("This needs a browser session: open the demo in a browser or use "
                             "gradio_client.")
        if session_id not in self._sessions:
            self._sessions[session_id] = _Session()
        return self._sessions[session_id]


def _free(entry: _Session | None) -> None:
    """Release what a session held (its record is already out of the store)."""
    if entry is None:
        return
    entry.models.clear()
    entry.results.clear()
    if entry.folder is not None:
        shutil.rmtree(entry.folder, ignore_errors=True)


def _folder_bytes(folder: Path | None) -> int:
    total = 0
    for file in folder.rglob("*") if folder is not None else []:
        try:
            total += file.stat().st_size if file.is_file() else 0
        except OSError:  # removed while we looked (a download being rewritten)
            continue
    return total
