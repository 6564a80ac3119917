"""A run's whole life, owned by the service: reserve -> start -> events -> stop / time limit ->
keep or discard -> release.

A *run* is any long job a visitor starts and may stop: the MLM fine-tune, the static-vs-dynamic
comparison, the article-labelling comparison, a classifier's training. Each session has one run
slot (held in `SessionStore`); the UI only turns a run's events into progress bars and plots.

    ticket = runs.reserve(store, session, waiting=still_in_queue)   # when the request is queued
    with runs.start(store, session, job, max_seconds=120) as run:    # in the handler
        for events in run.updates():        # lists of the job's events, at most one list per 0.5 s
            draw(events)
        result = run.outcome()              # the job's return value; its exception re-raised here
    # leaving the block, however (error, tab closed, generator closed): stop flag set, slot released
    note = runs.keep_or_discard(store, session, model, history, keep_partial, limits)

API
- `reserve(store, session, waiting=None) -> Ticket`: claim the session's slot when the request
  enters the queue, so a second click is refused at once (ValueError). `waiting()` says whether
  the queued request still exists: if it was cancelled before its handler started, the next
  `reserve` takes the slot over instead of being refused forever (a ticket is trusted for its
  first `GRACE_S` seconds, while the queue is still taking the request in).
- `start(store, session, job, *, max_seconds=None, every=0.5) -> Run`: claim the reserved ticket
  (or reserve one: a Python caller need not reserve) and run `job(emit, should_stop)` in a worker
  thread. `emit(event)` queues an event (any object); `should_stop()` is asked before each step and
  is True once Stop was pressed, the session closed, or `max_seconds` passed; its `.reason` is then
  "stopped" or "time limit". `Run` is a context manager; `close()` does the release.
- `Run.updates(every)`, `Run.outcome()`, `Run.ended` (None, "stopped" or "time limit").
- `stop(store, session) -> bool`: ask the session's run to stop after its current step.
- `keep_or_discard(store, session, model, history, keep_partial, limits, kind="tuned") -> str`:
  the policy for what a run leaves. A finished run's model is kept (not switched on); a stopped or
  timed-out one is discarded unless `keep_partial` (and it did at least one step and did not
  diverge). `history` needs `.stopped` (None: finished), `.steps` and `.planned_steps`.
- `model_zip(store, session, kind="tuned") -> Path`: the session's model of `kind` as a
  save_pretrained zip, made once per model (a second click serves the same file).
"""
from __future__ import annotations

import queue
import threading
import time
from pathlib import Path
from typing import Any, Callable

GRACE_S = 5.0  # a reservation younger than this is never taken over (its request may not be queued yet)
ENDED_BECAUSE = {  # Run.ended / History.stopped -> why, for a sentence "the run ended early because ..."
    "stopped": "you pressed Stop",
    "time limit": "it reached the time limit of {seconds} s per run",
    "diverged": "the loss became infinite or NaN (try a smaller learning rate)",
}
Job = Callable[[Callable[[Any], None], Callable[[], bool]], Any]  # job(emit, should_stop) -> result


class Ticket(threading.Event):
    """A session's run slot: set means "stop". Reserved when the request is queued, claimed when
    its handler starts, released by `Run.close` (or `SessionStore.finish_run`)."""

    def __init__(self, waiting: Callable[[], bool] | None = None):
        super().__init__()
        self.waiting = waiting
        self.claimed = False
        self.reserved_at = time.monotonic()

    def abandoned(self) -> bool:
        """True if the request holding this ticket left the queue without its handler starting."""
        if self.claimed or self.waiting is None or time.monotonic() - self.reserved_at < GRACE_S:
            return False
        try:
            return not self.waiting()
        except Exception:  # noqa: BLE001 - a probe that fails cannot prove the request is gone
            return False


class StopCheck:
    """The job's `should_stop()`: True once the ticket is set or the time is up; `.reason` says which."""

    def __init__(self, ticket: threading.Event, max_seconds: float | None):
        self.ticket, self.max_seconds = ticket, max_seconds
        self.started = time.perf_counter()
        self.reason: str | None = None

    def __call__(self) -> bool:
        if self.reason is None and self.ticket.is_set():
            self.reason = "stopped"
        elif self.reason is None and self.max_seconds is not None and \
                time.perf_counter() - self.started > self.max_seconds:
            self.reason = "time limit"
        return self.reason is not None


def reserve(store, session: str | None, waiting: Callable[[], bool] | None = None) -> Ticket:
    """Claim the session's run slot for a request entering the queue (ValueError if taken)."""
    return store.reserve_run(session, waiting)


def stop(store, session: str | None) -> bool:
    """Ask the session's run to stop after its current step; False if nothing runs."""
    return store.request_stop(session)


def start(store, session: str | None, job: Job, *, max_seconds: float | None = None) -> "Run":
    """Claim the session's slot and run `job(emit, should_stop)` in a worker thread."""
    ticket = store.claim_run(session)
    try:
        return Run(store, session, ticket, job, max_seconds)
    except BaseException:
        store.finish_run(session, ticket)
        raise


class Run:
    """One job running in a worker thread, with its stop flag and the session's slot."""

    def __init__(self, store, session: str | None, ticket: Ticket, job: Job, max_seconds: float | None):
        self.store, self.session, self.ticket = store, session, ticket
        self.should_stop = StopCheck(ticket, max_seconds)
        self._events: queue.Queue = queue.Queue()
        self._result = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, args=(job,), daemon=True)
        self._thread.start()

    def _work(self, job: Job) -> None:
        try:
            self._result = job(self._events.put, self.should_stop)
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread by outcome()
            self._error = err

    def updates(self, every: float = 0.5):
        """Lists of new events, at most one list per `every` seconds, until the job ends."""
        # Waiting the whole interval (not just for the first event) matters: a step takes
        # milliseconds on a small model, and a page redrawn at every step starves the run of CPU.
        while self._thread.is_alive() or not self._events.empty():
            self._thread.join(timeout=every)  # returns at once when the job ends
            batch = []
            try:
                while True:
                    batch.append(self._events.get_nowait())
            except queue.Empty:
                pass
            if batch:
                yield batch
        self._thread.join()

    def outcome(self):
        """The job's return value, once it ended (waits for it); re-raises its exception here."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._result

    @property
    def ended(self) -> str | None:
        """None while running or if it ran to the end; "stopped" or "time limit" otherwise."""
        return self.should_stop.reason

    def close(self) -> None:
        """Stop the job (it ends within one step) and free the session's slot. Idempotent."""
        self.ticket.set()
        self.store.finish_run(self.session, self.ticket)

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---------------------------------------------------------------- what a run leaves

def keep_or_discard(store, session: str | None, model, history, keep_partial: bool, limits,
                    kind: str = "tuned") -> str:
    """Keep the run's model as the session's model of `kind`, or say why it was not kept."""
    done = len(history.steps)
    if history.stopped is None or (keep_partial and history.stopped != "diverged" and done > 0):
        store.put_model(session, kind, model)
        if kind == "tuned" and store.using_tuned(session):
            return "It is your tuned model now, already in use in the other tabs."
        if kind == "tuned":
            return "It is your tuned model now: press **Use my tuned model in all tabs** to try it there."
        return f"It is your {kind} model now."
    why = ENDED_BECAUSE[history.stopped].format(seconds=int(limits.max_seconds))
    previous = (f"your previous {kind} model is unchanged" if store.model(session, kind) is not None
                else f"you have no {kind} model yet")
    return (f"The run ended early because {why}, after {done} of {history.planned_steps} steps. "
            f"Its model was **not kept**: {previous}. (Tick “Keep the model…” to keep a stopped run.)")


def model_zip(store, session: str | None, kind: str = "tuned") -> Path:
    """The session's model of `kind` as a save_pretrained zip, made once per model; ValueError if
    it has none or the zip is over the store's download cap."""
    from .training import save_zip  # here, not at the top: runs.py is generic, only zips know models

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
