"""SessionStore: each session's own tuned model, LRU eviction under a cap, one run per session."""
import gc
import weakref

import pytest
import torch

from bertdemo.models import LoadedModel
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
    store.put_tuned("a", tuned)
    assert store.for_session("a") is store.base  # kept, not yet switched to
    assert store.use_tuned("a") is tuned
    assert store.for_session("a") is tuned
    assert store.for_session("b") is store.base
    assert store.for_session(None) is store.base
    store.use_base("a")
    assert store.for_session("a") is store.base and store.tuned("a") is tuned


def test_least_recently_used_model_is_evicted_past_the_cap(store):
    for sid in "abc"[:2]:
        store.put_tuned(sid, fake_model(sid))
        store.use_tuned(sid)
    store.for_session("a")  # a used after b: b is now the least recently used
    store.put_tuned("c", fake_model("c"))
    assert store.tuned_count == 2
    assert store.tuned("b") is None and store.was_evicted("b")
    assert store.for_session("b") is store.base
    assert store.for_session("a").name == "a"
    with pytest.raises(ValueError, match="freed to make room"):
        store.use_tuned("b")


@pytest.mark.slow
def test_evicted_and_dropped_models_are_freed(store):
    store.put_tuned("a", fake_model("a"))
    ref = weakref.ref(store.tuned("a").model)
    store.put_tuned("b", fake_model("b"))
    store.put_tuned("c", fake_model("c"))  # evicts a
    gc.collect()
    assert ref() is None
    ref_c = weakref.ref(store.tuned("c").model)
    store.drop("c")
    gc.collect()
    assert ref_c() is None and store.tuned_count == 1


def test_replacing_a_sessions_model_does_not_evict_others(store):
    store.put_tuned("a", fake_model("a1"))
    store.put_tuned("b", fake_model("b"))
    store.put_tuned("a", fake_model("a2"))
    assert store.tuned("a").name == "a2" and store.tuned("b").name == "b"


def test_use_tuned_without_a_model_says_how_to_get_one(store):
    with pytest.raises(ValueError, match="Run a fine-tune first"):
        store.use_tuned("nobody")


def test_one_run_per_session_and_stop(store):
    assert store.request_stop("a") is False  # nothing runs: no error
    flag = store.reserve_run("a")
    with pytest.raises(ValueError, match="already running"):
        store.reserve_run("a")
    store.reserve_run("b")  # another session is independent
    assert store.run_flag("a") is flag
    assert store.request_stop("a") is True and flag.is_set()
    store.finish_run("a", flag)
    assert store.request_stop("a") is False
    assert not store.reserve_run("a").is_set()  # a new run gets a fresh flag


def test_drop_stops_the_run_and_deletes_the_files(store):
    flag = store.reserve_run("a")
    folder = store.session_dir("a")
    (folder / "model.zip").write_bytes(b"zip")
    store.put_tuned("a", fake_model("a"))
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
