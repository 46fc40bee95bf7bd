"""Load benchmark of ``xmc-serve``: a model folder under 1, 8, 32 and 128 requests in flight.

    python -m benchmarks.bench_serving --dataset eurlex57k --cache-dir CACHE \\
        --model RUN1/model/xrlinear --model RUN2/model/xrtransformer

For each ``--model``: one ``xmc-serve`` process on 127.0.0.1 (nothing else is ever addressed),
then for each ``--concurrency`` level a separate client process keeps that many requests in
flight for ``--seconds`` (bounded: it stops sending at the deadline, and after ``--max-requests``),
each request ``--texts-per-request`` texts of the eval split, k = ``--k``. The client speaks
HTTP/1.1 over keep-alive sockets itself (asyncio streams, request bodies encoded once), so it
costs the 2 shared cores as little as a Python client can; on a 503 it waits 10 ms and goes on.

Reported per level: requests/s and texts/s answered (200), p50 / p95 / p99 / max latency of the
200s, every status counted (and client-side timeouts), how many took longer than
``--request-timeout``, the server's CPU per request (``/proc``), texts per forward pass
(``/metrics``), and how busy the machine was with other processes meanwhile (``/proc/stat``
minus the server, the client and this process). Per model: the server's RSS at start (after its
warm-up), after the first 1,000 and 20,000 requests, and at the end; the load average and the
busiest other processes before each level; and the host (CPU model, cores, native bf16: the
``amx_bf16`` / ``avx512_bf16`` flags). Writes ``benchmarks/results/serving-load-<dataset>-<method>
.{json,md}`` and prints the table.

``--inprocess`` adds the older in-process figures (cold load in a fresh interpreter, batch
``predict_csr`` throughput, single-text latency) before the HTTP levels.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.report import git_commit, now

ROOT = Path(__file__).resolve().parents[1]

HOST = "127.0.0.1"
CLK = os.sysconf("SC_CLK_TCK")
TARGETS = {  # the serving targets on a 2-core CPU host
    "xrlinear": {"c1_p50_ms": 5.0, "c1_p99_ms": 25.0, "c32_texts_per_s": 1000.0},
    "xrtransformer": {"c1_p50_ms": 80.0},
}


# ---------------------------------------------------------------------------------------------- host
def host_info() -> dict[str, Any]:
    cpu, flags = "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and cpu == "unknown":
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    mem = 0
    with contextlib.suppress(OSError, StopIteration):
        mem = next(
            int(line.split()[1])
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal:")
        )
    bf16 = sorted(flags & {"amx_bf16", "amx_tile", "avx512_bf16"})
    import platform

    import torch

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_gib": round(mem / 2**20, 1),
        "native_bf16": bool(bf16),
        "bf16_flags": bf16,
        "avx512": "avx512f" in flags,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "threads_env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")},
    }


def pid_cpu(pid: int | str) -> float:
    """utime + stime seconds of a process (all its threads)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK
    except (OSError, IndexError, ValueError):
        return 0.0


def tree_pids(pid: int) -> list[int]:
    """``pid`` and its descendants (the server and its model workers)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.scandir(f"/proc/{p}/task"):
                todo += [int(c) for c in Path(task.path, "children").read_text().split()]
        except OSError:
            pass
    return out


def tree_cpu(pid: int) -> float:
    return sum(pid_cpu(p) for p in tree_pids(pid))


def _kib(path: str, key: str) -> int:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def pid_rss_mib(pid: int) -> float:
    """Resident MiB: the server's RSS; with model workers, the PSS of the server and its workers
    (each shared page counted once, split between the processes that share it)."""
    pids = tree_pids(pid)
    if len(pids) == 1:
        return round(_kib(f"/proc/{pid}/status", "VmRSS:") / 1024, 1)
    return round(sum(_kib(f"/proc/{p}/smaps_rollup", "Pss:") for p in pids) / 1024, 1)


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (all cores), from /proc/stat."""
    parts = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in parts[:8])
    return (user + nice + system + irq + softirq + steal) / CLK


def short_cmd(argv: list[str]) -> str:
    """A process as 'program script' (basenames, no options or other arguments: nothing private)."""
    if not argv:
        return "?"
    words = [Path(argv[0]).name]
    if len(argv) > 2 and argv[1] == "-m":
        words += ["-m", argv[2]]
    elif words[0].startswith("python"):
        rest = [a for a in argv[1:] if not a.startswith("-")]
        words += [Path(rest[0]).name] if rest else []
    return " ".join(words)[:60]


def busiest_processes(ours: set[int], window: float = 1.0, top: int = 5) -> list[dict[str, Any]]:
    """The processes that used the most CPU over ``window`` seconds (cores), ours marked."""

    def snapshot() -> dict[int, float]:
        out = {}
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                out[int(entry.name)] = pid_cpu(entry.name)
        return out

    a = snapshot()
    time.sleep(window)
    b = snapshot()
    rows = []
    for pid, cpu in b.items():
        used = (cpu - a.get(pid, cpu)) / window
        if used > 0.02:
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
                cmd = short_cmd([a for a in argv if a])
            except OSError:
                cmd = "?"
            rows.append({"pid": pid, "cores": round(used, 2), "ours": pid in ours, "cmd": cmd[:120]})
    return sorted(rows, key=lambda r: -r["cores"])[:top]


def load_snapshot(ours: set[int]) -> dict[str, Any]:
    busiest = busiest_processes(ours)
    others = [r for r in busiest if not r["ours"]]
    return {
        "loadavg": Path("/proc/loadavg").read_text().split()[:3],
        "busiest": busiest,
        "other_heavy": [r for r in others if r["cores"] >= 0.2],
    }


# ---------------------------------------------------------------------------------------------- server
def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def start_server(
    model: str, request_timeout: float, max_queue: int | None, workers: int, extra: list[str] = ()
) -> tuple[subprocess.Popen, str]:
    import httpx

    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "xtransformer",
        "serve",
        "--model",
        model,
        "--host",
        HOST,
        "--port",
        str(port),
        "--request-timeout",
        str(request_timeout),
    ]
    cmd += ["--max-queue", str(max_queue)] if max_queue else []
    cmd += ["--workers", str(workers), *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://{HOST}:{port}"
    for _ in range(1200):  # bounded: up to ~4 minutes (a transformer folder's sha256 + warm-up)
        if proc.poll() is not None:
            raise RuntimeError(proc.stderr.read())
        try:
            if httpx.get(f"{base}/ready", timeout=1).status_code == 200:
                return proc, base
        except httpx.TransportError:
            time.sleep(0.2)
    proc.terminate()
    raise RuntimeError("server did not come up")


def scrape(base: str) -> dict[str, float]:
    import httpx

    out: dict[str, float] = {"predict_requests": 0.0}
    for line in httpx.get(f"{base}/metrics", timeout=10).text.splitlines():
        if line.startswith("xmc_http_requests_total{") and 'path="/predict"' in line:  # labels in any order
            out["predict_requests"] += float(line.rsplit(" ", 1)[1])
        elif line.startswith(("xmc_batch_texts_sum ", "xmc_batch_texts_count ", "xmc_texts_total ")):
            name, value = line.split()
            out[name] = float(value)
    return out


class RssMonitor(threading.Thread):
    """Polls the server's RSS and its /predict count: the RSS when the count first passes each mark."""

    def __init__(self, pid: int, base: str, marks: tuple[int, ...] = (1000, 20000), every: float = 0.25):
        super().__init__(daemon=True)
        self.pid, self.base, self.marks, self.every = pid, base, marks, every
        self.at: dict[int, dict[str, float]] = {}
        self.peak = 0.0
        self.series: list[tuple[float, int, float]] = []  # (seconds, requests, MiB) every ~1 s
        self.stop_event = threading.Event()

    def run(self) -> None:
        self.t0 = time.monotonic()
        while not self.stop_event.wait(self.every):
            try:
                n = scrape(self.base)["predict_requests"]
            except Exception:
                continue
            rss = pid_rss_mib(self.pid)
            self.peak = max(self.peak, rss)
            now_s = time.monotonic()
            if not self.series or now_s - self.t0 - self.series[-1][0] >= 1:
                self.series.append((round(now_s - self.t0, 1), int(n), rss))
            for mark in self.marks:
                if n >= mark and mark not in self.at:
                    self.at[mark] = {"rss_mib": rss, "requests": n}


# ---------------------------------------------------------------------------------------------- client
async def _client(
    port: int, bodies: list[bytes], concurrency: int, seconds: float, max_requests: int, timeout: float, key: str | None
) -> dict[str, Any]:
    auth = f"Authorization: Bearer {key}\r\n".encode() if key else b""
    heads = [
        b"POST /predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + auth
        + b"Content-Length: %d\r\n\r\n" % len(body)
        for body in bodies
    ]
    latencies: list[float] = []
    statuses: Counter[str] = Counter()
    sent = 0
    stop_at = time.perf_counter() + seconds

    async def connection(worker: int) -> None:
        nonlocal sent
        reader = writer = None
        i = worker
        while time.perf_counter() < stop_at and sent < max_requests:
            if writer is None:
                reader, writer = await asyncio.open_connection(HOST, port)
            sent += 1
            j = i % len(bodies)
            i += concurrency
            t = time.perf_counter()
            try:
                writer.write(heads[j] + bodies[j])
                status_line = await asyncio.wait_for(reader.readline(), timeout)
                length, close = 0, False
                while True:
                    line = await asyncio.wait_for(reader.readline(), timeout)
                    if line in (b"\r\n", b""):
                        break
                    name, _, value = line.partition(b":")
                    name = name.strip().lower()
                    if name == b"content-length":
                        length = int(value)
                    elif name == b"connection" and value.strip().lower() == b"close":
                        close = True
                await asyncio.wait_for(reader.readexactly(length), timeout)
                status = status_line.split(b" ", 2)[1].decode() if status_line else "closed"
            except TimeoutError:
                status, close = "client-timeout", True
            except (ConnectionError, asyncio.IncompleteReadError, IndexError, ValueError) as e:
                status, close = f"error:{type(e).__name__}", True
            elapsed = time.perf_counter() - t
            statuses[status] += 1
            if status == "200":
                latencies.append(elapsed)
            else:
                latencies.append(-elapsed)  # negative: not a 200 (kept for the over-timeout count)
            if close:
                writer.close()
                reader = writer = None
            if status == "503":
                await asyncio.sleep(0.01)
        if writer is not None:
            writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(connection(w) for w in range(concurrency)))
    wall = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "wall_s": wall,
        "statuses": dict(statuses),
        "latencies": latencies,
        "client_cpu_s": usage.ru_utime + usage.ru_stime,
    }


def client_main(args: argparse.Namespace) -> int:
    spec = json.loads(Path(args.client).read_text())
    bodies = [json.dumps({"texts": batch, "k": spec["k"]}).encode() for batch in spec["batches"]]
    out = asyncio.run(
        _client(
            spec["port"],
            bodies,
            spec["concurrency"],
            spec["seconds"],
            spec["max_requests"],
            spec["timeout"],
            spec.get("key"),
        )
    )
    Path(spec["out"]).write_text(json.dumps(out))
    return 0


def run_level(
    base: str, batches: list[list[str]], concurrency: int, args: argparse.Namespace, work: Path
) -> dict[str, Any]:
    port = int(base.rsplit(":", 1)[1])
    spec = {
        "port": port,
        "batches": batches,
        "k": args.k,
        "concurrency": concurrency,
        "seconds": args.seconds,
        "max_requests": args.max_requests,
        "timeout": args.request_timeout + 30,
        "key": args.api_key,
        "out": str((work / f"client-{concurrency}.json").resolve()),
    }
    (work / f"spec-{concurrency}.json").write_text(json.dumps(spec))
    spec_file = str((work / f"spec-{concurrency}.json").resolve())
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.bench_serving", "--client", spec_file], cwd=ROOT)
    if proc.wait(timeout=args.seconds + args.request_timeout + 120) != 0:
        raise RuntimeError(f"client at concurrency {concurrency} failed")
    return json.loads(Path(spec["out"]).read_text())


def percentile_ms(values: np.ndarray, q: float) -> float | None:
    return round(float(np.percentile(values, q)) * 1000, 2) if len(values) else None


def measure_model(model_path: str, texts: list[str], args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from xtransformer.api import XMCModel

    model = XMCModel.load(model_path, verify=False)
    kind = model.kind  # the folder manifest's components.kind
    folder = Path(model.folder)
    info = {
        "model": str(folder),
        "method": model.method,
        "kind": kind,
        "n_labels": model.n_labels,
        "model_mib": round(sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20, 1),
        "predict_settings": model.predict_settings,
    }
    if args.inprocess:
        info["inprocess"] = inprocess(model_path, model, texts, args)
    del model
    n = args.texts_per_request
    batches = [texts[i : i + n] for i in range(0, len(texts) - n + 1, n)]
    proc, base = start_server(model_path, args.request_timeout, args.max_queue, args.server_workers, args.server_arg)
    ours = {os.getpid(), *tree_pids(proc.pid)}
    info["rss_mib"] = {"start": pid_rss_mib(proc.pid)}
    monitor = RssMonitor(proc.pid, base)
    monitor.start()
    levels = {}
    try:
        for c in args.concurrency:
            load = load_snapshot(ours)
            print(
                f"  c={c}: load average {' '.join(load['loadavg'])}; other heavy processes: "
                f"{[(r['cores'], r['cmd'][:60]) for r in load['other_heavy']] or 'none'}",
                flush=True,
            )
            before = scrape(base)
            cpu0, busy0, self0, t0 = tree_cpu(proc.pid), machine_busy_s(), time.process_time(), time.monotonic()
            out = run_level(base, batches, c, args, work)
            cpu1, busy1, self1, t1 = tree_cpu(proc.pid), machine_busy_s(), time.process_time(), time.monotonic()
            after = scrape(base)
            lat = np.asarray(out["latencies"])
            ok = lat[lat > 0]
            everything = np.abs(lat)
            n_req = len(lat)
            server_cpu = cpu1 - cpu0
            others = (busy1 - busy0) - server_cpu - out["client_cpu_s"] - (self1 - self0)
            passes = after.get("xmc_batch_texts_count", 0) - before.get("xmc_batch_texts_count", 0)
            level = {
                "concurrency": c,
                "seconds": round(out["wall_s"], 2),
                "requests": n_req,
                "statuses": out["statuses"],
                "requests_per_s": round(len(ok) / out["wall_s"], 1),
                "texts_per_s": round(len(ok) * n / out["wall_s"], 1),
                "p50_ms": percentile_ms(ok, 50),
                "p95_ms": percentile_ms(ok, 95),
                "p99_ms": percentile_ms(ok, 99),
                "max_ms": round(float(everything.max()) * 1000, 1) if n_req else None,
                "refused_p50_ms": percentile_ms(-lat[lat < 0], 50),
                "refused_p99_ms": percentile_ms(-lat[lat < 0], 99),
                "over_request_timeout": int((everything > args.request_timeout).sum()),
                "server_cpu_ms_per_request": round(1000 * server_cpu / max(n_req, 1), 3),
                "client_cpu_ms_per_request": round(1000 * out["client_cpu_s"] / max(n_req, 1), 3),
                "texts_per_forward_pass": round(
                    (after.get("xmc_batch_texts_sum", 0) - before.get("xmc_batch_texts_sum", 0)) / max(passes, 1), 2
                ),
                "other_processes_cores": round(max(others, 0.0) / max(t1 - t0, 1e-9), 2),
                "rss_mib_at_end": pid_rss_mib(proc.pid),
                "load_before": load,
            }
            key = str(c) if str(c) not in levels else f"{c}#{sum(k.split('#')[0] == str(c) for k in levels) + 1}"
            levels[key] = level
            print(
                f"  c={c}: {level['requests_per_s']} req/s, p50/p95/p99 {level['p50_ms']}/{level['p95_ms']}/"
                f"{level['p99_ms']} ms, statuses {level['statuses']}, server CPU "
                f"{level['server_cpu_ms_per_request']} ms/request, others busy {level['other_processes_cores']} "
                f"cores",
                flush=True,
            )
    finally:
        monitor.stop_event.set()
        monitor.join(timeout=5)
        info["rss_mib"]["end"] = pid_rss_mib(proc.pid)
        info["rss_mib"]["peak_polled"] = monitor.peak
        info["rss_series"] = monitor.series
        for mark, at in monitor.at.items():
            info["rss_mib"][f"after_{mark}"] = at["rss_mib"]
        proc.send_signal(signal.SIGTERM)
        try:
            info["server_exit_code_on_sigterm"] = proc.wait(timeout=args.request_timeout + 60)
        except subprocess.TimeoutExpired:
            proc.kill()
            info["server_exit_code_on_sigterm"] = "killed (did not stop)"
    info["levels"] = levels
    info["total_requests"] = sum(level["requests"] for level in levels.values())
    r = info["rss_mib"]
    if "after_1000" in r and "after_20000" in r:
        r["change_1k_to_20k_pct"] = round(100 * (r["after_20000"] - r["after_1000"]) / r["after_1000"], 2)
    add_rss_windows(info)
    info["targets"] = check_targets(kind, levels, r)
    return info


def rss_window(series: list[list[float]], mark: int, seconds: float = 20.0) -> dict[str, float] | None:
    """RSS from the moment ``mark`` requests were answered to ``seconds`` later: the floor (between
    forward passes: what stays allocated) and the peak (inside a pass: its working memory). A
    transformer's pass allocates and frees hundreds of MiB, so one sample says little."""
    start = next((t for t, n, _ in series if n >= mark), None)
    if start is None:
        return None
    window = [rss for t, n, rss in series if start <= t <= start + seconds]
    return {"floor": min(window), "peak": max(window), "samples": len(window)}


def add_rss_windows(info: dict[str, Any]) -> None:
    r = info["rss_mib"]
    for mark in (1000, 20000):
        w = rss_window(info.get("rss_series", []), mark)
        if w:
            r[f"after_{mark}_window"] = w
    if "after_1000_window" in r and "after_20000_window" in r:
        a, b = r["after_1000_window"]["floor"], r["after_20000_window"]["floor"]
        r["floor_change_1k_to_20k_pct"] = round(100 * (b - a) / a, 2)


def check_targets(kind: str, levels: dict[str, Any], rss: dict[str, float]) -> dict[str, Any]:
    t = TARGETS.get(kind, {})
    out: dict[str, Any] = {}
    c1, c32, c128 = levels.get("1"), levels.get("32"), levels.get("128")
    if c1 and "c1_p50_ms" in t:
        out["c=1 p50 <= {:g} ms".format(t["c1_p50_ms"])] = [
            c1["p50_ms"],
            c1["p50_ms"] is not None and c1["p50_ms"] <= t["c1_p50_ms"],
        ]
    if c1 and "c1_p99_ms" in t:
        out["c=1 p99 <= {:g} ms".format(t["c1_p99_ms"])] = [
            c1["p99_ms"],
            c1["p99_ms"] is not None and c1["p99_ms"] <= t["c1_p99_ms"],
        ]
    if c32 and "c32_texts_per_s" in t:
        out["c=32 >= {:g} texts/s".format(t["c32_texts_per_s"])] = [
            c32["texts_per_s"],
            c32["texts_per_s"] >= t["c32_texts_per_s"],
        ]
    if c128:
        others = {s: n for s, n in c128["statuses"].items() if s not in ("200", "503")}
        out["c=128 only 200 and 503"] = [c128["statuses"], not others]
    over = sum(level["over_request_timeout"] for level in levels.values())
    out["no request over --request-timeout"] = [over, over == 0]
    if "change_1k_to_20k_pct" in rss:
        out["RSS after 20k within 5% of after 1k (one sample each)"] = [
            f"{rss['change_1k_to_20k_pct']:+.2f}%",
            abs(rss["change_1k_to_20k_pct"]) <= 5,
        ]
    else:
        out["RSS after 20k within 5% of after 1k (one sample each)"] = ["fewer than 20,000 requests", None]
    if "floor_change_1k_to_20k_pct" in rss:
        out["RSS floor over 20 s after 20k within 5% of that after 1k"] = [
            f"{rss['floor_change_1k_to_20k_pct']:+.2f}%",
            abs(rss["floor_change_1k_to_20k_pct"]) <= 5,
        ]
    return out


# ---------------------------------------------------------------------------------------------- in-process
def cold_load_s(model: str, verify: bool) -> dict[str, float]:
    code = (
        "import time; t = time.perf_counter(); c = time.process_time(); from xtransformer import XMCModel; "
        f"XMCModel.load({model!r}, verify={verify}); print(time.perf_counter() - t, time.process_time() - c)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ)
    wall, cpu = map(float, out.stdout.strip().splitlines()[-1].split())
    return {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3)}


def inprocess(model_path: str, model: Any, texts: list[str], args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {
        "cold_load": {"verify": cold_load_s(model_path, True), "no_verify": cold_load_s(model_path, False)}
    }
    t = time.perf_counter()
    for i in range(0, len(texts), 4096):
        model.predict_csr(texts[i : i + 4096])
    out["batch_docs_per_s"] = round(len(texts) / (time.perf_counter() - t), 1)
    for text in texts[:5]:
        model.predict([text], k=args.k)
    ms, cpu = [], []
    for text in texts[: args.single]:
        s, c = time.perf_counter(), time.process_time()
        model.predict([text], k=args.k)
        ms.append(1000 * (time.perf_counter() - s))
        cpu.append(1000 * (time.process_time() - c))
    a = np.asarray(ms)
    out["single"] = {
        "n": len(ms),
        "p50_ms": round(float(np.percentile(a, 50)), 2),
        "p99_ms": round(float(np.percentile(a, 99)), 2),
        "cpu_p50_ms": round(float(np.median(cpu)), 2),
    }
    print(f"  in-process: {out}", flush=True)
    return out


# ---------------------------------------------------------------------------------------------- report
def eval_texts(args: argparse.Namespace) -> tuple[str, list[str]]:
    if args.texts:
        return Path(args.texts).stem, [
            t for t in Path(args.texts).read_text(encoding="utf-8").splitlines() if t.strip()
        ]
    from xtransformer.api import DataConfig, load_dataset

    ds = load_dataset(DataConfig(name=args.dataset), cache_dir=args.cache_dir)
    return ds.name, [t.replace("\n", " ") for t in ds.splits[ds.eval_split].texts]


def render(r: dict[str, Any]) -> str:
    m, h = r["model"], r["host"]
    worst: dict[str, float] = {}
    for level in m["levels"].values():
        for o in level["load_before"]["other_heavy"]:
            worst[o["cmd"][:70]] = max(worst.get(o["cmd"][:70], 0.0), o["cores"])
    heavy = [f"`{cmd}` (up to {cores} cores)" for cmd, cores in sorted(worst.items(), key=lambda kv: -kv[1])]
    quiet = not heavy and all(level["other_processes_cores"] < 0.2 for level in m["levels"].values())
    lines = [
        f"# xmc-serve under load: {m['method']} on {r['dataset']} ({m['n_labels']} labels)",
        "",
        f"{r['when']}, commit {r['commit']}. Host: {h['cpu']}, {h['cores']} cores, {h['ram_gib']} GiB; native bf16: "
        f"{'yes (' + ', '.join(h['bf16_flags']) + ')' if h['native_bf16'] else 'no (no amx_bf16 / avx512_bf16 flag)'}; "
        f"torch {h['torch']} ({h['torch_threads']} threads).",
        f"Model folder {m['model']} ({m['model_mib']} MiB). {r['note']}".rstrip(),
        "",
        f"{r['seconds']:g} s per level, {r['texts_per_request']} text(s) per request (eval split, cycled), "
        f"k = {r['k']}, "
        f"`--request-timeout {r['request_timeout']:g}`, `--max-queue {r['max_queue'] or 'default'}`, "
        f"`--workers {r['workers']}`{''.join(' `' + a + '`' for a in r.get('server_args', []))}; client and server "
        "on the same 2 cores, loopback only.",
        "",
        (
            "**Machine quiet**: no other process used 0.2 cores or more before or during any level."
            if quiet
            else "**Preliminary: other processes were running** (before a level: "
            + ("; ".join(heavy) or "none")
            + "; during the levels, see 'others busy'). Wall-clock figures measure the queue for the CPU as much "
            "as the server; the CPU-per-request figures the server."
        ),
        "",
        "| concurrency | requests | req/s | texts/s | p50 ms | p95 ms | p99 ms | max ms | statuses | > timeout | "
        "non-200 p50 / p99 ms | server CPU ms/req | texts/pass | RSS MiB at end | load avg before "
        "| others busy (cores) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---|---:|---:|---:|---|---:|",
    ]
    for c, s in m["levels"].items():
        st = ", ".join(f"{k}: {v}" for k, v in sorted(s["statuses"].items()))
        refused = "–" if s.get("refused_p50_ms") is None else f"{s['refused_p50_ms']} / {s['refused_p99_ms']}"
        lines.append(
            f"| {c} | {s['requests']:,} | {s['requests_per_s']:,} | {s['texts_per_s']:,} | {s['p50_ms']} | "
            f"{s['p95_ms']} | {s['p99_ms']} | {s['max_ms']} | {st} | {s['over_request_timeout']} | "
            f"{refused} | "
            f"{s['server_cpu_ms_per_request']} | {s['texts_per_forward_pass']} | {s.get('rss_mib_at_end')} | "
            f"{' '.join(s['load_before']['loadavg'])} | {s['other_processes_cores']} |"
        )
    rss = m["rss_mib"]
    what = "RSS" if r["workers"] == 1 else "PSS of server + workers"
    lines += [
        "",
        "Server "
        + what
        + " (MiB): start (after warm-up) {start}, after 1,000 requests {a1}, after 20,000 {a20}, "
        "end {end} ({n:,} requests in all){chg}; exit code on SIGTERM: {code}.".format(
            start=rss.get("start"),
            a1=rss.get("after_1000", "–"),
            a20=rss.get("after_20000", "–"),
            end=rss.get("end"),
            n=m["total_requests"],
            chg=f"; 1k -> 20k: {rss['change_1k_to_20k_pct']:+.2f}%" if "change_1k_to_20k_pct" in rss else "",
            code=m.get("server_exit_code_on_sigterm"),
        ),
    ]
    windows = [
        f"after {mark:,}: floor {rss[f'after_{mark}_window']['floor']}, peak {rss[f'after_{mark}_window']['peak']}"
        for mark in (1000, 20000)
        if f"after_{mark}_window" in rss
    ]
    if windows:
        lines += [
            "",
            "Over the 20 s after each mark (samples every 1-2 s; a forward pass allocates and frees its working "
            "memory, so single samples swing): " + "; ".join(windows) + " MiB.",
        ]
    if m.get("inprocess"):
        ip = m["inprocess"]
        lines += [
            "",
            f"In-process: cold load {ip['cold_load']['verify']['wall_s']} s (sha256 on), batch "
            f"{ip['batch_docs_per_s']} docs/s, single text p50 {ip['single']['p50_ms']} ms "
            f"(CPU {ip['single']['cpu_p50_ms']} ms), p99 {ip['single']['p99_ms']} ms.",
        ]
    lines += ["", "| target | measured | met |", "|---|---|---|"]
    for name, (value, met) in m["targets"].items():
        lines.append(f"| {name} | {value} | {'yes' if met else ('–' if met is None else 'no')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--client", default=None, help=argparse.SUPPRESS)  # internal: run one level's client
    p.add_argument(
        "--rerender",
        nargs="+",
        default=None,
        metavar="JSON",
        help="recompute the summaries and targets of stored results and rewrite their .md",
    )
    p.add_argument("--model", action="append", help="a method folder (RUN/model/<method>); repeat for several")
    p.add_argument("--dataset", default="reuters21578", help="eval split texts of this dataset")
    p.add_argument("--texts", default=None, help="or: a UTF-8 file, one text a line")
    p.add_argument("--cache-dir", default=str(ROOT / "cache"))
    p.add_argument("--concurrency", default="1,8,32,128")
    p.add_argument("--seconds", type=float, default=60.0, help="per concurrency level")
    p.add_argument(
        "--max-requests",
        "--requests",
        type=int,
        default=500_000,
        help="per level, a bound besides the time (--requests: its older name)",
    )
    p.add_argument("--texts-per-request", type=int, default=1)
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--request-timeout", type=float, default=30.0, help="the server's --request-timeout")
    p.add_argument("--max-queue", type=int, default=None, help="the server's --max-queue (default: its own)")
    p.add_argument("--server-arg", action="append", default=[], help="passed to xmc-serve as is (repeatable)")
    p.add_argument("--workers", default="1", help="the server's --workers: one value, or one per --model (2,1)")
    p.add_argument("--api-key", default=None, help="sent as Bearer (for a server started with keys)")
    p.add_argument("--inprocess", action="store_true", help="also cold load, batch and single-text in-process")
    p.add_argument("--single", type=int, default=300, help="texts timed one by one in-process (--inprocess)")
    p.add_argument("--suffix", default="", help="appended to the result files' names")
    p.add_argument(
        "--note",
        action="append",
        default=[],
        help="a sentence for the report (e.g. how the model was trained): one, or one per --model",
    )
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    p.add_argument("--work", default="/tmp/xmc-bench-serving", help="scratch for the client's specs and results")
    args = p.parse_args(argv)
    if args.client:
        return client_main(args)
    if args.rerender:
        for path in map(Path, args.rerender):
            result = json.loads(path.read_text())
            for level in result["model"]["levels"].values():
                load = level["load_before"]
                load.pop("ps_top", None)
                for row in load["busiest"] + load["other_heavy"]:
                    row["cmd"] = short_cmd(row["cmd"].split())
            add_rss_windows(result["model"])
            kind = result["model"]["kind"]
            result["model"]["targets"] = check_targets(kind, result["model"]["levels"], result["model"]["rss_mib"])
            path.write_text(json.dumps(result, indent=2) + "\n")
            path.with_suffix(".md").write_text(render(result))
            print(render(result))
        return 0
    if not args.model:
        p.error("--model is required")
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    name, texts = eval_texts(args)
    host = host_info()
    print(
        f"host: {host['cpu']}, {host['cores']} cores, native bf16 {host['native_bf16']} {host['bf16_flags']}; "
        f"{len(texts)} texts of {name}",
        flush=True,
    )
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    workers = [int(w) for w in str(args.workers).split(",")]
    if len(workers) not in (1, len(args.model)):
        p.error("--workers: one value, or one per --model")
    for i, model_path in enumerate(args.model):
        args.server_workers = workers[i] if len(workers) > 1 else workers[0]
        note = args.note[i] if len(args.note) == len(args.model) else " ".join(args.note)
        print(f"{model_path} (--workers {args.server_workers}):", flush=True)
        result = {
            "when": now(),
            "commit": git_commit(ROOT),
            "host": host,
            "dataset": name,
            "n_texts": len(texts),
            "seconds": args.seconds,
            "texts_per_request": args.texts_per_request,
            "k": args.k,
            "request_timeout": args.request_timeout,
            "max_queue": args.max_queue,
            "workers": args.server_workers,
            "server_args": args.server_arg,
            "note": note,
            "command": " ".join([Path(sys.executable).name, "-m", "benchmarks.bench_serving", *sys.argv[1:]]),
            "model": measure_model(model_path, texts, args, work),
        }
        stem = f"serving-load-{name}-{re.sub(r'[^A-Za-z0-9_.-]+', '-', result['model']['method'])}{args.suffix}"
        (out_dir / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
        (out_dir / f"{stem}.md").write_text(render(result))
        print(render(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
