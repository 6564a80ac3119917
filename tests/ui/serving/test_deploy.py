"""deploy/nginx.py's configuration and the app's /healthz, without starting anything (the real
thing, nginx and replicas, is tests/ui/serving/test_replicas.py)."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from bertdemo.sessions import SessionStore
from bertdemo.ui.serving.health import Health

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "deploy"))
import nginx  # noqa: E402  deploy/nginx.py


def test_a_replica_is_known_by_its_address_or_else_its_own_port():
    assert nginx.answered_patterns(["127.0.0.1:7861", "10.0.0.2:7861"]) == [
        r"(^|, )127\.0\.0\.1:7861$", r"(^|, )10\.0\.0\.2:7861$"]
    assert nginx.answered_patterns(["replica1:7861", "replica2:7862"]) == [":7861$", ":7862$"]
    with pytest.raises(ValueError, match="ports of their own"):
        nginx.answered_patterns(["replica1:7860", "replica2:7860"])


@pytest.mark.skipif(shutil.which("nginx") is None, reason="nginx is not installed")
def test_the_generated_configuration_is_valid_nginx(tmp_path):
    conf = nginx.write_standalone(["127.0.0.1:7861", "127.0.0.1:7862"], "127.0.0.1:18080", tmp_path)
    checked = subprocess.run(["nginx", "-t", "-p", str(tmp_path), "-c", str(conf)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr


def page_behind_health(store, replica):
    page = Starlette(routes=[Route("/", lambda request: PlainTextResponse("the page"), methods=["GET", "HEAD"])])
    return TestClient(Health(page, store, replica=replica))


def test_healthz_says_whether_the_model_loaded(tiny_bert):
    ok = page_behind_health(SessionStore(tiny_bert), replica=True)
    assert ok.get("/healthz").status_code == 200 and ok.get("/").text == "the page"
    broken = page_behind_health(SessionStore(None, load_error="no such folder"), replica=False)
    answer = broken.get("/healthz")
    assert answer.status_code == 503 and "no such folder" in answer.text
    assert broken.get("/").text == "the page"  # a lone process shows its page and the reason


def test_a_replica_without_its_model_refuses_its_page_but_not_gradios_own_check():
    broken = page_behind_health(SessionStore(None, load_error="no such folder"), replica=True)
    assert broken.get("/").status_code == 503
    assert broken.head("/").status_code == 200  # Gradio's "is localhost reachable" at launch
