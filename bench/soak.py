"""Soak: a few hundred mixed requests against the real app (`python app.py` in a subprocess), the
server's memory after warm-up and at the end, tuned models of closed or evicted sessions freed,
and the queue refusing a flood politely.

    python bench/soak.py                      # tiny random BERT: about a minute
    python bench/soak.py --model bert-base    # bert-base-sized random weights, real vocab: minutes
    python bench/soak.py --model /path/to/folder --rounds 40
    python bench/soak.py --seconds 180        # timed: everything at once, as on a busy shared link
    python bench/soak.py --crowd              # 180 s of a crowd of scripts around one fine-tuning

Prints the server's resident memory (VmRSS of its process) after warm-up, after the fine-tunes
(their sessions closed or evicted) and at the end, with the growth in MB and %.

The timed mode overlaps it all for `--seconds`: visitors predicting (15% of their requests bad
input), one visitor abandoning its requests mid-stream, one session fine-tuning back to back
through gradio_client, and a flood filling the queue every 30 s. It prints the requests answered,
refused with a clear message and failed (goal: 0), and the server's memory over time (goal: it
levels off, the peak of the last third at most 150 MB above the peak of the middle third).

The crowd scenario (`--crowd`, 180 s unless `--seconds`): six scripts pressing Predict in a loop over
raw HTTP, each request a session of its own (15% bad input), one visitor abandoning its requests
mid-stream every 0.2 s, and one gradio_client session running /finetune with the endpoint's
defaults back to back, on a bert-base-sized model of 4 layers served with
`--finetune-max-seconds 20`. Same report and goals. (Gradio forgets the oldest of 2,000 sessions'
message queues: on a fast machine this crowd makes 2,000 sessions in under a minute, and a
fine-tune whose session was forgotten ended in the client with a bare CancelledError; it prints how
many sessions it made.)
"""
from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import random
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from gradio_client import Client

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from common import bert_base_folder, free_port, machine, serve_app  # noqa: E402

SENTENCES = ["Paris is the [MASK] of France.", "The man went to the [MASK] to buy a [MASK] of milk.",
             "The Eiffel tower is a famous [MASK].", "La Tour Eiffel est située à [MASK].",
             "Berlin is the [MASK] of Germany.", "The [MASK] sat on the mat because it was tired."]
FT_TEXT = "\n".join(["Paris is the capital of France.", "The Eiffel Tower is a famous landmark.",
                     "La Tour Eiffel est située à Paris.", "Berlin is the capital of Germany."] * 3)


def model_folder(choice: str) -> str:
    if choice == "tiny":
        import tiny_models

        return str(tiny_models.save_tiny_bert(Path(tempfile.mkdtemp(prefix="soak-")) / "tiny-bert"))
    if choice == "bert-base":
        return str(bert_base_folder())
    return choice


def server_malloc(pid: int) -> str:
    """jemalloc if the server runs under it (app.py preloads it where installed), else glibc."""
    return "jemalloc" if "libjemalloc" in Path(f"/proc/{pid}/maps").read_text() else "glibc"


def rss_mb(pid: int) -> float:
    """Resident memory of process `pid` in MB (VmRSS in /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


class Tally:
    """Per-endpoint outcomes and latencies, shared by the worker threads."""

    def __init__(self):
        self.lock = threading.Lock()
        self.outcomes: dict[str, Counter] = defaultdict(Counter)
        self.seconds: dict[str, list[float]] = defaultdict(list)

    def call(self, client: Client, api_name: str, *args):
        start = time.perf_counter()
        try:
            result, outcome = client.predict(*args, api_name=api_name), "ok"
        except Exception as err:  # noqa: BLE001 - counted, printed in the report
            result, outcome = None, f"refused: {str(err)[:70]}"
        with self.lock:
            self.outcomes[api_name][outcome] += 1
            self.seconds[api_name].append(time.perf_counter() - start)
        return result

    @property
    def total(self) -> int:
        return sum(sum(c.values()) for c in self.outcomes.values())


def visitor_round(tally: Tally, client: Client, rng: random.Random) -> None:
    """What a person exploring the page does: fill masks, look at attention, sample masks."""
    sentence = rng.choice(SENTENCES)
    tally.call(client, "/fill_mask", sentence, rng.randint(1, 10))
    tally.call(client, "/fill_jointly", sentence, rng.randint(1, 3))
    tally.call(client, "/attention", sentence, "", rng.choice(["head", "model"]), [], [], "head",
               0, 0, False, False, 0, 1)
    tally.call(client, "/mask_sample", sentence.replace("[MASK]", "word"), rng.randint(0, 99),
               0.15, 0.8, 0.1, False)


@contextlib.contextmanager
def open_tab(url: str, session_hash: str):
    """A browser tab's heartbeat for a session; leaving the block closes it (the app's unload runs)."""
    with httpx.Client(timeout=30) as http, \
            http.stream("GET", f"{url}gradio_api/heartbeat/{session_hash}") as beat:
        lines = beat.iter_lines()
        next(lines)
        yield


def fine_tuner(tally: Tally, url: str, close_tab: bool) -> None:
    """A person who fine-tunes a little, uses the model, downloads it, then (maybe) closes the tab."""
    client = Client(url, verbose=False)
    tab = open_tab(url, client.session_hash) if close_tab else contextlib.nullcontext()
    with tab:
        tally.call(client, "/finetune", FT_TEXT, 3, "steps", 1e-3, 4, 16, 0.15, "dynamic", 0, False, "")
        tally.call(client, "/use_tuned")
        tally.call(client, "/fill_mask", SENTENCES[0], 5)
        tally.call(client, "/download_tuned")


def mixed_load(tally: Tally, url: str, clients: list[Client], rng: random.Random, rounds: int,
               finetunes: int, drive_bys: int) -> None:
    """Every visitor does `rounds` rounds while `finetunes` people fine-tune, one after another,
    and `drive_bys` people each send one request from a session of their own and leave."""
    with ThreadPoolExecutor(len(clients) + 2) as pool:
        visits = [pool.submit(lambda c=c, r=random.Random(rng.random()): [
            visitor_round(tally, c, r) for _ in range(rounds)]) for c in clients]
        # Half close their tab (their model is freed at once), half leave it open (evicted: cap 2).
        tunes = [pool.submit(fine_tuner, tally, url, i % 2 == 0) for i in range(finetunes)]
        passing = pool.submit(lambda: [drive_by(tally, url, rng.choice(SENTENCES)) for _ in range(drive_bys)])
        for future in visits + tunes + [passing]:
            future.result()


def drive_by(tally: Tally, url: str, sentence: str) -> None:
    """One request from a new session, through Gradio's HTTP API, as a script would send it."""
    start = time.perf_counter()
    posted = httpx.post(f"{url}gradio_api/call/fill_mask", timeout=60,
                        json={"data": [sentence, 5], "session_hash": uuid.uuid4().hex})
    answer = httpx.get(f"{url}gradio_api/call/fill_mask/{posted.json()['event_id']}", timeout=60)
    outcome = "ok" if "event: complete" in answer.text else "refused"
    with tally.lock:
        tally.outcomes["/fill_mask (drive-by)"][outcome] += 1
        tally.seconds["/fill_mask (drive-by)"].append(time.perf_counter() - start)


@contextlib.contextmanager
def sampling(pid: int, samples: list[float], every_s: float = 0.5):
    """Append the process's RSS to `samples` every `every_s` seconds while the block runs."""
    stop = threading.Event()

    def sample():
        while not stop.wait(every_s):
            samples.append(rss_mb(pid))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def flood(url: str, n: int, draws: int) -> Counter:
    """`n` slow requests sent at once through Gradio's HTTP API; how each was answered."""
    body = ["Paris is the capital of France.", 0, 0.15, 0.8, 0.1, False, draws]

    def send(i):
        try:
            posted = httpx.post(f"{url}gradio_api/call/masking_law", timeout=60,
                                json={"data": body, "session_hash": f"flood-{i}"})
            if posted.status_code != 200:
                return f"refused ({posted.status_code}): {posted.text[:60]}"
            answer = httpx.get(f"{url}gradio_api/call/masking_law/{posted.json()['event_id']}", timeout=300)
            events = [line for line in answer.text.splitlines() if line.startswith("event:")]
            if events and events[-1] == "event: complete":
                return "served"
            data = [line for line in answer.text.splitlines() if line.startswith("data:")]
            return "refused: " + (json.loads(data[-1][5:]) or {}).get("error", "?")[:60]
        except httpx.HTTPError as err:
            return f"failed: {type(err).__name__}"

    with ThreadPoolExecutor(n) as pool:
        return Counter(pool.map(send, range(n)))


# ---------------------------------------------------------------- the timed mode

BAD_INPUT = [("/fill_mask", ("No mask in this sentence.", 5)), ("/fill_mask", (SENTENCES[0], 0)),
             ("/fill_mask", ("[MASK] " * 40, 5)), ("/fill_jointly", ("", 2)),
             ("/mask_sample", ("Paris is nice.", 1, 1.5, 0.8, 0.1, False))]
LEVEL_MB = 150  # the goal: the last third's peak at most this far above the middle third's
UNCLEAR = ("has raised an exception", "Connection errored out", "Server stopped")


def verdict(err: BaseException) -> str:
    """"refused" if the server said why (a gr.Error, a field's check, "queue is full"), else
    "failed": no message, a crash inside a handler, a connection or time-out error."""
    text = str(err).strip()
    if isinstance(err, (concurrent.futures.CancelledError, TimeoutError, httpx.HTTPError)) or not text \
            or any(phrase in text for phrase in UNCLEAR):
        return "failed"
    return "refused"


class Outcomes:
    """answered / refused (with the message) / failed (with what came back), per kind of request."""

    def __init__(self):
        self.lock = threading.Lock()
        self.counts: dict[str, Counter] = defaultdict(Counter)
        self.failures: Counter = Counter()
        self.refusals: Counter = Counter()

    def call(self, kind: str, fn, *args, **kwargs):
        try:
            result = fn(*args, **kwargs)
        except BaseException as err:  # noqa: BLE001 - every outcome is counted
            self.add(kind, verdict(err), f"{type(err).__name__}: {str(err)[:90]}")
            return None
        self.add(kind, "answered")
        return result

    def add(self, kind: str, outcome: str, message: str = "") -> None:
        with self.lock:
            self.counts[kind][outcome] += 1
            if outcome == "failed":
                self.failures[f"{kind}: {message}"] += 1
            elif outcome == "refused":
                self.refusals[f"{kind}: {message}"] += 1

    def total(self, outcome: str) -> int:
        with self.lock:
            return sum(c[outcome] for c in self.counts.values())


def predicting(out: Outcomes, client: Client, rng: random.Random, until: float) -> None:
    """A visitor exploring the page; 15% of its requests are bad input."""
    while time.monotonic() < until:
        if rng.random() < 0.15:
            api_name, args = rng.choice(BAD_INPUT)
            out.call("bad input", client.predict, *args, api_name=api_name)
            continue
        sentence = rng.choice(SENTENCES)
        api_name, args = rng.choice([
            ("/fill_mask", (sentence, rng.randint(1, 10))), ("/fill_jointly", (sentence, rng.randint(1, 3))),
            ("/attention", (sentence, "", rng.choice(["head", "model"]), [], [], "head", 0, 0, False, False, 0, 1)),
            ("/mask_sample", (sentence.replace("[MASK]", "word"), rng.randint(0, 99), 0.15, 0.8, 0.1, False))])
        out.call(api_name, client.predict, *args, api_name=api_name)


def abandoning(out: Outcomes, url: str, until: float, pause: float = 0.5) -> None:
    """A visitor who sends a slow request and leaves once its first event arrives, every `pause` s."""
    body = {"data": ["Paris is the capital of France.", 0, 0.15, 0.8, 0.1, False, 20_000]}
    while time.monotonic() < until:
        try:
            posted = httpx.post(f"{url}gradio_api/call/masking_law", timeout=30,
                                json={**body, "session_hash": uuid.uuid4().hex})
            if posted.status_code == 503 and "queue is full" in posted.text.lower():
                out.add("abandoned mid-stream", "refused", f"503: {posted.text[:60]}")
                time.sleep(0.5)
                continue
            with httpx.stream("GET", f"{url}gradio_api/call/masking_law/{posted.json()['event_id']}",
                              timeout=30) as stream:
                next(stream.iter_lines())  # then gone, mid-stream
            out.add("abandoned mid-stream", "answered")
        except (httpx.HTTPError, KeyError, StopIteration) as err:
            out.add("abandoned mid-stream", "failed", f"{type(err).__name__}: {err}")
        time.sleep(pause)


def fine_tuning(out: Outcomes, url: str, until: float) -> None:
    """One session fine-tuning back to back, using and downloading each model."""
    client = Client(url, verbose=False)
    while time.monotonic() < until:
        if out.call("/finetune", client.predict, FT_TEXT, 20, "steps", 1e-3, 4, 32, 0.15, "dynamic",
                    0, False, "", api_name="/finetune") is not None:
            out.call("/use_tuned", client.predict, api_name="/use_tuned")
            out.call("/download_tuned", client.predict, api_name="/download_tuned")


def flooding(out: Outcomes, url: str, until: float, size: int) -> None:
    """Every 30 s, twice the queue's size of slow requests at once: some are refused as 'queue full'."""
    next_at = time.monotonic()
    while next_at + 10 < until:
        time.sleep(max(0.0, next_at - time.monotonic()))
        next_at += 30
        for answer, count in flood(url, size * 2, draws=20_000).items():
            outcome = ("answered" if answer == "served" else
                       "refused" if "queue is full" in answer.lower() else "failed")
            for _ in range(count):
                out.add("flood", outcome, answer)


def memory_report(samples: list[tuple[float, float]], every_s: float = 15) -> tuple[float, float]:
    """Print RSS over time; returns the peaks of the middle and of the last third."""
    end = samples[-1][0]
    print("\nserver memory (RSS) over time:")
    for mark in range(0, int(end) + 1, int(every_s)):
        window = [mb for t, mb in samples if mark <= t < mark + every_s]
        if window:
            print(f"  {mark:4d}-{mark + int(every_s):<4d} s  max {max(window):6.0f} MB")
    thirds = [[mb for t, mb in samples if i * end / 3 <= t <= (i + 1) * end / 3] for i in range(3)]
    return max(thirds[1]), max(thirds[2])


def sample_rss(pid: int, samples: list, started: float):
    """Append (seconds since `started`, the server's RSS in MB) to `samples` every second, in a
    thread, until the function returned is called (it waits for the thread's last sample)."""
    stop = threading.Event()

    def sample():
        while not stop.wait(1.0):
            samples.append((time.monotonic() - started, rss_mb(pid)))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()

    def finish():
        stop.set()
        sampler.join()
    return finish


def timed(args, url: str, pid: int) -> int:
    out, samples, started = Outcomes(), [], time.monotonic()
    until = started + args.seconds
    finish_sampling = sample_rss(pid, samples, started)
    rng = random.Random(args.seed)
    clients = [Client(url, verbose=False) for _ in range(args.clients)]
    with ThreadPoolExecutor(len(clients) + 3) as pool:
        jobs = [pool.submit(predicting, out, c, random.Random(rng.random()), until) for c in clients]
        jobs += [pool.submit(abandoning, out, url, until), pool.submit(fine_tuning, out, url, until),
                 pool.submit(flooding, out, url, until, args.queue_size)]
        for job in jobs:
            job.result()
    finish_sampling()
    return report(out, samples, args.seconds)


def report(out: Outcomes, samples: list[tuple[float, float]], seconds: int) -> int:
    """Print the outcomes and the memory over time; 0 if nothing failed and the memory levelled off."""
    print(f"\n{seconds} s: {out.total('answered')} answered, {out.total('refused')} refused with a "
          f"clear message, {out.total('failed')} failed (goal 0)")
    for kind, counts in sorted(out.counts.items()):
        print(f"  {kind:22s} {dict(counts)}")
    for title, messages in (("refused, most common reasons", out.refusals), ("failed", out.failures)):
        if messages:
            print(f"{title}:")
            for message, count in messages.most_common(12):
                print(f"  {count:4d} x {message}")
    middle, last = memory_report(samples)
    first = samples[0][1]
    level = last - middle <= LEVEL_MB
    print(f"RSS: start {first:.0f} MB, peak {max(mb for _, mb in samples):.0f} MB; peak of the middle third "
          f"{middle:.0f} MB, of the last third {last:.0f} MB ({last - middle:+.0f} MB: "
          f"{'levels off' if level else 'still climbing'}; goal at most +{LEVEL_MB} MB)")
    return 0 if level and out.total("failed") == 0 else 1


# ---------------------------------------------------------------- the crowd scenario

CROWD_LAYERS = 4  # a bert-base-sized model of 4 layers: fine-tunes end at the time limit, not sooner
CROWD_FINETUNE_S = 20
RAW_BAD_INPUT = [("No mask in this sentence.", 5), (SENTENCES[0], 0), ("[MASK] " * 40, 5)]


def raw_call(url: str, api_name: str, data: list, session_hash: str | None = None) -> tuple[str, str]:
    """One request through Gradio's HTTP API as a script sends it (curl, requests): POST, then read
    the event stream to its end. Returns (outcome, message): "answered"; "refused" with the
    server's message (a gr.Error, a field's check, a full queue); "failed" with what came back."""
    body = {"data": data, **({"session_hash": session_hash} if session_hash else {})}
    posted = httpx.post(f"{url}gradio_api/call/{api_name}", json=body, timeout=60)
    if posted.status_code != 200:
        said = posted.text[:70]
        return ("refused" if posted.status_code in (422, 503) and said else "failed"), f"{posted.status_code}: {said}"
    answer = httpx.get(f"{url}gradio_api/call/{api_name}/{posted.json()['event_id']}", timeout=120)
    events = [line[6:].strip() for line in answer.text.splitlines() if line.startswith("event:")]
    data_lines = [line[5:].strip() for line in answer.text.splitlines() if line.startswith("data:")]
    if events and events[-1] == "complete":
        return "answered", ""
    said = json.loads(data_lines[-1]) if data_lines else None
    message = said.get("error") if isinstance(said, dict) else said
    return ("refused" if message else "failed"), f"{events[-1:] or 'no event'}: {str(message)[:70]}"


def raw_predicting(out: Outcomes, url: str, rng: random.Random, until: float) -> None:
    """A script pressing Predict in a loop over raw HTTP, a new session per request; 15% bad input."""
    while time.monotonic() < until:
        bad = rng.random() < 0.15
        data = list(rng.choice(RAW_BAD_INPUT)) if bad else [rng.choice(SENTENCES), rng.randint(1, 10)]
        kind = "/fill_mask (bad input)" if bad else "/fill_mask (raw HTTP)"
        try:
            outcome, message = raw_call(url, "fill_mask", data)
        except httpx.HTTPError as err:
            outcome, message = "failed", f"{type(err).__name__}: {err}"
        out.add(kind, outcome, message)


def finetuning_defaults(out: Outcomes, url: str, until: float) -> None:
    """One gradio_client session running /finetune with the endpoint's defaults, back to back."""
    client = Client(url, verbose=False)
    while time.monotonic() < until:
        start = time.monotonic()
        out.call("/finetune (defaults)", client.predict, api_name="/finetune")
        if time.monotonic() - start < 1:  # refused at once: do not spin
            time.sleep(1)


def crowd(args, url: str, pid: int) -> int:
    """Six raw-HTTP visitors on /fill_mask, one abandoning its requests every 0.2 s, one gradio_client
    session fine-tuning with the endpoint's defaults back to back."""
    out, samples, started = Outcomes(), [], time.monotonic()
    until = started + args.seconds
    finish_sampling = sample_rss(pid, samples, started)
    rng = random.Random(args.seed)
    with ThreadPoolExecutor(args.clients + 2) as pool:
        jobs = [pool.submit(raw_predicting, out, url, random.Random(rng.random()), until)
                for _ in range(args.clients)]
        jobs += [pool.submit(abandoning, out, url, until, 0.2), pool.submit(finetuning_defaults, out, url, until)]
        for job in jobs:
            job.result()
    finish_sampling()
    sessions = sum(sum(c.values()) for kind, c in out.counts.items() if kind != "/finetune (defaults)")
    print(f"\n{sessions:,} one-request sessions came and went around the fine-tunes (Gradio's queue "
          f"keeps the messages of 2,000 sessions)")
    return report(out, samples, args.seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny", help="tiny (default), bert-base, or a model folder")
    parser.add_argument("--clients", type=int, help="visitors exploring at once (default 4; timed: 6)")
    parser.add_argument("--rounds", type=int, default=20, help="rounds of 4 requests per visitor")
    parser.add_argument("--finetunes", type=int, default=6, help="people who fine-tune (separate sessions)")
    parser.add_argument("--drive-bys", type=int, default=24, help="one-request sessions per load")
    parser.add_argument("--max-sessions", type=int, default=32,
                        help="the app's --max-sessions: small, so the warm-up already fills it")
    parser.add_argument("--loads", type=int, default=3, help="times the mixed load runs after warm-up")
    parser.add_argument("--queue-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seconds", type=int, default=0,
                        help="timed mode: everything at once for this long (e.g. 180); --clients visitors")
    parser.add_argument("--crowd", action="store_true",
                        help=f"the crowd scenario for --seconds (default 180): raw-HTTP visitors on "
                             f"/fill_mask, one abandoning, one fine-tuning with the defaults back to back; "
                             f"a {CROWD_LAYERS}-layer bert-base-sized model unless --model")
    parser.add_argument("--server-log", help="keep the server's log in this file")
    args = parser.parse_args()
    args.clients = args.clients or (6 if args.seconds or args.crowd else 4)
    if args.crowd:
        run_crowd(args)
        return

    folder, port = model_folder(args.model), free_port()
    url = f"http://127.0.0.1:{port}/"
    app_args = ["--model", folder, "--device", "cpu", "--port", str(port), "--queue-size",
                str(args.queue_size), "--finetune-max-models", "2", "--finetune-max-steps", "20",
                "--max-sessions", str(args.max_sessions)]
    print(f"app: {' '.join(app_args)}")
    if args.seconds:
        with serve_app(app_args) as proc:
            print(f"server's malloc: {server_malloc(proc.pid)}; {machine()}")
            sys.exit(timed(args, url, proc.pid))
    with serve_app(app_args) as proc:
        print(f"server's malloc: {server_malloc(proc.pid)}; {machine()}")
        tally, rng = Tally(), random.Random(args.seed)
        clients = [Client(url, verbose=False) for _ in range(args.clients)]
        samples: list[float] = []
        rss = {"start": rss_mb(proc.pid)}
        phases = ["warm-up"] + [f"load {i + 1}" for i in range(args.loads)]
        for phase in phases:  # the same mixed load each time
            before, start = tally.total, time.perf_counter()
            with sampling(proc.pid, samples if phase != "warm-up" else []):
                mixed_load(tally, url, clients, rng, args.rounds, args.finetunes, args.drive_bys)
            seconds, rss[phase] = time.perf_counter() - start, rss_mb(proc.pid)
            print(f"{phase}: {tally.total - before} requests in {seconds:.0f} s "
                  f"({(tally.total - before) / seconds:.1f}/s); RSS {rss[phase]:.0f} MB")

        print(f"\n{tally.total} requests: {args.clients} visitors x {args.rounds} rounds of 4, "
              f"{args.finetunes} fine-tunes (half close their tab, half are evicted: cap 2) and "
              f"{args.drive_bys} one-request sessions, {len(phases)} times")
        for api_name, outcomes in sorted(tally.outcomes.items()):
            median = statistics.median(tally.seconds[api_name]) * 1e3
            print(f"  {api_name:16s} {dict(outcomes)}  median {median:.0f} ms")
        warm, end = rss["warm-up"], rss[phases[-1]]
        print("\nRSS: " + ", ".join(f"{name} {mb:.0f} MB" for name, mb in rss.items()))
        print(f"growth after warm-up: {end - warm:+.0f} MB ({(end - warm) / warm:+.1%}) over "
              f"{args.loads} loads, {(end - warm) / args.loads:+.1f} MB per load; during the loads "
              f"min {min(samples or [end]):.0f} / max {max(samples or [end]):.0f} MB")

        n = args.queue_size * 4
        for attempt in (1, 2):  # twice: the second shows whether the first left memory behind
            answers = flood(url, n, draws=100_000)
            refused = sum(v for k, v in answers.items() if "queue is full" in k.lower())
            print(f"\nflood {attempt}: {n} requests at once, queue size {args.queue_size}: "
                  f"{answers.get('served', 0)} served, {refused} refused as 'queue full'; "
                  f"RSS {rss_mb(proc.pid):.0f} MB")
            for answer, count in answers.most_common():
                print(f"  {count:3d} x {answer}")
        alive = Client(url, verbose=False).predict(SENTENCES[0], 3, api_name="/fill_mask")[1]
        print(f"after the floods the server answers: {[p['token'] for p in alive[0]]}")


def run_crowd(args) -> None:
    args.seconds = args.seconds or 180
    folder = str(bert_base_folder(layers=CROWD_LAYERS)) if args.model == "tiny" else model_folder(args.model)
    port = free_port()
    app_args = ["--model", folder, "--device", "cpu", "--port", str(port), "--queue-size", str(args.queue_size),
                "--finetune-max-seconds", str(CROWD_FINETUNE_S)]
    print(f"app: {' '.join(app_args)}")
    with serve_app(app_args, log_path=args.server_log) as proc:
        print(f"server's malloc: {server_malloc(proc.pid)}; {machine()}")
        sys.exit(crowd(args, f"http://127.0.0.1:{port}/", proc.pid))


if __name__ == "__main__":
    main()
