"""What a tab's handlers get: the app (session store, settings, engine) and the visitor of one request.

A handler is a module-level function `on_x(visitor, *inputs)` taking plain values and returning
plain values or figures, so a test calls it with `Visitor(store, settings, "some-session")`
(with an engine of its own, unless it passes one).
`handler(ctx, on_x)` turns it into the function Gradio wires: same public parameter names (they
are the API's), the request read for the session id, service errors turned into messages.
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

import gradio as gr

from ..config import Settings
from ..engine import Engine
from ..models import LoadedModel
from ..sessions import SessionStore
from .common import friendly_errors, session_id


@dataclass(frozen=True)
class AppContext:
    """Everything the tabs share: the session store (what each visitor holds), the operator's
    settings, and the engine (the models served and their caches, the micro-batcher)."""

    store: SessionStore
    settings: Settings
    engine: Engine = None  # None: one of its own, sized by the settings

    def __post_init__(self):
        if self.engine is None:
            object.__setattr__(self, "engine", Engine(max_batch=self.settings.max_batch))

    def visitor(self, request: gr.Request | None) -> "Visitor":
        return Visitor(self.store, self.settings, session_id(request), self.engine)


@dataclass(frozen=True)
class Visitor:
    """One browser session as a handler sees it."""

    store: SessionStore
    settings: Settings
    session: str | None
    engine: Engine = None  # None: one of its own (a test's), sized by the settings

    def __post_init__(self):
        if self.engine is None:
            object.__setattr__(self, "engine", Engine(max_batch=self.settings.max_batch))

    @property
    def lm(self) -> LoadedModel:
        """The model this session uses now (its tuned model, its pick, or the app's)."""
        return self.store.for_session(self.session)


def handler(ctx: AppContext, fn):
    """The Gradio event function for `fn(visitor, *inputs, [progress=gr.Progress()])`.

    Gradio finds `request` by its annotation and `progress` by its default, and names the API's
    parameters after the signature: the wrapper shows `fn`'s parameters without `visitor`, plus
    `request`. Works for plain and generator handlers alike.
    """
    params = list(inspect.signature(fn).parameters.values())[1:]
    request = inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=gr.Request)
    split = next((i for i, p in enumerate(params) if isinstance(p.default, gr.Progress)), len(params))
    signature = inspect.Signature([*params[:split], request, *params[split:]])

    def call(args, kwargs):
        bound = signature.bind(*args, **kwargs)
        visitor = ctx.visitor(bound.arguments.pop("request", None))
        return fn(visitor, **bound.arguments)

    if inspect.isgeneratorfunction(fn):
        def wired(*args, **kwargs):
            yield from call(args, kwargs)
    else:
        def wired(*args, **kwargs):
            return call(args, kwargs)
    functools.update_wrapper(wired, fn)
    del wired.__wrapped__  # Gradio must see the signature below, not fn's
    wired.__signature__ = signature
    wired.__annotations__ = {"request": gr.Request}  # the one hint Gradio needs; others may be strings
    return friendly_errors(wired)
