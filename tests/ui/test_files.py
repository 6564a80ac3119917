"""Files: the app serves only what it made, from its own temp area; downloads are deleted after
their age, when their session ends, or when the download area outgrows its cap; uploads and
bertviz views are capped."""
import json
import os
import time
import zipfile
from pathlib import Path

import httpx
import numpy as np
import pytest
from gradio_client import Client

import app
from bertdemo.views.attention_views import VENDORED, Attention, bertviz_html
from bertdemo.config import Settings
from bertdemo.sessions import SessionStore
from bertdemo.ui.serving import lifecycle

FT_TEXT = "Paris is the capital of France.\nThe Eiffel Tower is a famous landmark."


@pytest.fixture(scope="module")
def files_app(engine, tiny_bert_dir):
    """The app with downloads kept for 1 second, and its store."""
    settings = Settings(model=str(tiny_bert_dir), device="cpu", port=None, download_max_age=1)
    store = app.load_store(settings, engine)
    demo = app.build_demo(settings, store, engine)
    url, _ = lifecycle.serve(demo, settings, block=False)
    yield url, store
    demo.close()


def fetch(url: str, path) -> httpx.Response:
    return httpx.get(f"{url}gradio_api/file={path}", timeout=30)


def tuned_client(url: str, steps: int) -> Client:
    """A new visitor of the app at `url` whose fine-tune of FT_TEXT ran `steps` steps."""
    client = Client(url, verbose=False)
    client.predict(FT_TEXT, steps, "steps", 5e-5, 2, 16, 0.15, "dynamic", 0, False, "", api_name="/finetune")
    return client


@pytest.mark.slow
def test_nothing_outside_the_apps_temp_area_can_be_fetched(files_app, tiny_bert_dir):
    url, store = files_app
    own_download = store.session_dir("someone") / "bertdemo-tuned-model.zip"
    own_download.write_bytes(b"PK\x05\x06" + b"\0" * 18)  # made by the app, but never returned
    gradio_temp = os.environ.get("GRADIO_TEMP_DIR", "/tmp/gradio")
    port = httpx.URL(url).port
    for path in ["/etc/passwd", tiny_bert_dir / "config.json", tiny_bert_dir / "model.safetensors",
                 Path(app.__file__), own_download, f"{gradio_temp}/../../etc/passwd", "../../etc/passwd",
                 f"http://127.0.0.1:{port}/config", "http://169.254.169.254/latest/meta-data/"]:
        response = fetch(url, path)
        assert response.status_code in (403, 404), (path, response.status_code)
        assert "root:x:0:0" not in response.text and "__metadata__" not in response.text
    assert fetch(url, VENDORED["require"]).status_code == 200  # the route itself works


@pytest.mark.slow
def test_a_download_is_served_from_gradios_temp_area_then_deleted_after_its_age(files_app):
    url, store = files_app
    client = tuned_client(url, steps=2)
    done, data = call_raw_data(url, "/download_tuned", client.session_hash)
    served = data[0]
    assert done and Path(served["path"]).name == "bertdemo-tuned-model.zip"
    assert Path(served["path"]).resolve().is_relative_to(Path(os.environ.get(
        "GRADIO_TEMP_DIR", "/tmp/gradio")).resolve())
    response = httpx.get(served["url"], timeout=30)
    assert response.status_code == 200 and response.content[:2] == b"PK"
    assert (store.session_dir(client.session_hash) / "bertdemo-tuned-model.zip").exists()
    assert wait_for(lambda: httpx.get(served["url"], timeout=30).status_code in (403, 404), 20), \
        "the download was still served after its age (1 s)"


def call_raw_data(url: str, api_name: str, session_hash: str):
    """(True, output data) of an endpoint without inputs, through Gradio's HTTP API."""
    posted = httpx.post(f"{url}gradio_api/call{api_name}", json={"data": [], "session_hash": session_hash})
    text = httpx.get(f"{url}gradio_api/call{api_name}/{posted.json()['event_id']}", timeout=60).text
    lines = [line.split(": ", 1) for line in text.splitlines() if ": " in line]
    return lines[-2][1] == "complete", json.loads(lines[-1][1])


def wait_for(condition, timeout_s: float) -> bool:
    """Poll `condition` until it holds (True) or `timeout_s` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


def test_downloads_past_the_cap_delete_the_least_recent_sessions_files():
    store = SessionStore(None, max_download_bytes=1_000)
    first = store.session_dir("a")
    (first / "model.zip").write_bytes(b"x" * 800)
    second = store.session_dir("b")
    assert first.exists()  # 800 bytes fit
    (second / "model.zip").write_bytes(b"x" * 800)
    third = store.session_dir("c")  # 1,600 bytes: the least recent session's files go
    assert not first.exists() and second.exists() and third.exists()
    assert store.download_bytes() <= 1_000
    assert all(f.parent == store.temp_root for f in (second, third))
    again = store.session_dir("a")
    assert again.is_dir() and again != first
    (third / "model.zip").write_bytes(b"x" * 5_000)  # bigger than the cap alone: kept for its owner
    assert store.session_dir("c") == third and (third / "model.zip").exists()
    store.drop("c")
    assert not third.exists()


@pytest.mark.slow
def test_uploads_are_capped(files_app):
    url, _ = files_app
    too_big = httpx.post(f"{url}gradio_api/upload", files={"files": ("big.txt", b"x" * 2_000_000)})
    assert too_big.status_code == 413
    small = httpx.post(f"{url}gradio_api/upload", files={"files": ("small.txt", b"hello")})
    assert small.status_code == 200


def uniform_attention(layers: int = 12, heads: int = 12, words: int = 58) -> Attention:
    """A bert-base-shaped attention over [CLS] + `words` + [SEP], every row uniform."""
    n = words + 2
    return Attention(tokens=["[CLS]", *["paris"] * words, "[SEP]"],
                     weights=np.full((layers, heads, n, n), 1 / n, dtype=np.float32),
                     sequence_ids=[None, *[0] * words, None], word_ids=[None, *range(words), None],
                     offsets=[(0, 0)] * n, texts=("paris " * words, None), mask_positions=[],
                     predictions=[])


@pytest.mark.slow
def test_a_chosen_bertviz_view_is_capped_but_never_below_the_default_view():
    att = uniform_attention()  # all 12 x 12 heads of 60 tokens: 518,400 weights
    with pytest.raises(ValueError, match="at most 300,000 .* fewer layers or heads"):
        bertviz_html(att, "head", layers=list(range(12)), max_weights=300_000)
    assert "bertviz" in bertviz_html(att, "head", layers=list(range(6)), max_weights=300_000)
    assert "bertviz" in bertviz_html(att, "head", max_weights=1)  # the default view always shows
    with pytest.raises(ValueError, match="fewer layers"):
        bertviz_html(att, "model", layers=list(range(12)), heads=list(range(12)), max_weights=1)


def test_the_app_uses_its_own_gradio_temp_folder_unless_the_operator_set_one(monkeypatch):
    monkeypatch.delenv("GRADIO_TEMP_DIR", raising=False)
    lifecycle.use_own_gradio_temp_dir()
    own = Path(os.environ["GRADIO_TEMP_DIR"])
    assert own.is_dir() and own.name.startswith("bertdemo-gradio-") and not any(own.iterdir())
    monkeypatch.setenv("GRADIO_TEMP_DIR", "/srv/operator-choice")
    lifecycle.use_own_gradio_temp_dir()
    assert os.environ["GRADIO_TEMP_DIR"] == "/srv/operator-choice"


@pytest.mark.slow
def test_the_tuned_model_zip_holds_the_model(files_app):
    url, _ = files_app
    client = tuned_client(url, steps=1)
    with zipfile.ZipFile(client.predict(api_name="/download_tuned")) as archive:
        assert {"config.json", "model.safetensors"} <= set(archive.namelist())
