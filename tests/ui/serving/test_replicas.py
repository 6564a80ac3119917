"""More than one process: `python app.py --replica` three times (two with a model, one whose model
cannot load) behind Debian's nginx with deploy/nginx.py's configuration, all on loopback. A
visitor stays on one replica (its tuned model with it), a crowd is spread over the two good
ones and never sent to the broken one, and when a replica is killed the other keeps serving while
its visitors are told, at once, that their process has gone."""
import re
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from test_hub import free_port
from test_shutdown import app_env, finetune_args

pytestmark = [pytest.mark.slow,  # four processes, three of them Python with torch and Gradio
              pytest.mark.skipif(shutil.which("nginx") is None,
                                 reason="nginx is not installed (apt-get install nginx; .ci/run does)")]

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "deploy"))
import nginx  # noqa: E402  deploy/nginx.py

SENTENCE = "Paris is the [MASK] of France."


def launch(args: list[str], log: Path, env: dict) -> tuple[subprocess.Popen, str]:
    """`python app.py --replica ARGS` on a free port, its output into `log`; not waited for."""
    port = free_port()
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "app.py", "--replica", "--port", str(port), *args],
                                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    return proc, f"127.0.0.1:{port}"


def wait_for_line(proc: subprocess.Popen, log: Path, pattern: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if re.search(pattern, log.read_text()):
            return
        assert proc.poll() is None, f"exited {proc.returncode}:\n{log.read_text()[-3000:]}"
        time.sleep(0.2)
    raise AssertionError(f"no {pattern!r} in {timeout} s:\n{log.read_text()[-3000:]}")


def wait_until_answers(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} did not answer")


@pytest.fixture(scope="module")
def cluster(tiny_bert_dir, tmp_path_factory):
    """{"url": nginx's, "replicas": {name: (process, address)}}; r0, r1 serve the tiny BERT, r2
    has no model. Everything is stopped after the module."""
    tmp = tmp_path_factory.mktemp("replicas")
    env = app_env(tmp)
    model = ["--model", str(tiny_bert_dir), "--device", "cpu"]
    specs = {"r0": model, "r1": model, "r2": ["--model", str(tmp / "no-such-model"), "--device", "cpu"]}
    replicas = {name: launch(args, tmp / f"{name}.log", env) for name, args in specs.items()}
    listen = f"127.0.0.1:{free_port()}"
    conf = nginx.write_standalone([addr for _, addr in replicas.values()], listen, tmp / "nginx")
    lb = subprocess.Popen(["nginx", "-p", str(conf.parent), "-c", str(conf)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for name, (proc, _) in replicas.items():
            wait_for_line(proc, tmp / f"{name}.log", r"Running on local URL")
        wait_until_answers(f"http://{listen}/")
        yield {"url": f"http://{listen}/", "replicas": replicas}
    finally:
        lb.terminate()
        for proc, _ in replicas.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in [lb, *(proc for proc, _ in replicas.values())]:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()


def visitor(url: str):
    from gradio_client import Client

    return Client(url, verbose=False)


def replica_of(client) -> str:
    return client.cookies[nginx.COOKIE]


def test_a_replica_without_its_model_says_so_and_gets_no_visitors(cluster):
    _, broken = cluster["replicas"]["r2"]
    answer = httpx.get(f"http://{broken}/healthz")
    assert answer.status_code == 503 and "no model" in answer.text
    assert httpx.get(f"http://{broken}/").status_code == 503
    for name in ("r0", "r1"):
        answer = httpx.get(f"http://{cluster['replicas'][name][1]}/healthz")
        assert answer.status_code == 200 and answer.text.startswith("ok: ")


def test_a_crowd_is_spread_over_the_replicas_that_serve(cluster):
    with ThreadPoolExecutor(4) as pool:
        crowd = list(pool.map(lambda _: visitor(cluster["url"]), range(8)))
        answers = list(pool.map(lambda c: c.predict(SENTENCE, 3, api_name="/fill_mask"), crowd))
    assert {replica_of(c) for c in crowd} == {"r0", "r1"}  # both, and never r2
    assert all(len(raw[0]) == 3 for _, raw, _ in answers)


def test_a_session_keeps_its_tuned_model_on_its_replica_and_hears_when_it_goes(cluster):
    tuner = visitor(cluster["url"])
    home = replica_of(tuner)
    tuner.predict(*finetune_args(3), api_name="/finetune")
    tuner.predict(api_name="/use_tuned")
    for _ in range(4):  # each call a new connection through nginx: always the same process
        _, _, line = tuner.predict(SENTENCE, 3, api_name="/fill_mask")
        assert "(fine-tuned)" in line
    other = next(c for c in iter(lambda: visitor(cluster["url"]), None) if replica_of(c) != home)

    proc, _ = cluster["replicas"][home]
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    started = time.monotonic()
    with pytest.raises(Exception, match="process that served you has stopped"):
        tuner.submit(SENTENCE, 3, api_name="/fill_mask").result(timeout=30)
    assert time.monotonic() - started < 10  # told at once, not left hanging
    assert other.predict(SENTENCE, 3, api_name="/fill_mask")[1]  # the other replica serves on
    newcomer = visitor(cluster["url"])
    assert replica_of(newcomer) == replica_of(other)
    _, _, line = newcomer.predict(SENTENCE, 3, api_name="/fill_mask")
    assert "(fine-tuned)" not in line
