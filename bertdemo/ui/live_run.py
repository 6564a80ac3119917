"""What the tabs that start runs share (fine-tune, mask sampling, and the classifier):
the limits from the settings, the probe that tells `runs` whether a queued request still exists,
and turning a run's step events into `gr.Progress`. The run itself lives in `bertdemo.runs`."""
from __future__ import annotations

import functools

import gradio as gr

from ..config import Settings
from ..training import Limits


def limits_from(settings: Settings) -> Limits:
    return Limits(max_chars=settings.finetune_max_chars, max_steps=settings.finetune_max_steps,
                  max_seconds=float(settings.finetune_max_seconds))


RUN_ENDPOINTS = {"finetune", "compare_masking", "article_finetune"}  # share a session's run slot


def watch_queue(store, api_names: set[str] = RUN_ENDPOINTS) -> None:
    """Give `store` its `queue_probe`: is a request of a session to one of `api_names` still
    waiting in this app's queue or being processed? Call while rendering (it finds the Blocks
    being built). With it, a reservation whose request was cancelled (`/cancel`, or the page's
    connection lost) before its handler started is taken over by the next click (`runs.reserve`).
    A tab adding a run endpoint adds its name to `api_names`."""
    blocks = gr.context.Context.root_block
    names = set(api_names) | getattr(getattr(store, "queue_probe", None), "api_names", set())
    store.queue_probe = functools.partial(in_queue, blocks, names)
    store.queue_probe.api_names = names


def in_queue(blocks, api_names: set[str], session: str) -> bool:
    """Whether Gradio's queue of `blocks` holds (or is running) a live request of `session` to one
    of `api_names`. Gradio has no public hook for "a queued job was cancelled", so this reads its
    queue; where that is not there (no queue yet, another Gradio) it answers True: the
    reservation then holds until its handler ends or the session is dropped."""
    queue = getattr(blocks, "_queue", None)
    if not hasattr(queue, "event_queue_per_concurrency_id") or not hasattr(queue, "active_jobs"):
        return True
    queued = [e for q in list(queue.event_queue_per_concurrency_id.values()) for e in list(q.queue)]
    running = [e for job in list(queue.active_jobs) if job for e in job]
    return any(e.session_hash == session and e.alive and getattr(e.fn, "api_name", None) in api_names
               for e in queued + running)


def show_steps(progress, done: int, total: int, desc: str = "fine-tuning") -> None:
    """One `gr.Progress` update in steps (nothing before the first step)."""
    if done and total:
        progress((done, total), desc=desc, unit="steps")
