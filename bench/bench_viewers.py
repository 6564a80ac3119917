"""Many viewers: 16 simultaneous fill-mask requests through the running app vs one request.

Goal: all 16 done within 4x the time of one (micro-batching), results identical to one at a time.
Also runs the same crowd with batching off (--max-batch 1 equivalent) for comparison.
Run: python bench/bench_viewers.py
"""
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gradio_client import Client  # noqa: E402

from common import bert_base_folder, free_port, serve_app  # noqa: E402

CROWD = 16
TEXTS = ["Paris is the [MASK] of France.", "The man went to the [MASK] to buy milk.",
         "She is a [MASK] at the hospital.", "The [MASK] sat on the mat."]


def crowd_seconds(clients: list[Client]) -> tuple[float, list]:
    """Wall time for every client to get its answer, all sent at once."""
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


def measure(max_batch: int, folder: str, rounds: int = 5) -> tuple[float, float, list]:
    """Serve the app in its own process (as in production) and time one request vs a crowd."""
    port = free_port()
    with serve_app(["--model", folder, "--device", "cpu", "--port", str(port),
                    "--max-batch", str(max_batch)]):
        clients = [Client(f"http://127.0.0.1:{port}/", verbose=False) for _ in range(CROWD)]
        crowd_seconds(clients[:1]), crowd_seconds(clients)  # warm-up
        one = statistics.median(crowd_seconds(clients[:1])[0] for _ in range(rounds))
        crowd_times, results = [], None
        for _ in range(rounds):
            seconds, results = crowd_seconds(clients)
            crowd_times.append(seconds)
        return one, statistics.median(crowd_times), results


def main() -> None:
    folder = str(bert_base_folder())
    one, crowd, batched = measure(16, folder)
    one_nb, crowd_nb, unbatched = measure(1, folder)
    same = all([[p["token_id"] for p in r] for r in a] == [[p["token_id"] for p in r] for r in b]
               for a, b in zip(batched, unbatched))
    print(f"bert-base-sized model, {CROWD} simultaneous /fill_mask requests through gradio_client")
    print(f"batched:   one request {one * 1e3:7.1f} ms, {CROWD} at once {crowd * 1e3:7.1f} ms, "
          f"ratio {crowd / one:5.2f}x (goal <= 4x)")
    print(f"unbatched: one request {one_nb * 1e3:7.1f} ms, {CROWD} at once {crowd_nb * 1e3:7.1f} ms, "
          f"ratio {crowd_nb / one_nb:5.2f}x")
    print(f"batched results identical to unbatched (top-k token ids): {same}")


if __name__ == "__main__":
    main()
