"""One concept, one module (over 500 lines): corpus search, the corpus contexts the model treats as the same
as a word in a sentence.

exBERT's search, for any encoder with hidden states: the contextual embedding of `word` in `text`
at `layer` (a word split into pieces is the mean of its pieces, as the embedding map does) against
every word occurrence of a corpus at that layer, ranked by cosine similarity.

    bertdemo.search_corpus(lm, "I sat on the river bank.", word="bank", layer=6)
    bertdemo.search_corpus(lm, "I sat on the river bank.", word="bank", layer=6,
                           corpus="The bank lent me money.\\nWe fished from the bank.")

The index of a corpus (every word occurrence's unit vector at every layer) comes from one batched
forward with `output_hidden_states`; it is built on first use and kept on disk under a digest of
the model's weights and the corpus, one file per layer (`IndexCache`): a restart reads it, a
fine-tuned model (other weights) gets its own, and two visitors asking for the same index while it
builds wait for the one build.

Why float32 and a plain matrix product: numpy and torch have no half-precision matrix product on
a CPU (float16 would be upcast on every query, costing the memory it saved, ~8x slower by
bench/bench_search.py's figures), and float16 cosines are off by ~1e-3, enough to swap near-tied
hits. A query is one (N, H) @ (H,) product over a memory-mapped file: ~12k occurrences x 768
floats is 9M multiply-adds, a few milliseconds; scikit-learn's brute-force NearestNeighbors does
the same product with more overhead and faiss's flat index is that product again (its approximate
indexes pay off from millions of vectors, two orders past a corpus a page can send).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from .. import disk, validate
from ..forward import anatomy, hooks
from ..model.digest import model_digest
from ..model.loading import LoadedModel
from . import embeddings

log = logging.getLogger(__name__)

ASSETS = Path(__file__).resolve().parents[2] / "assets" / "corpus"
DEFAULT_CORPUS = ASSETS / "everyday.txt"
MAX_LINES = 2_000  # a visitor's own corpus (Settings.search_max_lines)
MAX_CHARS = 100_000  # characters of a visitor's corpus (Settings.search_max_chars)
MAX_TOP_K = 50
LINE_TOKENS = 128  # a corpus line is cut at this many tokens (its later words are not indexed)
BATCH = 32  # lines per forward
WAIT_FOR_ROOM = 300  # seconds a build waits for the builds under way when it fits the disk budget only after them
FORMAT = 1  # bump when the files' layout changes: older indexes are then rebuilt, not misread
WORD = re.compile(r"\w+")  # what counts as a word occurrence of the corpus


class Stopped(Exception):
    """An index build stopped by its caller (`should_stop`); what it had built is freed."""


class StopRequests:
    """Who asked to stop their index build: a session's Stop button sets its flag, its build
    reads it between batches (`should_stop`)."""

    def __init__(self):
        self._asked: set = set()
        self._lock = threading.Lock()

    def ask(self, session) -> None:
        with self._lock:
            self._asked.add(session)

    def clear(self, session) -> None:
        with self._lock:
            self._asked.discard(session)

    def asked(self, session) -> bool:
        with self._lock:
            return session in self._asked


@dataclass(frozen=True)
class Corpus:
    """The lines searched: the shipped default or a visitor's own, and their digest."""

    lines: tuple[str, ...]
    name: str  # "default" or "yours"
    digest: str


@dataclass(frozen=True)
class Index:
    """Every word occurrence of a corpus at one layer: `vectors` (N, H) float32 of unit length
    (memory-mapped from the cache when read from disk), `spans` (N, 3) int32: line, start, end
    (characters of the word in its line), `pieces` (N,) int32: its first token's position."""

    layer: int
    vectors: np.ndarray
    spans: np.ndarray
    pieces: np.ndarray


def read_corpus(corpus: str | None = None, *, max_lines: int = MAX_LINES, max_chars: int = MAX_CHARS) -> Corpus:
    """The default corpus (`corpus` None or empty), or `corpus` as non-empty stripped lines within
    the limits (the default corpus is not held to them)."""
    if corpus is None or (isinstance(corpus, str) and not corpus.strip()):
        lines = tuple(line.strip() for line in DEFAULT_CORPUS.read_text(encoding="utf-8").splitlines() if line.strip())
        return Corpus(lines, "default", _digest(lines))
    if not isinstance(corpus, str):
        raise validate.InputError("corpus", "The corpus must be text, one line per sentence (or empty for the "
                                            "default corpus).")
    validate.length_at_most(len(corpus), max_chars, "corpus", "characters", "Use fewer or shorter lines, or "
                            "leave the corpus empty to search the default one.", field="corpus")
    lines = tuple(line.strip() for line in corpus.splitlines() if line.strip())
    if not any(WORD.search(line) for line in lines):
        raise validate.InputError("corpus", "The corpus has no words: type or upload lines of text, one "
                                            "sentence per line, or leave it empty to search the default corpus.")
    validate.length_at_most(len(lines), max_lines, "corpus", "lines", "Use fewer lines, or leave the corpus "
                            "empty to search the default one.", field="corpus")
    return Corpus(lines, "yours", _digest(lines))


def _digest(lines) -> str:
    return hashlib.blake2b("\n".join(lines).encode(), digest_size=12).hexdigest()


# ---------------------------------------------------------------- the search

def search_corpus(lm: LoadedModel, text, *, word, layer, top_k: int = 10, corpus: str | None = None,
                  cache: "IndexCache | None" = None, on_progress: Callable[[int, int], None] | None = None,
                  should_stop: Callable[[], bool] | None = None, max_lines: int = MAX_LINES,
                  max_chars: int = MAX_CHARS) -> dict:
    """The `top_k` word occurrences of the corpus nearest, by cosine at `layer` (0 = embeddings,
    L = last), to `word` as `text` uses it (its first occurrence; whole word, any case).

    `corpus`: lines of text (one sentence per line), or None for the default corpus. The index is
    read from `cache` (default: `IndexCache()` on the disk cache), else built, calling
    `on_progress(lines_done, lines)` per batch and stopping with `Stopped` when `should_stop()`.

    Returns {"sentence", "word", "layer", "corpus" ("default"/"yours"), "lines", "occurrences",
    "hits": [{"line" (0-based), "text", "word", "start", "end" (characters of the word in the
    line), "position" (its first token), "similarity"}], "counts": [{"word", "count"}] (the hits'
    words, lowercased, most frequent first), "left_out" (the lines, 0-based, that are `text` itself,
    spaces and case aside: none of their words is a hit), "built" (whether this call built the index)}."""
    text = validate.text(text, "sentence", "I sat on the river bank.", field="sentence")
    word = _query_word(text, word)
    layer = embeddings.check_layer(lm, layer)
    top_k = validate.whole_number(top_k, "number of hits", 1, MAX_TOP_K, field="top_k")
    chosen = read_corpus(corpus, max_lines=max_lines, max_chars=max_chars)
    query = query_vector(lm, text, word, layer)
    cache = cache if cache is not None else IndexCache()
    index, built = cache.get(lm, chosen, layer, on_progress=on_progress, should_stop=should_stop)
    similarity = index.vectors @ query  # (N,): cosine, both of unit length
    own = own_lines(chosen.lines, text)
    if own:  # the query's own sentence would top the list at cosine 1.000: it is left out
        similarity[np.isin(index.spans[:, 0], own)] = -np.inf
    top = np.argsort(-similarity, kind="stable")[:top_k]
    top = top[np.isfinite(similarity[top])]
    hits = []
    for i in top:
        line, start, end = (int(v) for v in index.spans[i])
        hits.append({"line": line, "text": chosen.lines[line], "word": chosen.lines[line][start:end],
                     "start": start, "end": end, "position": int(index.pieces[i]),
                     "similarity": float(similarity[i])})
    counts = Counter(hit["word"].lower() for hit in hits).most_common()
    return {"sentence": text, "word": word, "layer": layer, "corpus": chosen.name, "lines": len(chosen.lines),
            "occurrences": int(len(index.spans)), "hits": hits,
            "counts": [{"word": w, "count": n} for w, n in counts], "left_out": own, "built": built}


def own_lines(lines, text: str) -> list[int]:
    """The lines (0-based) that are the query's sentence itself (spaces and case aside)."""
    def same(line: str) -> str:
        return " ".join(line.split()).casefold()
    sentence = same(text)
    return [i for i, line in enumerate(lines) if same(line) == sentence]


def _query_word(text: str, word) -> str:
    if not isinstance(word, str) or not word.strip():
        raise validate.InputError("word", "Type the word to search for, one the sentence uses, e.g. 'bank'.")
    word = word.strip()
    if not re.search(rf"(?<!\w){re.escape(word)}(?!\w)", text, re.IGNORECASE):
        shown = word if len(word) <= 40 else word[:40] + "…"
        raise validate.InputError("word", f"'{shown}' is not in the sentence: type a word the sentence uses "
                                          "(whole word, any case).")
    return word


@torch.inference_mode()
def query_vector(lm: LoadedModel, text: str, word: str, layer: int) -> np.ndarray:
    """`word`'s first occurrence in `text` at `layer`: the mean of its pieces, of unit length (H,)."""
    match = re.search(rf"(?<!\w){re.escape(word)}(?!\w)", text, re.IGNORECASE)
    enc = lm.tokenizer([text], return_offsets_mapping=True, return_special_tokens_mask=True, truncation=False)
    validate.tokens_at_most(len(enc["input_ids"][0]), lm.max_length, lm.name, "sentence", field="sentence")
    pieces = [i for i, (a, b) in enumerate(enc["offset_mapping"][0])
              if not enc["special_tokens_mask"][0][i] and a < match.end() and b > match.start()]
    if not pieces:
        raise validate.InputError("word", f"'{word}' is cut off by the model's length limit: shorten the sentence.")
    states = _hidden_states(lm, [enc["input_ids"][0]])[layer, 0]  # (T, H)
    return _unit(states[pieces].mean(0).float().numpy())


def _hidden_states(lm: LoadedModel, ids: list[list[int]]) -> torch.Tensor:
    """(L+1, B, T, H) float32 on the CPU: every layer's states of a padded batch (the same forward
    as the embedding map's), run as `anatomy.batches` says: a padding-sensitive family one length per
    forward, so every line's states are its states alone (zeros past each line's end)."""
    anatomy.of(lm.model).require("stream", "Corpus search")  # Funnel: its blocks pool the sequence
    groups = anatomy.batches(lm.model, [len(row) for row in ids])
    if len(groups) > 1:
        parts = [(group, _hidden_states(lm, [ids[i] for i in group])) for group in groups]
        states = torch.zeros(parts[0][1].shape[0], len(ids), max(map(len, ids)), parts[0][1].shape[-1])
        for group, part in parts:
            states[:, group, :part.shape[2]] = part
        return states
    batch = lm.tokenizer.pad([{"input_ids": row} for row in ids], return_tensors="pt").to(lm.device)
    with hooks.switched_off(lm):  # a heads-off view searches without its heads
        hidden = lm.model.base_model(**batch, output_hidden_states=True).hidden_states  # L+1 x (B, T, H)
    return torch.stack(hidden).float().cpu()


def _unit(vectors: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return (vectors / np.maximum(norm, 1e-12)).astype(np.float32)


# ---------------------------------------------------------------- the index

def word_occurrences(lm: LoadedModel, lines) -> tuple[dict, np.ndarray, list[list[int]]]:
    """The corpus tokenized (cut at LINE_TOKENS), and each word occurrence: spans (N, 3) int32 (line,
    start, end), and the token positions its characters cover (a word past the cut is left out)."""
    enc = lm.tokenizer(list(lines), return_offsets_mapping=True, return_special_tokens_mask=True,
                       truncation=True, max_length=min(LINE_TOKENS, lm.max_length))
    spans, covered = [], []
    for n, line in enumerate(lines):
        offsets, special = enc["offset_mapping"][n], enc["special_tokens_mask"][n]
        for match in WORD.finditer(line):
            pieces = [i for i, (a, e) in enumerate(offsets) if not special[i] and a < match.end() and e > match.start()]
            if pieces:
                spans.append((n, match.start(), match.end()))
                covered.append(pieces)
    if not spans:
        raise validate.InputError("corpus", "The corpus has no words the model can read: add lines of text.")
    return enc, np.asarray(spans, dtype=np.int32), covered


STATES_BYTES = 24_000_000  # a build holds about this much of one forward's hidden states


def index_bytes(lm: LoadedModel, occurrences: int) -> int:
    """The index's size on disk: every occurrence's float32 vector at every layer, its span and piece."""
    return occurrences * (layer_count(lm) * hidden_size(lm) * 4 + 16)


def layer_count(lm: LoadedModel) -> int:
    """Hidden states a forward returns: the embeddings and every layer."""
    return int(lm.model.config.num_hidden_layers) + 1


def hidden_size(lm: LoadedModel) -> int:
    return int(lm.model.config.hidden_size)


def lines_per_forward(lm: LoadedModel) -> int:
    """Lines per forward of a build: BATCH, fewer for a large model, so that one forward's states
    of every layer at the longest lines stay within STATES_BYTES whatever the model's size."""
    per_line = layer_count(lm) * min(LINE_TOKENS, lm.max_length) * hidden_size(lm) * 4
    return max(1, min(BATCH, STATES_BYTES // per_line))


@torch.inference_mode()
def build_index(lm: LoadedModel, lines, folder: Path, *, on_progress=None, should_stop=None,
                words: tuple | None = None) -> dict:
    """Write every word occurrence of `lines` at every layer into `folder`: layerNN.npy (N, H)
    float32 of unit length, one per layer (0 = embeddings), spans.npy (N, 3) and pieces.npy (N,)
    int32. One forward per `lines_per_forward` lines, each batch's vectors appended to the layer
    files with plain writes (the page cache holds them, not the process: a memory map written
    through would keep every page it touched in the server's memory). Raises `Stopped` between
    batches when `should_stop()` (the caller removes `folder`). `words`: `word_occurrences`'s
    result when the caller has it. Returns {"occurrences", "layers", "hidden"}."""
    enc, spans, covered = words if words is not None else word_occurrences(lm, lines)
    np.save(folder / "spans.npy", spans)
    np.save(folder / "pieces.npy", np.asarray([c[0] for c in covered], dtype=np.int32))
    step, outs = lines_per_forward(lm), []
    with contextlib.ExitStack() as files:
        first = 0  # the first occurrence of this batch
        for start in range(0, len(lines), step):
            if should_stop is not None and should_stop():
                raise Stopped("The index build was stopped.")
            last = int(np.searchsorted(spans[:, 0], start + step))  # occurrences of this batch's lines
            vectors = _batch_vectors(lm, enc["input_ids"][start:start + step], spans[first:last, 0] - start,
                                     covered[first:last])  # (L+1, n, H)
            if not outs:  # the layers as the model returns them (the config may count them otherwise)
                layers, _, hidden = vectors.shape
                outs = [_open_layer(files, folder / f"layer{layer:02d}.npy", (len(spans), hidden))
                        for layer in range(layers)]
            for layer, out in enumerate(outs):
                out.write(vectors[layer].tobytes())
            first = last
            if on_progress is not None:
                on_progress(min(start + step, len(lines)), len(lines))
    return {"occurrences": len(spans), "layers": layers, "hidden": hidden}


def _open_layer(files: contextlib.ExitStack, path: Path, shape: tuple[int, int]):
    """A layer file opened for appending its rows: the .npy header of a float32 (N, H) array."""
    out = files.enter_context(open(path, "wb"))
    np.lib.format.write_array_header_1_0(out, {"descr": np.dtype(np.float32).str, "fortran_order": False,
                                               "shape": shape})
    return out


def _batch_vectors(lm: LoadedModel, ids: list[list[int]], lines: np.ndarray, covered: list) -> np.ndarray:
    """(L+1, n, H) float32 unit vectors of the n word occurrences in a batch of lines: each the
    mean of its pieces' states. `lines` (n,): each occurrence's line within the batch."""
    states = _hidden_states(lm, ids)  # (L+1, B, T, H)
    layers, _, width, hidden = states.shape
    mean = torch.zeros(len(lines), states.shape[1] * width)  # averages each word's pieces
    for row, (line, pieces) in enumerate(zip(lines, covered)):
        mean[row, [int(line) * width + i for i in pieces]] = 1.0 / len(pieces)
    return _unit((mean @ states.reshape(layers, -1, hidden)).numpy())


def cache_dir() -> Path:
    """Where indexes are kept: $BERTDEMO_SEARCH_CACHE, else <the disk cache>/search."""
    return disk.folder_of("search")


class IndexCache:
    """Indexes on disk, one folder per model and corpus (`<model digest>-<corpus digest>/`, a file
    per layer, memory-mapped when read), and the last few layers read kept open.

    The model digest covers its config, every weight (names, shapes, bytes) and its tokenizer, so
    a tuned model gets its own index and a restart finds the old one. Builds are one at a time per
    key (a lock each): a second visitor asking while the first builds waits, seeing its progress,
    then reads the files. Each index is an entry of the server's disk cache (`disk.DiskCache`):
    a build first reserves its size (refused when it cannot fit, evicting the least recently used
    entries when it can), an index read is marked used, and `pin` keeps one from eviction (the
    default corpus'). An app's engine holds one; `IndexCache()` anywhere else reads and writes the
    same disk cache."""

    def __init__(self, folder: Path | str | None = None, keep: int = 16, cache: disk.DiskCache | None = None,
                 budget_mb: float | None = None):
        """`cache`: the server's disk cache; else one of its own in `folder` (default the disk
        cache's search folder) with `budget_mb` (default the disk cache's budget)."""
        if cache is None:
            cache = disk.DiskCache.of_kind("search", folder, budget_mb)
        self.cache = cache
        self.folder = cache.folder("search")
        self.keep = keep
        self.builds = 0  # indexes this object built (a test counts them)
        self._open: OrderedDict[tuple[str, int], Index] = OrderedDict()
        self._locks: dict[str, threading.Lock] = {}
        self._progress: dict[str, tuple[int, int]] = {}  # key -> (lines done, lines) of a build under way
        self._stopping = threading.Event()  # the server stops: every build ends at its next batch
        self._lock = threading.Lock()
        cache.on_evict(self._forget_folder)

    def key(self, lm: LoadedModel, corpus: Corpus) -> str:
        return f"{model_digest(lm)}-{corpus.digest}"

    def pin(self, lm: LoadedModel, corpus: Corpus) -> None:
        """Never evict `lm`'s index of `corpus` (the default corpus' of a served model)."""
        self.cache.pin(self.folder / self.key(lm, corpus))

    def stop_all(self) -> list[str]:
        """Stop every build at its next batch (the server stops); what was under way, in words."""
        self._stopping.set()  # no lock: a signal handler may call this on a thread that holds it
        return [f"a search index ({done:,} of {total:,} lines)" for done, total in list(self._progress.values())]

    def progress(self, lm: LoadedModel, corpus: Corpus) -> tuple[int, int] | None:
        """(lines done, lines) of the build of `lm`'s index of `corpus` under way, else None."""
        with self._lock:
            return self._progress.get(self.key(lm, corpus))

    def get(self, lm: LoadedModel, corpus: Corpus, layer: int, *, on_progress=None,
            should_stop=None) -> tuple[Index, bool]:
        """(the index of `corpus` at `layer` for `lm`, whether this call built it). While another
        caller builds it, `on_progress` sees that build's progress."""
        key = self.key(lm, corpus)
        found = self._read(key, layer)
        if found is not None:
            return found, False
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        seen = None
        while not lock.acquire(timeout=0.2):  # one build per key; the others wait for it, then read its files
            if should_stop is not None and should_stop():
                raise Stopped("Stopped while waiting for another visitor's build of the same index.")
            with self._lock:
                now = self._progress.get(key)
            if on_progress is not None and now is not None and now != seen:
                on_progress(*now)
                seen = now
        try:
            found = self._read(key, layer)
            if found is not None:
                return found, False
            index = self._build(lm, corpus, key, layer, on_progress, should_stop)
        finally:
            lock.release()
        return index, True

    def _build(self, lm, corpus, key, layer, on_progress, asked_to_stop) -> Index:
        """Build the index of `corpus` into the cache; its `layer`, opened before the folder is
        renamed into place: another build's reservation may evict it at once (it is the least
        recently used entry when it is the only one), and this caller's search still answers on
        its memory map."""
        started = time.perf_counter()
        words = word_occurrences(lm, corpus.lines)

        def should_stop() -> bool:
            return self._stopping.is_set() or (asked_to_stop is not None and asked_to_stop())

        def progress(done: int, total: int) -> None:
            with self._lock:
                self._progress[key] = (done, total)
            if on_progress is not None:
                on_progress(done, total)

        with self._room(lm, key, len(words[1]), should_stop):
            work = self.cache.temporary("search", key)
            try:  # written whole, then renamed into place: a reader never sees half an index
                shape = build_index(lm, corpus.lines, work, on_progress=progress, should_stop=should_stop,
                                    words=words)
                (work / "index.json").write_text(json.dumps({
                    "model": lm.name, "corpus": corpus.name, "lines": len(corpus.lines), **shape,
                    "dtype": "float32", "format": FORMAT, "seconds": round(time.perf_counter() - started, 2)}))
                index = self._load(work, layer)
                target = self.folder / key
                shutil.rmtree(target, ignore_errors=True)  # a damaged earlier copy
                os.replace(work, target)
            finally:
                shutil.rmtree(work, ignore_errors=True)
                with self._lock:
                    self._progress.pop(key, None)
        self.builds += 1
        log.info("search index for %s on the %s corpus (%d lines, %d occurrences, %d layers) built in %.1f s",
                 lm.name, corpus.name, len(corpus.lines), shape["occurrences"], shape["layers"],
                 time.perf_counter() - started)
        return index

    @contextlib.contextmanager
    def _room(self, lm: LoadedModel, key: str, occurrences: int, should_stop):
        """The disk cache's room for the index (`disk.DiskCache.reserve`): waits for the builds
        under way when it fits only after them; a pinned index is never refused."""
        what = f"The index of this corpus ({occurrences:,} word occurrences at {layer_count(lm)} layers)"
        with contextlib.ExitStack() as held:
            try:
                held.enter_context(self.cache.reserve(index_bytes(lm, occurrences), what, wait=WAIT_FOR_ROOM,
                                                      must=self.cache.pinned(self.folder / key), should_stop=should_stop))
            except disk.TooBig:
                if should_stop is not None and should_stop():
                    raise Stopped("The index build was stopped.") from None
                raise
            yield

    def _read(self, key: str, layer: int) -> Index | None:
        folder = self.folder / key
        with self._lock:
            if (key, layer) in self._open:
                self._open.move_to_end((key, layer))
                index = self._open[(key, layer)]
            else:
                index = None
        if index is None:
            index = self._load(folder, layer)
            if index is None:
                return None
            with self._lock:
                self._open[(key, layer)] = index
                while len(self._open) > self.keep:
                    self._open.popitem(last=False)
        self.cache.touch(folder)
        return index

    @staticmethod
    def _load(folder: Path, layer: int) -> Index | None:
        try:
            meta = json.loads((folder / "index.json").read_text())
            if meta.get("format") != FORMAT:
                return None
            return Index(layer, np.load(folder / f"layer{layer:02d}.npy", mmap_mode="r"),
                         np.load(folder / "spans.npy"), np.load(folder / "pieces.npy"))
        except (OSError, ValueError):
            return None

    def _forget_folder(self, folder: Path) -> None:
        """The disk cache evicted `folder`: close its open layers (a search holding one finishes
        on its memory map; the next search of that corpus builds it again)."""
        with self._lock:
            for key_layer in [k for k in self._open if k[0] == folder.name]:
                del self._open[key_layer]

    def forget(self) -> None:
        """Close every open index (the files stay)."""
        with self._lock:
            self._open.clear()
