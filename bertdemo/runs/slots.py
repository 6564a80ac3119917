"""Each session's one run slot (`RunSlots`, held by the session store), its `Ticket` (reserved with
the plan, claimed by the handler, set to stop) and the job's `StopCheck`. No trainer is imported
here: the session store holds the slots without loading any training code."""
from __future__ import annotations

import threading
import time
from typing import Callable

GRACE_S = 5.0  # a reservation younger than this is never taken over (its request may not be queued yet)
SHUTTING_DOWN = "The server is shutting down: no new runs start now. Try again in a minute (reload the page)."


# ---------------------------------------------------------------- one slot per session

class Ticket(threading.Event):
    """A session's run slot: set means "stop". Reserved when the request is queued (with the plan
    its check made), claimed when its handler starts, released when the run ends."""

    def __init__(self, kind: str | None = None, plan=None, waiting: Callable[[], bool] | None = None):
        super().__init__()
        self.kind, self.plan, self.waiting = kind, plan, waiting
        self.claimed = False
        self.reserved_at = time.monotonic()
        self.why = "stopped"  # what the run's history says when this flag stops it

    def stop(self, why: str = "stopped") -> None:
        """Set the flag, saying why ("stopped": the visitor's Stop; "shutdown": the server's)."""
        self.why = why
        self.set()

    def abandoned(self) -> bool:
        """True if the request holding this ticket left the queue without its handler starting."""
        if self.claimed or self.waiting is None or time.monotonic() - self.reserved_at < GRACE_S:
            return False
        try:
            return not self.waiting()
        except Exception:  # noqa: BLE001 - a probe that fails cannot prove the request is gone
            return False


class RunSlots:
    """Every session's one run slot (a `Ticket`)."""

    def __init__(self):
        self._tickets: dict[str, Ticket] = {}
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # notified when a slot is freed
        self.closing = False  # the server is shutting down: no run starts any more

    def reserve(self, session: str | None, kind: str | None = None, plan=None,
                waiting: Callable[[], bool] | None = None) -> Ticket:
        """Claim the session's slot for a request entering the queue; ValueError if a run of the
        session is queued or running, unless that one's request left the queue (`Ticket.abandoned`:
        `waiting()` says whether this one's request is still queued; the web layer alone can tell)."""
        session = _needs_session(session)
        with self._lock:
            self._refuse_if_closing()
            held = self._tickets.get(session)
            if held is not None and not held.abandoned():
                raise ValueError("A run of yours (fine-tune, comparison, classifier or features) is already running "
                                 "or waiting in the queue: wait for it to finish, or press Stop.")
            self._tickets[session] = Ticket(kind, plan, waiting)
            return self._tickets[session]

    def claim(self, session: str | None, kind: str | None = None) -> Ticket:
        """The ticket of the run starting now: the one reserved for it, else a new one. ValueError
        if another run of this session already started."""
        session = _needs_session(session)
        with self._lock:
            self._refuse_if_closing()
            held = self._tickets.get(session)
            if held is None or held.abandoned():
                held = self._tickets[session] = Ticket(kind)
            elif held.claimed:
                raise ValueError("A run of yours is already running: wait for it to finish, or press Stop.")
            held.claimed = True
            return held

    def finish(self, session: str | None, ticket: Ticket) -> None:
        """Free the slot held by `ticket` (no-op if it was dropped or replaced since)."""
        with self._lock:
            if session in self._tickets and self._tickets[session] is ticket:
                del self._tickets[session]
            self._changed.notify_all()
        ticket.plan = None  # its prepared data goes now, not with the last reference to the ticket

    def status(self, session: str | None) -> str | None:
        """"running" (its handler started), "waiting" (reserved, still in the queue) or None."""
        with self._lock:
            held = self._tickets.get(session)
            if held is None or held.abandoned():
                return None
            return "running" if held.claimed else "waiting"

    def stop(self, session: str | None) -> bool:
        """Ask the session's run to stop after its current step. False if nothing runs."""
        with self._lock:
            held = self._tickets.get(session)
        if held is None:
            return False
        held.set()
        return True

    def drop(self, session: str | None) -> None:
        """The session ended: its run stops within a step and its slot is freed."""
        with self._lock:
            held = self._tickets.pop(session, None)
            self._changed.notify_all()
        if held is not None:
            held.stop("closed")

    def busy(self, session: str | None) -> bool:
        with self._lock:
            return session in self._tickets

    def stop_all(self, why: str = "shutdown") -> int:
        """The server is stopping: refuse new runs from now on and ask every run, running or
        queued, to stop after its current step. Returns how many were running."""
        with self._lock:
            self.closing = True
            held = list(self._tickets.values())
        for ticket in held:
            ticket.stop(why)
        return sum(ticket.claimed for ticket in held)

    def wait_idle(self, timeout: float) -> bool:
        """Wait up to `timeout` s until no run is running (their handlers freed their slots);
        False if some still are. Reserved slots whose handler never started do not count."""
        with self._changed:
            return self._changed.wait_for(lambda: not any(t.claimed for t in self._tickets.values()),
                                          timeout)

    def _refuse_if_closing(self) -> None:
        if self.closing:
            raise ValueError(SHUTTING_DOWN)


def _needs_session(session: str | None) -> str:
    if not session:
        raise ValueError("This needs a browser session: open the demo in a browser or use gradio_client.")
    return session


class StopCheck:
    """The job's `should_stop()`: True once the ticket is set or the time is up; `.reason` says which."""

    def __init__(self, ticket: threading.Event, max_seconds: float | None):
        self.ticket, self.max_seconds = ticket, max_seconds
        self.started = time.perf_counter()
        self.reason: str | None = None

    def __call__(self) -> bool:
        if self.reason is None and self.ticket.is_set():
            self.reason = getattr(self.ticket, "why", "stopped")
        elif self.reason is None and self.max_seconds is not None and \
                time.perf_counter() - self.started > self.max_seconds:
            self.reason = "time limit"
        return self.reason is not None
