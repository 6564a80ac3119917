"""bertdemo.runs: a run's whole life (slot, worker, events, Stop, time limit, keep/discard,
release), on its own and through the app, including a queued request cancelled before it starts."""
import threading
import time

import httpx
import pytest

import bertdemo
import tiny_models
from bertdemo import runs
from bertdemo.sessions import SessionStore
from bertdemo.training import Limits, finetune

REPEATED = "\n".join(tiny_models.SENTENCES * 5)
FAST = dict(lr=1e-2, batch_size=8, max_length=16)


def tune_job(lm, steps=50, on_event=None):
    def job(emit, should_stop):
        def step(event):
            emit(event)
            if on_event:
                on_event(event)
        return finetune(lm, REPEATED, steps=steps, on_step=step, should_stop=should_stop, **FAST)
    return job


def test_stop_ends_the_run_within_one_step_and_frees_the_slot(tiny_bert):
    store = SessionStore(tiny_bert)

    def press_stop_at_step_2(event):
        if event["kind"] == "step" and event["step"] == 2:
            assert runs.stop(store, "a")

    with runs.start(store, "a", tune_job(tiny_bert, on_event=press_stop_at_step_2)) as run:
        events = [e for batch in run.updates(every=0.01) for e in batch]
        assert store.run_status("a") == "running"
        _, history = run.outcome()
    assert history.stopped == "stopped" and len(history.steps) == 2 and run.ended == "stopped"
    assert [e["step"] for e in events if e["kind"] == "step"] == [1, 2]
    assert store.run_status("a") is None and runs.stop(store, "a") is False
    runs.reserve(store, "a")  # free again


def test_time_limit_of_the_run_is_reported_as_such(tiny_bert):
    store = SessionStore(tiny_bert)
    with runs.start(store, "a", tune_job(tiny_bert), max_seconds=0) as run:
        _, history = run.outcome()
    assert history.stopped == "time limit" and run.ended == "time limit" and history.steps == []


def test_a_failing_job_raises_in_the_caller_and_frees_the_slot(tiny_bert):
    store = SessionStore(tiny_bert)

    def job(emit, should_stop):
        emit("started")
        raise ValueError("bad input")

    with pytest.raises(ValueError, match="bad input"):
        with runs.start(store, "a", job) as run:
            assert [e for batch in run.updates(every=0.01) for e in batch] == ["started"]
            run.outcome()
    assert store.run_status("a") is None


def test_leaving_early_stops_the_worker_as_a_closed_tab_does(tiny_bert):
    store = SessionStore(tiny_bert)
    gate = threading.Event()

    def job(emit, should_stop):
        while not should_stop():
            gate.wait(0.01)
        return "stopped"

    run = runs.start(store, "a", job)
    with run:
        pass  # the handler's generator closed before the job ended
    assert run.outcome() == "stopped" and store.run_status("a") is None


def test_second_run_of_a_session_is_refused_others_are_independent(tiny_bert):
    store = SessionStore(tiny_bert)
    ticket = runs.reserve(store, "a")
    with pytest.raises(ValueError, match="already running or waiting"):
        runs.reserve(store, "a")
    runs.reserve(store, "b")
    assert store.run_status("a") == "waiting"
    with runs.start(store, "a", lambda emit, stop: 1) as run:  # claims the reserved ticket
        assert run.ticket is ticket and run.outcome() == 1
        with pytest.raises(ValueError, match="already running"):
            runs.start(store, "a", lambda emit, stop: 2)


def test_a_reservation_whose_request_left_the_queue_is_taken_over(tiny_bert, monkeypatch):
    store = SessionStore(tiny_bert)
    still_queued = threading.Event()
    still_queued.set()
    runs.reserve(store, "a", waiting=still_queued.is_set)
    still_queued.clear()  # its request was cancelled before its handler started
    with pytest.raises(ValueError, match="already running"):
        runs.reserve(store, "a")  # within the grace period: the queue may not hold it yet
    monkeypatch.setattr(runs, "GRACE_S", 0.0)
    assert store.run_status("a") is None
    runs.reserve(store, "a")  # taken over, not refused forever
    still_queued.set()
    runs.reserve(store, "b", waiting=still_queued.is_set)
    with pytest.raises(ValueError, match="already running"):
        runs.reserve(store, "b")  # still queued: refused


def test_keep_or_discard_for_another_kind_of_model(tiny_bert):
    """The classifier keeps its model by the same policy, in its own slot."""
    store = SessionStore(tiny_bert, max_models={"classifier": 1})
    model, history = finetune(tiny_bert, REPEATED, steps=2, **FAST)
    note = runs.keep_or_discard(store, "a", model, history, False, Limits(), kind="classifier")
    assert "classifier" in note and store.model("a", "classifier") is model
    assert store.tuned("a") is None and store.for_session("a") is tiny_bert
    runs.keep_or_discard(store, "b", model, history, False, Limits(), kind="classifier")
    assert store.model("a", "classifier") is None and store.was_evicted("a", "classifier")


def test_the_zip_is_made_once_per_model(tiny_bert):
    store = SessionStore(tiny_bert)
    with pytest.raises(ValueError, match="no tuned model"):
        runs.model_zip(store, "a")
    first, _ = finetune(tiny_bert, REPEATED, steps=1, **FAST)
    store.put_tuned("a", first)
    path = runs.model_zip(store, "a")
    made = path.stat().st_mtime_ns
    assert runs.model_zip(store, "a") == path and path.stat().st_mtime_ns == made
    second, _ = finetune(tiny_bert, REPEATED, steps=1, seed=1, **FAST)
    store.put_tuned("a", second)
    again = runs.model_zip(store, "a")
    assert again.exists() and again.stat().st_mtime_ns != made
    store.drop("a")
    assert not again.exists()


# ---------------------------------------------------------------- through the app's queue

@pytest.fixture
def gated_app(tiny_bert_dir, monkeypatch):
    """The real app whose fine-tune waits for a gate, so a second request stays queued behind it."""
    import app
    from conftest import launch

    from bertdemo.config import Settings
    from bertdemo.ui import finetune_tab

    gate = threading.Event()

    def held_finetune(lm, text, on_step=None, should_stop=None, **kwargs):
        while not gate.is_set() and not should_stop():
            time.sleep(0.01)
        return finetune(lm, text, on_step=on_step, should_stop=should_stop, **kwargs)

    monkeypatch.setattr(finetune_tab, "finetune", held_finetune)
    store = SessionStore(bertdemo.load(str(tiny_bert_dir), device="cpu"))
    demo = app.build_demo(Settings(model=str(tiny_bert_dir), device="cpu"), store)
    url = launch(demo)
    yield url, store, gate
    gate.set()
    demo.close()


def join(url: str, session: str, fn_index: int) -> httpx.Response:
    """Queue one /finetune request the way the page does, without listening for its result."""
    data = [REPEATED, 2, "steps", 1e-2, 8, 16, 0.15, "dynamic", 0, False, ""]
    return httpx.post(f"{url}gradio_api/queue/join", json={
        "data": data, "fn_index": fn_index, "session_hash": session, "event_data": None}, timeout=30)


def wait_for(condition, seconds=20.0):
    end = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


@pytest.mark.slow
def test_a_queued_request_cancelled_before_it_starts_does_not_keep_the_slot(gated_app, monkeypatch):
    url, store, gate = gated_app
    config = httpx.get(f"{url}config", timeout=30).json()
    fn_index = next(d["id"] for d in config["dependencies"] if d.get("api_name") == "finetune")
    assert join(url, "holder", fn_index).status_code == 200  # takes the only fine-tune worker
    wait_for(lambda: store.run_status("holder") == "running")

    queued = join(url, "visitor", fn_index)
    assert queued.status_code == 200 and store.run_status("visitor") == "waiting"
    refused = join(url, "visitor", fn_index)  # a second click: refused at once
    assert refused.status_code != 200 and "already running" in refused.text
    httpx.post(f"{url}gradio_api/cancel", json={"session_hash": "visitor", "fn_index": fn_index,
                                                "event_id": queued.json()["event_id"]}, timeout=30)
    monkeypatch.setattr(runs, "GRACE_S", 0.0)  # else the slot is taken over 5 s later
    assert store.run_status("visitor") is None
    assert join(url, "visitor", fn_index).status_code == 200  # the cancelled one kept nothing
    gate.set()
    wait_for(lambda: store.run_status("visitor") is None and store.tuned("visitor") is not None)
