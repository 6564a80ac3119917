"""Many viewers: 16 simultaneous fill-mask requests through the running app vs one request.

Goal: all 16 done within 4x the time of one (micro-batching), results identical to one at a time.
Two clients, both on this machine, so both take CPU from the server they measure:
- `gradio_client`: 16 `Client`s in threads, one session each, kept across rounds (~60 ms of the
  client's own CPU per request: on 2 cores it weighs as much as the server);
- light: one asyncio loop sending raw HTTP (`/gradio_api/call/fill_mask`), each request a new
  visitor with a new session, as a crowd arriving from a shared link (~2 ms of client CPU each).
The light client also sends 16 different sentences (`DIFFERENT`): with `TEXTS`, four visitors
ask each sentence, which the server computes once. Each is also run with batching off
(`--max-batch 1`), and with `--no-onnx` (torch serves every batch: the app's default picks ONNX
Runtime or torch per shape by measuring both, and its crowd should never be slower than torch
alone), and the CPU seconds of server and client per round are printed, so a ratio can be read
for what it is. The three servers run at once and their rounds take turns, call by call: these
machines are noisy, and a slower minute then hits all three alike (measured one after the other,
one run in three had the first server's every figure 13-19% slower, the client's own CPU too).
The first line names the CPU: the figures hold for it.
Run: python bench/bench_viewers.py
"""
import asyncio
import contextlib
import json
import os
import resource
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402
from gradio_client import Client  # noqa: E402

from bertdemo.forward import onnx_engine  # noqa: E402
from common import bert_base_folder, free_port, machine, serve_app  # noqa: E402

ONNX_READY = "ONNX Runtime forward ready"  # the app's log line (bertdemo/serving/engine.py): short sentences' engine built

CROWD = 16
ROUNDS = 9
TEXTS = ["Paris is the [MASK] of France.", "The man went to the [MASK] to buy milk.",
         "She is a [MASK] at the hospital.", "The [MASK] sat on the mat."]
# A crowd where nobody asks the same (the server computes a repeated sentence once):
DIFFERENT = TEXTS + ["He drank a cup of [MASK] every morning.", "The [MASK] was closed on Sunday.",
                     "We took the [MASK] to the airport.", "My sister plays the [MASK] very well.",
                     "The river flows into the [MASK].", "They watched a [MASK] at the cinema.",
                     "I left my keys in the [MASK].", "The children played in the [MASK].",
                     "Rome is the capital of [MASK].", "The doctor gave him some [MASK].",
                     "It was a cold and [MASK] night.", "The bird built a [MASK] in the tree."]


def crowd_seconds(clients: list[Client]) -> tuple[float, list]:
    """Wall time for every gradio_client to get its answer, all sent at once."""
    barrier, results = threading.Barrier(len(clients) + 1), [None] * len(clients)

    def ask(i):
        barrier.wait()
        results[i] = clients[i].predict(TEXTS[i % len(TEXTS)], 5, api_name="/fill_mask")[1]

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - start, results


async def ask_light(http: httpx.AsyncClient, url: str, text: str) -> list:
    """One /fill_mask call over Gradio's HTTP API (a new session): its predictions."""
    posted = await http.post(f"{url}gradio_api/call/fill_mask", json={"data": [text, 5]})
    posted.raise_for_status()
    event = None
    async with http.stream("GET", f"{url}gradio_api/call/fill_mask/{posted.json()['event_id']}") as stream:
        lines = stream.aiter_lines()
        try:
            async for line in lines:
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:") and event == "error":
                    raise RuntimeError(f"/fill_mask failed: {line[:300]}")
                elif line.startswith("data:") and event == "complete":
                    return json.loads(line[5:])[1]
        finally:
            await lines.aclose()  # leaving early: close the line reader before the response
    raise RuntimeError("the stream ended before the result")


def light_crowd_seconds(http: httpx.AsyncClient, url: str, n: int, texts=TEXTS) -> tuple[float, list]:
    async def crowd():
        start = time.perf_counter()
        results = await asyncio.gather(*(ask_light(http, url, texts[i % len(texts)]) for i in range(n)))
        return time.perf_counter() - start, results
    return asyncio.get_event_loop().run_until_complete(crowd())


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timed(rounds: dict) -> dict:
    """Median wall seconds of ROUNDS calls of each of `rounds` (name -> (server pid, fn)), the names
    taking turns, call by call, so that the machine's drift over a minute hits all alike; the
    CPU seconds per call of the server that answered and of this client."""
    stats = {name: {"walls": [], "server_cpu": 0.0, "client_cpu": 0.0} for name in rounds}
    for _ in range(ROUNDS):
        for name, (pid, run_round) in rounds.items():
            server, client = cpu_seconds(pid), own_cpu_seconds()
            seconds, stats[name]["results"] = run_round()
            stats[name]["server_cpu"] += (cpu_seconds(pid) - server) / ROUNDS
            stats[name]["client_cpu"] += (own_cpu_seconds() - client) / ROUNDS
            stats[name]["walls"].append(seconds)
    for entry in stats.values():
        entry["wall"] = statistics.median(entry.pop("walls"))
    return stats


VARIANTS = {"batched": (16, True), "unbatched": (1, True), "torch": (16, False)}  # name -> (--max-batch, ONNX on)


def measure(folder: str) -> dict:
    """Serve the app three times at once in processes of its own (as in production: batched,
    `--max-batch 1`, `--no-onnx`), each once its ONNX Runtime forward is built and measured; time
    one request vs a crowd with each client, the three servers' rounds taking turns."""
    with contextlib.ExitStack() as stack:
        servers = {}
        for name, (max_batch, onnx) in VARIANTS.items():
            port = free_port()
            flags = [] if onnx else ["--no-onnx"]
            proc = stack.enter_context(serve_app(
                ["--model", folder, "--device", "cpu", "--port", str(port), "--max-batch", str(max_batch), *flags],
                log_line=ONNX_READY if onnx and onnx_engine.available() else None))
            servers[name] = (proc.pid, f"http://127.0.0.1:{port}/")
        clients = {name: [Client(url, verbose=False) for _ in range(CROWD)] for name, (_, url) in servers.items()}
        for crowd in clients.values():
            crowd_seconds(crowd[:1]), crowd_seconds(crowd)  # warm-up
        got = timed({(name, kind): (pid, lambda c=clients[name], n=n: crowd_seconds(c[:n]))
                     for name, (pid, _) in servers.items() for kind, n in (("one", 1), ("crowd", CROWD))})
        out = {name: {"gradio_client": (got[name, "one"], got[name, "crowd"])} for name in servers}
        asyncio.set_event_loop(asyncio.new_event_loop())
        limits = httpx.Limits(max_connections=2 * CROWD, max_keepalive_connections=2 * CROWD)
        http = httpx.AsyncClient(timeout=120, limits=limits)
        for _, url in servers.values():
            light_crowd_seconds(http, url, 1), light_crowd_seconds(http, url, CROWD, DIFFERENT)  # warm-up
        kinds = {"one": (1, TEXTS), "crowd": (CROWD, TEXTS), "different": (CROWD, DIFFERENT)}
        got = timed({(name, kind): (pid, lambda url=url, n=n, texts=texts: light_crowd_seconds(http, url, n, texts))
                     for name, (pid, url) in servers.items() for kind, (n, texts) in kinds.items()})
        for name in servers:
            out[name]["light"] = (got[name, "one"], got[name, "crowd"])
            out[name]["light, all different"] = (got[name, "one"], got[name, "different"])
        loop = asyncio.get_event_loop()
        loop.run_until_complete(http.aclose())
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
    return out


def line(name: str, one: dict, crowd: dict) -> str:
    return (f"{name:<34} one {one['wall'] * 1e3:6.1f} ms, {CROWD} at once {crowd['wall'] * 1e3:7.1f} ms, "
            f"ratio {crowd['wall'] / one['wall']:5.2f}x | CPU per crowd: server {crowd['server_cpu'] * 1e3:4.0f} ms, "
            f"client {crowd['client_cpu'] * 1e3:4.0f} ms")


def main() -> None:
    folder = str(bert_base_folder())
    measured = measure(folder)
    batched, unbatched, torch_only = measured["batched"], measured["unbatched"], measured["torch"]
    print(f"{machine()}\nbert-base-sized model, {CROWD} simultaneous /fill_mask requests vs one (goal <= 4x)")
    for client in ("gradio_client", "light", "light, all different"):
        print(line(f"{client}, batched:", *batched[client]))
        print(line(f"{client}, batched, --no-onnx:", *torch_only[client]))
        print(line(f"{client}, unbatched:", *unbatched[client]))
    for client in ("gradio_client", "light", "light, all different"):
        ours, torch_alone = batched[client][1]["wall"], torch_only[client][1]["wall"]
        print(f"{client} crowd, the app's default vs --no-onnx: {ours * 1e3:.1f} vs {torch_alone * 1e3:.1f} ms "
              f"({ours / torch_alone:.2f}x; goal: never slower, within the noise)")
    same = all([[p["token_id"] for p in r] for r in a] == [[p["token_id"] for p in r] for r in b]
               for client in ("gradio_client", "light", "light, all different")
               for a, b in zip(batched[client][1]["results"], unbatched[client][1]["results"]))
    print(f"batched results identical to unbatched (top-k token ids): {same}")


if __name__ == "__main__":
    main()
