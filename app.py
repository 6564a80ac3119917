"""bertdemo's web app: parse flags/env, build the demo from the tabs, launch."""
from __future__ import annotations

if __name__ == "__main__":  # first of all, before torch: OpenMP's spin, then jemalloc (bertdemo/memory.py)
    import sys as _sys

    from bertdemo import memory as _memory  # the package loads its modules lazily: this loads no torch
    from bertdemo.serving import compute as _compute  # nor this

    _compute.short_openmp_spin()  # read by torch's OpenMP when torch loads, here or after the re-exec
    _memory.exec_with_jemalloc(_sys.argv)

import atexit
import contextlib
import dataclasses
import io
import logging
import os
import shutil
import signal
import sys
import threading
import time

import gradio as gr
from starlette.middleware import Middleware

from bertdemo import disk, memory
from bertdemo.config import DEFAULT_MODEL, Settings, parse_auth
from bertdemo.disk import DiskCache
from bertdemo.features.run import app_store
from bertdemo.model import bundled
from bertdemo.serving.engine import Engine
from bertdemo.sessions import SessionStore
from bertdemo.ui import (about_tab, attention_tab, classify_tab, embeddings_tab, explain_tab, features_tab,
                         fillmask_tab, finetune_tab, masking_tab, mcp_tools, model_banner, model_picker,
                         preload, queue_watch, search_tab, sent_values)
from bertdemo.ui.common import hide_paths, refuse_non_finite_numbers
from bertdemo.ui.context import AppContext, forget_session, handler
from bertdemo.ui.health import Health
from bertdemo.ui.links import Links, slug

log = logging.getLogger("bertdemo")
MAX_UPLOAD = "1mb"  # only the Classify tab's CSV upload takes files (it reads far less); cap the route
EXIT_WITHIN_S = 10.0  # SIGTERM to exit: Docker's `stop` kills after 10 s
RUNS_STOP_WITHIN_S = 6.0  # of which the running runs get this long to end their current step


TABS = [("Fill mask", fillmask_tab), ("Attention", attention_tab), ("Inside a prediction", explain_tab),
        ("Embeddings", embeddings_tab), ("Corpus search", search_tab), ("Features", features_tab),
        ("Mask sampling", masking_tab), ("Fine-tune", finetune_tab), ("Classify", classify_tab),
        ("About", about_tab)]


def parse_args(argv: list[str] | None = None) -> Settings:
    """Flags override env vars (BERTDEMO_MODEL, ...), which override the defaults; every flag
    comes from a `Settings` field (`python app.py --help` lists them)."""
    return Settings.from_flags(argv)


def make_engine(settings: Settings) -> Engine:
    """The engine, with the disk caches in the operator's folder and budget (--cache-dir, --cache-mb)."""
    return Engine(max_batch=settings.max_batch, onnx=settings.onnx,
                  disk=DiskCache(settings.cache_dir, settings.cache_mb))


def load_store(settings: Settings, engine: Engine) -> SessionStore:
    """Load the base model. If the default hub model cannot be had (no internet, hub down) the app
    serves the bundled model instead and says why; if any other model fails the app still starts
    and says why in the page (where a folder is named by its own name only: the log has the path)."""
    limits = dict(max_tuned=settings.finetune_max_models,
                  max_download_bytes=settings.download_max_mb * 2**20)
    try:
        base = engine.load_allowed(settings.model, settings.allowed_models, settings.device,
                                   allow_pickle=settings.allow_pickle, dtype=settings.dtype)
    except ValueError as err:
        if settings.model == DEFAULT_MODEL and bundled.available():  # expected offline: say what and why
            log.warning("Serving the bundled model (MiniLM-L6 with an MLM head trained offline) instead of "
                        "%s: %s. Start with --model HUB_ID_OR_FOLDER to serve another.", settings.model,
                        bundled.fallback_reason(settings.model, err, cause=True))
            notice = hide_paths(model_banner.fallback_notice(settings.model, err))
            return SessionStore(engine.load_bundled(settings.device), notice=notice, **limits)
        log.error("%s", err)
        return SessionStore(None, load_error=hide_paths(str(err) + model_banner.how_to_fix(settings)),
                            **limits)
    return SessionStore(base, **limits)


def served_settings(settings: Settings, store: SessionStore) -> Settings:
    """The settings as the page serves them: after falling back to the bundled model, that is
    the model the picker offers first, in the place of the one that failed."""
    if store.notice is not None and store.base is not None and store.base.name == bundled.BUNDLED:
        return dataclasses.replace(settings, model=bundled.BUNDLED)
    return settings


def build_demo(settings: Settings, store: SessionStore | None = None,
               engine: Engine | None = None, features=None) -> gr.Blocks:
    """Compose the tabs into one Blocks app called `demo`. The engine holds every model served and
    what their requests share; `store`, what each visitor holds; `features`, the feature
    dictionaries offered (a `FeatureStore`; all three made here when not given)."""
    engine = engine or make_engine(settings)
    store = store or load_store(settings, engine)
    features = features if features is not None else app_store(engine.disk)
    ctx = AppContext(store, served_settings(settings, store), engine, features=features)
    age = settings.download_max_age  # Gradio's copies of downloads: checked every minute or so
    with gr.Blocks(title="bertdemo: BERT masked-language modelling",
                   delete_cache=(max(1, min(60, age)), age)) as demo:
        gr.Markdown("# bertdemo — see how BERT fills in `[MASK]`")
        if model_banner.shown(ctx.store):
            model_banner.render(ctx, demo)
        model_picker.render(ctx)
        links = Links(ctx)
        with gr.Tabs() as tabs:
            for title, tab in TABS:
                with gr.Tab(title, id=slug(title)):
                    tab.render(ctx)
                    links.button(slug(title))
        links.wire(demo, tabs)  # /?tab=...&...: a link to any view
        preload.render(demo)  # the chart code fetched while the visitor reads (bertdemo/ui/preload.py)
        demo.unload(handler(ctx, forget_session))
    refuse_non_finite_numbers(demo)
    # After every event Gradio's queue rebuilds a pandas summary of its last 10,000 events, for a
    # monitoring dashboard this app does not open: 2 ms of CPU per request at first, 13 ms once a
    # Space has served 10,000 events. Once per 100 events instead (read when the queue is made).
    os.environ.setdefault("GRADIO_ANALYTICS_CACHE_FREQUENCY", "100")
    demo.queue(max_size=settings.queue_size, default_concurrency_limit=4)
    queue_watch.keep_live_sessions(demo)  # a script's session is not forgotten while its run goes on
    return demo


def configure_logging() -> None:
    """bertdemo's own lines from INFO (what is served, the allocator, refused input), every other
    library's from WARNING: their INFO lines (Gradio's startup requests, ONNX Runtime's fusions)
    and transformers' weight-loading bars say nothing an operator acts on (the hub's download
    bars stay: a first start may fetch hundreds of MB)."""
    from huggingface_hub.utils import enable_progress_bars
    from transformers.utils import logging as transformers_logging

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s:%(name)s:%(message)s")
    logging.getLogger("bertdemo").setLevel(logging.INFO)
    transformers_logging.disable_progress_bar()  # also the hub's, which come back below
    enable_progress_bars()


def main(argv: list[str] | None = None) -> None:
    configure_logging()
    arenas = memory.cap_arenas()  # before any thread starts: see bertdemo/memory.py
    settings = parse_args(argv)
    log.info("malloc: %s", "jemalloc" if memory.allocator() == "jemalloc"
             else f"glibc, arenas {arenas or 'by default'} (apt-get install libjemalloc2 to level memory)")
    own_temp = use_own_gradio_temp_dir()
    # gradio_client gives up a session's heartbeat stream after 20 s without a byte, and the server
    # then takes the page as closed (its run stopped, its models freed): Gradio's default beat of
    # 15 s leaves 5 s for a busy server to be late; 5 s leaves 15.
    os.environ.setdefault("GRADIO_HEARTBEAT_INTERVAL", "5")
    # A --allow-pickle model from a hub repo with only *.bin weights: transformers would start a
    # thread asking a conversion Space (safetensors-convert.hf.space) to open a pull request on that
    # repo. Never from this server; from_pretrained has no argument for it, so it is set here, for
    # this process (bertdemo.load itself refuses such a repo without --allow-pickle, per call).
    os.environ.setdefault("DISABLE_SAFETENSORS_CONVERSION", "1")
    signals = Signals()  # before the model loads: a SIGTERM then still exits cleanly
    engine = make_engine(settings)
    signals.engine = engine
    store = load_store(settings, engine)
    if store.base is not None and settings.index_at_start:
        engine.build_default_index(store.base)  # in the background: the first search answers at once
    store.start_sweeper()  # the age policy: idle sessions freed every minute (store.close stops it)
    demo = build_demo(settings, store, engine)
    serve(demo, settings, block=False, store=store, disk=engine.disk)
    signals.serving = True
    while not signals.stopping.wait(0.5):
        pass
    shut_down(demo, store, own_temp, engine)


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


def serve(demo: gr.Blocks, settings: Settings, block: bool = True,
          store: SessionStore | None = None, disk: DiskCache | None = None) -> tuple[str, str | None]:
    """Launch; returns (local URL, public share URL or None). If the share link can't be made
    (no internet, share server down) the demo keeps serving locally and says so in one line.
    With `store`, `/healthz` says whether its model loaded (bertdemo/ui/health.py)."""
    share = settings.share and not os.environ.get("SPACE_ID")  # a Space is already public
    gradio_says = io.StringIO()
    try:  # Gradio's own share-failure text is several lines and, offline, points at the wrong cause
        with contextlib.redirect_stdout(gradio_says):
            _, local_url, share_url = demo.launch(
                server_name=settings.host, server_port=settings.port, share=share,
                auth=parse_auth(settings.auth), auth_message="Log in to use this bertdemo.",
                max_file_size=MAX_UPLOAD, state_session_capacity=settings.max_sessions,
                mcp_server=settings.mcp, prevent_thread_lock=True, quiet=True,
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


if __name__ == "__main__":
    main()
