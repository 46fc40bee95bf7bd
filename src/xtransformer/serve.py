"""HTTP server for a saved model folder (FastAPI + uvicorn).

    xmc-serve --model outputs/train/runs/<date>/model                        # 127.0.0.1:8000
    xmc-serve --model RUN/model --host 0.0.0.0 --api-key-file keys.txt        # reachable, with keys

Endpoints: ``POST /predict`` ``{"texts": [...], "k": 5}`` -> ``{"predictions": [{labels, names,
scores}, ...]}`` (a calibrated model adds ``probabilities``, and takes ``decision``,
``threshold``, ``min_labels``, ``max_labels``: the decided labels instead of the k best);
``GET /`` a page to try the model; ``GET /health`` (liveness), ``GET /ready`` (model loaded,
queue below its limit, not shutting down), ``GET /metrics`` (Prometheus text format),
``GET /labels``; OpenAPI at ``/openapi.json`` and ``/docs``.

Under load: one worker thread runs the model; while it is busy, arriving requests queue and the
next forward pass takes all of them at once (up to ``--max-batch`` texts), so a lone request never
waits for company and many small requests share few passes. The queue is bounded
(``--max-queue`` texts): a request that does not fit is refused at once with ``503`` and
``Retry-After``, and so is one that would wait longer than ``--request-timeout`` by the recent pass
times; a request still unanswered at ``--request-timeout`` gets ``504`` (its texts leave the queue).
SIGTERM (or Ctrl+C) stops accepting connections, answers every queued request, then exits 0.

Hostile input: size limits (body bytes, texts per request, characters per text, k), malformed
JSON and schema errors get a 4xx whose JSON body is ``{"error": one line, "field": where}``;
``--api-key-file`` (one key a line) requires ``Authorization: Bearer <key>`` on everything but
the page, ``/health``, ``/ready`` and the docs; keys are compared in constant time. Without
``--host`` the server listens on 127.0.0.1 only, and says so when it starts.
"""

# no `from __future__ import annotations`: FastAPI reads the request model from the real annotation
import argparse
import asyncio
import bisect
import collections
import contextlib
import hashlib
import hmac
import ipaddress
import logging
import math
import os
import signal
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
PAGE = "serve_page.html"
# paths anyone may call when keys are required: probes, the page itself (it asks for a key) and the docs
PUBLIC_PATHS = frozenset(
    {"/", "/health", "/ready", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc", "/favicon.ico"}
)
ROUTES = ("/", "/predict", "/health", "/ready", "/metrics", "/labels", "/openapi.json", "/docs")


@dataclass
class Limits:
    max_texts: int = 256  # texts per request
    max_text_chars: int = 100_000  # characters per text
    max_k: int = 100  # labels per text
    max_body_bytes: int = 16 << 20
    max_batch: int = 1024  # texts per forward pass (several requests together)
    max_queue: int = 4096  # texts waiting for a forward pass; beyond: 503
    request_timeout: float = 30.0  # seconds from arrival to answer; beyond: 504

    def check(self) -> None:
        for name in ("max_texts", "max_text_chars", "max_k", "max_body_bytes", "max_batch", "max_queue"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.max_queue < self.max_texts:
            raise ValueError(
                f"--max-queue ({self.max_queue} texts) must hold one full request (--max-texts {self.max_texts})"
            )
        if not self.request_timeout > 0:
            raise ValueError(f"--request-timeout must be > 0 seconds, got {self.request_timeout}")


class QueueFull(Exception):
    """The request does not fit the queue: answer 503 with ``Retry-After`` (seconds)."""

    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


class RequestTimeout(Exception):
    """No answer within the request timeout: 504."""


# ---------------------------------------------------------------------------------------------- metrics
class Histogram:
    def __init__(self, buckets: Sequence[float]):
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)  # the last one: +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str, labels: str = "") -> list[str]:
        out, cum = [], 0
        sep = "," if labels else ""
        for bound, n in zip([*self.buckets, math.inf], self.counts):
            cum += n
            le = "+Inf" if bound == math.inf else repr(float(bound))
            out.append(f'{name}_bucket{{{labels}{sep}le="{le}"}} {cum}')
        braces = f"{{{labels}}}" if labels else ""
        out += [f"{name}_sum{braces} {self.sum!r}", f"{name}_count{braces} {self.count}"]
        return out


class Metrics:
    """Counters, gauges and histograms in the Prometheus text format (0.0.4), written by hand.
    Every update happens on the event loop's thread."""

    LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
    BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)

    def __init__(self) -> None:
        self.requests: collections.Counter[tuple[str, int]] = collections.Counter()  # (path, status)
        self.rejected: collections.Counter[str] = collections.Counter()  # reason
        self.latency: dict[str, Histogram] = {}
        self.batch_texts = Histogram(self.BATCH_BUCKETS)
        self.batch_seconds = Histogram(self.LATENCY_BUCKETS)
        self.texts = 0
        self.predict_errors = 0
        self.started = time.time()

    def request(self, path: str, status: int, seconds: float) -> None:
        self.requests[(path, status)] += 1
        if path not in self.latency:
            self.latency[path] = Histogram(self.LATENCY_BUCKETS)
        self.latency[path].observe(seconds)

    def render(self, batcher: "MicroBatcher", model: Any, ready: bool) -> str:
        def head(name: str, kind: str, text: str) -> list[str]:
            return [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]

        out = head("xmc_http_requests_total", "counter", "HTTP requests answered, by path and status code")
        out += [f'xmc_http_requests_total{{path="{p}",code="{s}"}} {n}' for (p, s), n in sorted(self.requests.items())]
        out += head("xmc_http_request_duration_seconds", "histogram", "time from arrival to the answer, by path")
        for path, hist in sorted(self.latency.items()):
            out += hist.lines("xmc_http_request_duration_seconds", f'path="{path}"')
        out += head("xmc_rejected_total", "counter", "predict requests refused: queue_full, timeout (504), draining")
        out += [
            f'xmc_rejected_total{{reason="{r}"}} {self.rejected.get(r, 0)}'
            for r in sorted({"queue_full", "timeout", "draining", *self.rejected})
        ]
        out += head("xmc_texts_total", "counter", "texts predicted")
        out += [f"xmc_texts_total {self.texts}"]
        out += head("xmc_predict_errors_total", "counter", "forward passes that raised")
        out += [f"xmc_predict_errors_total {self.predict_errors}"]
        out += head("xmc_batch_texts", "histogram", "texts per forward pass (requests batched together)")
        out += self.batch_texts.lines("xmc_batch_texts")
        out += head("xmc_batch_duration_seconds", "histogram", "wall time of a forward pass")
        out += self.batch_seconds.lines("xmc_batch_duration_seconds")
        out += head("xmc_queue_texts", "gauge", "texts waiting for a forward pass")
        out += [f"xmc_queue_texts {batcher.queued_texts}"]
        out += head("xmc_queue_requests", "gauge", "requests waiting for a forward pass")
        out += [f"xmc_queue_requests {len(batcher.jobs)}"]
        out += head("xmc_running_texts", "gauge", "texts in the forward pass running now")
        out += [f"xmc_running_texts {batcher.running_texts}"]
        out += head("xmc_queue_limit_texts", "gauge", "--max-queue")
        out += [f"xmc_queue_limit_texts {batcher.max_queue}"]
        out += head("xmc_workers", "gauge", "forward passes that can run at once (model workers)")
        out += [f"xmc_workers {batcher.workers}"]
        out += head("xmc_ready", "gauge", "1 when /ready answers 200")
        out += [f"xmc_ready {int(ready)}"]
        out += head("xmc_model_info", "gauge", "the model served")
        out += [f'xmc_model_info{{method="{_label_value(model.method)}",n_labels="{model.n_labels}"}} 1']
        rss, cpu = process_rss_cpu()
        out += head("process_resident_memory_bytes", "gauge", "resident set size")
        out += [f"process_resident_memory_bytes {rss}"]
        out += head("process_cpu_seconds_total", "counter", "user + system CPU time of the server process")
        out += [f"process_cpu_seconds_total {cpu!r}"]
        out += head("process_start_time_seconds", "gauge", "start time, seconds since the epoch")
        out += [f"process_start_time_seconds {self.started!r}"]
        return "\n".join(out) + "\n"


def _label_value(text: str) -> str:
    return str(text).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def process_rss_cpu(pid: int | str = "self") -> tuple[int, float]:
    """(resident bytes, user + system CPU seconds) of a process, from /proc (0s where there is none)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        rss = next(int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmRSS:"))
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return rss, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, ValueError, IndexError):
        return 0, time.process_time() if pid == "self" else 0.0


# ---------------------------------------------------------------------------------------------- batching
@dataclass(frozen=True)
class Ask:
    """A request's decision settings (a calibrated model's ``decision``, ``threshold``, ``min_labels``,
    ``max_labels``; unset: the folder's) and whether they ask for decided label sets."""

    settings: tuple[tuple[str, Any], ...] = ()
    decided: bool = False

    @classmethod
    def of(cls, model: Any, fields: dict[str, Any]) -> "Ask":
        """Checked against ``model`` (a ValueError names the field); nothing to check for a plain request."""
        given = {k: v for k, v in fields.items() if v is not None}
        if not given and not getattr(model, "decides", False):
            return cls()
        settings = model.settings(given)
        return cls(tuple(sorted(given.items())), settings.get("decision", "topk") != "topk")


class _Job:
    __slots__ = ("texts", "k", "future", "queued", "decide", "cut")

    def __init__(self, texts: list[str], k: int, future: asyncio.Future, decide: "Ask | None" = None):
        self.texts, self.k, self.future, self.queued = texts, k, future, True
        self.decide = decide or Ask()  # the request's decision settings; a pass shares one
        self.cut = None if self.decide.decided else k  # rows of the k best are cut to the request's k


class _ThreadSlot:
    """Runs the model's forward passes in one thread of this process."""

    def __init__(self, model: Any):
        self.model = model
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="xmc-model")

    @property
    def alive(self) -> bool:
        return True

    async def run(self, texts: list[str], k: int, decide: Ask) -> list[dict[str, Any]]:
        return await asyncio.get_running_loop().run_in_executor(self.executor, self._predict, texts, k, decide)

    def _predict(self, texts: list[str], k: int, decide: Ask) -> list[dict[str, Any]]:
        return self.model.predict(texts, k=k, **dict(decide.settings)) if texts else []

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


class WorkerDied(RuntimeError):
    pass


def _worker_main(conn: Any, model: Any, overrides: dict[str, Any], threads: int) -> None:
    """A forked model worker: answers ``(texts, k)`` on its pipe until the pipe closes. It ignores
    SIGINT / SIGTERM (a signal to the whole process group must not cut the server's drain short)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)
    with contextlib.suppress(Exception):
        model.predict(["warm up"], k=1, **overrides)
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            break
        if message is None:
            break
        texts, k, decide = message
        try:
            reply = (True, model.predict(texts, k=k, **overrides, **decide) if texts else [])
        except Exception as e:
            reply = (False, f"{type(e).__name__}: {e}")
        try:
            conn.send(reply)
        except (OSError, ValueError):
            break


class _ProcessSlot:
    """A worker process forked after the model was loaded (its arrays shared copy-on-write), fed
    over a pipe; one thread of this process waits on the pipe without holding the GIL."""

    def __init__(self, model: Any, overrides: dict[str, Any], threads: int):
        import multiprocessing

        ctx = multiprocessing.get_context("fork")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=_worker_main, args=(child, model, overrides, threads), daemon=True, name="xmc-model-worker"
        )
        self.proc.start()
        child.close()
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="xmc-worker-pipe")

    @property
    def alive(self) -> bool:
        return self.proc.is_alive()

    async def run(self, texts: list[str], k: int, decide: Ask) -> list[dict[str, Any]]:
        return await asyncio.get_running_loop().run_in_executor(self.executor, self._call, texts, k, decide)

    def _call(self, texts: list[str], k: int, decide: Ask) -> list[dict[str, Any]]:
        try:
            self.conn.send((texts, k, dict(decide.settings)))
            ok, value = self.conn.recv()
        except (EOFError, OSError, BrokenPipeError) as e:
            raise WorkerDied(
                f"model worker {self.proc.pid} died ({type(e).__name__}; exit code {self.proc.exitcode})"
            ) from None
        if not ok:
            raise RuntimeError(value)
        return value

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.conn.send(None)
        self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(timeout=5)
        self.conn.close()
        self.executor.shutdown(wait=False, cancel_futures=True)


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
        metrics: Metrics | None = None,
        workers: int = 1,
    ):
        self.model = model  # XMCModel (anything with predict(texts, k=...))
        self.max_batch, self.max_queue, self.request_timeout = max_batch, max_queue, request_timeout
        self.metrics = metrics or Metrics()
        self.stats = {"requests": 0, "batches": 0, "texts": 0}
        self.jobs: collections.deque[_Job] = collections.deque()
        self.queued_texts = 0  # texts of the jobs in `jobs` still waiting
        self.running_texts = 0
        self.seconds_per_text: float | None = None  # moving average over recent passes
        if workers <= 1:
            self.slots: list[Any] = [_ThreadSlot(model)]
        else:  # forked now, before the server starts any thread
            import gc

            gc.collect()
            gc.freeze()  # the model's objects: never scanned by the workers' collector, so their pages stay shared
            threads = max(1, (os.cpu_count() or 1) // workers)
            settings = getattr(model, "predict_settings", {}) or {}
            overrides = {"threads": threads} if "threads" in settings else {}
            self.slots = [_ProcessSlot(model, overrides, threads) for _ in range(workers)]
        self._free: asyncio.Queue | None = None
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._running: set[asyncio.Task] = set()

    @property
    def workers(self) -> int:
        return len(self.slots)

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
            rows = await slot.run(texts, k, batch[0].decide)
        except Exception as e:
            self.metrics.predict_errors += 1
            log.error("forward pass over %d texts failed: %s", len(texts), e, exc_info=not isinstance(e, WorkerDied))
            for job in batch:
                if not job.future.done():
                    job.future.set_exception(e)
            return
        finally:
            self.running_texts -= len(texts)
            self._free.put_nowait(slot)
        elapsed = time.perf_counter() - start
        if texts:  # per text of one worker: with several workers the queue drains that much faster
            per_text = elapsed / len(texts) / len(self.slots)
            self.seconds_per_text = (
                per_text if self.seconds_per_text is None else 0.8 * self.seconds_per_text + 0.2 * per_text
            )
        self.stats["requests"] += len(batch)
        self.stats["batches"] += 1
        self.stats["texts"] += len(texts)
        self.metrics.texts += len(texts)
        self.metrics.batch_texts.observe(len(texts))
        self.metrics.batch_seconds.observe(elapsed)
        start_row = 0
        for job in batch:  # each request gets its rows, the k best cut to its own k (rows are sorted)
            part = rows[start_row : start_row + len(job.texts)]
            start_row += len(job.texts)
            if not job.future.done():
                job.future.set_result([{key: value[: job.cut] for key, value in row.items()} for row in part])


# ---------------------------------------------------------------------------------------------- keys
def read_api_keys(path: str | os.PathLike) -> list[bytes]:
    """The sha256 of every key in ``path`` (one a line; blank lines and ``#`` comments skipped)."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--api-key-file {path}: cannot read it ({e})") from None
    keys = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if not keys:
        raise ValueError(f"--api-key-file {path}: no keys in it (one key a line)")
    for i, key in enumerate(keys):
        if any(c.isspace() for c in key) or not key.isprintable() or not key.isascii():
            raise ValueError(f"--api-key-file {path}: key {i + 1} holds whitespace or non-printable characters")
    return [hashlib.sha256(k.encode()).digest() for k in keys]


def key_matches(header: str | None, key_hashes: Sequence[bytes]) -> bool:
    """Whether ``Authorization: Bearer <key>`` names one of the keys; the time taken does not depend
    on which key or how much of it matched (fixed-length digests, every key compared)."""
    if not header:
        return False
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return False
    digest = hashlib.sha256(token.strip().encode("utf-8", "surrogatepass")).digest()
    found = False
    for key in key_hashes:
        found |= hmac.compare_digest(digest, key)
    return found


# ---------------------------------------------------------------------------------------------- app
def _json_error(status: int, message: str, field: str | None = None, headers: dict[str, str] | None = None) -> Any:
    from fastapi.responses import JSONResponse

    body: dict[str, Any] = {"error": message.replace("\n", " ")}
    if field is not None:
        body["field"] = field
    return JSONResponse(status_code=status, content=body, headers=headers)


def _field_path(loc: Sequence[Any]) -> str:
    """``("body", "texts", 3)`` -> ``texts[3]``; ``("query", "limit")`` -> ``limit``."""
    parts = [p for p in loc if p not in ("body", "query", "path", "header")] if len(loc) > 1 else list(loc)
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "body"


def _valid_unicode(text: str) -> str:
    """``text`` with lone surrogates (JSON allows ``"\\ud800"``; tokenizers do not) replaced by '?'."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")


def _body_too_large(limit: int) -> Exception:
    """Raised from ``receive`` as the body arrives: an HTTPException, so FastAPI passes it on as is."""
    from starlette.exceptions import HTTPException

    exc = HTTPException(413, f"request body exceeds the limit of {limit} bytes")
    exc.field = "body"  # type: ignore[attr-defined]
    return exc


class _Guard:
    """Pure ASGI middleware around every request: start time (for the request timeout), body size
    limit (declared and streamed), API keys, refusing new predictions while shutting down, a JSON
    500 for anything unexpected (one line; the traceback goes to the log), and request metrics."""

    def __init__(self, app: Any, server: "ServerState"):
        self.app = app
        self.s = server

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        s = self.s
        t0 = time.monotonic()
        scope["xmc_t0"] = asyncio.get_running_loop().time()
        path = scope.get("path", "")
        label = path if path in ROUTES else "other"
        status = [0]

        async def send_status(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                if s.draining:
                    message.setdefault("headers", [])
                    message["headers"] = [*message["headers"], (b"connection", b"close")]
            await send(message)

        try:
            response = self._refuse(scope, path)
            if response is not None:
                return await response(scope, receive, send_status)
            limit, seen = s.limits.max_body_bytes, 0

            async def receive_limited() -> dict:
                nonlocal seen
                message = await receive()
                if message["type"] == "http.request":
                    seen += len(message.get("body", b""))
                    if seen > limit:
                        raise _body_too_large(limit)
                return message

            await self.app(scope, receive_limited, send_status)
        except Exception:
            log.exception("error while answering %s %s", scope.get("method"), path)
            if not status[0]:
                await _json_error(500, "internal error (the server log has the details)")(scope, receive, send_status)
        finally:
            s.metrics.request(label, status[0] or 500, time.monotonic() - t0)

    def _refuse(self, scope: dict, path: str) -> Any:
        s = self.s
        if s.key_hashes and path not in PUBLIC_PATHS:
            header = None
            for name, value in scope.get("headers", ()):
                if name == b"authorization":
                    header = value.decode("latin-1")
                    break
            if not key_matches(header, s.key_hashes):
                return _json_error(
                    401,
                    "missing or wrong API key: send 'Authorization: Bearer <key>'",
                    "Authorization",
                    {"WWW-Authenticate": "Bearer"},
                )
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                size = value.decode("latin-1").strip()
                if not size.isdigit():
                    return _json_error(400, f"bad Content-Length {size!r}", "Content-Length")
                if int(size) > s.limits.max_body_bytes:
                    return _json_error(
                        413, f"request body of {size} bytes exceeds the limit of {s.limits.max_body_bytes}", "body"
                    )
        if s.draining and path == "/predict":
            s.metrics.rejected["draining"] += 1
            return _json_error(
                503, "the server is shutting down; retry on another instance", None, {"Retry-After": "1"}
            )
        return None


@dataclass
class ServerState:
    limits: Limits
    metrics: Metrics
    key_hashes: list[bytes]
    draining: bool = False


@dataclass
class Served:
    """What every route of one app reads: the model, its batcher, limits, metrics and state."""

    model: Any
    batcher: MicroBatcher
    limits: Limits
    metrics: Metrics
    state: ServerState
    manifest: dict[str, Any]
    loaded: dict[str, bool]
    schemas: Any  # the request / response models (:func:`api_schemas`)

    def is_ready(self) -> tuple[bool, str]:
        if not self.loaded["ready"]:
            return False, "model not loaded yet"
        if not self.batcher.alive:
            return False, "a model worker died"
        if self.state.draining:
            return False, "shutting down"
        if not self.batcher.has_room:
            return False, f"queue full ({self.batcher.queued_texts} of {self.batcher.max_queue} texts)"
        return True, "ok"

    def errors(self, *codes: int) -> dict[int | str, dict[str, Any]]:
        """OpenAPI responses of ``codes``, each with the error body's schema."""
        what = {
            400: "malformed request",
            401: "missing or wrong API key",
            413: "request too large",
            422: "invalid field",
            503: "queue full or shutting down (see Retry-After)",
            504: "no answer within the request timeout",
        }
        return {code: {"model": self.schemas.Error, "description": what[code]} for code in codes}


def api_schemas(limits: Limits) -> Any:
    """The request and response models of ``/predict`` and the error body, with the limits in them."""
    from types import SimpleNamespace
    from typing import Literal

    from pydantic import BaseModel, ConfigDict, Field

    class PredictRequest(BaseModel):
        model_config = ConfigDict(extra="forbid")
        texts: list[str] = Field(
            description=f"documents to label: at most {limits.max_texts} texts of at most "
            f"{limits.max_text_chars} characters (more: 413)",
            json_schema_extra={
                "maxItems": limits.max_texts,
                "items": {"type": "string", "maxLength": limits.max_text_chars},
            },
        )
        k: int = Field(
            5,
            description=f"labels per document, 1..{limits.max_k} (the k best; not used by decisions)",
            json_schema_extra={"minimum": 1, "maximum": limits.max_k},
        )
        decision: Literal["topk", "threshold", "per_label"] | None = Field(
            None,
            description="a calibrated model: topk (the k best), threshold (every label whose probability "
            "reaches `threshold`) or per_label (each label's tuned threshold); default: the model's",
        )
        threshold: float | None = Field(None, description="a probability in [0, 1]; alone it asks for decisions")
        min_labels: int | None = Field(None, description="labels a document always gets (its most probable)")
        max_labels: int | None = Field(None, description="labels a document gets at most")

        def decision_fields(self) -> dict[str, Any]:
            return {k: getattr(self, k) for k in ("decision", "threshold", "min_labels", "max_labels")}

    class Prediction(BaseModel):
        labels: list[str]
        names: list[str]
        scores: list[float]
        probabilities: list[float] | None = Field(None, description="a calibrated model's probability of each label")

    class PredictResponse(BaseModel):
        predictions: list[Prediction]

    class Error(BaseModel):
        error: str = Field(description="what was wrong, one line")
        field: str | None = Field(None, description="the request field at fault, e.g. texts[3], k, body")

    return SimpleNamespace(PredictRequest=PredictRequest, PredictResponse=PredictResponse, Error=Error)


def create_app(
    model: Any,
    limits: Limits | None = None,
    api_keys: Sequence[bytes] | None = None,
    warm_up: bool = True,
    workers: int = 1,
) -> Any:
    """The FastAPI app serving ``model`` (an :class:`xtransformer.model.XMCModel`); ``api_keys``:
    sha256 digests of the accepted keys (:func:`read_api_keys`), none: no keys needed; ``workers``:
    forward passes at once, in worker processes forked here (1: a thread of this process)."""
    from fastapi import FastAPI

    limits = limits or Limits()
    limits.check()
    metrics = Metrics()
    batcher = MicroBatcher(
        model,
        max_batch=limits.max_batch,
        max_queue=limits.max_queue,
        request_timeout=limits.request_timeout,
        metrics=metrics,
        workers=workers,
    )
    manifest = getattr(model, "manifest", None) or {}  # not part of the model's promised surface: optional
    srv = Served(
        model,
        batcher,
        limits,
        metrics,
        ServerState(limits, metrics, list(api_keys or [])),
        manifest,
        {"ready": False},
        api_schemas(limits),
    )
    app = FastAPI(
        title="xtransformer model server",
        version=str(manifest.get("library_version", "unknown")),
        description=f"{model.method} model, {model.n_labels} labels",
        lifespan=_lifespan(srv, warm_up),
    )
    app.state.batcher = batcher
    app.state.server = srv.state
    _error_handlers(app)
    _predict_route(app, srv)
    _status_routes(app, srv)
    _info_routes(app, srv)
    app.openapi = lambda: _openapi(app, srv.state)
    app.add_middleware(_Guard, server=srv.state)
    return app


def _lifespan(srv: Served, warm_up: bool) -> Any:
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app: Any):
        await srv.batcher.start()
        if warm_up:  # the first pass pays for lazy imports and allocations, not the first client
            try:
                await srv.batcher.predict(["warm up"], 1)
            except Exception as e:
                log.warning("warm-up prediction failed: %s", e)
        srv.loaded["ready"] = True
        yield
        srv.loaded["ready"] = False
        await srv.batcher.stop()

    return lifespan


def _error_handlers(app: Any) -> None:
    """Every 4xx as a JSON body naming the field at fault."""
    from fastapi import Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        errs = exc.errors()
        first = errs[0] if errs else {}
        if first.get("type") == "json_invalid":
            return _json_error(400, f"malformed JSON: {first.get('ctx', {}).get('error', first.get('msg'))}", "body")
        where = _field_path(first.get("loc", ()))
        msg = str(first.get("msg", "invalid request"))
        ctype = request.headers.get("content-type", "")
        if where == "body" and "json" not in ctype.lower():
            msg = f"send a JSON object with Content-Type: application/json (got {ctype or 'no Content-Type'})"
        more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
        return _json_error(422, f"{where}: {msg}{more}", where)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        field, detail = getattr(exc, "field", None), str(exc.detail)
        if exc.status_code == 400 and field is None:  # FastAPI could not decode the body (not UTF-8 JSON)
            field, detail = "body", f"malformed request body: not UTF-8 JSON ({detail.lower()})"
        return _json_error(exc.status_code, detail, field, getattr(exc, "headers", None))


def _predict_route(app: Any, srv: Served) -> None:
    from fastapi import Request
    from fastapi.responses import JSONResponse

    limits, S = srv.limits, srv.schemas
    PredictRequest = S.PredictRequest

    @app.post("/predict", response_model=S.PredictResponse, responses=srv.errors(400, 401, 413, 422, 503, 504))
    async def predict(req: PredictRequest, request: Request) -> Any:
        if len(req.texts) > limits.max_texts:
            return _json_error(413, f"{len(req.texts)} texts in one request; the limit is {limits.max_texts}", "texts")
        for i, text in enumerate(req.texts):
            if len(text) > limits.max_text_chars:
                return _json_error(
                    413, f"texts[{i}] has {len(text)} characters; the limit is {limits.max_text_chars}", f"texts[{i}]"
                )
        if not 1 <= req.k <= limits.max_k:
            return _json_error(422, f"k must be between 1 and {limits.max_k}, got {req.k}", "k")
        fields = req.decision_fields()
        try:
            decide = Ask.of(srv.model, fields)
        except ValueError as e:  # no calibrator, or a value out of range: the message names the field
            where = next((k for k in fields if str(e).startswith(k)), "body")
            return _json_error(422, str(e), where)
        t0 = request.scope.get("xmc_t0") or asyncio.get_running_loop().time()
        try:
            rows = await srv.batcher.predict(
                [_valid_unicode(t) for t in req.texts], req.k, deadline=t0 + limits.request_timeout, decide=decide
            )
        except QueueFull as e:
            srv.metrics.rejected["queue_full"] += 1
            return _json_error(503, str(e), None, {"Retry-After": str(e.retry_after)})
        except RequestTimeout as e:
            srv.metrics.rejected["timeout"] += 1
            return _json_error(504, str(e))
        return JSONResponse({"predictions": rows})


def _status_routes(app: Any, srv: Served) -> None:
    """``/health``, ``/ready`` and ``/metrics``."""
    from fastapi.responses import JSONResponse, PlainTextResponse

    model, batcher, limits = srv.model, srv.batcher, srv.limits

    @app.get("/health", responses={503: {"model": srv.schemas.Error, "description": "a model worker died"}})
    async def health() -> Any:
        """Liveness: the process answers and its model workers live (200 whatever the queue)."""
        if not batcher.alive:
            return _json_error(503, "a model worker died; restart the server")
        return {
            "status": "ok",
            "method": model.method,
            "workers": batcher.workers,
            "n_labels": model.n_labels,
            "calibrated": bool(getattr(model, "decides", False)),
            "format_version": srv.manifest.get("format_version"),
            "batching": dict(batcher.stats),
            "queue_texts": batcher.queued_texts,
            "auth": bool(srv.state.key_hashes),
            "limits": {
                "max_texts": limits.max_texts,
                "max_text_chars": limits.max_text_chars,
                "max_k": limits.max_k,
                "max_queue": limits.max_queue,
                "request_timeout": limits.request_timeout,
            },
        }

    @app.get("/ready", responses={503: {"model": srv.schemas.Error, "description": "not ready"}})
    async def ready() -> Any:
        """Readiness: the model is loaded, the queue is below its limit and the server is not shutting down."""
        ok, why = srv.is_ready()
        body = {"ready": ok, "queue_texts": batcher.queued_texts, "max_queue": batcher.max_queue}
        return JSONResponse(body) if ok else JSONResponse({"error": why, **body}, status_code=503)

    @app.get("/metrics", response_class=PlainTextResponse, responses=srv.errors(401))
    async def prometheus() -> PlainTextResponse:
        """Prometheus text format: requests, texts, batch sizes, queue depth, latency histograms."""
        return PlainTextResponse(
            srv.metrics.render(batcher, model, srv.is_ready()[0]), media_type="text/plain; version=0.0.4; charset=utf-8"
        )


def _info_routes(app: Any, srv: Served) -> None:
    """``/labels`` (the label space, paged) and the page at ``/``."""
    from fastapi import Query
    from fastapi.responses import HTMLResponse

    model = srv.model

    @app.get("/labels", responses=srv.errors(401, 422))
    async def labels(
        offset: int = Query(0, ge=0, description="first label index"),
        limit: int | None = Query(None, ge=0, description="labels to return (default: all)"),
    ) -> dict[str, Any]:
        end = None if limit is None else offset + limit
        return {
            "n_labels": model.n_labels,
            "offset": offset,
            "ids": model.label_ids[offset:end],
            "names": model.label_names[offset:end],
        }

    page = page_html()

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index() -> HTMLResponse:
        return HTMLResponse(page)


def _openapi(app: Any, state: ServerState) -> dict[str, Any]:
    """The schema, with the keys (when required) as a bearer security scheme of the guarded paths."""
    from fastapi.openapi.utils import get_openapi

    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        if state.key_hashes:
            schema.setdefault("components", {})["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
            for path, ops in schema.get("paths", {}).items():
                if path not in PUBLIC_PATHS:
                    for op in ops.values():
                        op["security"] = [{"bearer": []}]
        app.openapi_schema = schema
    return app.openapi_schema


def page_html() -> str:
    from importlib.resources import files

    return files("xtransformer").joinpath(PAGE).read_text(encoding="utf-8")


# ---------------------------------------------------------------------------------------------- running
def make_server(app: Any, host: str, port: int, log_level: str = "warning", drain_timeout: float | None = None) -> Any:
    """A uvicorn server whose SIGTERM / SIGINT stop accepting connections, let every queued request
    be answered, and end the process with status 0 (uvicorn itself re-raises the signal)."""
    import uvicorn

    state: ServerState | None = getattr(app.state, "server", None)
    timeout = (
        drain_timeout if drain_timeout is not None else (state.limits.request_timeout + 10 if state is not None else 30)
    )

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if state is not None and not state.draining:
                state.draining = True
                print(
                    f"xmc-serve: signal {sig}: not accepting connections, answering "
                    f"{app.state.batcher.queued_texts} queued texts, then exiting",
                    file=sys.stderr,
                    flush=True,
                )
            if self.should_exit:  # a second signal: stop now
                self.force_exit = True
            self.should_exit = True

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=timeout,
        access_log=log_level in ("debug", "trace", "info"),
    )
    return Server(config)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="xmc-serve",
        description="Serve a saved model folder over HTTP: POST /predict, "
        "a page to try it at /, GET /health, /ready, /metrics, /labels, docs at /docs.",
    )
    p.add_argument("--model", required=True, help="a method folder, a run's model/ folder or a run folder")
    p.add_argument("--method", default=None, help="which method of a run's model/ folder (default: the main one)")
    p.add_argument(
        "--host",
        default=None,
        help=f"address to listen on (default {DEFAULT_HOST}: this machine only; 0.0.0.0: every interface)",
    )
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--api-key-file",
        default=None,
        help="require 'Authorization: Bearer <key>' with one of the keys in this file (one a line)",
    )
    d = Limits()
    p.add_argument("--max-texts", type=int, default=d.max_texts, help="texts per request (more: 413)")
    p.add_argument("--max-text-chars", type=int, default=d.max_text_chars, help="characters per text (more: 413)")
    p.add_argument("--max-k", type=int, default=d.max_k, help="labels per text")
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes, help="request body size (more: 413)")
    p.add_argument("--max-batch", type=int, default=d.max_batch, help="texts per forward pass")
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="forward passes at once, each in a worker process forked after loading the model (its "
        "arrays shared); for models whose prediction holds the GIL, e.g. XR-Linear's TF-IDF. "
        "Default 1: one model thread in the server process",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        default=d.max_queue,
        help="texts waiting for a forward pass; a request that does not fit gets 503 + Retry-After",
    )
    p.add_argument(
        "--request-timeout",
        type=float,
        default=d.request_timeout,
        help="seconds from arrival to answer; a request still waiting then gets 504",
    )
    p.add_argument("--no-verify", action="store_true", help="skip the sha256 check of the model's files")
    p.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
    return p


def main(argv: Sequence[str] | None = None) -> int:
    return serve(parser().parse_args(argv))


def announce(args: argparse.Namespace, model: Any, host: str, keys: Sequence[bytes]) -> None:
    """What is served, where, and who may call it (stderr, at start)."""
    where = "this machine only" if is_loopback(host) else "reachable from other machines"
    origin = "" if args.host else " (no --host given; --host 0.0.0.0 to listen on every interface)"
    print(f"xmc-serve: {model.method} model, {model.n_labels} labels, from {model.folder}", file=sys.stderr)
    print(f"xmc-serve: listening on http://{host}:{args.port}: {where}{origin}; try it at /", file=sys.stderr)
    if keys:
        print(
            f"xmc-serve: {len(keys)} API key(s) from {args.api_key_file}: requests need 'Authorization: Bearer <key>'",
            file=sys.stderr,
        )
    else:
        anyone = "" if is_loopback(host) else f"; anyone who can reach {host}:{args.port} can use the model"
        print(f"xmc-serve: no --api-key-file: requests are not authenticated{anyone}", file=sys.stderr)


def serve(args: argparse.Namespace, wrap_model: Any = None) -> int:
    """``main`` after parsing (``wrap_model``: tests wrap the loaded model, e.g. to slow it down)."""

    def fail(message: str) -> int:
        print(f"xmc-serve: error: {message}", file=sys.stderr)
        return 2

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    limits = Limits(
        args.max_texts,
        args.max_text_chars,
        args.max_k,
        args.max_body_bytes,
        args.max_batch,
        args.max_queue,
        args.request_timeout,
    )
    try:
        limits.check()
        keys = read_api_keys(args.api_key_file) if args.api_key_file else []
    except ValueError as e:
        return fail(str(e))
    if not 0 <= args.port <= 65535:
        return fail(f"--port must be 0..65535, got {args.port}")
    if not 1 <= args.workers <= 64:
        return fail(f"--workers must be 1..64, got {args.workers}")
    from xtransformer.model import XMCModel

    try:
        model = XMCModel.load(args.model, method=args.method, verify=not args.no_verify)
    except (ValueError, OSError) as e:
        return fail(str(e))
    except Exception as e:
        return fail(f"{args.model}: cannot load the model ({type(e).__name__}: {e})")
    if wrap_model is not None:
        model = wrap_model(model)
    host = args.host or DEFAULT_HOST
    announce(args, model, host, keys)
    sys.stderr.flush()
    if args.workers > 1:
        print(f"xmc-serve: {args.workers} model worker processes", file=sys.stderr)
    server = make_server(create_app(model, limits, keys, workers=args.workers), host, args.port, args.log_level)
    server.run()
    if not server.started:  # e.g. the port is taken (uvicorn logged why)
        return 1
    print("xmc-serve: stopped", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
