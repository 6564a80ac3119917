"""Micro-batching: fill-mask requests that arrive together share one padded forward pass.

Many viewers of a shared link ask at once; on a CPU one forward of 16 short sentences costs far
less than 16 forwards. Written by hand because Gradio's `batch=True` fails a whole batch when one
visitor's input is bad; here each request is validated in its own thread first, so errors stay
with the person who caused them.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future

from . import fillmask
from .models import LoadedModel


class MicroBatcher:
    """Leader/follower batching without a background thread: the first caller to find no batch
    running becomes the leader, waits `max_wait_s` for company, and runs whatever is pending,
    grouped by model, until nothing is. Requests that arrive while a forward runs go together in
    the next one. A lone request pays `max_wait_s`; a crowd arriving within it shares one forward
    instead of one alone plus one for the rest."""

    def __init__(self, max_batch: int = 16, max_wait_s: float = 0.005):
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self._pending: list[tuple[LoadedModel, fillmask.Encoded, int, Future]] = []
        self._lock = threading.Lock()
        self._leader_active = False

    def fill_mask(self, lm: LoadedModel, text: str, top_k: int = 5,
                  max_masks: int = fillmask.DEFAULT_MAX_MASKS) -> list[list[dict]]:
        """Same result as `fillmask.fill_mask`, computed together with concurrent callers."""
        top_k = fillmask.check_top_k(top_k, lm)
        enc = fillmask.encode(lm, text, max_masks=max_masks)  # bad input fails here, alone
        future: Future = Future()
        with self._lock:
            self._pending.append((lm, enc, top_k, future))
            lead = not self._leader_active
            self._leader_active = self._leader_active or lead
        if lead:
            self._lead()
        return future.result()

    def _lead(self) -> None:
        if self.max_wait_s:
            time.sleep(self.max_wait_s)  # optionally wait for company
        while True:
            with self._lock:
                if not self._pending:
                    self._leader_active = False
                    return
                batch, self._pending = self._pending[:self.max_batch], self._pending[self.max_batch:]
            self._run(batch)

    @staticmethod
    def _run(batch) -> None:
        by_model: dict[int, list] = {}
        for item in batch:
            by_model.setdefault(id(item[0]), []).append(item)
        for items in by_model.values():
            try:
                results = fillmask.fill_encoded(items[0][0], [i[1] for i in items], [i[2] for i in items])
            except Exception as err:  # noqa: BLE001 - hand the error to every waiting caller
                for item in items:
                    item[3].set_exception(err)
                continue
            for item, result in zip(items, results):
                item[3].set_result(result)
