"""What the tabs that start runs share (fine-tune, mask sampling, and issue 12's classifier):
the limits from the settings, the probe that tells `runs` whether a queued request still exists,
and turning a run's step events into `gr.Progress`. The run itself lives in `bertdemo.runs`."""
from __future__ import annotations

from typing import Callable

import gradio as gr

from ..config import Settings
from ..training import Limits
from .common import session_id


def limits_from(settings: Settings) -> Limits:
    return Limits(max_chars=settings.finetune_max_chars, max_steps=settings.finetune_max_steps,
                  max_seconds=float(settings.finetune_max_seconds))


def queued_probe(request: gr.Request | None, api_names: set[str]) -> Callable[[], bool] | None:
    """`waiting()` for `runs.reserve`: is a request of this session to one of `api_names` still
    waiting in Gradio's queue or being processed? False once it was cancelled (`/cancel`, or the
    page's connection lost) before its handler started, so that reservation can be taken over.

    Gradio has no public hook for "a queued job was cancelled", so this reads its queue; if that
    is not there (no queue, a different Gradio), returns None: the reservation then holds until
    its handler ends or the session is dropped, as before.
    """
    session = session_id(request)
    app = getattr(getattr(request, "request", None), "app", None)
    queue = getattr(app.get_blocks(), "_queue", None) if hasattr(app, "get_blocks") else None
    if session is None or not hasattr(queue, "event_queue_per_concurrency_id"):
        return None

    def waiting() -> bool:
        queued = [e for q in list(queue.event_queue_per_concurrency_id.values()) for e in list(q.queue)]
        running = [e for job in list(queue.active_jobs) if job for e in job]
        return any(e.session_hash == session and e.alive and getattr(e.fn, "api_name", None) in api_names
                   for e in queued + running)
    return waiting


def show_steps(progress, done: int, total: int, desc: str = "fine-tuning") -> None:
    """One `gr.Progress` update in steps (nothing before the first step)."""
    if done and total:
        progress((done, total), desc=desc, unit="steps")
