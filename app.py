"""bertdemo's web app: parse flags/env, build the demo from the tabs, launch."""
from __future__ import annotations

import argparse
import logging

import gradio as gr

import bertdemo
from bertdemo.config import Settings
from bertdemo.sessions import ModelStore
from bertdemo.ui import about_tab, attention_tab, fillmask_tab, finetune_tab, masking_tab

log = logging.getLogger("bertdemo")


def parse_args(argv: list[str] | None = None) -> Settings:
    """Flags override env vars (BERTDEMO_MODEL, ...), which override the defaults."""
    env = Settings.from_env()
    parser = argparse.ArgumentParser(description="BERT masked-language-modelling demo")
    parser.add_argument("--model", default=env.model,
                        help="hub id or local folder (env BERTDEMO_MODEL; default %(default)s)")
    parser.add_argument("--device", default=env.device,
                        help="cpu, cuda or cuda:N (env BERTDEMO_DEVICE; default: CUDA when present)")
    parser.add_argument("--host", default=env.host, help="address to serve on (env BERTDEMO_HOST)")
    parser.add_argument("--port", type=int, default=env.port, help="port (env BERTDEMO_PORT)")
    parser.add_argument("--max-masks", type=int, default=env.max_masks,
                        help="most [MASK]s per sentence (env BERTDEMO_MAX_MASKS)")
    parser.add_argument("--allow-pickle", action="store_true", default=env.allow_pickle,
                        help="accept checkpoints without safetensors (env BERTDEMO_ALLOW_PICKLE)")
    args = parser.parse_args(argv)
    return Settings(model=args.model, device=args.device, host=args.host, port=args.port,
                    max_masks=args.max_masks, allow_pickle=args.allow_pickle)


def load_store(settings: Settings) -> ModelStore:
    """Load the base model; if that fails the app still starts and says why in the page."""
    try:
        base = bertdemo.load(settings.model, settings.device, allow_pickle=settings.allow_pickle)
    except ValueError as err:
        log.error("%s", err)
        return ModelStore(None, load_error=str(err))
    return ModelStore(base)


def build_demo(settings: Settings, store: ModelStore | None = None) -> gr.Blocks:
    """Compose the tabs into one Blocks app called `demo`."""
    store = store or load_store(settings)
    with gr.Blocks(title="bertdemo: BERT masked-language modelling") as demo:
        gr.Markdown("# bertdemo — see how BERT fills in `[MASK]`")
        with gr.Tab("Fill mask"):
            fillmask_tab.render(store, settings)
        with gr.Tab("Attention"):
            attention_tab.render(store, settings)
        with gr.Tab("Mask sampling"):
            masking_tab.render(store, settings)
        with gr.Tab("Fine-tune"):
            finetune_tab.render(store, settings)
        with gr.Tab("About"):
            about_tab.render(store, settings)

        def forget_session(request: gr.Request):
            store.drop(request.session_hash)

        demo.unload(forget_session)
    demo.queue(max_size=64, default_concurrency_limit=4)
    return demo


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO)
    settings = parse_args(argv)
    demo = build_demo(settings)
    demo.launch(server_name=settings.host, server_port=settings.port)


if __name__ == "__main__":
    main()
