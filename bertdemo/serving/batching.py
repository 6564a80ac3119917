"""Micro-batching: fill-mask requests that arrive together share one padded forward pass.

Many viewers of a shared link ask at once; on a CPU one forward of 16 short sentences costs far
less than 16 forwards. Written by hand because Gradio's `batch=True` fails a whole batch when one
visitor's input is bad; here each request is validated by its own caller first, and a batch that
fails anyway is re-run one request at a time, so errors stay with the person who caused them.
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import TimeoutError as FutureTimeout

from ..model.loading import LoadedModel
from ..views import fillmask
from .compute import ComputeThread


class MicroBatcher:
    """Leader/follower batching without a thread of its own: the first caller to find no batch
    running becomes the leader (a caller on an event loop, `fill_mask_async`, has the compute
    thread lead for it), waits `max_wait_s` for company, and runs whatever is pending,
    grouped by model, until nothing is. Requests that arrive while a forward runs go together in
    the next one. A lone request pays `max_wait_s`; while more keep arriving (a crowd, spread
    over tens of ms by the web server) or are still being tokenized, the leader keeps waiting,
    up to `max_gather_s`, so the crowd shares one forward instead of one for the first few plus
    one for the rest. Every forward runs on the compute thread (`compute`). A follower waits at
    most `timeout_s`."""

    def __init__(self, max_batch: int = 16, max_wait_s: float = 0.005, timeout_s: float = 120.0,
                 max_gather_s: float = 0.05, compute: ComputeThread | None = None):
        """`compute`: the thread each batch's forward runs on (`_run`), and an async caller's
        leader: the engine's (`Engine.compute`), or one of its own."""
        self.max_batch = max_batch
        self._compute = compute if compute is not None else ComputeThread()
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
        item, lead = self._join(lm, text, top_k, max_masks, max_top_k)
        if lead:
            self._lead()
        return self._result(item)

    async def fill_mask_async(self, lm: LoadedModel, text: str, top_k: int = 5,
                              max_masks: int = fillmask.DEFAULT_MAX_MASKS,
                              max_top_k: int = 10**9) -> list[list[dict]]:
        """`fill_mask` for a caller on an event loop (the web server's handler), awaited without a
        thread of its own: the checks and tokenizing run here, on the loop (~0.1 ms for a short
        sentence), and a batch's leader on the compute thread. Under a crowd each request then
        costs the server's event loop no hand-off to a worker thread and back. A caller that
        goes away (its task cancelled) is left out of the batches not yet run."""
        item, lead = self._join(lm, text, top_k, max_masks, max_top_k)
        if lead:
            self._compute.submit(self._lead)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(item[3]), self.timeout_s)
        except asyncio.TimeoutError:
            self._drop(item)
            raise self._busy() from None

    def _join(self, lm: LoadedModel, text: str, top_k: int, max_masks: int, max_top_k: int) -> tuple:
        """Check and tokenize one request (bad input fails here, alone), add it to the pending
        ones; returns it and whether its caller leads (no leader is running)."""
        top_k = fillmask.check_top_k(top_k, lm, max_top_k, name="top-k")
        with self._lock:
            self._arriving += 1
        try:
            enc = fillmask.encode(lm, text, max_masks=max_masks)
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
        return item, lead

    def _result(self, item) -> list[list[dict]]:
        try:
            return item[3].result(timeout=self.timeout_s)
        except FutureTimeout:
            self._drop(item)
            raise self._busy() from None

    def _drop(self, item) -> None:
        with self._lock:  # nobody took it yet: it will never run (by identity: items hold tensors)
            self._pending = [waiting for waiting in self._pending if waiting is not item]

    def _busy(self) -> TimeoutError:
        return TimeoutError(f"The server is busy: no prediction within {self.timeout_s:.0f} s. "
                            "Try again in a moment.")

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
                    waiting = [item for item in self._pending if not item[3].cancelled()]  # callers gone
                    batch, self._pending = waiting[:self.max_batch], waiting[self.max_batch:]
                answered.update(self._compute.run(self._run, batch))
        except BaseException as err:
            with self._lock:
                self._leader_active = False
                stranded, self._pending = self._pending, []
            for *_, future in batch + stranded:
                _settle(future, error=err)
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
            _settle(item[3], _copied(answered[_question(item)][1]))

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
                    _settle(items[0][3], error=err)
                else:
                    for item in items:
                        answered.update(cls._run([item]))
                continue
            for item, result in zip(items, results):
                answered[_question(item)] = (item[0], result)  # the model held: its id stays its own
                _settle(item[3], _copied(result))
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


def _settle(future: Future, result=None, error: BaseException | None = None) -> None:
    """Give a request its result or error, unless it has one or its caller has gone (an async
    caller's future is cancelled with its task)."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except InvalidStateError:
        pass


def _copied(result: list[list[dict]]) -> list[list[dict]]:
    """A result of its own for each request answered with it (a handler may change what it got)."""
    return [[dict(prediction) for prediction in row] for row in result]
