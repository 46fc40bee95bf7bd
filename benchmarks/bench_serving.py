"""Serving a saved model folder: load time, batch throughput, single-text and HTTP latency.

    python benchmarks/bench_serving.py --model RUN/model/xrlinear --dataset reuters21578
    python benchmarks/bench_serving.py --model RUN/model/xtransformer --dataset reuters21578 --requests 200

Measures, on the eval split's texts of ``--dataset`` (or the lines of ``--texts``):

* load: ``XMCModel.load`` in a fresh interpreter (imports included; sha256 check on and off);
* batch: ``predict_csr`` over all texts in chunks of ``--chunk-size`` (docs/s, best of ``--repeats``);
* single: one text per ``predict`` call in-process (p50/p95/p99 ms);
* server: ``xmc-serve`` on 127.0.0.1, one-text requests from an asyncio client with
  ``--concurrency`` requests in flight (p50/p95/p99 ms, requests/s).

Writes ``benchmarks/results/serving-<dataset>-<method>.{json,md}``. The client shares the CPU
with the server, as a sidecar would: on a 2-core machine that costs the server some throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from benchmarks.report import git_commit, machine_info, now  # noqa: E402

HOST = "127.0.0.1"


def percentiles(ms: list[float]) -> dict[str, float]:
    a = np.asarray(ms)
    return {"n": len(ms), "p50_ms": round(float(np.percentile(a, 50)), 2), "p95_ms": round(float(np.percentile(a, 95)), 2),
            "p99_ms": round(float(np.percentile(a, 99)), 2), "mean_ms": round(float(a.mean()), 2)}


def eval_texts(args: argparse.Namespace) -> tuple[str, list[str]]:
    if args.texts:
        return Path(args.texts).stem, Path(args.texts).read_text(encoding="utf-8").splitlines()
    from xtransformer.data import DataConfig, load_dataset

    ds = load_dataset(DataConfig(name=args.dataset), cache_dir=args.cache_dir)
    return ds.name, [t.replace("\n", " ") for t in ds.splits[ds.eval_split].texts]


def cold_load_s(model: str, verify: bool) -> dict[str, float]:
    """Wall and CPU seconds from a fresh interpreter to a loaded model (imports included)."""
    code = ("import time; t = time.perf_counter(); c = time.process_time(); from xtransformer import XMCModel; "
            f"XMCModel.load({model!r}, verify={verify}); print(time.perf_counter() - t, time.process_time() - c)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ)
    wall, cpu = map(float, out.stdout.strip().splitlines()[-1].split())
    return {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3)}


def batch_docs_per_s(model: Any, texts: list[str], chunk: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for i in range(0, len(texts), chunk):
            model.predict_csr(texts[i:i + chunk])
        best = min(best, time.perf_counter() - t)
    return round(len(texts) / best, 1)


def single_latency(model: Any, texts: list[str], n: int, k: int) -> dict[str, float]:
    for t in texts[:5]:
        model.predict([t], k=k)  # warm-up
    ms, cpu = [], []
    for t in texts[:n]:
        s, c = time.perf_counter(), time.process_time()
        model.predict([t], k=k)
        ms.append(1000 * (time.perf_counter() - s))
        cpu.append(1000 * (time.process_time() - c))
    # CPU time says what a call costs when the cores are shared (wall time then measures the queue)
    return percentiles(ms) | {"cpu_p50_ms": round(float(np.median(cpu)), 2)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads) from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_server(model: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "xtransformer", "serve", "--model", model, "--host", HOST,
                             "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    import httpx

    base = f"http://{HOST}:{port}"
    for _ in range(600):  # bounded: up to ~2 minutes
        if proc.poll() is not None:
            raise RuntimeError(proc.stderr.read())
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                return proc, base
        except httpx.TransportError:
            time.sleep(0.2)
    proc.terminate()
    raise RuntimeError("server did not come up")


async def _load(base: str, texts: list[str], concurrency: int, n: int, k: int) -> tuple[list[float], float]:
    import httpx

    ms: list[float] = []
    sent = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits) as client:
        async def worker() -> None:
            nonlocal sent
            while sent < n:
                text = texts[sent % len(texts)]
                sent += 1
                s = time.perf_counter()
                r = await client.post("/predict", json={"texts": [text], "k": k})
                ms.append(1000 * (time.perf_counter() - s))
                r.raise_for_status()

        for text in texts[:10]:  # warm-up
            (await client.post("/predict", json={"texts": [text], "k": k})).raise_for_status()
        t = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t
    return ms, wall


def server_latency(model: str, texts: list[str], levels: list[int], n: int, k: int) -> dict[str, Any]:
    import httpx

    proc, base = start_server(model)
    out = {}
    try:
        for c in levels:
            before = httpx.get(f"{base}/health").json()["batching"]
            cpu0 = cpu_seconds(proc.pid)
            ms, wall = asyncio.run(_load(base, texts, c, max(n, 4 * c), k))
            cpu1 = cpu_seconds(proc.pid)
            after = httpx.get(f"{base}/health").json()["batching"]
            batches = after["batches"] - before["batches"]
            out[str(c)] = percentiles(ms) | {"requests_per_s": round(len(ms) / wall, 1),
                                             "server_cpu_ms_per_request": round(1000 * (cpu1 - cpu0) / len(ms), 2),
                                             "texts_per_forward_pass": round((after["texts"] - before["texts"]) / max(batches, 1), 2)}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return out


def render(result: dict[str, Any]) -> str:
    r = result
    lines = [f"# Serving {r['method']} on {r['dataset']} ({r['n_texts']} eval texts, k={r['k']})", "",
             f"{r['when']}, commit {r['commit']}, {r['machine'].get('cpu', '')} ({r['machine'].get('cores', '?')} cores), "
             f"model folder {r['model_mb']} MB", "",
             "| measure | value |", "|---|---|",
             f"| cold load incl. imports (fresh interpreter, sha256 check on): wall / CPU | {r['load_s']['verify']['wall_s']} / {r['load_s']['verify']['cpu_s']} s |",
             f"| cold load, sha256 check off: wall / CPU | {r['load_s']['no_verify']['wall_s']} / {r['load_s']['no_verify']['cpu_s']} s |",
             f"| batch predict (chunks of {r['chunk_size']}) | {r['batch_docs_per_s']} docs/s |",
             f"| in-process single text p50 / p95 / p99 (wall) | {r['single']['p50_ms']} / {r['single']['p95_ms']} / {r['single']['p99_ms']} ms |",
             f"| in-process single text, CPU time p50 | {r['single']['cpu_p50_ms']} ms |",
             f"| load average (1 min) before / after | {r['loadavg'][0]} / {r['loadavg'][1]} |",
             "", "| HTTP concurrency | p50 ms | p95 ms | p99 ms | requests/s | server CPU ms / request | texts per forward pass |",
             "|---|---|---|---|---|---|---|"]
    for c, s in r["server"].items():
        lines.append(f"| {c} | {s['p50_ms']} | {s['p95_ms']} | {s['p99_ms']} | {s['requests_per_s']} | "
                     f"{s['server_cpu_ms_per_request']} | {s['texts_per_forward_pass']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a method folder (RUN/model/<method>)")
    p.add_argument("--dataset", default="reuters21578", help="eval split texts of this dataset")
    p.add_argument("--texts", default=None, help="or: a UTF-8 file, one text a line")
    p.add_argument("--cache-dir", default=str(ROOT / "cache"))
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--chunk-size", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--single", type=int, default=300, help="texts timed one by one in-process")
    p.add_argument("--requests", type=int, default=600, help="HTTP requests per concurrency level")
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = p.parse_args(argv)

    from xtransformer.model import XMCModel

    name, texts = eval_texts(args)
    model = XMCModel.load(args.model)
    folder = Path(args.model)
    result = {
        "when": now(), "commit": git_commit(ROOT), "machine": machine_info(), "dataset": name, "method": model.method,
        "model": str(folder), "n_texts": len(texts), "k": args.k, "chunk_size": args.chunk_size,
        "model_mb": round(sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20, 1),
        "threads": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")},
        "loadavg_start": os.getloadavg()[0],
        "load_s": {"verify": cold_load_s(args.model, True), "no_verify": cold_load_s(args.model, False)},
    }
    print(f"load {result['load_s']}", flush=True)
    result["batch_docs_per_s"] = batch_docs_per_s(model, texts, args.chunk_size, args.repeats)
    print(f"batch {result['batch_docs_per_s']} docs/s", flush=True)
    result["single"] = single_latency(model, texts, args.single, args.k)
    print(f"single {result['single']}", flush=True)
    del model
    result["server"] = server_latency(args.model, texts, [int(c) for c in args.concurrency.split(",")], args.requests,
                                      args.k)
    print(f"server {result['server']}", flush=True)
    result["loadavg"] = [round(result.pop("loadavg_start"), 2), round(os.getloadavg()[0], 2)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"serving-{name}-{model_name(result['method'])}"
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / f"{stem}.md").write_text(render(result))
    print(render(result))
    return 0


def model_name(method: str) -> str:
    return method.replace("+", "-")


if __name__ == "__main__":
    raise SystemExit(main())
