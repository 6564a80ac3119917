"""What a tab's handlers get: the app (session store, settings, engine) and the visitor of one request.

A handler is a module-level function `on_x(visitor, *inputs)` taking plain values and returning
plain values or figures, so a test calls it with `Visitor(store, settings, "some-session", Engine())`
(the engine is always passed: nothing here builds one behind the caller's back). An input may also
be a form: a parameter annotated with a dataclass (`form: FinetuneForm`) stands for its fields.
`handler(ctx, on_x)` turns it into the function Gradio wires: same public parameter names (they
are the API's; a form's are its fields'), the request read for the session id, service errors
turned into messages.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import gradio as gr

from ...config import Limits, Settings
from ...model.loading import LoadedModel
from ...serving.engine import Engine
from ...sessions import SessionStore
from .common import friendly_errors, session_id
from ..serving.queue_watch import QueueWatch, keep_live_sessions

if TYPE_CHECKING:  # the store's module loads sparsify: only the tabs that use it import it
    from ...features.store import FeatureStore


@dataclass(frozen=True)
class AppContext:
    """Everything the tabs share: the session store (what each visitor holds), the operator's
    settings, the engine (the models served and their caches, the micro-batcher), and the watch
    on the app's queue (for run slots whose request was cancelled)."""

    store: SessionStore
    settings: Settings
    engine: Engine  # built by whoever composes the app (app.py, `standalone_demo`, a test)
    queue: QueueWatch = field(default_factory=QueueWatch)
    features: "FeatureStore | None" = None  # the feature dictionaries offered (None: the engine's, `shared_store`)

    def visitor(self, request: gr.Request | None) -> "Visitor":
        return Visitor(self.store, self.settings, session_id(request), self.engine, self.queue, self.features)


@dataclass(frozen=True)
class Visitor:
    """One browser session as a handler sees it."""

    store: SessionStore
    settings: Settings
    session: str | None
    engine: Engine  # the app's (a test passes its own)
    queue: QueueWatch | None = None  # None: no queue to ask (a handler called directly)
    features: "FeatureStore | None" = None  # the app's feature dictionaries (None: the engine's, `shared_store`)

    @property
    def lm(self) -> LoadedModel:
        """The model this session uses now (its tuned model, its pick, or the app's)."""
        return self.store.for_session(self.session)

    @property
    def limits(self) -> Limits:
        """The caps on each run this visitor starts (a `runs` caller has them)."""
        return self.settings.limits

    def still_queued(self) -> bool:
        """Whether this visitor's run request is still in the app's queue (True when unknown)."""
        return self.queue is None or not self.session or self.queue.holds(self.session)


def handler(ctx: AppContext, fn):
    """The Gradio event function for `fn(visitor, *inputs, [progress=gr.Progress()])`.

    Gradio finds `request` and event data (`evt: gr.SelectData`, a click's cell) by their
    annotations and `progress` by its default, and names the API's parameters after the signature:
    the wrapper shows `fn`'s parameters without `visitor`, with each form parameter (annotated with
    a dataclass) replaced by the form's fields, plus `request`. Works for plain, generator and
    async handlers alike.
    """
    params, forms = _expand_forms(fn)
    events = {name: hint for name, hint in typing.get_type_hints(fn).items()
              if isinstance(hint, type) and issubclass(hint, gr.EventData)}
    request = inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=gr.Request)
    split = next((i for i, p in enumerate(params) if isinstance(p.default, gr.Progress)), len(params))
    signature = inspect.Signature([*params[:split], request, *params[split:]])

    def call(args, kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        values = dict(bound.arguments)
        visitor = ctx.visitor(values.pop("request", None))
        for name, form in forms.items():  # a form's fields back into the form
            values[name] = form(**{f.name: values.pop(f.name) for f in dataclasses.fields(form)})
        return fn(visitor, **values)

    if inspect.isgeneratorfunction(fn):
        def wired(*args, **kwargs):
            yield from call(args, kwargs)
    elif inspect.iscoroutinefunction(fn):  # run on the server's event loop, no worker thread
        async def wired(*args, **kwargs):
            return await call(args, kwargs)
    else:
        def wired(*args, **kwargs):
            return call(args, kwargs)
    functools.update_wrapper(wired, fn)
    del wired.__wrapped__  # Gradio must see the signature below, not fn's
    wired.__signature__ = signature
    wired.__annotations__ = {"request": gr.Request, **events}  # the hints Gradio needs; others may be strings
    return friendly_errors(wired)


def forget_session(visitor: Visitor) -> None:
    """A browser tab closed: free everything its session held (the page's unload event)."""
    visitor.store.drop(visitor.session)


def standalone_demo(title: str, render: Callable[[AppContext], None], store: SessionStore | None,
                    settings: Settings | None = None, engine: Engine | None = None) -> gr.Blocks:
    """One tab (any `render(ctx)`) on its own, for running or testing it alone: its sessions are
    freed when their page closes and its requests queue as the app's do. Like app.py, it composes
    an app: it builds the engine (sized by the settings) unless given one."""
    settings = settings or Settings()
    engine = engine if engine is not None else Engine(max_batch=settings.max_batch)
    ctx = AppContext(store if store is not None else SessionStore(None), settings, engine)
    with gr.Blocks(title=f"bertdemo: {title}") as demo:
        render(ctx)
        demo.unload(handler(ctx, forget_session))
    demo.queue(max_size=settings.queue_size)
    keep_live_sessions(demo)
    return demo


def form_fields(form: type) -> list[str]:
    """The endpoint parameters a form stands for, in order."""
    return [f.name for f in dataclasses.fields(form)]


def _expand_forms(fn) -> tuple[list[inspect.Parameter], dict[str, type]]:
    """`fn`'s parameters after `visitor`, each form parameter replaced by its fields; and the
    forms by parameter name."""
    hints = typing.get_type_hints(fn)
    params, forms = [], {}
    for param in list(inspect.signature(fn).parameters.values())[1:]:
        form = hints.get(param.name)
        if isinstance(form, type) and dataclasses.is_dataclass(form):
            forms[param.name] = form
            params += [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                       for name in form_fields(form)]
        else:
            params.append(param)
    return params, forms
