"""Several visitors at once: each sees their own model, the shared base model is never changed;
a closed tab frees its run, its tuned model and its files; limits end runs and refuse a flood
politely."""
import contextlib
import gc
import json
import re
import sys
import threading
import time
import weakref
from pathlib import Path

import httpx
import pytest
import torch
from gradio_client import Client
from gradio_client.utils import Status

import app
import bertdemo
import tiny_models
from bertdemo.views.attention_views import view
from bertdemo.config import Settings
from bertdemo.serving.engine import Engine
from bertdemo.model.loading import LoadedModel
from bertdemo.sessions import SessionStore
from bertdemo.ui.serving import lifecycle

SENTENCE = "Paris is the [MASK] of France."
TEXT = "\n".join(tiny_models.SENTENCES * 3)
LONG_TEXT = "\n".join(tiny_models.SENTENCES * 40)  # a run of hundreds of steps: tens of seconds here
# the page counts layers from 1 (0 = the embeddings) and heads from 1: its layer 2, head 1 is the Python
# API's layer 1, head 0
ATTENTION = [SENTENCE, "", "head", [], [], "head", 2, 1, False, False, 0, 1]


def tune(client: Client, text=TEXT, steps=8, learning_rate=1e-2, batch=8, block=16, keep=False, submit=False):
    args = (text, steps, "steps", learning_rate, batch, block, 0.15, "dynamic", 0, keep, SENTENCE)
    if submit:
        return client.submit(*args, api_name="/finetune")
    return client.predict(*args, api_name="/finetune")


def fill(client: Client):
    return client.predict(SENTENCE, 5, api_name="/fill_mask")[1]


def heatmap(client: Client) -> list[list[float]]:
    outputs = client.predict(*ATTENTION, api_name="/attention")
    return next(o for o in outputs if isinstance(o, dict) and "heatmap" in o)["heatmap"]["matrix"]


def same_predictions(raw, expected) -> bool:
    return ([[p["token_id"] for p in m] for m in raw] == [[p["token_id"] for p in m] for m in expected]
            and all(abs(p["score"] - q["score"]) < 1e-5
                    for m, n in zip(raw, expected) for p, q in zip(m, n)))


def same_heatmap(matrix, lm) -> bool:
    expected = view(bertdemo.attention(lm, SENTENCE), "head", 1, 0).matrix
    return bool(torch.allclose(torch.tensor(matrix), torch.tensor(expected).float(), atol=1e-4))


def serve(settings: Settings):
    engine = Engine(max_batch=settings.max_batch)
    store = app.load_store(settings, engine)
    demo = app.build_demo(settings, store, engine)
    url, _ = lifecycle.serve(demo, settings, block=False)
    return demo, url, store


@pytest.fixture(scope="module")
def shared_app(tiny_bert_dir, tiny_distilbert):
    demo, url, store = serve(Settings(model=str(tiny_bert_dir), models=tiny_distilbert.name,
                                      device="cpu", port=None, finetune_max_chars=20_000))
    yield url, store
    demo.close()


@pytest.mark.slow
def test_concurrent_visitors_each_see_their_own_model_and_the_base_never_changes(shared_app,
                                                                                 tiny_distilbert):
    url, store = shared_app
    base = store.base
    before = {name: t.clone() for name, t in base.model.state_dict().items()}
    tuner, viewers, picker = Client(url, verbose=False), [Client(url, verbose=False) for _ in range(2)], \
        Client(url, verbose=False)
    start, seen, errors = threading.Barrier(4), {}, []

    def visit(name, work):
        try:
            start.wait()
            seen[name] = work()
        except Exception as err:  # noqa: BLE001 - reported by the assertion below
            errors.append((name, err))

    def fine_tune_then_use_it():
        tune(tuner)
        tuner.predict(api_name="/use_tuned")
        return fill(tuner), heatmap(tuner)

    def look_around(client):
        return [(fill(client), heatmap(client)) for _ in range(6)]

    def pick_distilbert():
        picker.predict(Path(tiny_distilbert.name).name, api_name="/choose_model")
        return [fill(picker) for _ in range(4)]

    threads = [threading.Thread(target=visit, args=("tuner", fine_tune_then_use_it)),
               threading.Thread(target=visit, args=("picker", pick_distilbert))]
    threads += [threading.Thread(target=visit, args=(f"viewer{i}", lambda c=c: look_around(c)))
                for i, c in enumerate(viewers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not errors, errors

    base_fill = bertdemo.fill_mask(base, SENTENCE, 5)
    for name in ("viewer0", "viewer1"):
        assert all(same_predictions(f, base_fill) and same_heatmap(h, base) for f, h in seen[name])
    tuned = store.tuned(tuner.session_hash)
    assert tuned is not None and tuned.model is not base.model
    tuned_fill, tuned_heatmap = seen["tuner"]
    assert same_predictions(tuned_fill, bertdemo.fill_mask(tuned, SENTENCE, 5))
    assert not same_predictions(tuned_fill, base_fill) and same_heatmap(tuned_heatmap, tuned)
    assert all(same_predictions(f, bertdemo.fill_mask(tiny_distilbert, SENTENCE, 5)) for f in seen["picker"])
    after = base.model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert not any(p.requires_grad for p in base.model.parameters())


@contextlib.contextmanager
def open_tab(url: str, session_hash: str):
    """What a browser tab holds open while it shows the page: Gradio's heartbeat for its session.
    Leaving the block closes it, as closing the tab does; Gradio then runs the app's unload."""
    with httpx.Client(timeout=30) as http, \
            http.stream("GET", f"{url}gradio_api/heartbeat/{session_hash}") as beating:
        lines = beating.iter_lines()  # kept: a dropped iterator would close the connection now
        next(lines)  # connected
        yield


def wait_for(condition, timeout_s: float = 30) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


@pytest.mark.slow
def test_closing_the_tab_mid_finetune_stops_it_and_frees_the_model_and_files(shared_app):
    url, store = shared_app
    ann, bob = Client(url, verbose=False), Client(url, verbose=False)
    sid = ann.session_hash
    with open_tab(url, sid):
        tune(ann, steps=2)
        ann.predict(api_name="/use_tuned")
        heatmap(ann)  # its tuned model's attention twin must go too
        ann.predict(api_name="/download_tuned")
        tuned, folder = weakref.ref(store.tuned(sid).model), store.session_dir(sid)
        job = tune(ann, text=LONG_TEXT, steps=300, learning_rate=5e-5, batch=32, block=64, keep=True, submit=True)
        assert wait_for(lambda: len(job.outputs()) > 0 or job.done()), "the run never started"
        assert not job.done(), "the run ended before the tab closed: make it longer"
    status = job.result(timeout=120)[0]
    done = re.search(r"Ended early\*\* after (\d+) steps", status)
    assert done and int(done.group(1)) < 300, status  # stopped within a step of the tab closing
    assert wait_for(lambda: store.tuned(sid) is None and not folder.exists())
    gc.collect()
    assert tuned() is None, "the closed session's tuned model is still in memory"
    assert "Done" in tune(bob, steps=2)[0]  # the fine-tune worker is free for the next person


def test_a_run_that_ends_after_its_tab_closed_keeps_nothing(tiny_bert):
    store = SessionStore(tiny_bert)
    flag = store.runs.reserve("gone")
    store.drop("gone")  # the tab closes while the run is on its last step
    assert flag.is_set()
    store.put_model("gone", "tuned", LoadedModel("late", tiny_bert.tokenizer, torch.nn.Linear(1, 1), tiny_bert.device))
    assert store.tuned("gone") is None and store.model_count("tuned") == 0


@pytest.fixture(scope="module")
def limited_app(tiny_bert_dir):
    """Runs limited to 1 second; at most 2 requests wait in the queue."""
    demo, url, store = serve(Settings(model=str(tiny_bert_dir), device="cpu", port=None,
                                      finetune_max_seconds=1, finetune_max_chars=20_000, queue_size=2))
    yield url, store
    demo.close()


@pytest.mark.slow
def test_a_finetune_at_the_time_limit_stops_cleanly_and_the_next_runs(limited_app):
    url, store = limited_app
    client = Client(url, verbose=False)
    status = tune(client, text=LONG_TEXT, steps=300, batch=32, block=64)[0]
    assert "time limit of 1 s" in status and "not kept" in status
    assert store.tuned(client.session_hash) is None
    assert "Done" in tune(client, steps=2)[0]


@pytest.mark.slow
def test_past_its_size_the_queue_refuses_politely_and_the_server_stays_up(limited_app):
    url, _ = limited_app
    clients = [Client(url, verbose=False) for _ in range(6)]
    jobs = []
    for client in clients:  # one after the other: Gradio checks the size before running validators
        jobs.append(tune(client, text=LONG_TEXT, steps=300, batch=32, block=64, submit=True))
        assert wait_for(lambda: jobs[-1].status().code not in (Status.STARTING, Status.JOINING_QUEUE))
    outcomes = []
    for job in jobs:
        try:
            outcomes.append(job.result(timeout=120)[0])
        except Exception as err:  # noqa: BLE001 - the refusal is what we look at
            outcomes.append(f"refused: {err}")
    refused = [i for i, o in enumerate(outcomes) if o.startswith("refused")]
    assert refused and len(refused) < len(jobs), outcomes
    assert all("queue is full" in outcomes[i].lower() for i in refused), outcomes
    assert len(fill(Client(url, verbose=False))[0]) == 5
    assert "Done" in tune(clients[refused[0]], steps=2)[0]  # refused, not locked out


def test_the_first_viewers_at_once_each_get_the_complete_offline_scripts(monkeypatch):
    """The soak found it: the scripts' data: URLs were cached one by one, so a viewer arriving
    while the first was still filling the cache found it half full and got an error (they are now
    read for each view, and no module keeps them)."""
    attention = sys.modules["bertdemo.views.attention_views"]  # the package's `attention` is the function
    start, got = threading.Barrier(8), []

    def first_view():
        start.wait()
        got.append(set(attention.data_urls()))

    threads = [threading.Thread(target=first_view) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert got == [set(attention.VENDORED)] * 8


@pytest.mark.slow
def test_an_idle_session_keeps_no_copy_of_what_it_was_sent(tiny_bert_dir):
    """Gradio copies the page's configuration and every value sent into its session table (for
    deep links, which this page has not): a long sentence's attention views must not stay in
    memory after the visitor goes idle, and a new visitor costs no copy of the page."""
    demo, url, _ = serve(Settings(model=str(tiny_bert_dir), device="cpu", port=None))
    try:
        short, long = Client(url, verbose=False), Client(url, verbose=False)
        short.predict(*ATTENTION, api_name="/attention")
        long_sentence = " ".join(["the cat sat on the mat ."] * 5 + ["[MASK] ."])  # ~60 tokens
        sent = long.predict(long_sentence, *ATTENTION[1:], api_name="/attention")
        kept = {client: len(json.dumps(list(demo.state_holder.session_data[client.session_hash].components),
                                       default=str))
                for client in (short, long)}
        sent_size = len(json.dumps(sent, default=str))
        assert sent_size > 100_000  # what a copy would add: the views of 60 tokens
        assert abs(kept[long] - kept[short]) < 2_000, "the session kept what it was sent"
        # Nor a configuration of every component (~0.3 MB of JSON for this page, built per visitor).
        assert max(kept.values()) < 2_000, "the session copied the page's configuration"
    finally:
        demo.close()
