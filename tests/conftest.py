import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

sys.path.insert(0, str(Path(__file__).parent))  # tiny_models
sys.path.insert(0, str(Path(__file__).parent.parent))  # bertdemo, app

import bertdemo  # noqa: E402
import tiny_models  # noqa: E402


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory) -> Path:
    return tiny_models.save_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def tiny_bert(tiny_bert_dir):
    return bertdemo.load(str(tiny_bert_dir), device="cpu")


@pytest.fixture(scope="session")
def tiny_distilbert(tmp_path_factory):
    return bertdemo.load(str(tiny_models.save_tiny_distilbert(tmp_path_factory.mktemp("distil"))))


@pytest.fixture(scope="session")
def tiny_roberta(tmp_path_factory):
    return bertdemo.load(str(tiny_models.save_tiny_roberta(tmp_path_factory.mktemp("roberta"))))


def launch(demo):
    """Launch a built demo on a free local port; returns its URL. Caller closes it."""
    _, url, _ = demo.launch(server_name="127.0.0.1", server_port=None, prevent_thread_lock=True,
                            quiet=True, share=False)
    return url


@pytest.fixture(scope="session")
def app_url(tiny_bert_dir):
    """The real app (all tabs) serving the tiny BERT."""
    import app
    from bertdemo.config import Settings

    demo = app.build_demo(Settings(model=str(tiny_bert_dir), device="cpu"))
    url = launch(demo)
    yield url
    demo.close()


@pytest.fixture
def client(app_url):
    from gradio_client import Client

    return Client(app_url, verbose=False)
