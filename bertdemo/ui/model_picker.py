"""The model picker above the tabs: a visitor picks the base model of their own browser session
among those the operator offers (`--models`); nothing else can be loaded from the page."""
import logging

import gradio as gr

from ..config import Settings
from ..models import LoadedModel, allowed_choices, allowed_entry, load_allowed
from ..sessions import SessionStore
from .common import friendly_errors, session_id

log = logging.getLogger("bertdemo")


def render(store: SessionStore, settings: Settings) -> None:
    """Build the picker inside the current Blocks context."""
    names = list(allowed_choices(settings.allowed_models))
    offers = (f"This server offers {len(names)} models; your choice applies to your browser "
              "session only." if len(names) > 1 else "This server offers this model only.")
    with gr.Row():
        picker = gr.Dropdown(names, value=names[0], label="Model", info=offers,
                             interactive=len(names) > 1, scale=2)
        note = gr.Markdown(scale=3)

    @friendly_errors
    def on_pick(choice, request: gr.Request):
        sid = session_id(request)
        store.choose_base(sid, pick(store, settings, choice))
        return active_note(store, sid)

    # One load at a time: a model the operator listed can be large, and loading it once is enough.
    picker.input(on_pick, picker, note, api_name="choose_model", concurrency_id="load_model",
                 concurrency_limit=1)


def create_demo(store: SessionStore, settings: Settings) -> gr.Blocks:
    """The picker on its own, for running or testing it alone."""
    with gr.Blocks(title="bertdemo: model picker") as demo:
        render(store, settings)
    return demo


def pick(store: SessionStore, settings: Settings, choice) -> LoadedModel:
    """The model `choice` names, if the operator offers it. The app's own model is the store's
    (so its load error is reported, not retried on every visitor's pick)."""
    if allowed_entry(choice, settings.allowed_models) == settings.model:
        return store.require_base()
    try:
        return load_allowed(choice, settings.allowed_models, settings.device, settings.allow_pickle)
    except ValueError as err:
        log.warning("a visitor picked %r: %s", choice, err)  # the log keeps the full paths
        raise


def active_note(store: SessionStore, sid: str | None) -> str:
    base = store.base_for(sid)
    if store.using_tuned(sid):
        return (f"Your tuned model stays in use in every tab until you press “Back to the base "
                f"model” in the Fine-tune tab; then they use **{base.name}**.")
    return f"Your tabs use **{base.name}** (in your browser session only)."
