"""What this app needs from Gradio's queue beyond its public API, in one place.

- Whether a session's request to a run endpoint is still in the queue: what lets a run slot
  reserved by a request that was then cancelled (`/cancel`, the page's connection lost) before its
  handler started be taken over by the next click, instead of refusing it forever (`runs.slots.Ticket`).
- Every session with a request queued or running keeps its message queue (`keep_live_sessions`).
  Gradio holds each session's undelivered messages in a map of 2,000 sessions that forgets the
  oldest *created*, whether or not it is waiting for an answer. Every request sent by a script
  over raw HTTP without a session is a session of its own, so a crowd of them (40 a second) pushes
  out, within a minute, the session of a `gradio_client` script whose fine-tune is running: its
  progress and its answer then have nowhere to go, and its event stream ends with a 404, which the
  client reports as a bare `CancelledError`. The map kept here forgets, past the same size, the
  oldest sessions with nothing queued or running, and never one that still waits for an answer.
"""
from __future__ import annotations

import itertools
from collections import OrderedDict

from ...runs import kinds


class QueueWatch:
    """Reads the queue of the Blocks it watches (`watch`, while the app is built). One per app,
    held by its `AppContext`; a visitor's `still_queued()` asks it about that visitor."""

    def __init__(self):
        self.blocks = None

    def watch(self, blocks) -> None:
        self.blocks = blocks

    def holds(self, session: str) -> bool:
        """Whether the queue holds (or is running) a live request of `session` to a run endpoint
        (`kinds.RUNS`). Gradio has no public hook for "a queued job was cancelled", so this reads its
        queue; where that is not there (not watching yet, no queue yet, another Gradio) it answers
        True: the reservation then holds until its handler ends or the session is dropped."""
        queue = getattr(self.blocks, "_queue", None)
        if not hasattr(queue, "event_queue_per_concurrency_id") or not hasattr(queue, "active_jobs"):
            return True
        queued = [e for q in list(queue.event_queue_per_concurrency_id.values()) for e in list(q.queue)]
        running = [e for job in list(queue.active_jobs) if job for e in job]
        return any(e.session_hash == session and e.alive and getattr(e.fn, "api_name", None) in kinds.RUNS
                   for e in queued + running)


class LiveSessions(OrderedDict):
    """Each session's message queue (Gradio's `Queue.pending_messages_per_session`), oldest first.
    Adding a session past `max_size` forgets the oldest ones with no request pending (`pending()`
    says which sessions have one); sessions still waiting for an answer are kept even past it, and
    forgotten once they are the oldest with nothing pending."""

    def __init__(self, entries, max_size: int, pending):
        super().__init__(entries)
        self.max_size = max_size
        self.pending = pending  # () -> {session: set of its request ids not answered yet}

    def __setitem__(self, session, messages) -> None:
        if session in self:
            self.move_to_end(session)
        else:
            self._make_room()
        super().__setitem__(session, messages)

    def _make_room(self) -> None:
        if len(self) < self.max_size:
            return
        pending = self.pending()
        idle = (session for session in self if not pending.get(session))  # oldest first
        for session in list(itertools.islice(idle, len(self) - self.max_size + 1)):
            del self[session]
            pending.pop(session, None)  # its empty set of pending ids, which Gradio never removes


def keep_live_sessions(demo) -> bool:
    """Call after `demo.queue()`: the queue's message map keeps every session that waits for an
    answer (`LiveSessions`). False (nothing changed) where this Gradio has no such map."""
    queue = getattr(demo, "_queue", None)
    held = getattr(queue, "pending_messages_per_session", None)
    if held is None or not hasattr(queue, "pending_event_ids_session") or isinstance(held, LiveSessions):
        return held is not None
    queue.pending_messages_per_session = LiveSessions(held, getattr(held, "max_size", 2000),
                                                      lambda: queue.pending_event_ids_session)
    return True
