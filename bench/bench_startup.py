"""Start-up, cold and warm: time to the page, time to the fast path (the ONNX Runtime forward
ready), and one fill-mask request's time during the first 30 s against steady state.

Cold: an empty cache folder, so the server exports its ONNX Runtime twin in the background after
the page answers (what every container start paid before the image baked its export). Warm: the
export made ahead by `python -m bertdemo warm` (timed, once) and read from BERTDEMO_WARM_DIR, as
the Docker image does. Each start runs `python app.py --model <a bert-base-sized random-weight
folder> --no-index-at-start` (the index build is another background job, measured by
bench_search.py) and sends one request a second from the page's first answer for 30 s, then 20 at
steady state. Prints the CPU model.

Run: python bench/bench_startup.py            (bert-base-sized: minutes)
     python bench/bench_startup.py --bundled  (the bundled model: a quicker run)
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, bert_base_folder, free_port, machine, wait_until_up  # noqa: E402

SENTENCE = "Paris is the [MASK] of France."
FIRST_S, STEADY = 30.0, 20


def one_request(client) -> float:
    started = time.perf_counter()
    client.predict(SENTENCE, 5, api_name="/fill_mask")
    return time.perf_counter() - started


def start(model: str, cache: Path, warm: Path | None) -> dict:
    """One start: {"page", "fast" (s from launch), "early" [(s since launch, request s)], "steady" [s]}."""
    from gradio_client import Client

    port = free_port()
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1",
           "BERTDEMO_CACHE_DIR": str(cache)}
    env.pop("BERTDEMO_ONNX", None)
    if warm is not None:
        env["BERTDEMO_WARM_DIR"] = str(warm)
    log = tempfile.TemporaryFile("w+")
    launched = time.perf_counter()
    proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--model", model, "--device", "cpu",
                             "--port", str(port), "--no-index-at-start"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=log)
    try:
        wait_until_up(f"http://127.0.0.1:{port}/", 300, proc)
        page = time.perf_counter() - launched
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        early, fast = [], None
        while time.perf_counter() - launched < page + FIRST_S or fast is None:
            at = time.perf_counter() - launched
            early.append((at, one_request(client)))
            if fast is None and _ready(log):
                fast = time.perf_counter() - launched
            time.sleep(max(0.0, 1.0 - (time.perf_counter() - launched - at)))
            if time.perf_counter() - launched > 600:
                raise TimeoutError("no ONNX Runtime forward within 600 s")
        steady = [one_request(client) for _ in range(STEADY)]
        return {"page": page, "fast": fast, "early": early, "steady": steady, "log": _read(log)}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _read(log) -> str:
    log.seek(0)
    return log.read()


def _ready(log) -> bool:
    return "ONNX Runtime forward ready" in _read(log)


def report(name: str, run: dict) -> None:
    steady = statistics.median(run["steady"])
    first = [t for at, t in run["early"] if at <= run["page"] + FIRST_S]
    how = re.search(r"ONNX Runtime forward ready for .* in [\d.]+ s \(([^)]*)\)", run["log"])
    print(f"{name}: page {run['page']:5.1f} s, fast path {run['fast']:5.1f} s "
          f"({how.group(1) if how else 'no ONNX Runtime line'})")
    print(f"  one request in the first {FIRST_S:.0f} s: median {statistics.median(first) * 1e3:6.1f} ms, "
          f"max {max(first) * 1e3:6.1f} ms ({len(first)} requests); steady state median {steady * 1e3:6.1f} ms "
          f"-> first 30 s / steady {statistics.median(first) / steady:4.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundled", action="store_true", help="the bundled model instead of bert-base-sized")
    args = parser.parse_args()
    model = "bundled" if args.bundled else str(bert_base_folder())
    work = Path(tempfile.mkdtemp(prefix="bertdemo-bench-startup-"))
    try:
        cold = start(model, work / "cold-cache", None)
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "bertdemo", "warm", model, "--into", str(work / "warm")], cwd=ROOT,
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       env={**os.environ, "BERTDEMO_CACHE_DIR": str(work / "warm-cache")})
        warm_s = time.perf_counter() - started
        warm = start(model, work / "warm-cache", work / "warm")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"CPU: {machine()}")
    print(f"model: {'bundled' if args.bundled else 'bert-base-sized (random weights, real vocab)'}")
    report("cold (export at start)", cold)
    print(f"python -m bertdemo warm: {warm_s:.1f} s, once, ahead (the Docker image's build)")
    report("warm (export made ahead)", warm)


if __name__ == "__main__":
    main()
