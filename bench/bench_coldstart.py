"""Cold start: from `python app.py` to the first answered fill-mask request, vs loading the model alone.

Goal: the app's overhead beyond the model load is under 3 s. Both are measured from a fresh
Python process (imports included), alternately, a few times. Run: python bench/bench_coldstart.py
"""
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, bert_base_folder, free_port, serve_app  # noqa: E402

LOAD_ONLY = "import bertdemo, sys; bertdemo.load(sys.argv[1], device='cpu')"


def load_only_seconds(folder: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", LOAD_ONLY, folder], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def app_first_answer_seconds(folder: str) -> float:
    from gradio_client import Client

    port = free_port()
    start = time.perf_counter()
    with serve_app(["--model", folder, "--device", "cpu", "--port", str(port)]):
        Client(f"http://127.0.0.1:{port}/", verbose=False).predict(
            "Paris is the [MASK] of France.", 5, api_name="/fill_mask")
        return time.perf_counter() - start


def main(rounds: int = 3) -> None:
    folder = str(bert_base_folder())
    load_only_seconds(folder)  # warm the page cache for both
    loads, apps = [], []
    for _ in range(rounds):
        loads.append(load_only_seconds(folder))
        apps.append(app_first_answer_seconds(folder))
    load, app = statistics.median(loads), statistics.median(apps)
    print(f"model load alone (fresh process, imports included): {load:6.2f} s")
    print(f"python app.py -> first answered /fill_mask:          {app:6.2f} s")
    print(f"overhead beyond the model load: {app - load:5.2f} s (goal < 3 s), ratio {app / load:4.2f}x")


if __name__ == "__main__":
    main()
