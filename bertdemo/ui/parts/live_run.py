"""Any run, live in the page: how every tab that starts runs wires them. The run itself (its
declaration, slot, plan, worker, Stop, time limit, what it keeps) lives in `bertdemo.runs`.

    live_run.wire(ctx, "finetune", button, form, outputs, on_finetune)   # form: {field name: component}

    def on_finetune(visitor, request: TuningRequest, progress=gr.Progress()):
        outcome = yield from live_run.stream(visitor, "finetune", request, progress, draw_live)
        yield draw_final(outcome)

`wire` gives the button the kind's endpoint (named after it), its validator (the request checked
into a plan and the session's slot reserved when the request enters the queue: bad input is
refused at once, beside its field) and the shared fine-tune concurrency; `stream` runs it,
drawing the events as they arrive and showing the steps in `gr.Progress`. What a run did (its
`life.Kept`, why it ended early) is facts from the service; `kept_note` and `ended_because` word
them for the page.
"""
from __future__ import annotations

import gradio as gr

from ...config import Limits
from ...runs import kinds, life
from ...training.loop import EventLog
from .context import AppContext, Visitor, form_fields, handler

FINETUNE_GROUP = "finetune"  # every run shares one concurrency group: the server never trains more at once
ENDED_BECAUSE = {  # Run.ended / RunHistory.stopped -> why, for a sentence "the run ended early because ..."
    "stopped": "you pressed Stop",
    "time limit": "it reached the time limit of {seconds} s per run",
    "diverged": "the loss became infinite or NaN (try a smaller learning rate)",
    "shutdown": "the server is shutting down (its operator stopped it)",
    "closed": "the server lost this page's connection and took the page as closed",
}


def wire(ctx: AppContext, kind: str, button: gr.Button, form: dict, outputs: list, fn) -> None:
    """Start runs of `kind` (`kinds.RUNS`) from `button` with `fn`, a handler whose input is the
    kind's request. `form` maps the request's field names to their components (more may be there:
    each run takes the fields of its own request)."""
    names = form_fields(kinds.RUNS[kind].request)
    missing = [name for name in names if name not in form]
    if missing:
        raise ValueError(f"{kind} needs a component for {', '.join(missing)}")
    inputs = [form[name] for name in names]
    ctx.queue.watch(gr.context.Context.root_block)  # the Blocks being built
    button.click(handler(ctx, fn), inputs, outputs, api_name=kind, validator=handler(ctx, validator(kind)),
                 concurrency_id=FINETUNE_GROUP, concurrency_limit=ctx.settings.finetune_concurrency)


def validator(kind: str):
    """The validator of `kind`'s endpoint: one `gr.validate` per input, the first problem beside
    its field; on success the session's slot is reserved with the plan (`life.reserve`)."""
    request = kinds.RUNS[kind].request
    names = form_fields(request)

    def check(visitor: Visitor, form) -> list:
        verdicts = [gr.validate(True, "")] * len(names)
        try:
            life.reserve(visitor, kinds.RUNS[kind], form, waiting=visitor.still_queued)
        except ValueError as err:
            field = getattr(err, "field", None)
            verdicts[names.index(field) if field in names else 0] = gr.validate(False, str(err))
        return verdicts
    check.__annotations__ = {"visitor": Visitor, "form": request}
    check.__name__ = f"check_{kind}"
    return check


def stream(visitor: Visitor, kind: str, request, progress, draw, desc: str = "training", cleared=None):
    """Run `request` as the visitor's run of `kind`: yields `cleared` (when given: the outputs with
    the last run's results taken away) as soon as the run has started, then `draw(log)` (the
    `loop.EventLog` so far) after each batch of events, shows the current training run's
    steps in `progress`, and returns the run's `life.Outcome` (use with `yield from`). Leaving
    early (the page closed) stops the run and frees the slot."""
    with life.start(visitor, kinds.RUNS[kind], request) as run:
        if cleared is not None:
            yield cleared
        for log in run.updates():
            show_steps(progress, log, desc)
            yield draw(log)
        return run.finish()


def show_steps(progress, log: EventLog, desc: str = "training") -> None:
    """One `gr.Progress` update: the current training run's steps (nothing before its first)."""
    latest = log.latest
    if latest.steps and latest.planned_steps:
        name = f"{desc} ({log.current})" if log.current else desc
        progress((len(latest.steps), latest.planned_steps), desc=name, unit="steps")


def stop(visitor: Visitor) -> bool:
    """Ask the visitor's run to stop after its current step; False if nothing runs."""
    return life.stop(visitor)


# ---------------------------------------------------------------- what a run did, in the page's words

def ended_because(stopped: str | None, limits: Limits) -> str:
    """Why a run ended early (`RunHistory.stopped`), to follow "because"; "" if it did not."""
    return ENDED_BECAUSE.get(stopped, "").format(seconds=int(limits.max_seconds))


def how_it_ended(history, max_seconds: float) -> str:
    """A coder run's first words on the page: "**Done**: 120 steps, 400,000 tokens in 118 s." or
    "**Ended early** because you pressed Stop, after ..." (`history`: steps, tokens, seconds, stopped)."""
    done = f"{len(history.steps)} steps, {history.tokens:,} tokens in {history.seconds:.0f} s"
    if history.stopped is None:
        return f"**Done**: {done}."
    why = ENDED_BECAUSE.get(history.stopped, history.stopped).format(seconds=int(max_seconds))
    return f"**Ended early** because {why}, after {done}."


def kept_note(kept: life.Kept, limits: Limits) -> str:
    """The sentence the page shows under a run's result: what its keep policy did."""
    kind = kept.kind
    if kept.page_closed:
        return ("Its model was **not kept**: the server took this page as closed while the run "
                "went on. Reload the page to start again.")
    if kept.kept and kind == "tuned":
        return ("It is your tuned model now, already in use in the other tabs." if kept.in_use
                else "It is your tuned model now: press **Use my tuned model in all tabs** to try it there.")
    if kept.kept:
        return f"It is your {kind} model now."
    previous = f"your previous {kind} model is unchanged" if kept.had_previous else f"you have no {kind} model yet"
    return (f"The run ended early because {ended_because(kept.stopped, limits)}, after {kept.steps_done} of "
            f"{kept.steps_planned} steps. Its model was **not kept**: {previous}. (Tick “Keep the model…” "
            "to keep a stopped run.)")
