"""Sharing the demo: share link, login, hosting conventions, offline start, model download,
and the Docker/Space files staying consistent with requirements.txt."""
import contextlib
import os
import queue
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import gradio as gr
import gradio.networking
import httpx
import pytest
import yaml
from gradio_client import Client
from gradio_client.exceptions import AppError

import app
import bertdemo
from bertdemo.__main__ import download
from bertdemo.__main__ import main as bertdemo_cli
from bertdemo.config import DEFAULT_MODEL, Settings, parse_auth
from bertdemo.serving.engine import Engine
from bertdemo.model import bundled
from bertdemo.model.loading import MINILM_NAME, minilm_path
from bertdemo.ui.parts.model_banner import BUNDLED_BUTTON
from bertdemo.ui.serving import lifecycle

ROOT = Path(__file__).resolve().parents[2]
SENTENCE = "Paris is the [MASK] of France."


# --- share link -------------------------------------------------------------------------------

@pytest.mark.slow
def test_share_without_internet_keeps_serving_locally_and_says_so_in_one_line(tiny_bert_dir, tiny_bert):
    """The real `python app.py --model DIR --share`, offline: its share-server request goes to a
    dead proxy (so the test is hermetic even where there is internet)."""
    dead = f"http://127.0.0.1:{_free_port()}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "HTTPS_PROXY": dead,
           "HTTP_PROXY": dead, "ALL_PROXY": dead, "NO_PROXY": "127.0.0.1,localhost"}
    env.pop("GRADIO_SHARE_SERVER_ADDRESS", None)
    command = [sys.executable, "app.py", "--model", str(tiny_bert_dir), "--share",
               "--port", str(_free_port()), "--device", "cpu"]
    with subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as proc:
        try:
            lines = _lines_until(proc, "No share link", timeout=180)
            local_url = re.search(r"Running on local URL: (\S+)", "\n".join(lines)).group(1)
            _, raw, _ = Client(local_url, verbose=False).predict(SENTENCE, 3, api_name="/fill_mask")
        finally:
            proc.terminate()
    share_lines = [line for line in lines if "share" in line.lower()]
    assert len(share_lines) == 1, lines
    assert local_url in share_lines[0] and "locally" in share_lines[0]
    expected = bertdemo.fill_mask(tiny_bert, SENTENCE, 3)[0]
    assert [p["token_id"] for p in raw[0]] == [p["token_id"] for p in expected]


@pytest.mark.slow
@pytest.mark.parametrize("auth, login_hint", [(None, True), ("ann:pw", False)])
def test_share_link_is_printed_with_a_warning_that_it_is_public(monkeypatch, capsys, auth, login_hint):
    monkeypatch.delenv("SPACE_ID", raising=False)
    monkeypatch.setattr(gradio.networking, "setup_tunnel", lambda **_: "https://abc123.gradio.live")
    demo = _hello_demo()
    local_url, share_url = lifecycle.serve(demo, Settings(port=None, share=True, auth=auth), block=False)
    demo.close()
    out = capsys.readouterr().out
    assert share_url == "https://abc123.gradio.live"
    line = next(line for line in out.splitlines() if share_url in line)
    assert "anyone with this link" in line
    assert ("--auth" in line) == login_hint
    assert "Could not create share link" not in out


@pytest.mark.slow
def test_on_a_space_share_is_not_attempted(monkeypatch, capsys):
    monkeypatch.setenv("SPACE_ID", "someone/bertdemo")
    monkeypatch.setattr(gradio.networking, "setup_tunnel",
                        lambda **_: pytest.fail("a Space is already public: no tunnel"))
    demo = _hello_demo()
    _, share_url = lifecycle.serve(demo, Settings(port=None, share=True), block=False)
    demo.close()
    assert share_url is None and "share" not in capsys.readouterr().out.lower()


# --- login ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def private_url(tiny_bert_dir):
    """The whole app behind a login whose password contains a colon."""
    settings = Settings(model=str(tiny_bert_dir), device="cpu", port=None, auth="ann:open:sesame", onnx=False)
    demo = app.build_demo(settings)
    url, _ = lifecycle.serve(demo, settings, block=False)
    yield url
    demo.close()


@pytest.mark.slow
def test_login_refuses_strangers_and_admits_the_user(private_url):
    assert httpx.get(private_url + "gradio_api/info").status_code == 401
    for wrong in [None, ("ann", "open"), ("bob", "open:sesame")]:
        with pytest.raises(Exception):
            Client(private_url, auth=wrong, verbose=False)
    client = Client(private_url, auth=("ann", "open:sesame"), verbose=False)
    _, raw, _ = client.predict(SENTENCE, 3, api_name="/fill_mask")
    assert len(raw) == 1 and len(raw[0]) == 3


def test_auth_and_share_flags_and_env(monkeypatch, capsys):
    for name in ["BERTDEMO_AUTH", "BERTDEMO_SHARE"]:
        monkeypatch.delenv(name, raising=False)
    settings = app.parse_args(["--share", "--auth", "ann:pw"])
    assert settings.share and parse_auth(settings.auth) == ("ann", "pw")
    assert "pw" not in repr(settings)  # the password stays out of logs
    monkeypatch.setenv("BERTDEMO_AUTH", "eve:x:y")
    monkeypatch.setenv("BERTDEMO_SHARE", "1")
    settings = app.parse_args([])
    assert settings.share and parse_auth(settings.auth) == ("eve", "x:y")
    for bad in [["--auth", "no-password"], ["--auth", ":pw"], ["--auth", "ann:"]]:
        with pytest.raises(SystemExit):
            app.parse_args(bad)
        assert "USER:PASSWORD" in capsys.readouterr().err
    monkeypatch.setenv("BERTDEMO_AUTH", "no-colon")  # a bad env var is refused the same way
    with pytest.raises(SystemExit):
        app.parse_args([])


# --- hosting conventions --------------------------------------------------------------------

@pytest.mark.parametrize("env, host, port", [
    ({}, "127.0.0.1", 7860),
    ({"SPACE_ID": "someone/bertdemo"}, "0.0.0.0", 7860),
    ({"GRADIO_SERVER_NAME": "0.0.0.0", "GRADIO_SERVER_PORT": "8080"}, "0.0.0.0", 8080),
    ({"SPACE_ID": "a/b", "GRADIO_SERVER_NAME": "10.1.2.3"}, "10.1.2.3", 7860),
    ({"SPACE_ID": "a/b", "GRADIO_SERVER_PORT": "7000", "BERTDEMO_HOST": "127.0.0.1",
      "BERTDEMO_PORT": "9000"}, "127.0.0.1", 9000),
])
def test_host_and_port_follow_space_and_gradio_conventions(monkeypatch, env, host, port):
    for name in ["SPACE_ID", "GRADIO_SERVER_NAME", "GRADIO_SERVER_PORT", "BERTDEMO_HOST", "BERTDEMO_PORT"]:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = app.parse_args([])
    assert (settings.host, settings.port) == (host, port)
    flags = app.parse_args(["--host", "::1", "--port", "1234"])
    assert (flags.host, flags.port) == ("::1", 1234)


# --- offline start --------------------------------------------------------------------------

@pytest.mark.slow
def test_without_a_model_the_page_says_how_to_fix_and_offers_the_bundled_model(no_model_client):
    with pytest.raises(AppError, match=r"python -m bertdemo download .* --model .*bundled"):
        no_model_client.predict(SENTENCE, 3, api_name="/fill_mask")
    banner = no_model_client.predict(api_name="/use_bundled")
    assert "Serving the bundled model" in banner and "trained offline" in banner and "untrained" not in banner
    _, raw, model_line = no_model_client.predict(SENTENCE, 3, api_name="/fill_mask")
    assert "bundled" in model_line and "noise" not in model_line  # every tab's line says what it is
    assert len(raw[0]) == 3


def test_minilm_fallback_has_the_real_pretrained_body():
    """'Real attention': the packaged weights, not a fresh init (only the MLM head is new)."""
    import torch
    from safetensors.torch import load_file

    saved = load_file(minilm_path() / "model.safetensors")
    key = next(k for k in saved if k.endswith("encoder.layer.0.attention.self.query.weight"))
    lm = Engine().load_minilm("cpu")
    assert lm.name == MINILM_NAME
    assert torch.equal(lm.model.bert.encoder.layer[0].attention.self.query.weight, saved[key])


@pytest.mark.slow
def test_without_the_bundled_files_no_button_is_offered(monkeypatch, tmp_path):
    monkeypatch.setattr(bundled, "FOLDER", tmp_path / "no-bundled-model")
    settings = Settings(model="bertdemo-tests/no-such-model", device="cpu")
    engine = Engine()
    store = app.load_store(settings, engine)
    demo = app.build_demo(settings, store, engine)
    buttons = [b for b in demo.blocks.values() if isinstance(b, gr.Button) and b.value == BUNDLED_BUTTON]
    assert buttons and not buttons[0].visible
    assert "bundled" not in store.load_error and "--model" in store.load_error


def test_local_folder_with_hub_offline_loads(tiny_bert_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    store = app.load_store(app.parse_args(["--model", str(tiny_bert_dir), "--device", "cpu"]), Engine())
    assert store.base is not None and store.load_error is None


# --- python -m bertdemo download ------------------------------------------------------------

@pytest.fixture(scope="module")
def fake_hub_repo(tiny_bert_dir, tmp_path_factory):
    """A folder laid out like a hub repo: the tiny model plus files the demo doesn't need."""
    repo = tmp_path_factory.mktemp("fake-hub-repo")
    for f in tiny_bert_dir.iterdir():
        (repo / f.name).write_bytes(f.read_bytes())
    for extra in ["tf_model.h5", "flax_model.msgpack", "pytorch_model.bin", "onnx/model.onnx",
                  "coreml/fill-mask/float32_model.mlpackage/Data/weights.bin", "README.md", ".gitattributes"]:
        (repo / extra).parent.mkdir(parents=True, exist_ok=True)
        (repo / extra).write_bytes(b"not needed")
    return repo


def test_download_fetches_only_what_the_demo_loads(fake_hub_repo, tiny_bert_dir, tmp_path, monkeypatch,
                                                   capsys):
    """The hub path with snapshot_download faked by a copy that applies the same file filter."""
    from huggingface_hub.utils import filter_repo_objects

    calls = []

    def fake_snapshot_download(repo_id, *, revision=None, local_dir=None, allow_patterns=None, **kw):
        calls.append((repo_id, revision, local_dir))
        files = [p.relative_to(fake_hub_repo).as_posix() for p in fake_hub_repo.rglob("*") if p.is_file()]
        for name in filter_repo_objects(files, allow_patterns=allow_patterns):
            (Path(local_dir) / name).parent.mkdir(parents=True, exist_ok=True)
            (Path(local_dir) / name).write_bytes((fake_hub_repo / name).read_bytes())
        return str(local_dir)

    def fake_list_repo_files(self, repo_id, *, revision=None, **kw):  # asked first (pickle-only check)
        return [p.relative_to(fake_hub_repo).as_posix() for p in fake_hub_repo.rglob("*") if p.is_file()]

    monkeypatch.setattr("huggingface_hub.snapshot_download", fake_snapshot_download)
    monkeypatch.setattr("huggingface_hub.HfApi.list_repo_files", fake_list_repo_files)
    target = tmp_path / "bert"
    assert bertdemo_cli(["download", "some-org/tiny-bert", "--dir", str(target), "--revision", "v1"]) == 0
    assert calls == [("some-org/tiny-bert", "v1", str(target))]
    assert _files(target) == _files(tiny_bert_dir)  # the model, none of the extras
    assert f"python app.py --model {target}" in capsys.readouterr().out
    got = bertdemo.fill_mask(bertdemo.load(str(target), "cpu"), SENTENCE, 5)
    want = bertdemo.fill_mask(bertdemo.load(str(fake_hub_repo), "cpu"), SENTENCE, 5)
    assert got == want


@pytest.mark.slow
def test_download_command_copies_a_local_folder(fake_hub_repo, tiny_bert_dir, tmp_path):
    """The real `python -m bertdemo download` entry point (as the Dockerfile runs it)."""
    target = tmp_path / "copy"
    result = subprocess.run([sys.executable, "-m", "bertdemo", "download", str(fake_hub_repo),
                             "--dir", str(target)], cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "BertForMaskedLM" in result.stdout
    assert _files(target) == _files(tiny_bert_dir)


def test_download_offline_fails_with_a_message(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bertdemo_cli(["download", "bertdemo-tests/no-such-model", "--dir", str(tmp_path / "x")])
    assert exit_info.value.code == 1
    assert "Could not download 'bertdemo-tests/no-such-model'" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [[], ["download"], ["upload", "bert-base-uncased"]])
def test_download_command_refuses_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bertdemo_cli(argv)
    assert exit_info.value.code == 2 and "usage: python -m bertdemo" in capsys.readouterr().err


def test_download_of_a_folder_without_dir_is_that_folder(tiny_bert_dir):
    assert download(str(tiny_bert_dir)) == tiny_bert_dir


# --- Docker and Space files -----------------------------------------------------------------

def test_space_header_matches_requirements_and_default_model():
    header = _space_header()
    assert header["sdk"] == "gradio" and header["sdk_version"] == _pinned("gradio")
    assert (ROOT / header["app_file"]).is_file() and header["app_file"] == "app.py"
    assert header["models"] == [DEFAULT_MODEL]
    assert not header["suggested_hardware"].startswith("cpu")  # fine-tuning wants a GPU
    assert header["title"]


def test_dockerfile_installs_requirements_bakes_the_default_model_and_runs_as_a_user():
    steps = _dockerfile_steps()
    python = re.search(r"^python:(\d+\.\d+)-slim", steps["FROM"][0]).group(1)
    assert f"Python {python}" in _readme()  # the Python README promises
    assert any(s.split()[0] == "requirements.txt" for s in steps["COPY"])
    install = next(s for s in steps["RUN"] if "pip install" in s)
    assert "-r requirements.txt" in install and "pip install -r requirements.txt" in _readme()
    baked = re.search(rf"python -m bertdemo download {re.escape(DEFAULT_MODEL)} --dir (\S+)",
                      " ".join(steps["RUN"])).group(1)
    env = dict(re.findall(r"(\w+)=(\S+)", " ".join(steps["ENV"])))
    assert env["BERTDEMO_MODEL"] == baked and env["GRADIO_SERVER_NAME"] == "0.0.0.0"
    warmed = re.search(rf"python -m bertdemo warm {re.escape(baked)} --into (\S+)", " ".join(steps["RUN"])).group(1)
    assert env["BERTDEMO_WARM_DIR"] == warmed  # its export made ahead, read at start
    assert steps["EXPOSE"] == ["7860"] and env.get("GRADIO_SERVER_PORT", "7860") == "7860"
    assert steps["USER"] and steps["USER"][-1] not in {"root", "0"}
    check = steps["HEALTHCHECK"][0]  # the health endpoint on the port served (7860, or as run with -e)
    assert "/healthz" in check and "os.environ['GRADIO_SERVER_PORT']" in check and env["GRADIO_SERVER_PORT"] == "7860"
    assert "app.py" in steps["CMD"][0]
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert not {"app.py", "bertdemo", "requirements.txt", "bertdemo/"} & set(ignored)


# --- helpers --------------------------------------------------------------------------------

def _hello_demo() -> gr.Blocks:
    with gr.Blocks() as demo:
        gr.Markdown("hello")
    return demo


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _lines_until(proc: subprocess.Popen, marker: str, timeout: float) -> list[str]:
    """The process's output lines up to and including the first containing `marker`."""
    lines: queue.Queue = queue.Queue()

    def read() -> None:
        with contextlib.suppress(ValueError):  # the test closed the pipe when it was done with it
            for line in proc.stdout:
                lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    seen = []
    while True:
        try:
            line = lines.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"no {marker!r} within {timeout}s:\n" + "".join(seen))
        if line is None:
            pytest.fail(f"app exited before {marker!r}:\n" + "".join(seen))
        seen.append(line)
        if marker in line:
            return [s.rstrip("\n") for s in seen]


def _files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def _readme() -> str:
    return (ROOT / "README.md").read_text()


def _space_header() -> dict:
    match = re.match(r"---\n(.*?)\n---\n", _readme(), re.S)
    assert match, "README.md must start with the Space's YAML header"
    return yaml.safe_load(match.group(1))


def _pinned(package: str) -> str:
    text = (ROOT / "requirements.txt").read_text()
    return re.search(rf"^{re.escape(package)}(?:\[[\w,]+\])?==(\S+)", text, re.M).group(1)  # extras allowed


def _dockerfile_steps() -> dict[str, list[str]]:
    """Dockerfile instructions (continuation lines joined), e.g. {"RUN": ["pip install ..."]}."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / "Dockerfile").read_text())
    steps: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            keyword, _, rest = line.strip().partition(" ")
            steps.setdefault(keyword.upper(), []).append(rest.strip())
    return steps


def test_readme_gradio_client_example_runs(app_url, capsys):
    """README's API example, pointed at a running demo, prints the predicted tokens."""
    block = next(b for b in re.findall(r"```python\n(.*?)```", _readme(), re.S) if "gradio_client" in b)
    exec(block.replace('"http://127.0.0.1:7860/"', repr(app_url)), {})
    tokens = eval(capsys.readouterr().out.splitlines()[-1])  # after gradio_client's "Loaded as API"
    assert isinstance(tokens, list) and len(tokens) == 5
