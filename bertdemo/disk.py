"""The server's disk caches: one folder, one budget, least recently used out first (`DiskCache`).

    ~/.cache/bertdemo/              $BERTDEMO_CACHE_DIR (--cache-dir); budget $BERTDEMO_CACHE_MB (--cache-mb)
      search/<model>-<corpus>/      a corpus' search index        (views/corpus_search.py; $BERTDEMO_SEARCH_CACHE)
      onnx/<family>-<weights>.onnx  a model's ONNX Runtime export (forward/onnx_engine.py; $BERTDEMO_ONNX_CACHE)
      features/<weights>/layer_N/   a dictionary trained here     (features/store.py; $BERTDEMO_FEATURES_CACHE)
      transcoders/<weights>/layer_N/ a transcoder trained here    (circuits/transcoders.py)
      examples/<name>/<model>/      the examples' cached results  (ui/parts/cached_examples.py)
      warm/onnx/...                 exports made ahead by `python -m bertdemo warm` ($BERTDEMO_WARM_DIR):
                                    read only, never evicted, not counted

The older per-cache variables still move their cache where set; it is counted in the one budget
all the same. An entry is written under a temporary name in its own folder (`temporary`: ".part-"
with the host and process that writes it) and renamed when whole, so nothing ever reads half an
entry; a start removes what a killed process left (`remove_leftovers`, one log line with the MB
freed). Before a write, `reserve` makes room for its estimated size, least recently used entries
first (an entry is used when read: `touch`), never a pinned one (the default corpus' index, the
served models' exports); a write that cannot fit is refused with both figures. An evicted entry
that a reader holds open keeps answering: a memory-mapped file outlives its name on POSIX.

Why by hand: the caches are folders of files that other libraries write (numpy, ONNX,
safetensors, Gradio's CSV); diskcache and cachetools keep values of their own, not another
writer's folders, and none evicts across several folders under one budget.
"""
from __future__ import annotations

import contextlib
import fnmatch
import itertools
import logging
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

log = logging.getLogger(__name__)

DEFAULT_BUDGET_MB = 2_000
MB = 1_000_000
PART = ".part-"  # a temporary entry's name starts with this
# kind -> (the env var that moves it on its own, the glob of its entries inside its folder)
KINDS = {
    "search": ("BERTDEMO_SEARCH_CACHE", "*"),
    "onnx": ("BERTDEMO_ONNX_CACHE", "*.onnx"),
    "features": ("BERTDEMO_FEATURES_CACHE", "*/layer_*"),
    "transcoders": (None, "*/layer_*"),
    "examples": (None, "*/*"),
}
LEFTOVER_AGE = 3_600  # seconds: another host's temporary entry this old is nobody's


def root_dir(environ=None) -> Path:
    """$BERTDEMO_CACHE_DIR, else ~/.cache/bertdemo."""
    environ = os.environ if environ is None else environ
    return Path(environ.get("BERTDEMO_CACHE_DIR") or Path.home() / ".cache" / "bertdemo")


def budget_mb(environ=None) -> float:
    """$BERTDEMO_CACHE_MB, else DEFAULT_BUDGET_MB."""
    environ = os.environ if environ is None else environ
    return float(environ.get("BERTDEMO_CACHE_MB") or DEFAULT_BUDGET_MB)


def folder_of(kind: str, environ=None) -> Path:
    """Where entries of `kind` are kept: its own variable where set, else <root>/<kind>."""
    environ = os.environ if environ is None else environ
    variable = KINDS[kind][0]
    return Path(environ[variable]) if variable and environ.get(variable) else root_dir(environ) / kind


def size_of(path: Path) -> int:
    """Bytes of a file, or of every file under a folder; what vanishes meanwhile (an eviction, a
    rename) counts 0, the rest still counts."""
    if not path.is_dir():
        with contextlib.suppress(OSError):
            return path.stat().st_size
        return 0
    total = 0
    for folder, _, names in os.walk(path):  # os.walk skips a folder that vanished
        for name in names:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(folder, name), follow_symlinks=False).st_size
    return total


def named(folder: Path, prefix: str) -> list[Path]:
    """Files and folders under `folder`, at any depth, whose name starts with `prefix` (not
    looking inside those found). Other writers rename and evict under the same folder while it
    is walked: a folder that vanishes is skipped (`Path.rglob` raises FileNotFoundError then)."""
    found = []
    for parent, folders, files in os.walk(folder):  # os.walk skips a folder that vanished
        found += [Path(parent, name) for name in (*folders, *files) if name.startswith(prefix)]
        folders[:] = [name for name in folders if not name.startswith(prefix)]
    return found


def matching(folder: Path, pattern: str) -> list[Path]:
    """`folder.glob(pattern)` for a pattern of one or two levels ("*", "*.onnx", "*/layer_*"),
    skipping a folder that vanishes while it is read (`Path.glob` raises FileNotFoundError then)."""
    first, _, rest = pattern.partition("/")
    try:
        here = [folder / name for name in os.listdir(folder) if fnmatch.fnmatchcase(name, first)]
    except OSError:
        return []
    return here if not rest else [p for sub in here if sub.is_dir() for p in matching(sub, rest)]


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


@dataclass(frozen=True)
class Entry:
    kind: str
    path: Path
    size: int
    used: float  # last use (mtime), seconds since the epoch


class TooBig(ValueError):
    """A write that cannot fit the budget; its message names both figures. `later`: it would fit
    once the writes under way end."""

    def __init__(self, message: str, later: bool = False):
        super().__init__(message)
        self.later = later


class DiskCache:
    """The caches' folders, their budget and what is pinned (see the module doc). Every
    `DiskCache` reads the disk itself, so several (an engine's, a script's, another replica's)
    share the same truth; reservations and pins are this object's."""

    def __init__(self, root: Path | str | None = None, budget: float | None = None, environ=None,
                 folders: dict[str, Path] | None = None):
        """`root`: the caches' folder (default `root_dir()`); `budget`: megabytes (default
        `budget_mb()`). A kind's own variable in `environ` (default os.environ) still moves it.
        `folders` ({kind: folder}): only these kinds, there (a cache of one kind made in code)."""
        environ = dict(os.environ if environ is None else environ)
        if root is not None:
            environ["BERTDEMO_CACHE_DIR"] = str(root)
        self.root = root_dir(environ)
        self.folders = ({kind: Path(folder) for kind, folder in folders.items()} if folders is not None
                        else {kind: folder_of(kind, environ) for kind in KINDS})
        # made ahead (`python -m bertdemo warm`): read, never written, evicted nor counted here
        self.warm = Path(environ.get("BERTDEMO_WARM_DIR") or self.root / "warm")
        self.budget_bytes = int((budget_mb(environ) if budget is None else budget) * MB)
        self._pinned: set[Path] = set()
        self._reserved: dict[int, int] = {}
        self._tickets = itertools.count()
        self._evicted: list[Callable[[Path], None]] = []
        self._lock = threading.RLock()

    @classmethod
    def of_kind(cls, kind: str, folder: Path | str | None = None, budget: float | None = None) -> "DiskCache":
        """Where a store made in code, without an engine, keeps its entries: `kind` alone in
        `folder`, or with no folder the whole disk cache (its budget shared with every kind)."""
        return cls(budget=budget) if folder is None else cls(budget=budget, folders={kind: Path(folder)})

    def folder(self, kind: str) -> Path:
        return self.folders[kind]

    # ------------------------------------------------------------ what is there

    def entries(self) -> list[Entry]:
        """Every whole entry, least recently used first."""
        found = []
        for kind, folder in self.folders.items():
            for path in matching(folder, KINDS[kind][1]):
                if PART not in str(path.relative_to(folder)):
                    with contextlib.suppress(OSError):
                        found.append(Entry(kind, path, size_of(path), path.stat().st_mtime))
        return sorted(found, key=lambda e: e.used)

    def used_bytes(self) -> int:
        """Bytes on disk under every cache folder, temporary entries included."""
        return sum(size_of(folder) for folder in set(self.folders.values()) if folder.is_dir())

    def kinds_mb(self) -> dict[str, float]:
        """{kind: MB on disk} (the About tab's detail)."""
        return {kind: size_of(folder) / MB for kind, folder in self.folders.items()}

    def line(self) -> str:
        """"cache 312.4 of 2,000 MB used" (the health endpoint's and the About tab's words)."""
        return f"cache {self.used_bytes() / MB:,.1f} of {self.budget_bytes / MB:,.0f} MB used"

    # ------------------------------------------------------------ use, pins, eviction

    def touch(self, path: Path) -> None:
        """Mark an entry used now (the budget keeps it longer)."""
        with contextlib.suppress(OSError):
            os.utime(path)

    def pin(self, path: Path) -> None:
        """Never evict `path` (this process's pin: the default corpus' index, a served export)."""
        with self._lock:
            self._pinned.add(Path(path))

    def pinned(self, path: Path) -> bool:
        with self._lock:
            return Path(path) in self._pinned

    def on_evict(self, callback: Callable[[Path], None]) -> None:
        """Call `callback(path)` after each entry this object evicts (a reader forgets it)."""
        self._evicted.append(callback)

    @contextlib.contextmanager
    def reserve(self, need_bytes: int, what: str, keep: tuple[Path, ...] = (), *, must: bool = False,
                wait: float = 0.0, should_stop: Callable[[], bool] | None = None) -> Iterator[None]:
        """Room for a write of about `need_bytes` (`what` names it in the refusal), held until
        the block ends: least recently used entries are evicted until what is on disk, what other
        writes reserved and `need_bytes` fit the budget. `TooBig` when they cannot even with
        every unpinned entry gone; entries in `keep` are not evicted for it. A write that would
        fit once the writes under way end waits for them up to `wait` seconds (or until
        `should_stop()`). `must`: a write the app cannot do without (a pinned entry) is never
        refused, only given what room there is."""
        ticket, deadline = next(self._tickets), time.monotonic() + wait
        while not self._claim(ticket, need_bytes, what, keep, must,
                              waiting=time.monotonic() < deadline and not (should_stop and should_stop())):
            time.sleep(0.2)
        try:
            yield
        finally:
            with self._lock:
                del self._reserved[ticket]

    def _claim(self, ticket: int, need: int, what: str, keep: tuple[Path, ...], must: bool, waiting: bool) -> bool:
        """Reserve `need` bytes under `ticket` if they fit after eviction (True); False to wait
        for the writes under way; else `TooBig`."""
        with self._lock:
            try:
                self._make_room(need, what, keep)
            except TooBig as refusal:
                if not must:
                    if refusal.later and waiting:
                        return False
                    raise
                log.warning("disk cache: %s is written over the budget of %.0f MB (it is kept: raise --cache-mb)",
                            what, self.budget_bytes / MB)
                self._make_room(0, what, keep, refuse=False)
            self._reserved[ticket] = need
            return True

    def _make_room(self, need: int, what: str, keep: tuple[Path, ...], refuse: bool = True) -> None:
        entries = self.entries()
        # this process's writes under way count by their reservations, not by what they wrote so far
        used, reserved = self.used_bytes() - self._own_temporaries_bytes(), sum(self._reserved.values())
        stays = [e for e in entries if e.path in self._pinned or e.path in keep]
        fixed = used - sum(e.size for e in entries) + sum(e.size for e in stays)  # what eviction cannot free
        if refuse and fixed + reserved + need > self.budget_bytes:
            raise TooBig(f"{what} needs about {need / MB:,.0f} MB of disk, and the server's cache budget is "
                         f"{self.budget_bytes / MB:,.0f} MB ({(fixed + reserved) / MB:,.0f} MB of it is kept or "
                         "being written now). Use a shorter corpus or fewer lines, try again later, or ask "
                         "the operator for a larger --cache-mb.", later=fixed + need <= self.budget_bytes)
        for entry in entries:
            if used + reserved + need <= self.budget_bytes:
                break
            if entry in stays:
                continue
            self._evict(entry)
            used -= entry.size

    def _own_temporaries_bytes(self) -> int:
        return sum(size_of(p) for folder in set(self.folders.values()) for p in named(folder, temporary_prefix()))

    def _evict(self, entry: Entry) -> None:
        _remove(entry.path)
        log.info("disk cache: evicted the %s entry %s (%.1f MB, unused for %.0f s) to stay within %.0f MB",
                 entry.kind, entry.path.name, entry.size / MB, time.time() - entry.used, self.budget_bytes / MB)
        for callback in self._evicted:
            callback(entry.path)

    def trim(self, keep: tuple[Path, ...] = ()) -> None:
        """Evict least recently used entries but those in `keep` until the cache is within its
        budget (after a write whose size was not known before, e.g. a dictionary)."""
        with self._lock:
            self._make_room(0, "the cache", tuple(Path(p) for p in keep), refuse=False)

    # ------------------------------------------------------------ writing, leftovers

    def temporary(self, kind: str, name: str = "", inside: Path | None = None) -> Path:
        """A new empty folder to write an entry of `kind` into, under a temporary name in the
        folder it will be renamed into (`inside`, default the kind's folder), so the rename is
        atomic and a start knows it for a leftover of whoever wrote it."""
        folder = Path(inside) if inside is not None else self.folder(kind)
        folder.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(dir=folder, prefix=f"{temporary_prefix()}{name}-"))

    def remove_leftovers(self) -> int:
        """Remove every temporary entry whose writer is gone (a process of this host that no
        longer runs, or this very pid reused after a restart; another host's after LEFTOVER_AGE),
        and the `process_temp` folders of this host's processes that no longer run; log one line
        with the MB freed. Returns the bytes freed."""
        freed, count = 0, 0
        leftovers = [path for folder in set(self.folders.values()) for path in named(folder, PART)
                     if not writer_alive(path)]
        for path in [*leftovers, *dead_process_temps()]:
            if path.exists():
                freed += size_of(path)
                count += 1
                _remove(path)
        if count:
            log.info("disk cache: removed %d leftover%s of killed processes (half-written entries, temp "
                     "folders; %.1f MB freed)", count, "" if count == 1 else "s", freed / MB)
        return freed


def temporary_prefix() -> str:
    """".part-<pid>@<host>~": what a temporary entry of this process is named from."""
    return f"{PART}{os.getpid()}@{socket.gethostname()}~"


_WRITER = re.compile(r"-(\d+)@([^~/]+)~")  # "<what>-<pid>@<host>~<rest>": who writes it
_STARTED = time.time()
PROCESS_TEMP = "bertdemo-"  # the system temp folder's entries of a process start with this
_process_temps: list[Path] = []


def process_temp(name: str) -> Path:
    """A new folder in the system's temp folder for this process's own files (`name` says what:
    "gradio", "sessions"), named after the process so that a start removes it when the process
    was killed (`remove_leftovers`), and `remove_own` at a clean stop."""
    folder = Path(tempfile.mkdtemp(prefix=f"{PROCESS_TEMP}{name}-{os.getpid()}@{socket.gethostname()}~"))
    _process_temps.append(folder)
    return folder


def writer_alive(path: Path) -> bool:
    """Whether the process that names itself in temporary `path` may still be writing it."""
    found = _WRITER.search(path.name)
    if found is None:
        return False
    pid, host = int(found.group(1)), found.group(2)
    if host != socket.gethostname():
        with contextlib.suppress(OSError):
            return time.time() - path.stat().st_mtime < LEFTOVER_AGE
        return False
    if pid == os.getpid():  # ours: written since this process started, or a pid reused after a restart
        with contextlib.suppress(OSError):
            return path.stat().st_mtime >= _STARTED
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def dead_process_temps() -> list[Path]:
    """This host's `process_temp` folders whose process no longer runs."""
    root = Path(tempfile.gettempdir())
    return [p for p in root.glob(f"{PROCESS_TEMP}*") if p.is_dir() and _WRITER.search(p.name)
            and not writer_alive(p)]


def remove_own(cache: "DiskCache | None" = None) -> int:
    """At a clean stop: remove this process's temporary entries (writes cut short: an export, an
    index) in `cache`'s folders and its `process_temp` folders. Returns the bytes freed."""
    folders = set(cache.folders.values()) if cache is not None else set()
    found = [p for folder in folders for p in named(folder, temporary_prefix())]
    freed = 0
    for path in [*found, *_process_temps]:
        freed += size_of(path)
        _remove(path)
    _process_temps.clear()
    return freed
