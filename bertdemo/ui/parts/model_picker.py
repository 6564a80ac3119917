"""The model picker above the tabs: a visitor picks the base model of their own browser session
among those the operator offers (`--models`); nothing else can be loaded from the page. Under it,
the one line saying how every tab counts layers."""
import logging

import gradio as gr

from ...config import Settings
from ...model.loading import LoadedModel, allowed_choices, allowed_entry, family_hint
from .common import LAYERS_LINE
from .context import AppContext, Visitor, handler, standalone_demo
from .model_line import model_card, model_line

log = logging.getLogger("bertdemo")


def render(ctx: AppContext) -> None:
    """The picker, inside the current Blocks context."""
    offered = allowed_choices(ctx.settings.allowed_models)
    names = list(offered)
    # each shown with its family where its folder says it; the value stays the name
    labelled = [(f"{name} · {family_hint(entry)}" if family_hint(entry) else name, name)
                for name, entry in offered.items()]
    offers = (f"This server offers {len(names)} models; your choice applies to your browser "
              "session only." if len(names) > 1 else "This server offers this model only.")
    with gr.Row():
        picker = gr.Dropdown(labelled, value=names[0], label="Model", info=offers,
                             interactive=len(names) > 1, scale=2)
        note = gr.Markdown(scale=3)
    with gr.Accordion("Model card: size, precision, what the checkpoint lacked", open=False):
        card = gr.Markdown(model_card(ctx.store, features=ctx.features))
    gr.Markdown(LAYERS_LINE, elem_id="layers-line")  # said once, for every tab
    # One load at a time: a model the operator listed can be large, and loading it once is enough.
    picker.input(handler(ctx, on_pick), picker, note, api_name="choose_model", concurrency_id="load_model",
                 concurrency_limit=1).then(handler(ctx, on_card), None, card, api_visibility="private",
                                           queue=False)


def on_card(visitor: Visitor) -> str:
    """The model card of the model this session's tabs use."""
    return model_card(visitor.store, visitor.session, visitor.features)


def create_demo(store=None, settings: Settings | None = None) -> gr.Blocks:
    """The picker on its own, for running or testing it alone."""
    return standalone_demo("model picker", render, store, settings)


def on_pick(visitor: Visitor, model) -> str:
    """Make `model` (a name the picker offers) this session's base model; returns the line saying
    what the tabs use now."""
    visitor.store.choose_base(visitor.session, pick(visitor, model))
    return model_line(visitor.store, visitor.session, place="picker")


def pick(visitor: Visitor, choice) -> LoadedModel:
    """The model `choice` names, if the operator offers it. The app's own model is the store's
    (so its load error is reported, not retried on every visitor's pick)."""
    settings = visitor.settings
    if allowed_entry(choice, settings.allowed_models) == settings.model:
        return visitor.store.require_base()
    try:
        return visitor.engine.load_allowed(choice, settings.allowed_models, settings.device,
                                           settings.allow_pickle, settings.dtype)
    except ValueError as err:
        log.warning("a visitor picked %r: %s", choice, err)  # the log keeps the full paths
        raise
