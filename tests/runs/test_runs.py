"""bertdemo.runs: a run's whole life (declaration, slot, plan, worker, events, Stop, time limit,
keep/discard, release), on its own and through the app, including a queued request cancelled
before it starts."""
import dataclasses
import threading
import time
from types import SimpleNamespace

import httpx
import pytest

import bertdemo
import tiny_models
from bertdemo.runs import kinds, life, slots
from bertdemo.config import Limits
from bertdemo.training.fine_tuning import finetune
from bertdemo.sessions import SessionStore
from bertdemo.training.loop import Step

REPEATED = "\n".join(tiny_models.SENTENCES * 5)
FAST = dict(learning_rate=1e-2, batch_size=8, block_length=16)


def caller(store, session="a", limits=None):
    """Who asks for a run, as `runs` sees a visitor: the store, the session, the caps."""
    return SimpleNamespace(store=store, session=session, limits=limits or Limits())


def spec_of(job, name="test"):
    """A run kind whose request is its own plan and whose job is `job(plan, on_event, should_stop)`."""
    return life.RunSpec(name, dict, check=lambda caller, request: request, job=job)


def tune_job(lm, steps=50, also=None):
    """A run kind that fine-tunes `lm`, its events also sent to `also`."""
    def job(plan, on_event, should_stop):
        def step(event):
            on_event(event)
            if also:
                also(event)
        return finetune(lm, REPEATED, training_length=steps, on_event=step, should_stop=should_stop, **FAST)
    return spec_of(job)


def test_stop_ends_the_run_within_one_step_and_frees_the_slot(tiny_bert):
    store = SessionStore(tiny_bert)

    def press_stop_at_step_2(event):
        if isinstance(event, Step) and event.step == 2:
            assert life.stop(caller(store))

    with life.start(caller(store), tune_job(tiny_bert, also=press_stop_at_step_2), {}) as run:
        logs = list(run.updates(every=0.01))
        assert store.runs.status("a") == "running"
        outcome = run.finish()
    _, history = outcome.result
    assert history.stopped == "stopped" and len(history.steps) == 2 and outcome.ended == "stopped"
    assert [s.step for s in logs[-1].latest.steps] == [1, 2]
    assert store.runs.status("a") is None and life.stop(caller(store)) is False
    store.runs.reserve("a")  # free again


def test_time_limit_of_the_run_is_reported_as_such(tiny_bert):
    store = SessionStore(tiny_bert)
    with life.start(caller(store, limits=Limits(max_seconds=0)), tune_job(tiny_bert), {}) as run:
        outcome = run.finish()
    _, history = outcome.result
    assert history.stopped == "time limit" and outcome.ended == "time limit" and history.steps == []


def test_a_failing_job_raises_in_the_caller_and_frees_the_slot(tiny_bert):
    store = SessionStore(tiny_bert)
    started = Step(1, 1, 0.5, 1e-3, 0.0)

    def job(plan, on_event, should_stop):
        on_event(started)
        raise ValueError("bad input")

    with pytest.raises(ValueError, match="bad input"):
        with life.start(caller(store), spec_of(job), {}) as run:
            assert [log.latest.steps for log in run.updates(every=0.01)] == [[started]]
            run.finish()
    assert store.runs.status("a") is None


def test_leaving_early_stops_the_worker_as_a_closed_tab_does(tiny_bert):
    store = SessionStore(tiny_bert)
    gate = threading.Event()

    def job(plan, on_event, should_stop):
        while not should_stop():
            gate.wait(0.01)
        return "stopped"

    run = life.start(caller(store), spec_of(job), {})
    with run:
        pass  # the handler's generator closed before the job ended
    assert run.finish().result == "stopped" and store.runs.status("a") is None


def test_second_run_of_a_session_is_refused_others_are_independent(tiny_bert):
    store = SessionStore(tiny_bert)
    one, two = spec_of(lambda plan, on_event, should_stop: plan["n"]), spec_of(lambda *a, **k: 2)
    plan = life.reserve(caller(store), one, {"n": 1})  # the validator: the plan goes with the slot
    with pytest.raises(ValueError, match="already running or waiting"):
        life.reserve(caller(store), one, {"n": 1})
    life.reserve(caller(store, "b"), one, {"n": 1})
    assert store.runs.status("a") == "waiting"
    with life.start(caller(store), one, {"n": 99}) as run:  # claims the reserved ticket and its plan
        assert run.plan is plan and run.finish().result == 1
        with pytest.raises(ValueError, match="already running"):
            life.start(caller(store), two, {})


def test_a_reservation_whose_request_left_the_queue_is_taken_over(tiny_bert, monkeypatch):
    store = SessionStore(tiny_bert)
    still_queued = threading.Event()
    still_queued.set()
    store.runs.reserve("a", waiting=still_queued.is_set)
    still_queued.clear()  # its request was cancelled before its handler started
    with pytest.raises(ValueError, match="already running"):
        store.runs.reserve("a")  # within the grace period: the queue may not hold it yet
    monkeypatch.setattr(slots, "GRACE_S", 0.0)
    assert store.runs.status("a") is None
    store.runs.reserve("a")  # taken over, not refused forever
    still_queued.set()
    store.runs.reserve("b", waiting=still_queued.is_set)
    with pytest.raises(ValueError, match="already running"):
        store.runs.reserve("b")  # still queued: refused


def test_a_bad_request_is_refused_before_it_takes_the_slot(tiny_bert):
    store = SessionStore(tiny_bert)
    form = kinds.RUNS["compare_masking"].request(REPEATED, 3, "minutes", 5e-5, 8, 16, 0.15, "dynamic", 0)
    with pytest.raises(ValueError, match="'steps' or 'epochs'") as refused:
        life.reserve(caller(store), kinds.RUNS["compare_masking"], form)
    assert refused.value.field == "length_unit" and store.runs.status("a") is None


def test_every_run_kind_is_declared_once_with_its_endpoint():
    assert set(kinds.RUNS) == {"finetune", "compare_masking", "article_finetune", "train_classifier",
                              "forgetting_sweep", "adapt_then_classify", "train_features",
                              "train_transcoders"}
    assert all(spec.api_name == name and dataclasses.is_dataclass(spec.request)
               for name, spec in kinds.RUNS.items())


def test_keep_or_discard_for_another_kind_of_model(tiny_bert):
    """The classifier keeps its model by the same policy, in its own slot."""
    store = SessionStore(tiny_bert, max_models={"classifier": 1})
    model, history = finetune(tiny_bert, REPEATED, training_length=2, **FAST)
    kept = life.keep_or_discard(caller(store), model, history, False, kind="classifier")
    assert (kept.kind, kept.kept) == ("classifier", True) and store.model("a", "classifier") is model
    assert store.tuned("a") is None and store.for_session("a") is tiny_bert
    life.keep_or_discard(caller(store, "b"), model, history, False, kind="classifier")
    assert store.model("a", "classifier") is None and store.was_evicted("a", "classifier")


def fake_model(name: str):
    import torch

    return bertdemo.LoadedModel(name, tokenizer=None, model=torch.nn.Linear(2, 2), device=torch.device("cpu"))


def history_of(stopped: str | None, done: int = 10, planned: int = 10):
    from bertdemo.training.loop import RunHistory

    return RunHistory(planned, steps=[Step(i, planned, 1.0, 1e-3, 0.0) for i in range(1, done + 1)],
                      stopped=stopped)


# (what happened before the keep: a previous tuned model, in use; the page closed), the run, and the
# facts the keep policy returns
KEEP_CASES = {
    "finished": (dict(), history_of(None), False,
                 life.Kept("tuned", True, steps_done=10, steps_planned=10)),
    "finished, tuned in use": (dict(previous=True, in_use=True), history_of(None), False,
                               life.Kept("tuned", True, in_use=True, steps_done=10, steps_planned=10,
                                         had_previous=True)),
    "stopped, kept": (dict(), history_of("stopped", 3), True,
                      life.Kept("tuned", True, stopped="stopped", steps_done=3, steps_planned=10)),
    "stopped, not kept": (dict(previous=True), history_of("stopped", 3), False,
                          life.Kept("tuned", False, stopped="stopped", steps_done=3, steps_planned=10,
                                    had_previous=True)),
    "time limit, not kept": (dict(), history_of("time limit", 4), False,
                             life.Kept("tuned", False, stopped="time limit", steps_done=4, steps_planned=10)),
    "diverged": (dict(), history_of("diverged", 5), True,
                 life.Kept("tuned", False, stopped="diverged", steps_done=5, steps_planned=10)),
    "page closed": (dict(closed=True), history_of(None), False,
                    life.Kept("tuned", False, page_closed=True, steps_done=10, steps_planned=10)),
}


def keep_in_a_fresh_store(before: dict, history, keep_partial: bool):
    store = SessionStore(fake_model("base"))
    if before.get("previous"):
        store.put_model("a", "tuned", fake_model("previous"))
    if before.get("in_use"):
        store.use_tuned("a")
    if before.get("closed"):
        store.drop("a")
    model = fake_model("this run's")
    return store, model, life.keep_or_discard(caller(store), model, history, keep_partial)


@pytest.mark.parametrize("case", KEEP_CASES)
def test_the_keep_policy_returns_what_happened_as_facts(case):
    before, history, keep_partial, expected = KEEP_CASES[case]
    store, model, kept = keep_in_a_fresh_store(before, history, keep_partial)
    assert kept == expected
    assert (store.tuned("a") is model) == kept.kept


@pytest.mark.parametrize("case, said", [
    ("finished", "It is your tuned model now: press **Use my tuned model in all tabs** to try it there."),
    ("finished, tuned in use", "It is your tuned model now, already in use in the other tabs."),
    ("stopped, kept", "It is your tuned model now: press **Use my tuned model in all tabs** to try it there."),
    ("stopped, not kept", "The run ended early because you pressed Stop, after 3 of 10 steps. Its model was "
                          "**not kept**: your previous tuned model is unchanged. (Tick “Keep the model…” to "
                          "keep a stopped run.)"),
    ("time limit, not kept", "The run ended early because it reached the time limit of 60 s per run, after 4 "
                             "of 10 steps. Its model was **not kept**: you have no tuned model yet. (Tick “Keep "
                             "the model…” to keep a stopped run.)"),
    ("diverged", "The run ended early because the loss became infinite or NaN (try a smaller learning rate), "
                 "after 5 of 10 steps. Its model was **not kept**: you have no tuned model yet. (Tick “Keep the "
                 "model…” to keep a stopped run.)"),
    ("page closed", "Its model was **not kept**: the server took this page as closed while the run went on. "
                    "Reload the page to start again."),
])
def test_the_page_words_what_the_keep_policy_did(case, said):
    from bertdemo.ui.parts import live_run

    assert live_run.kept_note(KEEP_CASES[case][3], Limits(max_seconds=60)) == said
    assert live_run.kept_note(life.Kept("classifier", True), Limits()) == "It is your classifier model now."


def test_a_fine_tune_through_runs_alone_is_remembered_for_the_export(tiny_bert, tiny_bert_dir):
    """No tab involved: the fine-tune's keep policy keeps the run for the Trainer-script export,
    naming a server folder by its name only."""
    import json
    import zipfile

    from bertdemo.config import Settings
    from bertdemo.training import export
    from bertdemo.training.fine_tuning import TuningRequest

    store = SessionStore(tiny_bert)
    who = SimpleNamespace(store=store, session="a", limits=Limits(),
                          settings=Settings(model=str(tiny_bert_dir), device="cpu"))
    request = TuningRequest(REPEATED, 2, "steps", 1e-2, 8, 16, 0.15, "dynamic", 0, False, "")
    with life.start(who, kinds.RUNS["finetune"], request) as run:
        list(run.updates(every=0.01))
        outcome = run.finish()
    assert outcome.kept.kept and store.tuned("a") is outcome.result[0]
    with zipfile.ZipFile(export.script_zip(store, "a")) as archive:
        config = json.loads(archive.read("train-mlm/run.json"))
        assert archive.read("train-mlm/train.txt").decode().splitlines() == REPEATED.splitlines()
    assert config["model"] == tiny_bert_dir.name and config["model_note"] == export.FOLDER_NOTE
    assert str(tiny_bert_dir) not in json.dumps(config)  # the server's path stays on the server
    assert (config["training_length"], config["block_length"]) == (2, 16)


def test_the_zip_is_made_once_per_model(tiny_bert):
    store = SessionStore(tiny_bert)
    with pytest.raises(ValueError, match="no tuned model"):
        life.model_zip(store, "a")
    first, _ = finetune(tiny_bert, REPEATED, training_length=1, **FAST)
    store.put_model("a", "tuned", first)
    path = life.model_zip(store, "a")
    made = path.stat().st_mtime_ns
    assert life.model_zip(store, "a") == path and path.stat().st_mtime_ns == made
    second, _ = finetune(tiny_bert, REPEATED, training_length=1, seed=1, **FAST)
    store.put_model("a", "tuned", second)
    again = life.model_zip(store, "a")
    assert again.exists() and again.stat().st_mtime_ns != made
    store.drop("a")
    assert not again.exists()


# ---------------------------------------------------------------- through the app's queue

@pytest.fixture
def gated_demo(tiny_bert_dir, monkeypatch):
    """The real app whose fine-tune waits for a gate, so a second request stays queued behind it:
    (demo, url, store, gate)."""
    import app
    from conftest import launch

    from bertdemo.config import Settings

    gate = threading.Event()
    tuning = kinds.RUNS["finetune"]

    def held_tuning(plan, on_event=None, should_stop=None):
        while not gate.is_set() and not should_stop():
            time.sleep(0.01)
        return tuning.job(plan, on_event=on_event, should_stop=should_stop)

    monkeypatch.setitem(kinds.RUNS, "finetune", dataclasses.replace(tuning, job=held_tuning))
    store = SessionStore(bertdemo.load(str(tiny_bert_dir), device="cpu"))
    demo = app.build_demo(Settings(model=str(tiny_bert_dir), device="cpu"), store)
    url = launch(demo)
    yield demo, url, store, gate
    gate.set()
    demo.close()


@pytest.fixture
def gated_app(gated_demo):
    _, url, store, gate = gated_demo
    return url, store, gate


def join(url: str, session: str, fn_index: int) -> httpx.Response:
    """Queue one /finetune request the way the page does, without listening for its result."""
    data = [REPEATED, 2, "steps", 1e-2, 8, 16, 0.15, "dynamic", 0, False, "", True]  # /finetune's parameters
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
    wait_for(lambda: store.runs.status("holder") == "running")

    queued = join(url, "visitor", fn_index)
    assert queued.status_code == 200 and store.runs.status("visitor") == "waiting"
    refused = join(url, "visitor", fn_index)  # a second click: refused at once
    assert refused.status_code != 200 and "already running" in refused.text
    httpx.post(f"{url}gradio_api/cancel", json={"session_hash": "visitor", "fn_index": fn_index,
                                                "event_id": queued.json()["event_id"]}, timeout=30)
    monkeypatch.setattr(slots, "GRACE_S", 0.0)  # else the slot is taken over 5 s later
    assert store.runs.status("visitor") is None
    assert join(url, "visitor", fn_index).status_code == 200  # the cancelled one kept nothing
    gate.set()
    wait_for(lambda: store.runs.status("visitor") is None and store.tuned("visitor") is not None)


def test_stop_all_ends_every_run_says_shutdown_and_refuses_new_ones(tiny_bert):
    store = SessionStore(tiny_bert)
    started = threading.Event()

    def job(plan, on_event, should_stop):
        started.set()
        while not should_stop():
            time.sleep(0.01)
        return should_stop.reason

    spec = spec_of(job)
    store.runs.reserve("queued")  # its handler never starts: waiting for it must not block
    with life.start(caller(store), spec, {}) as run:
        assert started.wait(10)
        assert store.runs.stop_all() == 1
        assert run.finish().result == "shutdown" and run.ended == "shutdown"
    assert store.runs.wait_idle(timeout=5)
    with pytest.raises(ValueError, match="shutting down"):
        store.runs.reserve("b")
    with pytest.raises(ValueError, match="shutting down"):
        life.start(caller(store, "b"), spec, {})


def test_wait_idle_times_out_while_a_run_goes_on(tiny_bert):
    store = SessionStore(tiny_bert)
    release = threading.Event()
    spec = spec_of(lambda plan, on_event, should_stop: release.wait(10))
    with life.start(caller(store), spec, {}):
        assert store.runs.wait_idle(timeout=0.2) is False
        release.set()
    assert store.runs.wait_idle(timeout=5)


def test_a_run_whose_page_closed_says_so_not_stop(tiny_bert):
    store = SessionStore(tiny_bert)

    def close_the_page_at_step_2(event):
        if isinstance(event, Step) and event.step == 2:
            store.drop("a")  # what the page's unload does when the server loses its heartbeat

    with life.start(caller(store), tune_job(tiny_bert, also=close_the_page_at_step_2), {}) as run:
        list(run.updates(every=0.01))
        outcome = run.finish()
    assert outcome.ended == "closed" and outcome.result[1].stopped == "closed"
    kept = life.keep_or_discard(caller(store), outcome.result[0], outcome.result[1], keep_partial=False)
    assert not kept.kept and kept.stopped == "closed"
    from bertdemo.ui.parts import live_run  # and the page says so

    assert "lost this page's connection" in live_run.kept_note(kept, Limits())


# ---------------------------------------------------------------- a script's run among a crowd

def test_the_queues_message_map_never_forgets_a_session_waiting_for_an_answer():
    from bertdemo.ui.serving.queue_watch import LiveSessions

    pending = {"script": {"its fine-tune"}}
    held = LiveSessions({}, max_size=3, pending=lambda: pending)
    held["script"] = "its messages"
    for i in range(10):  # one-request sessions, answered
        held[f"one-{i}"] = "theirs"
        pending[f"one-{i}"] = set()
    assert held["script"] == "its messages" and len(held) == 3
    assert list(pending) == ["script", "one-8", "one-9"]  # the forgotten ones' empty sets go too
    pending["script"].clear()  # answered: it may go now, as the oldest
    held["next"] = "new"
    assert "script" not in held and len(held) == 3


@pytest.mark.slow
def test_a_scripts_fine_tune_is_answered_while_a_crowd_of_sessions_comes_and_goes(gated_demo):
    """A gradio_client script fine-tuning while one-request sessions (scripts calling the HTTP API
    without a session) keep arriving: Gradio forgets the oldest of 2,000 sessions' message queues,
    here of 20, and a run still going must not be among them."""
    from gradio_client import Client

    demo, url, store, gate = gated_demo
    client = Client(url, verbose=False)
    job = client.submit(REPEATED, 2, "steps", 1e-2, 8, 16, 0.15, "dynamic", 0, False, "", api_name="/finetune")
    wait_for(lambda: store.runs.status(client.session_hash) == "running")
    demo._queue.pending_messages_per_session.max_size = 20  # Gradio's 2,000, made small
    for _ in range(25):
        posted = httpx.post(f"{url}gradio_api/call/fill_mask", json={"data": ["Paris is the [MASK].", 3]},
                            timeout=30)
        answer = httpx.get(f"{url}gradio_api/call/fill_mask/{posted.json()['event_id']}", timeout=30)
        assert "event: complete" in answer.text
    gate.set()
    status = job.result(timeout=60)[0]
    assert "Done" in status
