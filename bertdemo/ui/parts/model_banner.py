"""The banner above the tabs when the app does not serve BERT as it was asked to: no model could be
loaded (why, how to fix it, and one button that loads the bundled model for everyone), the bundled
model is served instead of a default that could not be reached (why, and what that model is), or
the bundled model is served (`--model bundled`, or the button): one line saying it is small, its
guesses rough, and how to serve BERT itself. Visitors never choose a path: the button loads only
the model shipped with bertdemo."""
from __future__ import annotations

import html

import gradio as gr

from ...config import DEFAULT_MODEL, Settings
from ...model import bundled
from .context import AppContext, Visitor, handler
from .model_line import details, model_line

BUNDLED_BUTTON = "Use the bundled model (MiniLM-L6 with an MLM head trained offline)"


def how_to_fix(settings: Settings) -> str:
    """The rest of the 'no model' message every tab shows: how to get a model from here."""
    hint = (f" To make such a folder where there is internet: `python -m bertdemo download "
            f"{settings.model} --dir models/model`, then `python app.py --model models/model`.")
    if bundled.available():
        hint += f" Or press “{BUNDLED_BUTTON}” at the top of this page (or start with `--model bundled`)."
    return hint


def fallback_notice(wanted: str, error: Exception | str) -> str:
    """The banner when the bundled model is served because `wanted` could not be loaded: two
    lines (what is served and why; how to serve another), then the whole error and what the
    bundled model is in a closed <details> (Markdown keeps one component, so `/use_bundled`
    still returns one value)."""
    served = f"**Serving the bundled model**, not {wanted}: {bundled.fallback_reason(wanted, error)}."
    change = ("It is small and trained offline, so its guesses are rough; to serve another model, start "
              "the app with `--model` and a hub id or a local folder.")
    cause = (f"<p><b>{html.escape(wanted, quote=False)} could not be loaded:</b> "
             f"{html.escape(_one_line(error), quote=False)}</p>")  # HTML: the error's text stays as it is
    return f"{served}  \n{change}\n\n" + details("Why, and what the bundled model is", cause,
                                                  bundled.describe(bundled.read_report()))


def bundled_note() -> str:
    """The one line above the tabs while the app serves the bundled model: what it is and how to
    serve BERT itself; what it is in full in a closed <details>."""
    line = (f"**Serving the bundled model**: small and trained offline, so its guesses are rough. To serve "
            f"BERT itself, start the app with `--model {DEFAULT_MODEL}`.")
    offline = (f"BERT is downloaded once; for a machine offline, run `python -m bertdemo download {DEFAULT_MODEL} "
               "--dir models/bert` where there is internet, then start with `--model models/bert`.")
    return line + "\n\n" + details("What the bundled model is, and BERT offline",
                                    bundled.describe(bundled.read_report()), offline)


def shown(store) -> bool:
    """Whether the page needs the banner: no model, the bundled one served in another's place, or
    the bundled one served at all."""
    return store.base is None or store.notice is not None or _serves_bundled(store)


def _serves_bundled(store) -> bool:
    return store.base is not None and store.base.name == bundled.BUNDLED


def render(ctx: AppContext, demo: gr.Blocks) -> None:
    """The banner and its button, inside the current Blocks context."""
    banner = gr.Markdown(_text(ctx.store), elem_id="model-banner")
    button = gr.Button(BUNDLED_BUTTON, visible=_offer_bundled(ctx.store))
    button.click(handler(ctx, on_use_bundled), None, [banner, button], api_name="use_bundled",
                 concurrency_id="model")
    demo.load(handler(ctx, on_page_load), None, [banner, button], api_visibility="private", queue=False)


def on_use_bundled(visitor: Visitor):
    """Load the bundled model as the app's model (for everyone); a second click keeps the first."""
    store = visitor.store
    if store.base is None:
        store.base, store.load_error = visitor.engine.load_bundled(visitor.settings.device), None
    return on_page_load(visitor)


def on_page_load(visitor: Visitor):
    """The banner as it is now: someone else may have loaded the bundled model since the page was built."""
    return _text(visitor.store), gr.update(visible=_offer_bundled(visitor.store))


def _text(store) -> str:
    if store.notice:
        return store.notice
    return bundled_note() if _serves_bundled(store) else model_line(store, place="banner")


def _offer_bundled(store) -> bool:
    return store.base is None and bundled.available()


def _one_line(error: Exception | str) -> str:
    return " ".join(str(error).split()) or type(error).__name__
