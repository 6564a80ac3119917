"""A run's whole life, in one place: declared once -> checked into a plan when its request is
queued -> started -> events -> Stop / time limit -> kept or discarded -> slot released.

A *run* is any long job a visitor starts and may stop: the MLM fine-tune, the static-vs-dynamic
comparison, the article-labelling experiment, a classifier's training, its learning-rate sweep,
"adapt, then classify". Each kind is one `RunSpec` in `kinds.RUNS` (runs/kinds.py, which imports
this module: a run's life knows no kind by name, its caller passes the spec):

    RunSpec("finetune", TuningRequest, planned_on(base_model), run_tuning, keep_tuned)

its endpoint, the request it takes (a dataclass whose fields are the endpoint's parameters), how a
request is checked into a plan (`check(caller, request)`: the input checked and prepared once,
InputError naming the field at fault), the job that runs the plan (`job(plan, on_event=...,
should_stop=...)`) and what the session keeps of its result (`keep(caller, plan, result) -> Kept`: what
happened, as facts; the page words them, in `ui/parts/live_run.py`). Adding a run kind
is a declaration in kinds.py plus its job; the UI wires any of them the same way (`ui/parts/live_run.py`).

Each session has one run slot (`slots.RunSlots`, held by the session store):

    spec = kinds.RUNS["finetune"]
    plan = life.reserve(caller, spec, request)       # the validator, when the request is queued
    with life.start(caller, spec, request) as run:   # the handler: takes the reserved plan
        for log in run.updates():       # the events so far (loop.EventLog), at most every 0.5 s
            draw(log)
        outcome = run.finish()          # the result and what was kept; the job's error re-raised here
    # leaving the block, however (error, tab closed, generator closed): stop flag set, slot released

`caller` is whoever asks: anything with `.store` (the session store), `.session` (its id),
`.limits` (`config.Limits`) and, for a fine-tune, `.settings` (`config.Settings`: its allowed models
say how an exported run names its base model); the UI's `Visitor` is one.
"""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .. import memory
from ..training.fine_tuning import save_zip
from ..training.loop import EventLog
from .slots import StopCheck, Ticket

Job = Callable[..., Any]  # job(plan, *, on_event=emit, should_stop=stop_check) -> result


# ---------------------------------------------------------------- a kind of run, declared once

@dataclass(frozen=True)
class RunSpec:
    """One kind of run (see the module doc). `trainings`: the training runs its job holds, so its
    time limit is that many times the per-run limit."""

    api_name: str
    request: type  # a dataclass: its fields are the endpoint's parameters, in order
    check: Callable[[Any, Any], Any]  # (caller, request) -> plan; InputError naming the field
    job: Job
    keep: Callable[[Any, Any, Any], "Kept | None"] = lambda caller, plan, result: None  # keeps nothing
    trainings: int = 1


@dataclass(frozen=True)
class Outcome:
    """How a run ended: the plan it ran, its job's result, and what the session kept of it."""

    plan: Any
    result: Any
    kept: "Kept | None"  # what the keep policy did (None: this kind keeps nothing)
    ended: str | None  # None: ran to the end; "stopped", "shutdown" or "time limit" (its stop check)


def reserve(caller, spec: RunSpec, request, waiting: Callable[[], bool] | None = None):
    """The validator's half, when the request enters the queue: check `request` into the plan of
    a run of kind `spec` (e.g. `kinds.RUNS["finetune"]`), and reserve the caller's slot with it (a
    second click is refused at once). `waiting()`: whether this request is still in the queue (see
    `RunSlots.reserve`). Returns the plan; InputError (a ValueError) says what to fix, naming the
    field."""
    plan = spec.check(caller, request)
    caller.store.runs.reserve(caller.session, spec.api_name, plan, waiting)
    return plan


def start(caller, spec: RunSpec, request=None) -> "Run":
    """The handler's half: claim the caller's slot and run the job of kind `spec` in a worker
    thread, on the plan reserved with the slot (or, for a caller that did not reserve, `request`'s)."""
    slots = caller.store.runs
    ticket = slots.claim(caller.session, spec.api_name)
    caller.store.reopen(caller.session)
    try:
        reserved = ticket.kind == spec.api_name and ticket.plan is not None
        plan = ticket.plan if reserved else spec.check(caller, request)
        return Run(caller, spec, ticket, plan)
    except BaseException:
        slots.finish(caller.session, ticket)
        raise


def stop(caller) -> bool:
    """Ask the caller's run to stop after its current step; False if nothing runs."""
    return caller.store.runs.stop(caller.session)


class Run:
    """One job running in a worker thread, with its stop flag and the session's slot."""

    def __init__(self, caller, spec: RunSpec, ticket: Ticket, plan):
        self.caller, self.spec, self.ticket, self.plan = caller, spec, ticket, plan
        self.should_stop = StopCheck(ticket, spec.trainings * caller.limits.max_seconds)
        self.log = EventLog()
        self._events: queue.Queue = queue.Queue()
        self._result = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, daemon=True)
        self._thread.start()

    def _work(self) -> None:
        try:
            self._result = self.spec.job(self.plan, on_event=self._events.put, should_stop=self.should_stop)
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread by finish()
            self._error = err
        finally:  # the job's activations and optimizer state are freed now: give them back
            memory.trim()

    def updates(self, every: float = 0.5):
        """`self.log` after each batch of new events, at most once per `every` seconds, until the
        job ends."""
        # Waiting the whole interval (not just for the first event) matters: a step takes
        # milliseconds on a small model, and a page redrawn at every step starves the run of CPU.
        while self._thread.is_alive() or not self._events.empty():
            self._thread.join(timeout=every)  # returns at once when the job ends
            new = False
            try:
                while True:
                    self.log.add(self._events.get_nowait())
                    new = True
            except queue.Empty:
                pass
            if new:
                yield self.log
        self._thread.join()

    def finish(self) -> Outcome:
        """Wait for the job; re-raise its error here, or apply the kind's keep policy."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        kept = self.spec.keep(self.caller, self.plan, self._result)
        return Outcome(self.plan, self._result, kept, self.ended)

    @property
    def ended(self) -> str | None:
        """None while running or if it ran to the end; "stopped" or "time limit" otherwise."""
        return self.should_stop.reason

    def close(self) -> None:
        """Stop the job (it ends within one step) and free the session's slot. Idempotent."""
        self.ticket.set()
        self.caller.store.runs.finish(self.caller.session, self.ticket)

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---------------------------------------------------------------- what a run leaves

@dataclass(frozen=True)
class Kept:
    """What a keep policy did with a run's model, as facts (the page words them).

    kind: the session's model slot ("tuned", "classifier"); kept: the model is now the session's
    model of that kind; in_use: kept, and the session's tabs already use that kind (a tuned model
    switched on); page_closed: the session was dropped while the run went on, so nothing could be
    kept; stopped: why the run ended early (`RunHistory.stopped`: "stopped", "time limit",
    "diverged", "shutdown", "closed"; None when it ran to its end); steps_done of steps_planned;
    had_previous: the session had a model of this kind before (unchanged when not kept)."""

    kind: str
    kept: bool
    in_use: bool = False
    page_closed: bool = False
    stopped: str | None = None
    steps_done: int = 0
    steps_planned: int = 0
    had_previous: bool = False


def keep_or_discard(caller, model, history, keep_partial: bool, kind: str = "tuned") -> Kept:
    """Keep the run's model as the session's model of `kind`, or not: a finished run's model is
    kept (not switched on); a stopped or timed-out one only if `keep_partial` (and it did at least
    one step), a diverged one never. Returns what happened (`Kept`)."""
    store, session = caller.store, caller.session
    facts = dict(kind=kind, stopped=history.stopped, steps_done=len(history.steps),
                 steps_planned=history.planned_steps, had_previous=store.model(session, kind) is not None)
    if history.stopped is None or (keep_partial and history.stopped != "diverged" and facts["steps_done"] > 0):
        store.put_model(session, kind, model)
        if store.model(session, kind) is not model:  # the page closed while it ran
            return Kept(kept=False, page_closed=True, **facts)
        return Kept(kept=True, in_use=kind == "tuned" and store.using_tuned(session), **facts)
    return Kept(kept=False, **facts)


def model_zip(store, session: str | None, kind: str = "tuned") -> Path:
    """The session's model of `kind` as a save_pretrained zip, made once per model; ValueError if
    it has none or the zip is over the store's download cap."""
    model = store.model(session, kind)
    if model is None:
        raise ValueError(f"You have no {kind} model to download: run a fine-tune first.")
    archive = store.cached_file(session, f"{kind}-zip", model,
                                lambda folder: save_zip(model, folder, f"bertdemo-{kind}-model"))
    size = archive.stat().st_size
    if size > store.max_download_bytes:
        raise ValueError(f"The {kind} model's zip is {size / 1e6:.0f} MB; this server serves at "
                         f"most {store.max_download_bytes / 1e6:.0f} MB.")
    return archive
