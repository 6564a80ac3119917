"""bertdemo's web app: parse flags/env, build the demo from the tabs, launch."""
from __future__ import annotations

if __name__ == "__main__":  # first of all, before torch: OpenMP's spin, jemalloc, the collector (bertdemo/memory.py)
    import sys as _sys

    from bertdemo import memory as _memory  # the package loads its modules lazily: this loads no torch
    from bertdemo.serving import compute as _compute  # nor this

    _compute.short_openmp_spin()  # read by torch's OpenMP when torch loads, here or after the re-exec
    _memory.exec_with_jemalloc(_sys.argv)
    _memory.hold_gc()  # till the app is built (main: freeze_started)

import dataclasses
import logging
import os

import gradio as gr

from bertdemo import memory
from bertdemo.config import DEFAULT_MODEL, Settings
from bertdemo.disk import DiskCache
from bertdemo.features.store import shared_store
from bertdemo.model import bundled
from bertdemo.serving.engine import Engine
from bertdemo.sessions import SessionStore
from bertdemo.ui.parts import model_banner, model_picker, preload
from bertdemo.ui.parts.common import hide_paths, refuse_non_finite_numbers
from bertdemo.ui.parts.context import AppContext, forget_session, handler
from bertdemo.ui.parts.links import Links, slug
from bertdemo.ui.serving import queue_watch
from bertdemo.ui.serving.lifecycle import Signals, app_made_at_launch, serve, shut_down, use_own_gradio_temp_dir
from bertdemo.ui.tabs import (about_tab, attention_tab, circuits_tab, classify_tab, embeddings_tab, explain_tab,
                              features_tab, fillmask_tab, finetune_tab, masking_tab, search_tab)

log = logging.getLogger("bertdemo")


TABS = [("Fill mask", fillmask_tab), ("Attention", attention_tab), ("Inside a prediction", explain_tab),
        ("Embeddings", embeddings_tab), ("Corpus search", search_tab), ("Features", features_tab),
        ("Circuits", circuits_tab), ("Mask sampling", masking_tab), ("Fine-tune", finetune_tab),
        ("Classify", classify_tab), ("About", about_tab)]


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
    features = features if features is not None else shared_store(engine.caches)  # the engine's
    ctx = AppContext(store, served_settings(settings, store), engine, features=features)
    age = settings.download_max_age  # Gradio's copies of downloads: checked every minute or so
    with app_made_at_launch():  # its FastAPI app made once, by launch (bertdemo/ui/serving/lifecycle.py)
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
            preload.render(demo)  # the chart code fetched while the visitor reads (bertdemo/ui/parts/preload.py)
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
    memory.freeze_started()  # what the start made, out of the collector's way (bertdemo/memory.py)
    serve(demo, settings, block=False, store=store, disk=engine.disk)
    signals.serving = True
    while not signals.stopping.wait(0.5):
        pass
    shut_down(demo, store, own_temp, engine)


if __name__ == "__main__":
    main()
