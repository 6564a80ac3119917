"""The page's own speed, in a real browser: what a visitor waits for, and how much of it is the page.

Every other bench times the server. This one starts `python app.py` (the bundled model, then a
bert-base-sized folder with random weights), opens it in Debian's chromium (`/usr/bin/chromium`,
headless, through Playwright, which never downloads a browser here) with a fresh profile for every
visit, and times:

- the page's load: requests and bytes (transferred, and decoded) until the tabs show and until the
  first click, and the time from navigation to the tabs;
- each tab's main view: a new visit that reads the landing page for `--read` s (3), opens the tab,
  reads it as long, fills the view's text and clicks its button; the time from that click to the view
  drawn (every chart, table or frame of it that the visitor sees, as a new drawing), the first time and
  `--later` times more with other text. Beside it the server's own time for the same request: from
  the moment the browser sends the request (`queue/join`) to the moment the last byte of its answer
  (`process_completed`) arrives, read from chromium's network events (the DevTools protocol), so the
  two figures are of one and the same request. The page's share is the difference: Gradio's code
  before the request goes out and after the answer comes in (parsing, drawing, modules fetched).

What the visitor sees is what is waited for: a section folded until the visitor opens it is not drawn
by an answer (Attention's "What the [MASK] looked at" and its numbers' JSON: the page mounts their
charts when opened), so it is not in `drawn`; everything the view shows open is. A frame counts as
drawn when it adds new `svg text` after the click, whether the answer built a new document (as
bertviz's frame did) or drew into the one the page keeps (as it does now).

Run: python bench/bench_page.py [--models bundled,bert-base] [--later 3] [--read 3] [--visits 1]
     [--app DIR] (another checkout's app.py, e.g. before a change; needs its own package there)
"""
from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, bert_base_folder, free_port, machine, wait_until_up  # noqa: E402

CHROMIUM = "/usr/bin/chromium"  # Debian's package (`apt-get install chromium`)
ONNX_READY = "ONNX Runtime forward ready"  # the app's log line once its short sentences' engine is built
LOCAL = ("http://127.0.0.1", "http://localhost", "data:", "blob:")
DRAWN_TIMEOUT_MS = int(os.environ.get('BENCH_PAGE_TIMEOUT_MS', 180_000))  # a first corpus search on a new model builds its index: minutes on bert-base


@dataclass
class View:
    """One tab's main view: how a visitor asks for it and what shows it is drawn.

    `fill`: (the text box's label, or a CSS selector starting with '#'; one value per click).
    `drawn`: what must show a new drawing (new nodes, or new text in them), each `plot(label)` (a
    plotly chart in the block whose label starts so), {"block": label or "css": selector, "ready":
    selector of what it shows}, or {"frame": selector of an iframe} (bertviz: once it adds `svg text`).
    Every chart, table and frame the answer shows open, none that waits folded for a click.
    `button`: None: the view is the tab's own content (drawn when the tab opens, no request)."""

    tab: str
    button: str | None
    api: str | None  # the endpoint the button calls (its request is the one timed on the server)
    fill: list[tuple[str, list[str]]]
    drawn: list[dict]
    only: str | None = None  # the model this view needs (Features: the bundled model's dictionaries)


def plot(label: str) -> dict:
    return {"block": label, "ready": ".js-plotly-plot .main-svg"}


MASKED = ["Paris is the [MASK] of France.", "The cat sat on the [MASK].",
          "I drank a cup of [MASK] this morning.", "She [MASK] to the station before noon.",
          "The children played in the [MASK] after school."]
PLAIN = ["I sat on the river bank and watched the water.", "The bank lent me money for a house.",
         "He swung the bat and hit the ball.", "The box is light enough to carry.",
         "We walked along the river after dinner."]
BANK = ["I sat on the river bank.", "The bank lent me money.", "We fished from the muddy bank.",
        "She works at a bank in town.", "The bank closed at noon.", "Reeds grew along the bank."]
SEARCH = [("I sat on the river bank and watched the water.", "bank"), ("He swung the bat and hit the ball.", "bat"),
          ("The box is light enough to carry.", "light"), ("She opened the window to let in the air.", "window"),
          ("The children played in the park after school.", "park")]  # each word its own chart
VIEWS = [
    View("Fill mask", "Predict", "fill_mask", [("Sentence with [MASK]s", MASKED)], [plot("Predictions per mask")]),
    View("Attention", "Show attention", "attention", [("Sentence", MASKED)],
         [{"frame": "#bertviz-view iframe"}, plot("Attention heatmap")]),
    View("Inside a prediction", "Show predictions after each layer", "layer_predictions",
         [("Sentence to look inside (with [MASK]s)", MASKED)],
         [plot("Top tokens after each layer"), plot("Rank of the final answer")]),
    View("Embeddings", "Map the embeddings", "embedding_map",
         [("Sentences, one per line", ["\n".join(BANK[:i] + BANK[i + 1:]) for i in range(len(BANK))])],
         [plot("Hidden states at the chosen layer"), {"css": "#embedding-neighbours", "ready": "tbody td"}]),
    View("Corpus search", "Search the corpus", "search_corpus",
         [("Sentence", [s for s, _ in SEARCH]), ("Word to search for (one the sentence uses)", [w for _, w in SEARCH])],
         [{"css": "#search-hits", "ready": "tbody tr"}, plot("How often each word")]),
    View("Features", "Show the sentence's features", "sentence_features", [("#features-sentence textarea", PLAIN)],
         [plot("Tokens x features"), {"css": "#features-tokens", "ready": "tbody td"}], only="bundled"),
    View("Mask sampling", "Sample", "mask_sample", [("Text", PLAIN)],
         [{"block": "Tokens coloured by outcome", "ready": ".token"}]),
    View("About", None, None, [], [plot("GLUE [1] scores")]),
]

# In the page: when the tabs first show (the frame after the tab list appears), from navigation start.
# In a frame inside it (bertviz's, sandboxed: the page cannot look in), tell the page when it has drawn.
INIT_JS = """if (window === window.top) {
    new MutationObserver((_, observer) => {
        if (!document.querySelector('[role=tab]')) return;
        observer.disconnect();
        requestAnimationFrame(() => { window.__tabsShown = performance.now(); });
    }).observe(document, {subtree: true, childList: true});
} else {  // each new drawing (svg text added), whether in a new document or one the page reuses
    const drawing = (node) => node.nodeType === 1 && (node.matches('svg text') || !!node.querySelector('svg text'));
    new MutationObserver((records) => {
        if (!records.some((r) => [...r.addedNodes].some(drawing))) return;
        window.parent.postMessage({benchFrameDrawn: true}, '*');  // (no frames drawn for it off screen)
    }).observe(document, {subtree: true, childList: true});
}"""

# In the page, before a click: note what each check shows now; then, from the click on, look at every
# frame for the moment all of them show a new drawing (a new node, or new text in it).
WATCH_JS = """(checks) => {
    const shown = (el) => el && el.offsetParent !== null;
    const block = (label) => [...document.querySelectorAll('[data-testid="block-label"]')]
        .filter((el) => el.textContent.trim().startsWith(label) && shown(el))
        .map((el) => el.closest('.block'))[0];
    const look = (c) => {
        if (c.frame) {  // drawn: the frame said so (INIT_JS) since the click, a new document or not
            const node = [...document.querySelectorAll(c.frame)].filter(shown)[0];
            const drawn = !!node && framesDrawn.has(node.contentWindow);
            return {node, text: drawn ? 'drawn since the click' : '', ready: drawn};
        }
        // what the view shows, not the block around it (whose progress timer ticks while it waits)
        const root = c.block ? block(c.block) : [...document.querySelectorAll(c.css)].filter(shown)[0];
        const parts = root ? [...root.querySelectorAll(c.ready)] : [];
        return {node: parts[0], text: parts.map((part) => part.textContent).join('|'), ready: parts.length > 0};
    };
    const framesDrawn = new Set();
    window.addEventListener('message', (e) => { if (e.data?.benchFrameDrawn) framesDrawn.add(e.source); });
    const state = {clicked: null, drawn: null, before: checks.map(look)};
    state.now = () => checks.map((c, i) => { const n = look(c);
        return {check: c, found: !!n.node, ready: n.ready, new: n.node !== state.before[i].node || n.text !== state.before[i].text}; });
    window.__bench = state;
    document.addEventListener('click', (e) => { state.clicked = e.timeStamp; }, {capture: true, once: true});
    const poll = () => {
        if (state.clicked !== null) {
            const now = checks.map(look);
            if (now.every((n, i) => n.ready && (n.node !== state.before[i].node || n.text !== state.before[i].text))) {
                state.drawn = performance.now();
                return;
            }
        }
        requestAnimationFrame(poll);
    };
    requestAnimationFrame(poll);
}"""


class Network:
    """Chromium's network events for one page (the DevTools protocol): every request with its
    bytes, each queued event's `queue/join` and the arrival of its `process_completed` message."""

    def __init__(self, context, page):
        self.cdp = context.new_cdp_session(page)
        self.requests: dict[str, dict] = {}  # requestId -> {url, sent, wall, bytes, decoded}
        self.order: list[str] = []
        self.joins: list[str] = []  # requestIds of queue/join, in order
        self.completed: dict[str, float] = {}  # event_id -> monotonic s its answer was whole
        self.streams: dict[str, dict] = {}  # requestId of queue/data -> {chunks, text}
        self.cdp.send("Network.enable")
        self.cdp.on("Network.requestWillBeSent", self._sent)
        self.cdp.on("Network.dataReceived", self._data)
        self.cdp.on("Network.loadingFinished", self._finished)

    def _sent(self, e):
        url, rid = e["request"]["url"], e["requestId"]
        if rid in self.requests:  # a redirect: the same request goes on
            return
        self.requests[rid] = {"url": url, "sent": e["timestamp"], "wall": e["wallTime"], "bytes": 0,
                              "decoded": 0, "done": False}
        self.order.append(rid)
        if "/queue/join" in url:
            self.joins.append(rid)
            with contextlib.suppress(Exception):
                body = e["request"].get("postData") or self.cdp.send("Network.getRequestPostData", {"requestId": rid})["postData"]
                self.requests[rid]["fn_index"] = json.loads(body).get("fn_index")
        if "/queue/data" in url:  # its messages' bytes, to see when each answer is whole
            stream = self.streams[rid] = {"chunks": [], "text": b""}
            with contextlib.suppress(Exception):
                buffered = self.cdp.send("Network.streamResourceContent", {"requestId": rid})
                stream["text"] += base64.b64decode(buffered.get("bufferedData", ""))

    def _data(self, e):
        rid = e["requestId"]
        request = self.requests.get(rid)
        if request is None:
            return
        request["decoded"] += e.get("dataLength", 0)
        request["bytes"] += e.get("encodedDataLength", 0)
        stream = self.streams.get(rid)
        if stream is not None:
            stream["chunks"].append((e["timestamp"], e.get("dataLength", 0)))
            stream["text"] += base64.b64decode(e.get("data", "") or "")
            self._messages(stream)

    def _finished(self, e):
        request = self.requests.get(e["requestId"])
        if request is not None:
            request["bytes"] = max(request["bytes"], e.get("encodedDataLength", 0))
            request["done"] = True

    def _messages(self, stream):
        """Each whole `process_completed` message on a stream, timed by the chunk that completed it."""
        text, start = stream["text"], stream.setdefault("read", 0)
        while (end := text.find(b"\n\n", start)) >= 0:
            message = text[start:end]
            start = end + 2
            if b'"process_completed"' not in message:
                continue
            with contextlib.suppress(ValueError):
                event_id = json.loads(message.split(b"data:", 1)[1])["event_id"]
                received = 0
                for timestamp, length in stream["chunks"]:
                    received += length
                    if received >= end + 2:
                        self.completed[event_id] = timestamp
                        break
        stream["read"] = start

    def event_id(self, join_id: str) -> str | None:
        with contextlib.suppress(Exception):
            body = self.cdp.send("Network.getResponseBody", {"requestId": join_id})["body"]
            return json.loads(body)["event_id"]
        return None

    def to_monotonic(self, wall_ms: float) -> float:
        """A wall-clock time of the page (ms since the epoch) on the protocol's clock (s)."""
        first = self.requests[self.order[0]]
        return wall_ms / 1000 - (first["wall"] - first["sent"])

    def totals(self, until: float | None = None) -> tuple[int, int, int]:
        """(requests, bytes transferred, bytes decoded) of the requests sent by `until` (protocol clock)."""
        chosen = [r for r in self.requests.values() if until is None or r["sent"] <= until]
        return len(chosen), sum(r["bytes"] for r in chosen), sum(r["decoded"] for r in chosen)

    def request_times(self, joins_before: int, fn_index: int, page, timeout_s: float = 10.0):
        """The first request for `fn_index` queued since `joins_before` joins: (its join sent, its answer
        whole), on the protocol's clock (s); None if none came."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            join = next((j for j in self.joins[joins_before:] if self.requests[j].get("fn_index") == fn_index), None)
            if join is not None:
                event_id = self.event_id(join) if self.requests[join]["done"] else None
                if event_id and event_id in self.completed:
                    return self.requests[join]["sent"], self.completed[event_id]
            page.wait_for_timeout(20)  # lets Playwright deliver the protocol's events
        return None


@dataclass
class Timing:
    total: float  # s, click to drawn
    server: float | None = None  # s, the request's join sent to its answer whole (None: no request)
    before: float | None = None  # s, the click to the request sent (the page's, before the server)
    fetched: list[str] = field(default_factory=list)  # the page's own files fetched meanwhile

    @property
    def page(self) -> float:
        return self.total - (self.server or 0.0)

    @property
    def after(self) -> float | None:
        """s, the answer whole to the view drawn (the page's, after the server)."""
        return None if self.before is None else self.page - self.before


@contextlib.contextmanager
def serve(root: Path, args: list[str], log_path: str, timeout_s: float = 300.0):
    """`python ROOT/app.py ARGS` until it answers and its ONNX Runtime forward is built (when it builds one)."""
    port = int(args[args.index("--port") + 1])
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1"}
    with open(log_path, "w+") as log:
        proc = subprocess.Popen([sys.executable, str(root / "app.py"), *args], env=env, cwd=root,
                                stdout=subprocess.DEVNULL, stderr=log)
        try:
            started = time.perf_counter()
            wait_until_up(f"http://127.0.0.1:{port}/", timeout_s, proc)
            while "--no-onnx" not in args and time.perf_counter() - started < 60:
                log.seek(0)
                if ONNX_READY in log.read():
                    break
                time.sleep(0.2)
            yield f"http://127.0.0.1:{port}/"
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def new_visit(browser, url: str):
    """A fresh profile's page (its own cache and storage) that can reach only this machine."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.add_init_script(INIT_JS)
    context.route("**/*", lambda route: route.continue_() if route.request.url.startswith(LOCAL) else route.abort())
    page = context.new_page()
    page.set_default_timeout(60_000)
    network = Network(context, page)
    page.goto(url)
    page.wait_for_function("window.__tabsShown !== undefined")
    return context, page, network


def load_figures(page, network: Network, read_s: float) -> dict:
    """Time to the tabs, and what the page fetched by then and by the first click."""
    tabs_ms, origin = page.evaluate("[window.__tabsShown, performance.timeOrigin]")
    page.wait_for_timeout(read_s * 1000)
    return {"tabs_s": tabs_ms / 1000, "to_tabs": network.totals(network.to_monotonic(origin + tabs_ms)),
            "by_click": network.totals()}


def fill(page, target: str, value: str) -> None:
    box = page.locator(target) if target.startswith("#") else page.get_by_label(re.compile(r"^\s*" + re.escape(target)))
    box.filter(visible=True).first.fill(value)


def fn_indexes(url: str) -> dict[str, int]:
    """Each endpoint's api_name -> the fn_index its requests carry (the app's /config)."""
    import urllib.request

    with urllib.request.urlopen(f"{url}config", timeout=30) as response:
        config = json.load(response)
    return {d["api_name"]: d["id"] for d in config["dependencies"] if d.get("api_name")}


def timed_click(page, network: Network, view: View, click, fn_index: int | None = None) -> Timing:
    """Click (`click()`), wait until the view shows a new drawing; the time and the server's share."""
    page.evaluate(WATCH_JS, view.drawn)
    joins, requests = len(network.joins), len(network.order)
    click()
    try:
        page.wait_for_function("window.__bench.drawn !== null", timeout=DRAWN_TIMEOUT_MS)
    except Exception as err:
        raise RuntimeError(f"{view.tab}: not drawn: {page.evaluate('window.__bench.now()')}") from err
    clicked, drawn, origin = page.evaluate("[window.__bench.clicked, window.__bench.drawn, performance.timeOrigin]")
    total = (drawn - clicked) / 1000
    request = network.request_times(joins, fn_index, page) if fn_index is not None else None
    server = before = None
    if request is not None:
        sent, answered = request
        server, before = answered - sent, sent - network.to_monotonic(origin + clicked)
    fetched = [network.requests[r]["url"].rsplit("/", 1)[-1] for r in network.order[requests:]
               if "/assets/" in network.requests[r]["url"] or "/static/" in network.requests[r]["url"]]
    return Timing(total, server, before, fetched)


def visit_view(browser, url: str, view: View, later: int, read_s: float, fn_index: int | None) -> tuple[dict, list[Timing]]:
    """A new visitor: reads the page, opens the view's tab, reads it, asks for the view, then `later` more."""
    context, page, network = new_visit(browser, url)
    try:
        load = load_figures(page, network, read_s)
        tab = page.get_by_role("tab", name=view.tab, exact=True)
        if view.button is None:
            return load, [timed_click(page, network, view, tab.click)]
        if tab.get_attribute("aria-selected") != "true":
            tab.click()
            page.get_by_role("button", name=view.button, exact=True).wait_for()
            page.wait_for_timeout(read_s * 1000)
        timings = []
        for i in range(1 + later):
            for target, values in view.fill:
                fill(page, target, values[i % len(values)])
            button = page.get_by_role("button", name=view.button, exact=True).filter(visible=True).first
            timings.append(timed_click(page, network, view, button.click, fn_index))
        return load, timings
    finally:
        context.close()


def ms(seconds: float | None, width: int = 5) -> str:
    return f"{'-':>{width}}" if seconds is None else f"{seconds * 1000:{width}.0f}"


def median(timings: list[Timing], figure: str) -> float | None:
    values = [getattr(t, figure) for t in timings]
    return statistics.median(values) if values and None not in values else None


def columns(timings: list[Timing]) -> str:
    """total, server, page (before the request + after the answer), in ms."""
    if not timings:
        return f"{'':31}"
    return (f"{ms(median(timings, 'total'))} {ms(median(timings, 'server'))} {ms(median(timings, 'page'))} "
            f"({ms(median(timings, 'before'), 3)} +{ms(median(timings, 'after'))})")


def report(model: str, loads: list[dict], results: dict[str, list[list[Timing]]], later: int) -> None:
    tabs = statistics.median(load["tabs_s"] for load in loads)
    to_tabs = [statistics.median(load["to_tabs"][i] for load in loads) for i in range(3)]
    by_click = [statistics.median(load["by_click"][i] for load in loads) for i in range(3)]
    print(f"\n== {model}: page load (median of {len(loads)} visits)")
    print(f"tabs shown {tabs:.2f} s after navigation; by then {to_tabs[0]:.0f} requests, {to_tabs[1] / 1e3:.0f} kB "
          f"transferred, {to_tabs[2] / 1e6:.1f} MB decoded; by the first click {by_click[0]:.0f} requests, "
          f"{by_click[1] / 1e3:.0f} kB transferred, {by_click[2] / 1e6:.1f} MB decoded")
    print(f"ms, click to drawn: total, server, page (before the request + after the answer); later: median of "
          f"{later} per visit")
    print(f"{'view':20} {'first':^31}   {'later':^31}   fetched at the first click")
    for tab, visits in results.items():
        first, rest = [v[0] for v in visits], [t for v in visits for t in v[1:]]
        fetched = sorted({name for t in first for name in t.fetched})
        print(f"{tab:20} {columns(first)}   {columns(rest)}   {', '.join(fetched) or '-'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="bundled,bert-base", help="bundled, bert-base, or a folder; comma-separated")
    parser.add_argument("--later", type=int, default=3, help="clicks after the first, each with other text")
    parser.add_argument("--read", type=float, default=3.0, help="seconds the visitor reads before a first click")
    parser.add_argument("--visits", type=int, default=1, help="visits per view (medians over them)")
    parser.add_argument("--views", default="", help="only these tabs (comma-separated titles)")
    parser.add_argument("--app", default=str(ROOT), help="the checkout whose app.py is served")
    parser.add_argument("--no-onnx", action="store_true", help="serve fill-mask with torch")
    args = parser.parse_args()

    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        sys.exit(f"no browser at {CHROMIUM}: apt-get install chromium")
    chromium = subprocess.run([CHROMIUM, "--version"], capture_output=True, text=True).stdout.strip()
    import gradio

    print(f"{machine()}; {chromium}; gradio {gradio.__version__}; load average {os.getloadavg()[0]:.2f} at start")
    print(f"a visitor reads {args.read:.0f} s before each first click; server = the request's join sent to its "
          "answer whole (chromium's network events); page = the rest")
    wanted = [v.strip() for v in args.views.split(",") if v.strip()]
    for model in args.models.split(","):
        folder = {"bundled": "bundled", "bert-base": str(bert_base_folder())}.get(model, model)
        port = free_port()
        serve_args = ["--model", folder, "--port", str(port)] + (["--no-onnx"] if args.no_onnx else [])
        log = Path(tempfile.gettempdir()) / f"bench-page-{os.getpid()}.log"
        with serve(Path(args.app), serve_args, str(log)) as url, sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=[
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--no-first-run"])
            loads, results, endpoints = [], {}, fn_indexes(url)
            for view in VIEWS:
                if (wanted and view.tab not in wanted) or (view.only and view.only != model):
                    continue
                for _ in range(args.visits):
                    load, timings = visit_view(browser, url, view, args.later, args.read, endpoints.get(view.api))
                    loads.append(load)
                    results.setdefault(view.tab, []).append(timings)
            browser.close()
        report(model, loads, results, args.later)
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
