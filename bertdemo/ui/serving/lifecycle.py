"""What serves the page and ends it: launch (the upload cap, /healthz), Gradio's own temp folder, the signals and a clean shut-down (from app.py)."""
from __future__ import annotations

import atexit
import contextlib
import io
import logging
import os
import shutil
import signal
import sys
import threading
import time

import gradio as gr
from gradio import routes
from starlette.middleware import Middleware

from ... import disk
from ...config import Settings, parse_auth
from ...disk import DiskCache
from ...serving.engine import Engine
from ...sessions import SessionStore
from . import mcp_tools, sent_values
from .health import Health

log = logging.getLogger("bertdemo")
MAX_UPLOAD = "1mb"  # only the Classify tab's CSV upload takes files (it reads far less); cap the route
EXIT_WITHIN_S = 10.0  # SIGTERM to exit: Docker's `stop` kills after 10 s
RUNS_STOP_WITHIN_S = 6.0  # of which the running runs get this long to end their current step


def page_theme() -> gr.themes.Base:
    """Gradio's default theme with fonts the app serves itself, whole. The default's Source Sans
    Pro and IBM Plex Mono come from Gradio's own static folder, but its SemiBold files (weight 600:
    headings, labels, bold text) hold 55 and 75 glyphs (no lowercase, few capitals), so bold text
    fell back to the system font letter by letter and some capitals showed smaller ("ʙERT").
    Weights 400 and 700 are the fonts' whole files (1,615 and 750 glyphs; SIL Open Font License,
    shipped in the gradio package): text at 600 takes the 700 face. Nothing comes from Google, so
    the page renders the same offline.

    Its colours pass WCAG 2 AA (4.5:1 for text; tests/ui/test_browser_accessibility.py runs axe-core):
    the default's grey for info text under labels, slider bounds and the footer (neutral 400,
    #bbbbc2: 1.9:1 on white) becomes neutral 500 (#71717a: 4.8:1), white on the primary buttons'
    orange 500 (2.8:1) sits on orange 700 (#c2410c: 5.2:1), and white on the Stop buttons' red 500
    (3.8:1) on red 600 (#dc2626: 4.8:1); each hover one shade darker."""
    return gr.themes.Default(
        font=(gr.themes.LocalFont("Source Sans Pro", weights=(400, 700)), "ui-sans-serif", "system-ui", "sans-serif"),
        font_mono=(gr.themes.LocalFont("IBM Plex Mono", weights=(400, 700)), "ui-monospace", "Consolas", "monospace"),
    ).set(body_text_color_subdued="*neutral_500", block_info_text_color="*neutral_500",
          button_primary_background_fill="*primary_700", button_primary_background_fill_hover="*primary_800",
          button_cancel_background_fill=gr.themes.colors.red.c600,
          button_cancel_background_fill_hover=gr.themes.colors.red.c700)


# Gradio's tables break a header anywhere ("featu re", "influenc e"): on every tab a header breaks
# between words only, its column widening to fit.
PAGE_CSS = ".gradio-container table th .header.text{word-break:normal;overflow-wrap:normal;hyphens:none}"


def page_look() -> dict:
    """The page's theme and style, as `launch` takes them (the app's launch and the tests' alike)."""
    return {"theme": page_theme(), "css": PAGE_CSS}


# Gradio makes a demo's FastAPI app (its ~440 routes, the page's config, the MCP check) in
# `gr.Blocks()` (which calls `queue()`), when its `with` block ends and again in `queue()`, then once
# more in `launch()`, which serves only that last one: the three before cost 0.3 s of CPU per start
# (of ~0.55 s for the whole build over a tiny model), and nothing of ours reads `demo.app` before
# launch. Inside `app_made_at_launch()` those calls make nothing, in this thread only; every other
# call (launch, `gr.mount_gradio_app`, other threads) is Gradio's own. tests/test_perf_invariants.py
# fails when Gradio stops making them so, or calls them otherwise.
_building = threading.local()
_GRADIOS_CREATE_APP = routes.App.create_app


def _create_app(blocks, **kwargs):
    if getattr(_building, "on", False) and kwargs == {"mcp_server": False}:  # Blocks' own calls
        return None
    return _GRADIOS_CREATE_APP(blocks, **kwargs)


@contextlib.contextmanager
def app_made_at_launch():
    """While the demo is built in this block (`gr.Blocks()`, its `with`, `queue()`), Gradio makes
    it no FastAPI app: `launch()` makes the one it serves."""
    routes.App.create_app = staticmethod(_create_app)
    _building.on = True
    try:
        yield
    finally:
        _building.on = False


class Signals:
    """SIGTERM (docker stop, kubectl, systemd) and Ctrl-C. While the server starts (the model
    loading, the page being built) the process exits at once, status 0, its temporary files
    removed; once it serves, they set `stopping` instead of killing the process mid-run, and
    `shut_down` ends the runs and removes the files. A second Ctrl-C exits at once."""

    def __init__(self):
        self.stopping = threading.Event()
        self.serving = False
        self.engine: Engine | None = None  # whose background work and temporary entries a stop while starting ends
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self.on_signal)

    def on_signal(self, signum, frame) -> None:
        if self.stopping.is_set():
            os._exit(128 + signum)
        log.info("%s: shutting down", signal.Signals(signum).name)
        self.stopping.set()
        if not self.serving:  # the main thread was loading or building: nothing to hand over
            background = self.engine.stop_background() if self.engine is not None else []
            freed = disk.remove_own(self.engine.disk if self.engine is not None else None)
            log.info("stopped while starting%s; temporary files removed (%.1f MB)",
                     f", mid-way: {', '.join(background)}" if background else "", freed / disk.MB)
            _exit_clean()


def shut_down(demo: gr.Blocks, store: SessionStore, gradio_temp: str | None = None,
              engine: Engine | None = None) -> None:
    """Stop every run after its current step (its visitor is told why) and every index build at its
    next batch, wait for their handlers to send that (bounded), delete every session's downloads
    and exports and this process's temporary cache entries (an ONNX export cut short), close the
    server and exit 0: the interpreter's own exit would wait for background threads (an export) and
    abort in their C++ code. If closing hangs on a connection, the process still exits within
    `EXIT_WITHIN_S`."""
    started = time.monotonic()
    watchdog = threading.Timer(EXIT_WITHIN_S - 1, _exit_now, args=(started,))
    watchdog.daemon = True
    watchdog.start()
    background = engine.stop_background() if engine is not None else []
    running = store.runs.stop_all("shutdown")
    ended = store.runs.wait_idle(RUNS_STOP_WITHIN_S)
    _wait_for_handlers(demo, RUNS_STOP_WITHIN_S - (time.monotonic() - started))
    store.close()
    if gradio_temp:  # Gradio's copies of the downloads (atexit would too, unless the watchdog fires)
        shutil.rmtree(gradio_temp, ignore_errors=True)
    freed = disk.remove_own(engine.disk if engine is not None else None)
    if background:
        log.info("stopped mid-way: %s (%.1f MB of temporary files removed)", ", ".join(background), freed / disk.MB)
    log.info("stopped %d run(s) after their current step%s; temp files removed in %.1f s", running,
             "" if ended else " (some did not end in time)", time.monotonic() - started)
    demo.close(verbose=False)
    watchdog.cancel()
    _exit_clean()


def _exit_clean() -> None:
    """Exit 0 now, the log flushed (see `shut_down`)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _wait_for_handlers(demo: gr.Blocks, seconds: float) -> None:
    """Until Gradio's queue runs no event (a stopped run's handler sends its last message), at most
    `seconds`. Reads the queue's job list: Gradio has no public "idle" call."""
    deadline = time.monotonic() + max(0.0, seconds)
    jobs = getattr(getattr(demo, "_queue", None), "active_jobs", None)
    while jobs is not None and any(jobs) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)  # the last message's bytes, written after the job leaves the list


def _exit_now(started: float) -> None:
    log.warning("still closing %.0f s after the signal: exiting now", time.monotonic() - started)
    _exit_clean()


def health_check(store: SessionStore | None, settings: Settings, disk: DiskCache | None = None) -> dict:
    """The FastAPI arguments that add `/healthz` (and, for a replica, the page's 503)."""
    if store is None:
        return {}
    return {"middleware": [Middleware(Health, store=store, replica=settings.replica, disk=disk)]}


def use_own_gradio_temp_dir() -> str | None:
    """Gradio serves files (downloads) from its temp folder, by default one shared by every Gradio
    app of the machine: give this app its own, removed at exit, unless GRADIO_TEMP_DIR is set.
    Returns the folder made, if one was."""
    if os.environ.get("GRADIO_TEMP_DIR"):
        return None
    folder = str(disk.process_temp("gradio"))  # named after the process: a start after a kill removes it
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    os.environ["GRADIO_TEMP_DIR"] = folder
    return folder


def run_history() -> bool | None:
    """Gradio's run history, off unless GRADIO_RUN_HISTORY asks for it (None: Gradio reads that
    itself). On, the page keeps every event's inputs and outputs in the visitor's localStorage (up
    to 100 events: their sentences, a feature map's 260 kB each) and reads and writes the whole of
    it again several times per event: after ten maps 2.8 MB a time, and a map drawn in chromium took
    1.65 s against 1.09 s without it (medians of 9, interleaved, at a load of 5.7)."""
    return None if os.environ.get("GRADIO_RUN_HISTORY") else False


def serve(demo: gr.Blocks, settings: Settings, block: bool = True,
          store: SessionStore | None = None, disk: DiskCache | None = None) -> tuple[str, str | None]:
    """Launch; returns (local URL, public share URL or None). If the share link can't be made
    (no internet, share server down) the demo keeps serving locally and says so in one line.
    With `store`, `/healthz` says whether its model loaded (bertdemo/ui/serving/health.py)."""
    share = settings.share and not os.environ.get("SPACE_ID")  # a Space is already public
    gradio_says = io.StringIO()
    try:  # Gradio's own share-failure text is several lines and, offline, points at the wrong cause
        with contextlib.redirect_stdout(gradio_says):
            _, local_url, share_url = demo.launch(
                server_name=settings.host, server_port=settings.port, share=share,
                auth=parse_auth(settings.auth), auth_message="Log in to use this bertdemo.",
                max_file_size=MAX_UPLOAD, state_session_capacity=settings.max_sessions,
                mcp_server=settings.mcp, prevent_thread_lock=True, quiet=True, **page_look(),
                run_history=run_history(),
                app_kwargs=health_check(store, settings, disk))
    except BaseException:
        sys.stdout.write(gradio_says.getvalue())
        raise
    sent_values.forget_sent_values(demo)
    print(f"* Running on local URL: {local_url}", flush=True)
    if settings.mcp:
        tools = mcp_tools.keep_tools(demo)
        print(f"* MCP server (streamable HTTP): {mcp_tools.mcp_url(local_url)} with tools "
              f"{', '.join(tools)}", flush=True)
    if share_url:
        print(f"* Public share link: {share_url} — anyone with this link can use the demo"
              + ("" if settings.auth else " (add --auth USER:PASSWORD for a login)"), flush=True)
    elif share:
        print(f"* No share link: Gradio's share server could not be reached; serving locally only "
              f"at {local_url}", flush=True)
    if block:
        demo.block_thread()
    return local_url, share_url
