"""The micro-batcher: a bounded queue of requests answered by the model's forward passes, several
requests per pass. While a pass runs, arriving requests queue, and the next pass takes all of them
at once (up to ``max_batch`` texts), so a lone request never waits for company; a request that does
not fit (count, or the time the queue holds) is refused at once, one past its deadline gets
:class:`~xtransformer.serve.limits.RequestTimeout` and leaves the queue."""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

from xtransformer.serve.limits import QueueFull, RequestTimeout
from xtransformer.serve.metrics import ServeMetrics
from xtransformer.serve.workers import ThreadSlot, WorkerDied, fork_workers

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Ask:
    """A request's decision settings (a calibrated model's ``decision``, ``threshold``, ``min_labels``,
    ``max_labels``; unset: the folder's) and whether they ask for decided label sets."""

    settings: tuple[tuple[str, Any], ...] = ()
    decided: bool = False

    @classmethod
    def of(cls, model: Any, fields: dict[str, Any]) -> Ask:
        """Checked against ``model`` (a ValueError names the field); nothing to check for a plain request."""
        given = {k: v for k, v in fields.items() if v is not None}
        if not given and not getattr(model, "decides", False):
            return cls()
        settings = model.settings(given)
        return cls(tuple(sorted(given.items())), settings.get("decision", "topk") != "topk")


class _Job:
    __slots__ = ("texts", "k", "future", "queued", "decide", "cut")

    def __init__(self, texts: list[str], k: int, future: asyncio.Future, decide: Ask | None = None):
        self.texts, self.k, self.future, self.queued = texts, k, future, True
        self.decide = decide or Ask()  # the request's decision settings; a pass shares one
        self.cut = None if self.decide.decided else k  # rows of the k best are cut to the request's k


class MicroBatcher:
    """A bounded queue of requests served by the model's forward passes, several requests per
    pass: one pass at a time in a thread (``workers=1``), or up to ``workers`` at once in forked
    worker processes (for models whose prediction holds the GIL, e.g. TF-IDF in Python)."""

    def __init__(
        self,
        model: Any,
        max_batch: int = 1024,
        max_queue: int = 4096,
        request_timeout: float = 30.0,
        metrics: ServeMetrics | None = None,
        workers: int = 1,
    ):
        self.model = model  # XMCModel (anything with predict(texts, k=...))
        self.max_batch, self.max_queue, self.request_timeout = max_batch, max_queue, request_timeout
        self.metrics = metrics or ServeMetrics()
        self.stats = {"requests": 0, "batches": 0, "texts": 0}
        self.jobs: collections.deque[_Job] = collections.deque()
        self.queued_texts = 0  # texts of the jobs in `jobs` still waiting
        self.running_texts = 0
        self.seconds_per_text: float | None = None  # moving average over recent passes
        self.slots: list[Any] = [ThreadSlot(model)] if workers <= 1 else fork_workers(model, workers)
        self._free: asyncio.Queue | None = None
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._running: set[asyncio.Task] = set()

    @property
    def workers(self) -> int:
        return len(self.slots)

    @property
    def worker_pids(self) -> list[int]:
        """The model worker processes' ids (none when passes run in a thread of this process)."""
        return [slot.pid for slot in self.slots if slot.pid is not None]

    @property
    def alive(self) -> bool:
        return all(slot.alive for slot in self.slots)

    async def start(self) -> None:
        if self._task is None:
            self._wakeup = asyncio.Event()
            self._free = asyncio.Queue()
            for slot in self.slots:
                self._free.put_nowait(slot)
            self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        for job in self.jobs:  # normally none: the server stops after every request was answered
            if not job.future.done():
                job.future.set_exception(QueueFull("the server is shutting down", 1))
        self.jobs.clear()
        self.queued_texts = 0
        for slot in self.slots:
            slot.close()

    # -------------------------------------------------------------- admission
    def estimated_wait(self, extra_texts: int = 0) -> float:
        """Seconds until ``extra_texts`` more would be answered, by the recent seconds per text."""
        return (self.queued_texts + self.running_texts + extra_texts) * (self.seconds_per_text or 0.0)

    def retry_after(self) -> int:
        return int(min(60, max(1, math.ceil(self.estimated_wait()))))

    def admit(self, n: int, budget: float | None = None) -> None:
        """Raise :class:`QueueFull` unless ``n`` more texts fit (count and, when others wait, time)."""
        if self.queued_texts + n > self.max_queue:
            raise QueueFull(
                f"the queue is full ({self.queued_texts} texts waiting, limit {self.max_queue}); retry later",
                self.retry_after(),
            )
        budget = self.request_timeout if budget is None else budget
        if self.queued_texts and self.estimated_wait(n) > budget:
            raise QueueFull(
                f"the queue holds about {self.estimated_wait():.1f} s of work, more than the "
                f"request timeout of {self.request_timeout:g} s; retry later",
                self.retry_after(),
            )

    @property
    def has_room(self) -> bool:
        return self.queued_texts < self.max_queue

    # -------------------------------------------------------------- requests
    async def predict(
        self, texts: list[str], k: int, deadline: float | None = None, decide: Ask | None = None
    ) -> list[dict[str, Any]]:
        """Rows for ``texts`` (``decide``: the request's decision settings); :class:`QueueFull` at once
        when they do not fit, :class:`RequestTimeout` when ``deadline`` (``loop.time()``) passes first
        (their texts then leave the queue)."""
        await self.start()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.request_timeout if deadline is None else deadline
        self.admit(len(texts), budget=deadline - loop.time())
        job = _Job(texts, k, loop.create_future(), decide)
        self.jobs.append(job)
        self.queued_texts += len(texts)
        self._wakeup.set()
        try:
            return await asyncio.wait_for(job.future, timeout=max(0.0, deadline - loop.time()))
        except TimeoutError:
            self._unqueue(job)
            raise RequestTimeout(
                f"no answer within the request timeout of {self.request_timeout:g} s "
                f"({self.queued_texts} texts still queued)"
            ) from None
        except asyncio.CancelledError:  # the client went away
            self._unqueue(job)
            raise

    def _unqueue(self, job: _Job) -> None:
        if job.queued:
            job.queued = False
            self.queued_texts -= len(job.texts)

    def _take(self) -> list[_Job]:
        """The next pass: queued requests in order, up to ``max_batch`` texts (at least one request),
        all with the same decision settings (one forward pass applies one)."""
        batch, size = [], 0
        while self.jobs and (not batch or self._joins(batch, size)):
            job = self.jobs.popleft()
            was_queued = job.queued
            self._unqueue(job)
            if not was_queued or job.future.done():  # timed out or abandoned while it waited
                continue
            batch.append(job)
            size += len(job.texts)
        return batch

    def _joins(self, batch: list[_Job], size: int) -> bool:
        head = self.jobs[0]
        # a request already answered or abandoned is always taken off (its settings do not matter)
        same = head.decide == batch[0].decide or not head.queued or head.future.done()
        return same and size + len(head.texts) <= self.max_batch

    async def _loop(self) -> None:
        while True:
            while not self.jobs:
                self._wakeup.clear()
                await self._wakeup.wait()
            slot = await self._free.get()  # meanwhile more requests queue up: a bigger pass
            batch = self._take()
            if not batch:
                self._free.put_nowait(slot)
                continue
            task = asyncio.create_task(self._pass(slot, batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _pass(self, slot: Any, batch: list[_Job]) -> None:
        texts = [t for job in batch for t in job.texts]
        k = max(job.k for job in batch)
        self.running_texts += len(texts)
        start = time.perf_counter()
        try:
            rows = await slot.run(texts, k, dict(batch[0].decide.settings))
        except Exception as e:
            self.metrics.predict_errors.inc()
            log.error("forward pass over %d texts failed: %s", len(texts), e, exc_info=not isinstance(e, WorkerDied))
            for job in batch:
                if not job.future.done():
                    job.future.set_exception(e)
            return
        finally:
            self.running_texts -= len(texts)
            self._free.put_nowait(slot)
        self._record(len(batch), len(texts), time.perf_counter() - start)
        start_row = 0
        for job in batch:  # each request gets its rows, the k best cut to its own k (rows are sorted)
            part = rows[start_row : start_row + len(job.texts)]
            start_row += len(job.texts)
            if not job.future.done():
                job.future.set_result([{key: value[: job.cut] for key, value in row.items()} for row in part])

    def _record(self, requests: int, texts: int, elapsed: float) -> None:
        """A pass's figures: the moving seconds per text (admission), the stats, the metrics."""
        if texts:  # per text of one worker: with several workers the queue drains that much faster
            per_text = elapsed / texts / len(self.slots)
            self.seconds_per_text = (
                per_text if self.seconds_per_text is None else 0.8 * self.seconds_per_text + 0.2 * per_text
            )
        self.stats["requests"] += requests
        self.stats["batches"] += 1
        self.stats["texts"] += texts
        self.metrics.forward_pass(texts, elapsed)
