"""SessionStore: each session's own tuned model, LRU eviction under a cap, one run per session."""
import gc
import threading
import time
import types
import weakref

import pytest
import torch

from bertdemo.model.loading import LoadedModel
from bertdemo import sessions
from bertdemo.sessions import SessionStore


class Weights(torch.nn.Linear):  # stands in for a model: only its identity and lifetime matter
    def __init__(self):
        super().__init__(2, 2)


def fake_model(name: str) -> LoadedModel:
    return LoadedModel(name, tokenizer=None, model=Weights(), device=torch.device("cpu"))


@pytest.fixture
def store():
    return SessionStore(fake_model("base"), max_tuned=2)


def test_tuned_model_is_used_only_by_its_session_after_switching(store):
    tuned = fake_model("a-tuned")
    store.put_model("a", "tuned", tuned)
    assert store.for_session("a") is store.base  # kept, not yet switched to
    assert store.use_tuned("a") is tuned
    assert store.for_session("a") is tuned
    assert store.for_session("b") is store.base
    assert store.for_session(None) is store.base
    store.use_base("a")
    assert store.for_session("a") is store.base and store.tuned("a") is tuned


def test_least_recently_used_model_is_evicted_past_the_cap(store):
    for sid in "abc"[:2]:
        store.put_model(sid, "tuned", fake_model(sid))
        store.use_tuned(sid)
    store.for_session("a")  # a used after b: b is now the least recently used
    store.put_model("c", "tuned", fake_model("c"))
    assert store.model_count("tuned") == 2
    assert store.tuned("b") is None and store.was_evicted("b")
    assert store.for_session("b") is store.base
    assert store.for_session("a").name == "a"
    with pytest.raises(ValueError, match="freed to make room"):
        store.use_tuned("b")


@pytest.mark.slow
def test_evicted_and_dropped_models_are_freed(store):
    store.put_model("a", "tuned", fake_model("a"))
    ref = weakref.ref(store.tuned("a").model)
    store.put_model("b", "tuned", fake_model("b"))
    store.put_model("c", "tuned", fake_model("c"))  # evicts a
    gc.collect()
    assert ref() is None
    ref_c = weakref.ref(store.tuned("c").model)
    store.drop("c")
    gc.collect()
    assert ref_c() is None and store.model_count("tuned") == 1


def test_replacing_a_sessions_model_does_not_evict_others(store):
    store.put_model("a", "tuned", fake_model("a1"))
    store.put_model("b", "tuned", fake_model("b"))
    store.put_model("a", "tuned", fake_model("a2"))
    assert store.tuned("a").name == "a2" and store.tuned("b").name == "b"


def test_use_tuned_without_a_model_says_how_to_get_one(store):
    with pytest.raises(ValueError, match="Run a fine-tune first"):
        store.use_tuned("nobody")


def test_one_run_per_session_and_stop(store):
    assert store.runs.stop("a") is False  # nothing runs: no error
    flag = store.runs.reserve("a")
    with pytest.raises(ValueError, match="already running"):
        store.runs.reserve("a")
    store.runs.reserve("b")  # another session is independent
    assert store.runs.claim("a") is flag  # the handler starts: it takes the reserved ticket
    assert store.runs.stop("a") is True and flag.is_set()
    store.runs.finish("a", flag)
    assert store.runs.stop("a") is False
    assert not store.runs.reserve("a").is_set()  # a new run gets a fresh flag


def test_drop_stops_the_run_and_deletes_the_files(store):
    flag = store.runs.reserve("a")
    folder = store.session_dir("a")
    (folder / "model.zip").write_bytes(b"zip")
    store.put_model("a", "tuned", fake_model("a"))
    store.drop("a")
    assert flag.is_set() and not folder.exists() and store.tuned("a") is None
    store.drop("a")  # twice, or a session never seen: no error
    store.drop(None)


def test_session_dirs_are_separate(store):
    assert store.session_dir("a") != store.session_dir("b")
    assert store.session_dir("a") == store.session_dir("a")


def test_no_base_model_gives_the_load_error():
    store = SessionStore(None, load_error="could not load: pass --model")
    with pytest.raises(ValueError, match="could not load"):
        store.for_session("a")
    with pytest.raises(ValueError, match="at least 1"):
        SessionStore(None, max_tuned=0)


def test_drop_frees_everything_a_session_holds(store):
    """Models of every kind, kept results, downloads and exports, and the run: all at once."""
    ticket = store.runs.reserve("a")
    store.put_model("a", "tuned", fake_model("a"))
    store.put_model("a", "classifier", fake_model("a-classifier"))
    refs = [weakref.ref(store.tuned("a").model), weakref.ref(store.model("a", "classifier").model)]
    store.keep_result("a", "attention", object(), 300)
    export = store.session_dir("a") / "bertviz-head-view.html"
    export.write_text("<html>")
    store.drop("a")
    gc.collect()
    assert ticket.is_set() and not export.exists() and all(ref() is None for ref in refs)
    assert store.result("a", "attention") is None and store.result_bytes() == 0
    assert store.model("a", "classifier") is None and "a" not in store


def test_models_of_each_kind_have_their_own_cap():
    store = SessionStore(fake_model("base"), max_tuned=2, max_models={"classifier": 1})
    store.put_model("a", "classifier", fake_model("a"))
    store.put_model("a", "tuned", fake_model("a-tuned"))
    store.put_model("b", "classifier", fake_model("b"))  # evicts a's classifier only
    assert store.model("a", "classifier") is None and store.was_evicted("a", "classifier")
    assert store.tuned("a") is not None and not store.was_evicted("a")
    assert store.model_count("classifier") == 1 and store.model_count("tuned") == 1


def test_kept_results_stay_within_their_cap_least_recent_first():
    store = SessionStore(None, max_result_bytes=1_000)
    store.keep_result("a", "attention", "a's", 400)
    store.keep_result("b", "attention", "b's", 400)
    store.result("a", "attention")  # a used after b
    store.keep_result("c", "attention", "c's", 400)
    assert store.result("b", "attention") is None
    assert store.result("a", "attention") == "a's" and store.result("c", "attention") == "c's"


def test_idle_sessions_are_freed_but_not_while_their_run_goes(store):
    store.keep_result("idle", "attention", "q", 100)
    store.put_model("idle", "tuned", fake_model("idle"))
    store.runs.reserve("running")
    store.keep_result("fresh", "attention", "q", 100)
    later = time.monotonic() + store.max_idle_s + 1
    store._sessions["fresh"].used = later  # noqa: SLF001 - as if used just now, at `later`
    assert store.sweep(now=later) == ["idle"]
    assert store.tuned("idle") is None and store.result("fresh", "attention") == "q"
    assert store.runs.stop("running")


def test_the_sweeper_frees_an_idle_session_in_the_running_app():
    store = SessionStore(fake_model("base"), max_idle_s=0.05)
    store.keep_result("idle", "attention", "q", 100)
    sweeper = store.start_sweeper(every_s=0.02)  # as app.py starts it (every minute there)
    try:
        assert store.start_sweeper() is sweeper  # one sweeper per store
        deadline = time.monotonic() + 10
        while "idle" in store and time.monotonic() < deadline:
            time.sleep(0.02)
        assert "idle" not in store and store.result("idle", "attention") is None
    finally:
        store.close()
    sweeper.join(timeout=5)
    assert not sweeper.is_alive()  # close stops it


def test_reading_or_adding_a_session_starts_no_thread(store, monkeypatch):
    later = time.monotonic() + 3 * 3600  # the store's clock only (a server in this process keeps its own)
    monkeypatch.setattr(sessions, "time", types.SimpleNamespace(monotonic=lambda: later))  # long after any sweep
    started, start = [], threading.Thread.start
    monkeypatch.setattr(threading.Thread, "start", lambda thread: started.append(thread) or start(thread))
    for session in ("a", "b", "c"):
        store.keep_result(session, "attention", "q", 10)
        store.for_session(session)
        store.result(session, "attention")
        store.session_dir(session)
    assert not [t for t in started if getattr(getattr(t, "_target", None), "__self__", None) is store]
    assert all(session in store for session in "abc")  # and nothing was swept behind the reader's back


def test_a_file_is_made_once_per_owner(store):
    made = []

    def make(folder):
        made.append(folder)
        path = folder / "model.zip"
        path.write_bytes(b"zip")
        return path

    first, second = fake_model("1"), fake_model("2")
    path = store.cached_file("a", "zip", first, make)
    assert store.cached_file("a", "zip", first, make) == path and len(made) == 1
    store.cached_file("a", "zip", second, make)
    assert len(made) == 2


def test_close_deletes_every_sessions_files_and_the_temp_area(store):
    made = [store.cached_file(sid, "zip", store.base.model, lambda folder: _write(folder / "m.zip"))
            for sid in ("a", "b")]
    root = store.temp_root
    store.close()
    assert not root.exists() and not any(path.exists() for path in made)
    assert "a" not in store and store.for_session("a") is store.base


def _write(path):
    path.write_bytes(b"zip")
    return path


def test_a_closed_session_that_starts_a_new_run_keeps_its_model_again(store):
    store.drop("a")  # e.g. its heartbeat stream timed out while the script goes on
    store.put_model("a", "tuned", fake_model("during"))
    assert store.tuned("a") is None  # a run going when it closed keeps nothing
    store.reopen("a")  # a new run of it starts
    store.put_model("a", "tuned", fake_model("after"))
    assert store.tuned("a").name == "after"
