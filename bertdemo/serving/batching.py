"""Micro-batching: fill-mask requests that arrive together share one padded forward pass.

Many viewers of a shared link ask at once; on a CPU one forward of 16 short sentences costs far
less than 16 forwards. Written by hand because Gradio's `batch=True` fails a whole batch when one
visitor's input is bad; here each request is validated in its own thread first, and a batch that
fails anyway is re-run one request at a time, so errors stay with the person who caused them.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Callable

from ..model.loading import LoadedModel
from ..views import fillmask


class MicroBatcher:
    """Leader/follower batching without a background thread: the first caller to find no batch
    running becomes the leader, waits `max_wait_s` for company, and runs whatever is pending,
    grouped by model, until nothing is. Requests that arrive while a forward runs go together in
    the next one. A lone request pays `max_wait_s`; while more keep arriving (a crowd, spread
    over tens of ms by the web server) or are still being tokenized, the leader keeps waiting,
    up to `max_gather_s`, so the crowd shares one forward instead of one for the first few plus
    one for the rest. A follower waits at most `timeout_s`."""

    def __init__(self, max_batch: int = 16, max_wait_s: float = 0.005, timeout_s: float = 120.0,
                 max_gather_s: float = 0.05, compute: Callable[..., Any] | None = None):
        """`compute(fn, *args)`: runs each batch's forward (`_run`); the engine's runs it on its
        compute thread (`compute.ComputeThread`), None in the leader's own thread."""
        self.max_batch = max_batch
        self._compute = compute or (lambda fn, *args: fn(*args))
        self.max_wait_s = max_wait_s
        self.max_gather_s = max_gather_s
        self.timeout_s = timeout_s
        self._pending: list[tuple[LoadedModel, fillmask.Encoded, int, Future]] = []
        self._lock = threading.Lock()
        self._leader_active = False
        self._arriving = 0  # callers between entering fill_mask and joining `_pending` (tokenizing)

    def fill_mask(self, lm: LoadedModel, text: str, top_k: int = 5,
                  max_masks: int = fillmask.DEFAULT_MAX_MASKS, max_top_k: int = 10**9) -> list[list[dict]]:
        """Same result as `fillmask.fill_mask`, computed together with concurrent callers; `top_k`
        checked once here, from 1 to `max_top_k` (the server's limit).

        Raises TimeoutError if no result came within `timeout_s` (the request is dropped)."""
        top_k = fillmask.check_top_k(top_k, lm, max_top_k, name="top-k")
        with self._lock:
            self._arriving += 1
        try:
            enc = fillmask.encode(lm, text, max_masks=max_masks)  # bad input fails here, alone
        except BaseException:
            with self._lock:
                self._arriving -= 1
            raise
        item = (lm, enc, top_k, Future())
        with self._lock:
            self._arriving -= 1
            self._pending.append(item)
            lead = not self._leader_active
            self._leader_active = True
        if lead:
            self._lead()
        return self._result(item)

    def _result(self, item) -> list[list[dict]]:
        try:
            return item[3].result(timeout=self.timeout_s)
        except FutureTimeout:
            with self._lock:
                if item in self._pending:  # nobody took it yet: it will never run
                    self._pending.remove(item)
            raise TimeoutError(f"The server is busy: no prediction within {self.timeout_s:.0f} s. "
                               "Try again in a moment.") from None

    def _lead(self) -> None:
        """Run batches until none is pending. Leadership ends with the loop, and also when
        anything fails outside `_run`: the requests taken or still waiting then get that error
        instead of waiting for a leader that has gone."""
        batch, answered = [], Answered(4 * self.max_batch)
        try:
            self._gather()
            while True:
                self._answer_repeats(answered)
                with self._lock:
                    if not self._pending:
                        self._leader_active = False  # under the lock: no request is left behind
                        return
                    batch, self._pending = self._pending[:self.max_batch], self._pending[self.max_batch:]
                answered.update(self._compute(self._run, batch))
        except BaseException as err:
            with self._lock:
                self._leader_active = False
                stranded, self._pending = self._pending, []
            for *_, future in batch + stranded:
                if not future.done():
                    future.set_exception(err)
            raise

    def _gather(self) -> None:
        """Wait `max_wait_s` for company, again and again while requests keep arriving or are
        still tokenizing (under a crowd, 16 threads share the GIL: one can take 20 ms to join),
        until the batch is full or `max_gather_s` has passed."""
        if not self.max_wait_s:
            return
        deadline, seen = time.monotonic() + self.max_gather_s, 1
        while True:
            time.sleep(self.max_wait_s)
            with self._lock:
                waiting, arriving = len(self._pending), self._arriving
            if waiting >= self.max_batch or time.monotonic() >= deadline:
                return
            if waiting <= seen and not arriving:
                return
            seen = waiting

    def _answer_repeats(self, answered: "Answered") -> None:
        """Answer the pending requests that ask what this leader's forwards computed (the same
        model, sentence and top-k) from their results, without another forward: under a crowd
        asking the page's example, the requests that arrived during a forward. The answers live
        as long as the leader's run of batches (no answer outlives the crowd that asked it)."""
        with self._lock:
            repeats = [item for item in self._pending if _question(item) in answered]
            self._pending = [item for item in self._pending if _question(item) not in answered]
        for item in repeats:
            item[3].set_result(_copied(answered[_question(item)][1]))

    @classmethod
    def _run(cls, batch) -> dict:
        """One padded forward per model; a group that fails is re-run one request at a time.
        Returns each answered question (`_question`) with its model and result."""
        by_model: dict[int, list] = {}
        for item in batch:
            by_model.setdefault(id(item[0]), []).append(item)
        answered = {}
        for items in by_model.values():
            try:
                results = fillmask.fill_encoded(items[0][0], [i[1] for i in items], [i[2] for i in items])
            except Exception as err:  # noqa: BLE001 - find whose request it was
                if len(items) == 1:
                    items[0][3].set_exception(err)
                else:
                    for item in items:
                        answered.update(cls._run([item]))
                continue
            for item, result in zip(items, results):
                answered[_question(item)] = (item[0], result)  # the model held: its id stays its own
                item[3].set_result(_copied(result))
        return answered


class Answered(OrderedDict):
    """The questions (`_question`) a leader's forwards answered, each with (model, result): the
    most recent `most` only (a leader that never runs out of requests keeps no more)."""

    def __init__(self, most: int):
        super().__init__()
        self.most = most

    def update(self, results: dict) -> None:  # type: ignore[override]
        for question, result in results.items():
            self[question] = result
            self.move_to_end(question)
        while len(self) > self.most:
            self.popitem(last=False)


def _question(item) -> tuple:
    """What a request asks, as the forward sees it: the model, the sentence's token ids, top-k."""
    lm, enc, top_k, _ = item
    return id(lm), enc.key, top_k


def _copied(result: list[list[dict]]) -> list[list[dict]]:
    """A result of its own for each request answered with it (a handler may change what it got)."""
    return [[dict(prediction) for prediction in row] for row in result]
