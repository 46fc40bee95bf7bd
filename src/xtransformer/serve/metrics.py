"""``GET /metrics``: the server's figures through prometheus_client, on a registry of each app's own
(two apps in one process never mix their counts): requests and their latency, refusals, forward
passes, the queue, the model, this process (memory, CPU, garbage collector) and each model worker
process."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_PLAIN_0_0_4,
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4  # the text format generate_latest writes
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
REJECT_REASONS = ("queue_full", "timeout", "draining")


class ServeMetrics:
    """The counters and histograms the server updates as it answers (on the event loop's thread),
    and, once :meth:`watch` names them, the gauges read from the batcher and the model at each scrape."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        ProcessCollector(registry=r)
        GCCollector(registry=r)
        self.requests = Counter(
            "xmc_http_requests", "HTTP requests answered, by path and status code", ["path", "code"], registry=r
        )
        self.latency = Histogram(
            "xmc_http_request_duration_seconds",
            "time from arrival to the answer, by path",
            ["path"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.rejected = Counter(
            "xmc_rejected", "predict requests refused: queue_full, timeout (504), draining", ["reason"], registry=r
        )
        for reason in REJECT_REASONS:  # every reason listed from the start, at 0
            self.rejected.labels(reason)
        self.texts = Counter("xmc_texts", "texts predicted", registry=r)
        self.predict_errors = Counter("xmc_predict_errors", "forward passes that raised", registry=r)
        self.batch_texts = Histogram(
            "xmc_batch_texts", "texts per forward pass (requests batched together)", buckets=BATCH_BUCKETS, registry=r
        )
        self.batch_seconds = Histogram(
            "xmc_batch_duration_seconds", "wall time of a forward pass", buckets=LATENCY_BUCKETS, registry=r
        )

    def request(self, path: str, status: int, seconds: float) -> None:
        self.requests.labels(path, str(status)).inc()
        self.latency.labels(path).observe(seconds)

    def reject(self, reason: str) -> None:
        self.rejected.labels(reason).inc()

    def forward_pass(self, texts: int, seconds: float) -> None:
        self.texts.inc(texts)
        self.batch_texts.observe(texts)
        self.batch_seconds.observe(seconds)

    def watch(self, batcher: Any, model: Any, ready: Callable[[], bool]) -> None:
        """The gauges of ``batcher`` (a :class:`~xtransformer.serve.batching.MicroBatcher`), the model
        served, readiness and the batcher's worker processes, read at each scrape (once per app)."""
        gauges = {
            "xmc_queue_texts": ("texts waiting for a forward pass", lambda: batcher.queued_texts),
            "xmc_queue_requests": ("requests waiting for a forward pass", lambda: len(batcher.jobs)),
            "xmc_running_texts": ("texts in the forward pass running now", lambda: batcher.running_texts),
            "xmc_queue_limit_texts": ("--max-queue", lambda: batcher.max_queue),
            "xmc_workers": ("forward passes that can run at once (model workers)", lambda: batcher.workers),
            "xmc_ready": ("1 when /ready answers 200", lambda: int(ready())),
        }
        for name, (text, read) in gauges.items():
            Gauge(name, text, registry=self.registry).set_function(read)
        info = Gauge("xmc_model_info", "the model served", ["method", "n_labels"], registry=self.registry)
        info.labels(str(model.method), str(model.n_labels)).set(1)
        self.registry.register(WorkerProcesses(lambda: batcher.worker_pids))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class WorkerProcesses(Collector):
    """Resident memory and CPU time of each model worker process (``--workers`` > 1), by worker index."""

    def __init__(self, pids: Callable[[], list[int]]):
        self.pids = pids

    def collect(self) -> Iterator[Metric]:
        pids = self.pids()
        if not pids:
            return
        rss = GaugeMetricFamily(
            "xmc_worker_resident_memory_bytes", "resident set size of each model worker process", labels=["worker"]
        )
        cpu = CounterMetricFamily(
            "xmc_worker_cpu_seconds", "user + system CPU time of each model worker process", labels=["worker"]
        )
        for i, pid in enumerate(pids):
            resident, seconds = process_rss_cpu(pid)
            rss.add_metric([str(i)], resident)
            cpu.add_metric([str(i)], seconds)
        yield rss
        yield cpu


def process_rss_cpu(pid: int) -> tuple[int, float]:
    """(resident bytes, user + system CPU seconds) of a process, from /proc (0s where there is none)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        rss = next(int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmRSS:"))
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return rss, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, ValueError, IndexError):
        return 0, 0.0
