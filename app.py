"""bertdemo's web app: parse flags/env, build the demo from the tabs, launch."""
from __future__ import annotations

import atexit
import contextlib
import dataclasses
import io
import logging
import os
import shutil
import sys
import tempfile

import gradio as gr

from bertdemo import bundled
from bertdemo.config import DEFAULT_MODEL, Settings, parse_auth
from bertdemo.engine import Engine
from bertdemo.sessions import SessionStore
from bertdemo.ui import (about_tab, attention_tab, classify_tab, embeddings_tab, explain_tab, fillmask_tab,
                         finetune_tab, masking_tab, mcp_tools, model_banner, model_picker, sent_values)
from bertdemo.ui.common import hide_paths, refuse_non_finite_numbers
from bertdemo.ui.context import AppContext, forget_session, handler

log = logging.getLogger("bertdemo")
MAX_UPLOAD = "1mb"  # only the Classify tab's CSV upload takes files (it reads far less); cap the route


def parse_args(argv: list[str] | None = None) -> Settings:
    """Flags override env vars (BERTDEMO_MODEL, ...), which override the defaults; every flag
    comes from a `Settings` field (`python app.py --help` lists them)."""
    return Settings.from_flags(argv)


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
        log.error("%s", err)
        if settings.model == DEFAULT_MODEL and bundled.available():
            log.warning("serving the bundled model instead of %s", settings.model)
            notice = hide_paths(bundled.fallback_notice(settings.model, err))
            return SessionStore(engine.load_bundled(settings.device), notice=notice, **limits)
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
               engine: Engine | None = None) -> gr.Blocks:
    """Compose the tabs into one Blocks app called `demo`. The engine holds every model served and
    what their requests share; `store`, what each visitor holds (both made here when not given)."""
    engine = engine or Engine(max_batch=settings.max_batch)
    store = store or load_store(settings, engine)
    ctx = AppContext(store, served_settings(settings, store), engine)
    age = settings.download_max_age  # Gradio's copies of downloads: checked every minute or so
    with gr.Blocks(title="bertdemo: BERT masked-language modelling",
                   delete_cache=(max(1, min(60, age)), age)) as demo:
        gr.Markdown("# bertdemo — see how BERT fills in `[MASK]`")
        if model_banner.shown(ctx.store):
            model_banner.render(ctx, demo)
        model_picker.render(ctx)
        with gr.Tab("Fill mask"):
            fillmask_tab.render(ctx)
        with gr.Tab("Attention"):
            attention_tab.render(ctx)
        with gr.Tab("Inside a prediction"):
            explain_tab.render(ctx)
        with gr.Tab("Embeddings"):
            embeddings_tab.render(ctx)
        with gr.Tab("Mask sampling"):
            masking_tab.render(ctx)
        with gr.Tab("Fine-tune"):
            finetune_tab.render(ctx)
        with gr.Tab("Classify"):
            classify_tab.render(ctx)
        with gr.Tab("About"):
            about_tab.render(ctx)
        demo.unload(handler(ctx, forget_session))
    refuse_non_finite_numbers(demo)
    # After every event Gradio's queue rebuilds a pandas summary of its last 10,000 events, for a
    # monitoring dashboard this app does not open: 2 ms of CPU per request at first, 13 ms once a
    # Space has served 10,000 events. Once per 100 events instead (read when the queue is made).
    os.environ.setdefault("GRADIO_ANALYTICS_CACHE_FREQUENCY", "100")
    demo.queue(max_size=settings.queue_size, default_concurrency_limit=4)
    return demo


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # Gradio's own startup requests: noise
    settings = parse_args(argv)
    use_own_gradio_temp_dir()
    demo = build_demo(settings)
    serve(demo, settings)


def use_own_gradio_temp_dir() -> None:
    """Gradio serves files (downloads) from its temp folder, by default one shared by every Gradio
    app of the machine: give this app its own, removed at exit, unless GRADIO_TEMP_DIR is set."""
    if not os.environ.get("GRADIO_TEMP_DIR"):
        folder = tempfile.mkdtemp(prefix="bertdemo-gradio-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        os.environ["GRADIO_TEMP_DIR"] = folder


def serve(demo: gr.Blocks, settings: Settings, block: bool = True) -> tuple[str, str | None]:
    """Launch; returns (local URL, public share URL or None). If the share link can't be made
    (no internet, share server down) the demo keeps serving locally and says so in one line."""
    share = settings.share and not os.environ.get("SPACE_ID")  # a Space is already public
    gradio_says = io.StringIO()
    try:  # Gradio's own share-failure text is several lines and, offline, points at the wrong cause
        with contextlib.redirect_stdout(gradio_says):
            _, local_url, share_url = demo.launch(
                server_name=settings.host, server_port=settings.port, share=share,
                auth=parse_auth(settings.auth), auth_message="Log in to use this bertdemo.",
                max_file_size=MAX_UPLOAD, state_session_capacity=settings.max_sessions,
                mcp_server=settings.mcp, prevent_thread_lock=True, quiet=True)
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
