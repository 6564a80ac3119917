"""A clean stop: SIGTERM or Ctrl-C during a fine-tune ends the run after its current step (its visitor is
told why), frees the slot, deletes the downloads and exports, and `python app.py` exits 0 within
10 s. The app runs in a subprocess, with its own TMPDIR to look into afterwards."""
import os
import signal
import time

import pytest

from test_hub import start_app, stop

pytestmark = pytest.mark.slow  # starts Python with torch and Gradio in a subprocess

FT_TEXT = "\n".join(["Paris is the capital of France.", "The Eiffel Tower is a famous landmark.",
                     "Berlin is the capital of Germany.", "Rome is the capital of Italy."] * 3)


def finetune_args(steps: int) -> list:
    """/finetune's inputs: text, amount, unit, learning rate, batch, length, mask rate, masking,
    seed, keep a stopped run's model, probes, keep the best evaluation's weights."""
    return [FT_TEXT, steps, "steps", 1e-3, 4, 16, 0.15, "dynamic", 0, False, "", True]


def app_env(tmp: os.PathLike) -> dict:
    return {**os.environ, "TMPDIR": str(tmp), "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1"}


def wait_for_steps(job, timeout: float = 60) -> None:
    """Until the run has sent its first live update (it is past its first steps)."""
    deadline = time.monotonic() + timeout
    while not job.outputs() and time.monotonic() < deadline:
        assert not job.done(), job.status()
        time.sleep(0.1)
    assert job.outputs(), "the fine-tune sent no update"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_a_signal_mid_run_stops_the_run_removes_files_and_exits_in_time(signum, tiny_bert_dir, tmp_path):
    from gradio_client import Client

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc, url = start_app(["--model", str(tiny_bert_dir), "--device", "cpu",
                           "--finetune-max-steps", "100000", "--finetune-max-seconds", "300"], app_env(tmp))
    try:
        client = Client(url, verbose=False)
        client.predict(*finetune_args(2), api_name="/finetune")
        client.predict(api_name="/download_tuned")  # a zip in the app's temp area
        assert list(tmp.rglob("*.zip")), "the download made no zip"
        job = client.submit(*finetune_args(100000), api_name="/finetune")
        wait_for_steps(job)
        signalled = time.monotonic()
        proc.send_signal(signum)
        returncode = proc.wait(timeout=15)
        took = time.monotonic() - signalled
        log = proc.stdout.read()
    finally:
        if proc.poll() is None:
            stop(proc)
    assert returncode == 0, log[-3000:]
    assert took < 10, f"exited {took:.1f} s after the signal"
    assert "stopped 1 run(s) after their current step; temp files removed" in log, log[-3000:]
    status = job.outputs()[-1][0]
    assert "ended early because the server is shutting down" in status, status
    left = [p.name for p in tmp.iterdir() if p.name.startswith("bertdemo-")]
    assert left == [] and not list(tmp.rglob("*.zip")), left
