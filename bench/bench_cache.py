"""The disk budget under a crowd: eight visitors each search their own corpus at the server's size
limit, four at once, with BERTDEMO_CACHE_MB=400 (the issue's figures), on the bundled model (6
layers, hidden 384: about 140 MB of index per corpus).

Prints, with the CPU model: each search's answer or refusal and its time, the cache folder's
largest size while the builds ran (sampled every 20 ms; goal <= 400 MB, 10% slack while a file is
written), the server's memory growth (resident set size, sampled, against the model loaded and
warm; goal <= 400 MB, about 100 MB per build under way), and whether a corpus whose index was
evicted answers again with the same hits.

The allocator is the server's (jemalloc where installed, else glibc with 2 arenas; bertdemo/memory.py).

Run: python bench/bench_cache.py             (the issue's crowd: minutes on 2 threads)
     python bench/bench_cache.py --small     (a quarter of each corpus, budget 100 MB: a smoke run)
"""
import argparse
import shutil
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bertdemo import memory  # noqa: E402

memory.exec_with_jemalloc(sys.argv)  # the server's allocator, as app.py runs it
memory.cap_arenas()

import torch  # noqa: E402

import bertdemo  # noqa: E402
from bertdemo.disk import MB, DiskCache, size_of  # noqa: E402
from bertdemo.views import corpus_search  # noqa: E402
from common import machine  # noqa: E402

THREADS = 2
VISITORS, AT_ONCE = 8, 4
QUERY = ("I sat on the river bank and watched the water.", "bank")


def visitor_corpus(seed: int, chars: int) -> str:
    """Lines of the default corpus drawn at random and joined two or three at a time, up to
    `chars` characters and 2,000 lines (the server's limits: 100,000 characters, 2,000 lines)."""
    lines, pick = list(corpus_search.read_corpus(None).lines), random.Random(seed)
    out, size = [], 0
    while len(out) < corpus_search.MAX_LINES:
        line = " ".join(pick.sample(lines, pick.choice((2, 3))))
        if size + len(line) + 1 > chars:
            break
        out.append(line)
        size += len(line) + 1
    return "\n".join(out)


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def folder_mb(folder: Path) -> float:
    return size_of(folder) / MB  # what an eviction removes meanwhile counts 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a quarter of each corpus, budget 100 MB")
    args = parser.parse_args()
    torch.set_num_threads(THREADS)
    budget = 100 if args.small else 400
    chars = 24_000 if args.small else 99_000
    root = Path(tempfile.mkdtemp(prefix="bertdemo-bench-cache-"))
    engine = bertdemo.Engine(disk=DiskCache(root, budget=budget))
    lm = engine.load_bundled()
    bertdemo.search_corpus(lm, QUERY[0], word=QUERY[1], layer=3, corpus="a warm up line about a bank",
                           cache=engine.search)
    corpora = [visitor_corpus(seed, chars) for seed in range(VISITORS)]
    base_rss, peaks, answers, done = rss_mb(), {"disk": 0.0, "rss": 0.0}, {}, threading.Event()

    def watch():
        while not done.is_set():
            peaks["disk"] = max(peaks["disk"], folder_mb(root))
            peaks["rss"] = max(peaks["rss"], rss_mb())
            time.sleep(0.02)

    def visit(n):
        started = time.perf_counter()
        try:
            hits = bertdemo.search_corpus(lm, QUERY[0], word=QUERY[1], layer=6, corpus=corpora[n],
                                          cache=engine.search)["hits"]
        except ValueError as refused:
            hits = str(refused)
        answers[n] = (hits, time.perf_counter() - started)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    started = time.perf_counter()
    for wave in (range(AT_ONCE), range(AT_ONCE, VISITORS)):
        visitors = [threading.Thread(target=visit, args=(n,)) for n in wave]
        for v in visitors:
            v.start()
        for v in visitors:
            v.join()
    crowd_s = time.perf_counter() - started
    first = next(n for n in range(VISITORS) if not isinstance(answers[n][0], str))
    again_started = time.perf_counter()
    again = bertdemo.search_corpus(lm, QUERY[0], word=QUERY[1], layer=6, corpus=corpora[first], cache=engine.search)
    again_s = time.perf_counter() - again_started
    done.set()
    watcher.join()

    print(f"CPU: {machine()}")
    print(f"bundled model (6 layers, hidden 384); {VISITORS} visitors, {AT_ONCE} at once; corpora of "
          f"{min(len(c) for c in corpora):,}-{max(len(c) for c in corpora):,} characters; "
          f"BERTDEMO_CACHE_MB={budget}")
    for n in range(VISITORS):
        hits, seconds = answers[n]
        said = (f"{len(hits)} hits" if not isinstance(hits, str) else f"refused: {hits}")
        print(f"  visitor {n + 1}: {seconds:6.1f} s  {said}")
    print(f"the crowd in {crowd_s:.0f} s")
    print(f"cache folder at most        {peaks['disk']:8.1f} MB  (goal <= {budget} MB, 10% slack while written: "
          f"{'met' if peaks['disk'] <= 1.1 * budget else 'NOT met'}); {folder_mb(root):.1f} MB after")
    growth = peaks["rss"] - base_rss
    print(f"server memory growth        {growth:8.1f} MB  (goal <= 400 MB: {'met' if growth <= 400 else 'NOT met'}; "
          f"resident {base_rss:.0f} MB before)")
    same = [h["similarity"] for h in again["hits"]] == [h["similarity"] for h in answers[first][0]] and \
        [h["text"] for h in again["hits"]] == [h["text"] for h in answers[first][0]]
    print(f"visitor {first + 1} again ({'rebuilt: it was evicted' if again['built'] else 'still cached'}) in "
          f"{again_s:.1f} s: {'the same hits' if same else 'OTHER HITS'}")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
