"""Whether a session's request to a run endpoint is still in this app's queue: what lets a run slot
reserved by a request that was then cancelled (`/cancel`, the page's connection lost) before its
handler started be taken over by the next click, instead of refusing it forever (`runs.Ticket`)."""
from __future__ import annotations

from .. import runs


class QueueWatch:
    """Reads the queue of the Blocks it watches (`watch`, while the app is built). One per app,
    held by its `AppContext`; a visitor's `still_queued()` asks it about that visitor."""

    def __init__(self):
        self.blocks = None

    def watch(self, blocks) -> None:
        self.blocks = blocks

    def holds(self, session: str) -> bool:
        """Whether the queue holds (or is running) a live request of `session` to a run endpoint
        (`runs.RUNS`). Gradio has no public hook for "a queued job was cancelled", so this reads its
        queue; where that is not there (not watching yet, no queue yet, another Gradio) it answers
        True: the reservation then holds until its handler ends or the session is dropped."""
        queue = getattr(self.blocks, "_queue", None)
        if not hasattr(queue, "event_queue_per_concurrency_id") or not hasattr(queue, "active_jobs"):
            return True
        queued = [e for q in list(queue.event_queue_per_concurrency_id.values()) for e in list(q.queue)]
        running = [e for job in list(queue.active_jobs) if job for e in job]
        return any(e.session_hash == session and e.alive and getattr(e.fn, "api_name", None) in runs.RUNS
                   for e in queued + running)
