"""The default path, `python app.py` with no --model, and `python -m bertdemo download`, tested
against a local stand-in for the Hugging Face Hub (tests/hub_server.py). No real network: each
subprocess gets HF_ENDPOINT pointing at 127.0.0.1 and a fresh HF_HOME."""
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each test starts Python with torch and transformers in a subprocess

import bertdemo
import tiny_models
from hub_server import HubServer, hub_env
from test_model_card import save_pickle_only

ROOT = Path(__file__).resolve().parents[2]
SENTENCE = "Paris is the [MASK] of France."
# What `bertdemo.load` needs; a real hub repo also has the rest, which download must skip.
EXTRAS = {"pytorch_model.bin", "tf_model.h5", "flax_model.msgpack", "onnx/model.onnx", "README.md"}


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """`bert-base-uncased` (the tiny BERT plus a real repo's other files) and a pickle-only repo."""
    repo = tiny_models.save_tiny_bert(tmp_path_factory.mktemp("bert-base-uncased"))
    (repo / "onnx").mkdir()
    for extra in EXTRAS - {"pytorch_model.bin"}:
        (repo / extra).write_bytes(b"not needed by bertdemo\n")
    (repo / "pytorch_model.bin").write_bytes((repo / "model.safetensors").read_bytes())
    old = save_pickle_only(tiny_models.save_tiny_bert(tmp_path_factory.mktemp("old")))
    with HubServer({"bert-base-uncased": repo, "old-org/pickle-bert": old}) as server:
        server.folder = repo
        yield server


def run_module(hub, home, *args):
    return subprocess.run([sys.executable, "-m", "bertdemo", *args], cwd=ROOT, env=hub_env(hub.url, home),
                          capture_output=True, text=True, timeout=300)


def test_download_fetches_only_config_safetensors_and_tokenizer(hub, tmp_path):
    hub.requests.clear()
    result = run_module(hub, tmp_path / "hf-home", "download", "bert-base-uncased", "--dir",
                        str(tmp_path / "model"))
    assert result.returncode == 0, result.stderr[-2000:]
    fetched = hub.downloaded("bert-base-uncased")
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= fetched
    assert fetched <= {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                       "special_tokens_map.json", "vocab.txt"}
    assert not fetched & EXTRAS
    saved = {p.relative_to(tmp_path / "model").as_posix() for p in (tmp_path / "model").rglob("*")
             if p.is_file() and ".cache" not in p.parts}
    assert saved == fetched
    assert "BertForMaskedLM" in result.stdout and "--model" in result.stdout
    # What it saved is the served model, offline.
    served = bertdemo.load(str(hub.folder), device="cpu")
    fetched_lm = bertdemo.load(str(tmp_path / "model"), device="cpu")
    assert bertdemo.fill_mask(fetched_lm, SENTENCE, 5) == bertdemo.fill_mask(served, SENTENCE, 5)


def test_download_into_the_cache_is_what_the_app_then_finds_offline(hub, tmp_path):
    home = tmp_path / "hf-home"
    assert run_module(hub, home, "download", "bert-base-uncased").returncode == 0
    hub.requests.clear()
    env = {**hub_env(hub.url, home), "HF_HUB_OFFLINE": "1"}
    check = subprocess.run([sys.executable, "-c", "import bertdemo; print(bertdemo.load("
                            "'bert-base-uncased', device='cpu').card.summary())"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stderr[-2000:]
    assert "BertForMaskedLM" in check.stdout
    assert hub.requests == []  # offline: served from the cache alone


def test_download_refuses_a_pickle_only_repo_before_fetching_anything(hub, tmp_path):
    hub.requests.clear()
    result = run_module(hub, tmp_path / "hf-home", "download", "old-org/pickle-bert", "--dir",
                        str(tmp_path / "model"))
    assert result.returncode == 1
    assert "only pickle weights" in result.stderr and "--allow-pickle" in result.stderr
    assert hub.downloaded("old-org/pickle-bert") == set()
    assert not (tmp_path / "model").exists()


def test_download_of_an_unknown_repo_says_so(hub, tmp_path):
    result = run_module(hub, tmp_path / "hf-home", "download", "nobody/no-such-model")
    assert result.returncode == 1 and "Could not download 'nobody/no-such-model'" in result.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_app(args: list[str], env: dict, timeout: float = 240) -> tuple[subprocess.Popen, str]:
    """`python app.py ARGS` on a free port; returns (process, URL) once it serves. Caller stops it."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "app.py", "--port", str(port), *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    found, _ = read_until(proc, r"Running on local URL: *(\S+)", timeout)
    return proc, found.group(1).rstrip("/")


def read_until(proc: subprocess.Popen, pattern: str, timeout: float = 180) -> tuple[re.Match, str]:
    """(the first line of `proc`'s output matching `pattern`, the output so far); kills `proc`
    and fails, with its last lines, when none comes."""
    lines, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        lines.append(line)
        if found := re.search(pattern, line):
            return found, "".join(lines)
    proc.kill()
    raise AssertionError(f"no line matching {pattern!r} (did the app start?):\n" + "".join(lines[-40:]))


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
    proc.stdout.close()


def test_app_with_no_model_flag_serves_bert_base_uncased_from_the_hub(hub, tmp_path):
    from gradio_client import Client

    hub.requests.clear()
    # no BERTDEMO_MODEL: the default model; the ONNX settings stay (conftest: both sides run torch)
    env = {k: v for k, v in hub_env(hub.url, tmp_path / "hf-home").items()
           if not k.startswith("BERTDEMO_") or k.startswith("BERTDEMO_ONNX")}
    proc, url = start_app([], env)
    try:
        _, raw, model_line = Client(url, verbose=False).predict(SENTENCE, 5, api_name="/fill_mask")
    finally:
        stop(proc)
    served = bertdemo.load(str(hub.folder), device="cpu")
    assert raw == bertdemo.fill_mask(served, SENTENCE, 5)
    assert "bert-base-uncased" in model_line
    assert "model.safetensors" in hub.downloaded("bert-base-uncased")
    assert not hub.downloaded("bert-base-uncased") & EXTRAS  # no pickle, TF, ONNX or README


def test_loading_a_pickle_only_hub_repo_is_refused_without_asking_a_conversion_bot(hub, tmp_path):
    """transformers, asked for safetensors a repo lacks, would ask the hub's conversion Space to open
    a pull request on that repo (its commits and discussions first): bertdemo.load never does."""
    hub.requests.clear()
    code = ("import bertdemo\ntry:\n    bertdemo.load('old-org/pickle-bert', device='cpu')\n"
            "except ValueError as err:\n    print(err)\n")
    env = {k: v for k, v in hub_env(hub.url, tmp_path / "hf-home").items()
           if k != "DISABLE_SAFETENSORS_CONVERSION"}
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=300)
    assert "--allow-pickle" in result.stdout and "safetensors" in result.stdout, result.stderr[-2000:]
    assert "pytorch_model.bin" not in hub.downloaded("old-org/pickle-bert")
    assert not [path for _, path in hub.requests if "/commits/" in path or "/discussions" in path]
