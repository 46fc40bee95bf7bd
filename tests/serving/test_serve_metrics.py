"""``GET /metrics`` through prometheus_client: each app counts on a registry of its own (two apps in
one process never mix their figures), the process and GC collectors are on it, a model worker
process is reported by index, and importing ``xtransformer.serve`` loads neither torch nor FastAPI."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from fastapi.testclient import TestClient
from model_helpers import save_toy_xrlinear

from xtransformer.model import XMCModel
from xtransformer.serve import create_app
from xtransformer.serve.metrics import WorkerProcesses


def _values(text: str) -> dict[str, float]:
    lines = [line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#")]
    return {name: float(value) for name, value in lines}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder, _ = save_toy_xrlinear(tmp_path_factory.mktemp("metrics") / "xrlinear")
    return XMCModel.load(folder)


def test_two_apps_in_one_process_count_apart(model):
    with TestClient(create_app(model)) as one, TestClient(create_app(model)) as two:
        for _ in range(3):
            assert one.post("/predict", json={"texts": ["oil prices", "grain"]}).status_code == 200
        first, second = _values(one.get("/metrics").text), _values(two.get("/metrics").text)
    # each app's warm-up pass predicted one text
    assert first["xmc_texts_total"] == 1 + 6 and second["xmc_texts_total"] == 1
    assert first['xmc_http_requests_total{code="200",path="/predict"}'] == 3
    assert 'xmc_http_requests_total{code="200",path="/predict"}' not in second
    assert first[f'xmc_model_info{{method="xrlinear",n_labels="{model.n_labels}"}}'] == 1
    for name in (
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        'python_gc_collections_total{generation="0"}',
    ):
        assert name in first and name in second
    assert first['xmc_rejected_total{reason="draining"}'] == 0 and first["xmc_workers"] == 1


def test_worker_processes_are_reported_by_index():
    metrics = {m.name: m for m in WorkerProcesses(lambda: [os.getpid()]).collect()}
    (rss,) = metrics["xmc_worker_resident_memory_bytes"].samples
    (cpu,) = metrics["xmc_worker_cpu_seconds"].samples
    assert rss.labels == {"worker": "0"} and rss.value > 0 and cpu.name == "xmc_worker_cpu_seconds_total"
    assert list(WorkerProcesses(lambda: []).collect()) == []  # passes in a thread: nothing to report


def test_importing_serve_loads_neither_torch_nor_fastapi():
    code = (
        "import sys, xtransformer.serve; print(sorted(m for m in ('torch', 'fastapi', 'uvicorn') if m in sys.modules))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "[]", res.stderr
