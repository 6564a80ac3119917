"""The server's disk caches under one folder and one budget: least recently used out first, never a
pinned entry, a write that cannot fit refused in words, what a killed process left removed at the
next start, and the corpus search's indexes within the budget whatever visitors bring."""
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import bertdemo
from bertdemo import disk
from bertdemo.config import Settings
from bertdemo.disk import DiskCache, TooBig
from bertdemo.views import corpus_search
from bertdemo.views.corpus_search import IndexCache

ROOT = Path(__file__).resolve().parent.parent
WORDS = ("the cat dog sat ran on in at park river bank money house tree water city capital paris france "
         "berlin germany red blue green small big old new happy sad fast slow day night").split()


def entry(folder: Path, name: str, mb: float, age: float = 0.0) -> Path:
    """A cache entry of `mb` megabytes, last used `age` seconds ago."""
    path = folder / name
    path.mkdir(parents=True)
    (path / "data.bin").write_bytes(b"\0" * int(mb * disk.MB))
    when = time.time() - age
    os.utime(path, (when, when))
    return path


def folder_bytes(folder: Path) -> int:
    return disk.size_of(folder)  # a file evicted meanwhile counts 0


def visitor_corpus(seed: int, lines: int) -> str:
    pick = random.Random(seed)
    return "\n".join(" ".join(pick.choice(WORDS) for _ in range(pick.randint(6, 14))) for _ in range(lines))


# ---------------------------------------------------------------- the budget

def test_least_recently_used_entries_of_every_kind_go_first_and_pinned_ones_never(tmp_path):
    cache = DiskCache(tmp_path, budget=10)
    oldest = entry(cache.folder("search"), "old-index", 3, age=300)
    pinned = entry(cache.folder("search"), "default-index", 3, age=400)
    export = tmp_path / "onnx" / "bert-abc.onnx"
    export.parent.mkdir()
    export.write_bytes(b"\0" * 3 * disk.MB)
    os.utime(export, (time.time() - 200,) * 2)
    recent = entry(cache.folder("features"), "digest/layer_3", 1, age=10)
    cache.pin(pinned)
    with cache.reserve(4 * disk.MB, "a new index"):  # 10 used + 4 > 10: the two least recent unpinned go
        pass
    assert pinned.exists() and recent.exists()
    assert not oldest.exists() and not export.exists()
    assert cache.used_bytes() <= cache.budget_bytes


def test_a_write_that_cannot_fit_is_refused_naming_both_figures(tmp_path):
    cache = DiskCache(tmp_path, budget=10)
    cache.pin(entry(cache.folder("search"), "default-index", 6))
    unpinned = entry(cache.folder("search"), "other", 2)
    with pytest.raises(TooBig, match=r"needs about 5 MB of disk, and the server's cache budget is 10 MB"):
        with cache.reserve(5 * disk.MB, "The index of this corpus"):
            pass
    assert unpinned.exists(), "a refused write evicted what it could not use"


def test_writes_under_way_count_against_the_budget(tmp_path):
    cache = DiskCache(tmp_path, budget=10)
    with cache.reserve(6 * disk.MB, "the first"):
        with pytest.raises(TooBig, match="6 MB of it is kept or being written now"):
            with cache.reserve(6 * disk.MB, "the second"):
                pass
    with cache.reserve(6 * disk.MB, "the second, after"):
        pass


def test_a_write_that_fits_once_the_writes_under_way_end_waits_for_them(tmp_path):
    cache, order = DiskCache(tmp_path, budget=10), []

    def second():
        with cache.reserve(6 * disk.MB, "the second", wait=10):
            order.append("second writes")
    with cache.reserve(6 * disk.MB, "the first"):
        waiting = threading.Thread(target=second)
        waiting.start()
        time.sleep(0.5)
        order.append("first ends")
    waiting.join()
    assert order == ["first ends", "second writes"]


def test_a_folder_of_its_own_still_counts_in_the_one_budget(tmp_path):
    own = tmp_path / "elsewhere"
    cache = DiskCache(tmp_path / "root", budget=5, environ={"BERTDEMO_SEARCH_CACHE": str(own)})
    assert cache.folder("search") == own and cache.folder("onnx") == tmp_path / "root" / "onnx"
    old = entry(own, "old-index", 4, age=100)
    with cache.reserve(2 * disk.MB, "a dictionary"):
        pass
    assert not old.exists()


def test_the_settings_name_the_folder_and_the_budget(tmp_path):
    settings = Settings.from_flags(["--cache-dir", str(tmp_path), "--cache-mb", "400"], environ={})
    assert (settings.cache_dir, settings.cache_mb) == (str(tmp_path), 400)
    assert Settings.from_env({"BERTDEMO_CACHE_MB": "300"}).cache_mb == 300
    assert Settings().cache_mb == disk.DEFAULT_BUDGET_MB


# ---------------------------------------------------------------- what a killed process left

def test_a_start_removes_what_a_killed_writer_left_and_keeps_a_live_ones(tmp_path, caplog):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    host = socket.gethostname()
    cache = DiskCache(tmp_path)
    dead = entry(cache.folder("search"), f"{disk.PART}{gone.pid}@{host}~abc-x", 2)
    dead_export = cache.folder("onnx") / f"{disk.PART}{gone.pid}@{host}~bert-y"
    dead_export.mkdir(parents=True)
    (dead_export / "model.onnx").write_bytes(b"\0" * disk.MB)
    live = entry(cache.folder("features"), f"d/{disk.PART}{os.getppid()}@{host}~layer_1-z", 1)
    whole = entry(cache.folder("search"), "whole-index", 1)
    with caplog.at_level(logging.INFO, logger="bertdemo.disk"):
        bertdemo.Engine(disk=DiskCache(tmp_path))
    assert not dead.exists() and not dead_export.exists()
    assert live.exists() and whole.exists()
    lines = [r.getMessage() for r in caplog.records if "leftover" in r.getMessage()]
    assert lines == ["disk cache: removed 2 leftovers of killed processes (half-written entries, temp folders; "
                     "3.0 MB freed)"]


@pytest.mark.slow
def test_an_index_build_killed_mid_write_is_removed_at_the_next_start_and_never_read(tmp_path):
    script = textwrap.dedent(f"""
        import sys, time
        sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / 'tests')!r}]
        import bertdemo, tiny_models
        from bertdemo.views import corpus_search
        lm = bertdemo.load(str(tiny_models.save_tiny_bert(__import__('pathlib').Path({str(tmp_path / 'model')!r}))))
        slow = corpus_search._batch_vectors
        def slowly(*args):
            print("writing", flush=True)
            time.sleep(0.5)
            return slow(*args)
        corpus_search._batch_vectors = slowly
        corpus_search.search_corpus(lm, "the cat sat", word="cat", layer=1, corpus={visitor_corpus(1, 400)!r},
                                    cache=corpus_search.IndexCache({str(tmp_path / 'search')!r}))
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    for _ in range(3):  # a few batches written
        assert child.stdout.readline() == "writing\n"
    child.send_signal(signal.SIGKILL)
    child.wait()
    left = list((tmp_path / "search").iterdir())
    assert len(left) == 1 and left[0].name.startswith(disk.PART) and folder_bytes(left[0]) > 0
    lm = bertdemo.load(str(tmp_path / "model"))
    engine = bertdemo.Engine(disk=DiskCache(tmp_path, environ={"BERTDEMO_SEARCH_CACHE": str(tmp_path / "search")}))
    assert list((tmp_path / "search").iterdir()) == []
    result = bertdemo.search_corpus(lm, "the cat sat", word="cat", layer=1, corpus=visitor_corpus(1, 400),
                                    cache=engine.search)
    assert result["built"] and result["hits"]


# ---------------------------------------------------------------- the search's indexes

def test_an_evicted_index_answers_while_read_then_again_with_the_same_hits(tiny_bert, tmp_path):
    corpus = visitor_corpus(2, 300)
    size = corpus_search.index_bytes(tiny_bert, len(corpus_search.word_occurrences(
        tiny_bert, corpus_search.read_corpus(corpus).lines)[1]))
    search = IndexCache(tmp_path, budget_mb=1.5 * size / disk.MB)
    first = bertdemo.search_corpus(tiny_bert, "the cat sat", word="cat", layer=2, corpus=corpus, cache=search)
    index, _ = search.get(tiny_bert, corpus_search.read_corpus(corpus), 2)  # a visitor holds it
    bertdemo.search_corpus(tiny_bert, "the cat sat", word="cat", layer=2, corpus=visitor_corpus(3, 300),
                           cache=search)  # another corpus: the first is evicted
    assert not (tmp_path / search.key(tiny_bert, corpus_search.read_corpus(corpus))).exists()
    assert np.isfinite(np.asarray(index.vectors[:5])).all()  # still readable where it is held
    again = bertdemo.search_corpus(tiny_bert, "the cat sat", word="cat", layer=2, corpus=corpus, cache=search)
    assert again["built"] and again["hits"] == first["hits"]


def test_an_index_evicted_the_moment_it_is_built_still_answers_its_builder(tiny_bert, tmp_path, monkeypatch):
    """Another visitor's build may evict a fresh index at once (the only entry, so the least
    recently used): the search that built it answers all the same, with the hits of a quiet build."""
    corpus = visitor_corpus(5, 200)
    quiet = bertdemo.search_corpus(tiny_bert, "the big dog ran", word="dog", layer=2, corpus=corpus,
                                   cache=IndexCache(tmp_path / "quiet"))
    search = IndexCache(tmp_path / "crowded")
    rename = corpus_search.os.replace

    def renamed_then_evicted(source, target):
        rename(source, target)
        search.cache._evict(next(e for e in search.cache.entries() if e.path == Path(target)))

    monkeypatch.setattr(corpus_search.os, "replace", renamed_then_evicted)
    crowded = bertdemo.search_corpus(tiny_bert, "the big dog ran", word="dog", layer=2, corpus=corpus,
                                     cache=search)
    assert crowded["built"] and crowded["hits"] == quiet["hits"]
    assert not (search.folder / search.key(tiny_bert, corpus_search.read_corpus(corpus))).exists()


def test_eight_visitors_four_at_once_stay_within_the_budget(tiny_bert, tmp_path):
    """The issue's crowd, scaled to the tiny model: eight corpora, each about a third of the budget,
    four built at once; every search answers or refuses in words, the folder stays within the
    budget (10% slack while a file is written), and an evicted corpus answers again alike."""
    corpora = [visitor_corpus(seed, 600) for seed in range(8)]
    one = corpus_search.index_bytes(tiny_bert, len(corpus_search.word_occurrences(
        tiny_bert, corpus_search.read_corpus(corpora[0]).lines)[1]))
    budget = 3.2 * one
    search = IndexCache(tmp_path, budget_mb=budget / disk.MB)
    peak, answers, done = [0], {}, threading.Event()

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], folder_bytes(tmp_path))
            time.sleep(0.01)

    def visit(n):
        try:
            answers[n] = bertdemo.search_corpus(tiny_bert, "the big dog ran", word="dog", layer=2,
                                                corpus=corpora[n], cache=search)["hits"]
        except ValueError as refused:
            answers[n] = str(refused)

    watcher = threading.Thread(target=watch)
    watcher.start()
    for wave in (range(4), range(4, 8)):
        visitors = [threading.Thread(target=visit, args=(n,)) for n in wave]
        for v in visitors:
            v.start()
        for v in visitors:
            v.join()
    done.set()
    watcher.join()
    assert len(answers) == 8
    refused = [a for a in answers.values() if isinstance(a, str)]
    assert all("cache budget is" in a and "MB" in a for a in refused)
    assert len(refused) < 8
    assert peak[0] <= 1.1 * budget, f"{peak[0] / disk.MB:.2f} MB on disk, budget {budget / disk.MB:.2f}"
    first = next(n for n, a in answers.items() if not isinstance(a, str))
    again = bertdemo.search_corpus(tiny_bert, "the big dog ran", word="dog", layer=2, corpus=corpora[first],
                                   cache=search)
    assert again["hits"] == answers[first]


def test_a_search_waiting_on_a_build_sees_its_progress(tiny_bert, tmp_path, monkeypatch):
    search = IndexCache(tmp_path)
    corpus = visitor_corpus(4, 400)
    slow = corpus_search._batch_vectors

    def slowly(*args):
        time.sleep(0.05)
        return slow(*args)
    monkeypatch.setattr(corpus_search, "_batch_vectors", slowly)
    monkeypatch.setattr(corpus_search, "lines_per_forward", lambda lm: 20)
    builder = threading.Thread(target=bertdemo.search_corpus, args=(tiny_bert, "the cat sat"),
                               kwargs=dict(word="cat", layer=1, corpus=corpus, cache=search))
    builder.start()
    while search.progress(tiny_bert, corpus_search.read_corpus(corpus)) is None:
        time.sleep(0.01)
    seen = []
    result = bertdemo.search_corpus(tiny_bert, "the cat sat", word="cat", layer=1, corpus=corpus, cache=search,
                                    on_progress=lambda done, total: seen.append((done, total)))
    builder.join()
    assert not result["built"] and len(seen) >= 2 and seen == sorted(seen) and seen[-1][1] == 400


def test_the_default_corpus_index_is_built_in_the_background_and_pinned(tiny_bert, tmp_path):
    engine = bertdemo.Engine(disk=DiskCache(tmp_path, budget=1))  # a budget far below it: pinned all the same
    engine.build_default_index(tiny_bert).join()
    result = bertdemo.search_corpus(tiny_bert, "I sat on the river bank.", word="bank", layer=1, cache=engine.search)
    assert not result["built"] and result["corpus"] == "default"
    key = engine.search.key(tiny_bert, corpus_search.read_corpus(None))
    assert engine.disk.pinned(tmp_path / "search" / key)
    with pytest.raises(TooBig):
        with engine.disk.reserve(1, "anything else"):
            pass
    assert (tmp_path / "search" / key).is_dir()


def test_a_build_holds_a_bounded_batch_whatever_the_model_size(tiny_bert):
    """lines_per_forward: one forward's states of every layer at the longest lines stay within
    STATES_BYTES (bert-base: 13 layers x 128 tokens x 768 floats per line)."""
    class Config:
        num_hidden_layers, hidden_size = 12, 768

    class BertBaseSized:
        model = type("M", (), {"config": Config()})()
        max_length = 512
    lines = corpus_search.lines_per_forward(BertBaseSized())
    assert 1 <= lines < corpus_search.BATCH
    assert lines * 13 * 128 * 768 * 4 <= corpus_search.STATES_BYTES
    assert corpus_search.lines_per_forward(tiny_bert) == corpus_search.BATCH


# ---------------------------------------------------------------- where the operator sees it

def test_the_health_endpoint_and_the_about_tab_say_used_and_budget(tiny_bert, tmp_path):
    from starlette.applications import Starlette
    from starlette.testclient import TestClient

    from bertdemo.sessions import SessionStore
    from bertdemo.ui.parts.context import Visitor
    from bertdemo.ui.serving.health import Health
    from bertdemo.ui.tabs import about_tab

    cache = DiskCache(tmp_path, budget=400)
    entry(cache.folder("search"), "an-index", 12.5)
    answer = TestClient(Health(Starlette(), SessionStore(tiny_bert), disk=cache)).get("/healthz")
    assert answer.status_code == 200 and answer.text.splitlines()[1] == "cache 12.5 of 400 MB used"
    engine = bertdemo.Engine(disk=cache)
    said = about_tab.on_disk(Visitor(SessionStore(tiny_bert), Settings(), "someone", engine))
    assert "cache 12.5 of 400 MB used" in said and "search 12.5 MB" in said


def test_walking_the_cache_skips_what_vanishes_while_it_is_walked(tmp_path, monkeypatch):
    """Other writers rename and evict under the folder being walked: what vanishes is skipped,
    what stays is found (`Path.glob`/`rglob` raise FileNotFoundError there)."""
    for name in ("a/layer_1", "a/layer_2", "b/layer_1", "b/.part-9@h~x/inner", "c/.part-9@h~y"):
        (tmp_path / name).mkdir(parents=True)
    listdir = os.listdir

    def b_evicted_while_read(path):
        names = listdir(path)
        if Path(path) == tmp_path:
            shutil.rmtree(tmp_path / "b")
        return names

    monkeypatch.setattr(disk.os, "listdir", b_evicted_while_read)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in disk.matching(tmp_path, "*/layer_*")) \
        == ["a/layer_1", "a/layer_2"]
    assert [p.relative_to(tmp_path).as_posix() for p in disk.named(tmp_path, ".part-9@h~")] == ["c/.part-9@h~y"]
