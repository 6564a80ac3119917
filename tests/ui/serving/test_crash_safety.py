"""A stop or a crash at any moment of the server's life: `python app.py` in a subprocess, stopped
(SIGTERM) or killed (kill -9) while it loads its model, exports its ONNX Runtime twin, builds the
default corpus' index or trains a feature dictionary. A SIGTERM exits within 10 s with status 0 and
a log with no abort and no traceback; a kill -9 leaves what it was writing under a temporary name,
which the next start removes (one log line with the MB freed) before answering as before. A phase
that a tiny model ends too soon to be caught is slowed down by a patch the subprocess applies first.
And the warm start: an export made ahead serves the first request, with no export at start."""
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from test_hub import free_port, read_until

pytestmark = pytest.mark.slow  # each test starts Python with torch and Gradio in a subprocess

ROOT = Path(__file__).resolve().parents[3]
SENTENCE = "the capital of france is [MASK] ."
# A phase held long enough to be interrupted, once it has written something: the marker line
# tells the test it is there (written to the file descriptor: the app redirects sys.stdout while
# Gradio launches, which may be when a background phase begins).
SLOW_EXPORT = """
import onnxruntime.transformers.optimizer as optimizer
real = optimizer.optimize_model
def slowly(*args, **kwargs):  # the raw export is on disk, in the export's temporary folder
    os.write(1, b"PHASE export\\n")  # past lifecycle.serve's redirect of sys.stdout
    time.sleep(120)
    return real(*args, **kwargs)
optimizer.optimize_model = slowly
"""
SLOW_INDEX = """
from bertdemo.views import corpus_search
real = corpus_search._batch_vectors
def slowly(*args):
    os.write(1, b"PHASE index\\n")  # past lifecycle.serve's redirect of sys.stdout
    time.sleep(0.5)
    return real(*args)
corpus_search._batch_vectors = slowly
corpus_search.lines_per_forward = lambda lm: 4
"""
SLOW_LOAD = """
from bertdemo.model import loading
real = loading.load
def slowly(*args, **kwargs):
    os.write(1, b"PHASE load\\n")  # past lifecycle.serve's redirect of sys.stdout
    time.sleep(120)
    return real(*args, **kwargs)
loading.load = slowly
"""


def app_env(tmp_path: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BERTDEMO_")}
    return {**env, "TMPDIR": str(tmp_path / "tmp"), "BERTDEMO_CACHE_DIR": str(tmp_path / "cache"),
            "BERTDEMO_MALLOC": "glibc",  # no re-exec under jemalloc: it would drop the patch
            "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1", **extra}


def start(model: Path, tmp_path: Path, patch: str = "", args=(), **env) -> subprocess.Popen:
    """`python app.py --model MODEL ARGS` with `patch` applied first, in `tmp_path`'s own temp and
    cache folders."""
    (tmp_path / "tmp").mkdir(exist_ok=True)
    argv = ["app.py", "--model", str(model), "--device", "cpu", "--port", str(free_port()), *args]
    code = f"import os, sys, time, runpy\n{textwrap.dedent(patch)}\nsys.argv = {argv!r}\n" \
           "runpy.run_path('app.py', run_name='__main__')\n"
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=app_env(tmp_path, **env),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def stop_within_10_s(proc: subprocess.Popen, log: str, within: float = 10) -> str:
    """SIGTERM; asserts status 0 within 10 s (or `within`), no abort, no traceback. Returns the whole log."""
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        returncode = proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    took = time.monotonic() - signalled
    log += proc.stdout.read()
    assert returncode == 0, log[-3000:]
    assert took < within, f"exited {took:.1f} s after SIGTERM"
    assert "terminate called" not in log and "Traceback" not in log, log[-3000:]
    return log


def kill_9(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=20)
    proc.stdout.close()


def temporaries(tmp_path: Path) -> list[Path]:
    """What a process left under a temporary name: cache entries and its own temp folders."""
    return [*(tmp_path / "cache").rglob(".part-*"), *(tmp_path / "tmp").glob("bertdemo-*")]


def answers_fill_mask(url: str) -> None:
    from gradio_client import Client

    _, raw, _ = Client(url, verbose=False).predict(SENTENCE, 5, api_name="/fill_mask")
    assert raw and len(raw[0]) == 5, raw  # five predictions for the one mask


def restart_cleans_up(model: Path, tmp_path: Path, killed: list[Path], **env) -> str:
    """A normal start after a kill -9: what the killed process left is removed, said in one log
    line, and the server answers. Returns its log."""
    freed_mb = sum(f.stat().st_size for p in killed for f in ([p] if p.is_file() else p.rglob("*"))
                   if f.is_file()) / 1e6
    proc = start(model, tmp_path, args=["--no-index-at-start"], **env)
    try:
        found, log = read_until(proc, r"Running on local URL: *(\S+)")
        assert not [p for p in killed if p.exists()], "the killed process's files are still there"
        line = next(line for line in log.splitlines() if "leftover" in line)
        assert f"{freed_mb:.1f} MB freed" in line, (line, freed_mb)
        answers_fill_mask(found.group(1).rstrip("/"))
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    return log


# ---------------------------------------------------------------- the ONNX export

def test_sigterm_mid_export_exits_in_time_and_leaves_nothing(tiny_bert_dir, tmp_path):
    proc = start(tiny_bert_dir, tmp_path, SLOW_EXPORT, args=["--onnx", "--no-index-at-start"])
    _, log = read_until(proc, r"PHASE export")
    assert list((tmp_path / "cache" / "onnx").glob(".part-*/model.onnx")), "no export on disk yet"
    log = stop_within_10_s(proc, log)
    assert "mid-way: the ONNX export of" in log  # "stopped mid-way: ..." or, before the page, "stopped while starting, mid-way: ..."
    assert temporaries(tmp_path) == []
    assert not list((tmp_path / "cache" / "onnx").glob("*.onnx"))


def test_kill_9_mid_export_then_a_restart_leaves_0_mb_of_it(tiny_bert_dir, tmp_path):
    proc = start(tiny_bert_dir, tmp_path, SLOW_EXPORT, args=["--onnx", "--no-index-at-start"])
    read_until(proc, r"PHASE export")
    kill_9(proc)
    killed = temporaries(tmp_path)
    assert any(p.name.startswith(".part-") for p in killed) and any(p.name.startswith("bertdemo-") for p in killed)
    restart_cleans_up(tiny_bert_dir, tmp_path, killed, BERTDEMO_ONNX="0")
    assert temporaries(tmp_path) == []


# ---------------------------------------------------------------- the default corpus' index

def test_sigterm_mid_index_build_exits_in_time_and_leaves_nothing(tiny_bert_dir, tmp_path):
    proc = start(tiny_bert_dir, tmp_path, SLOW_INDEX, BERTDEMO_ONNX="0")
    _, log = read_until(proc, r"Running on local URL")
    read_until(proc, r"PHASE index")
    log = stop_within_10_s(proc, log)
    assert "stopped mid-way: a search index" in log
    assert temporaries(tmp_path) == [] and not list((tmp_path / "cache" / "search").iterdir())


def test_kill_9_mid_index_build_then_a_restart_removes_it(tiny_bert_dir, tmp_path):
    proc = start(tiny_bert_dir, tmp_path, SLOW_INDEX, BERTDEMO_ONNX="0")
    for _ in range(3):  # a few batches written
        read_until(proc, r"PHASE index")
    kill_9(proc)
    killed = temporaries(tmp_path)
    written = [p for p in killed if p.name.startswith(".part-")]
    assert written and any(f.stat().st_size > 0 for f in written[0].rglob("layer*.npy"))
    restart_cleans_up(tiny_bert_dir, tmp_path, killed, BERTDEMO_ONNX="0")


# ---------------------------------------------------------------- loading, training

def test_sigterm_while_the_model_loads_exits_in_time(tiny_bert_dir, tmp_path):
    proc = start(tiny_bert_dir, tmp_path, SLOW_LOAD, BERTDEMO_ONNX="0")
    _, log = read_until(proc, r"PHASE load")
    log = stop_within_10_s(proc, log)
    assert "stopped while starting" in log
    assert temporaries(tmp_path) == []


def test_sigterm_mid_features_training_exits_in_time_and_leaves_nothing(tiny_bert_dir, tmp_path):
    from gradio_client import Client

    proc = start(tiny_bert_dir, tmp_path, BERTDEMO_ONNX="0", args=["--no-index-at-start",
                                                                     "--features-max-seconds", "300",
                                                                     "--finetune-max-seconds", "300"])
    found, log = read_until(proc, r"Running on local URL: *(\S+)")
    job = Client(found.group(1).rstrip("/"), verbose=False).submit(1, "", True, api_name="/train_features")
    deadline = time.monotonic() + 120
    while not job.outputs() and time.monotonic() < deadline:
        assert not job.done(), job.status()
        time.sleep(0.1)
    assert job.outputs(), "the training sent no update"
    log = stop_within_10_s(proc, log, within=5)  # at its next step: no statistics measured on the way out
    assert "stopped 1 run(s) after their current step" in log
    assert "did not end in time" not in log  # it ended at its step, not by the watchdog
    assert temporaries(tmp_path) == []


# ---------------------------------------------------------------- the warm start

def test_a_warm_start_serves_its_first_request_with_no_export(tiny_bert_dir, tmp_path):
    warm = tmp_path / "warm"
    made = subprocess.run([sys.executable, "-m", "bertdemo", "warm", str(tiny_bert_dir), "--into", str(warm)],
                          cwd=ROOT, env=app_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-2000:]
    assert len(list((warm / "onnx").glob("*.onnx"))) == 1
    proc = start(tiny_bert_dir, tmp_path, args=["--onnx", "--no-index-at-start"], BERTDEMO_WARM_DIR=str(warm))
    try:
        found, log = read_until(proc, r"Running on local URL: *(\S+)")
        if "ONNX Runtime forward ready" not in log:  # ready before the page or after it
            log += read_until(proc, r"ONNX Runtime forward ready")[1]
        assert "(warm: exported ahead by `python -m bertdemo warm`)" in log
        assert "ONNX export" not in log  # nothing exported at start
        assert not list((tmp_path / "cache").rglob("*.onnx"))
        answers_fill_mask(found.group(1).rstrip("/"))
    finally:
        proc.terminate()
        proc.wait(timeout=20)
