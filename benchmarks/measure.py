"""Run one system once in a subprocess, measure it, and score its predictions with our metrics.

Peak RSS is the child's own ``VmHWM`` (reported by the child at its end, and polled from
``/proc/<pid>/status`` by the parent in case it dies first); ``ru_maxrss`` from ``wait4`` or
``RUSAGE_CHILDREN`` would include this runner's memory, which Linux carries across fork+exec.
Quality is computed here, in our environment, by ``xtransformer.api.evaluate`` on the top-k CSR
each system wrote, so every system is scored by the same code on the same outputs.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.phases import MODEL_DIR, TIMINGS_FILE, preds_file, vm_hwm_mb
from benchmarks.systems import SystemSetupError, SystemSpec
from benchmarks.workdata import Problem, ProblemError
from xtransformer.api import load_csr, load_json

ROOT = Path(__file__).resolve().parents[1]  # where `python -m benchmarks...` finds the systems' modules
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "RAYON_NUM_THREADS", "NUMEXPR_NUM_THREADS")
QUIET_ENV = {
    "WANDB_MODE": "offline",
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONUNBUFFERED": "1",
}


@dataclass
class RunSettings:
    topk: int = 5
    threads: int = 2
    stop_after: str = "predict"  # index | train | predict
    timeout_s: float = 3600.0
    keep_models: bool = False  # model folders can be large; only their size is kept by default
    first_repeat: int = 0  # repeat r runs with seed r: a later result adds seeds, merged by --rerender
    extra_args: dict[str, list[str]] = field(default_factory=dict)  # system name -> more script args


@dataclass
class RunRecord:
    """One (system, repeat) execution: raw timings, peak RSS, and per-variant scores."""

    system: str
    repeat: int
    ok: bool
    wall_s: float
    peak_rss_mb: float | None = None
    error: str | None = None
    timings: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)  # variant -> metric -> value
    load: dict[str, float] = field(default_factory=dict)  # host 1-min load average: before, max during, after
    cpu_s: float | None = None  # user + system CPU seconds of the child and the processes it waited for

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def child_env(threads: int, is_peer: bool) -> dict[str, str]:
    env = dict(os.environ)
    env.update({k: str(threads) for k in THREAD_ENV})
    env.update(QUIET_ENV)
    if is_peer:
        env.pop("PYTHONPATH", None)  # a peer venv must not see our packages
    return env


def load_average() -> float:
    """The host's 1-minute load average (the runnable processes it has had: the system's own
    threads included, so a quiet 2-core host running a 2-thread system reads about 2)."""
    return round(os.getloadavg()[0], 2)


def children_cpu_s() -> float:
    """User + system CPU seconds of this process's waited-for children so far (``RUSAGE_CHILDREN``:
    a child's workers count once it has waited for them). Unlike wall time it does not grow when
    other work shares the cores, only a little through cache and memory contention."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def launch(
    argv: list[str], env: dict[str, str], log_path: Path, timeout_s: float, poll_s: float = 0.1
) -> tuple[int, float, float | None, dict[str, float], float]:
    """Run ``argv`` from the repository root; return (exit code, wall seconds, polled peak RSS of the
    child in MiB, host load, CPU seconds of the child: the growth of ``children_cpu_s``, one child
    running at a time)."""
    load = {"before": load_average(), "max": load_average()}
    cpu0 = children_cpu_s()
    with open(log_path, "w") as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        peak: float | None = None
        while True:
            try:
                code = proc.wait(timeout=poll_s)
                break
            except subprocess.TimeoutExpired:
                hwm = vm_hwm_mb(proc.pid)  # VmHWM only grows, so the last reading is the peak
                if hwm is not None:
                    peak = hwm if peak is None else max(peak, hwm)
                load["max"] = max(load["max"], load_average())
                if time.perf_counter() - t0 > timeout_s:
                    proc.kill()
        return code, time.perf_counter() - t0, peak, load | {"after": load_average()}, children_cpu_s() - cpu0


def exit_reason(code: int, timed_out: bool) -> str:
    """A failed run's first line: its exit code, or the signal that killed it and the likely sender."""
    if timed_out:
        return f"exit code {code} (killed: --timeout)"
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
        oom = " (the out-of-memory killer's signal, when the host ran out of memory)" if -code == signal.SIGKILL else ""
        return f"exit code {code}: killed by {name}{oom}"
    return f"exit code {code}"


def _tail(path: Path, n: int = 1500) -> str:
    text = path.read_text(errors="replace") if path.is_file() else ""
    return text[-n:]


def score(problem: Problem, run_dir: Path, variants: list[str]) -> dict[str, dict[str, float]]:
    """Our metrics on each variant's top-k predictions against the eval split's labels."""
    from xtransformer.api import evaluate

    Y_true = problem.Y(problem.eval_split)
    out = {}
    for variant in variants:
        pred = load_csr(run_dir / preds_file(variant))
        out[variant] = {k: float(v) for k, v in evaluate(Y_true, pred).items()}
    return out


def run_once(spec: SystemSpec, problem: Problem, run_dir: Path, repeat: int, settings: RunSettings) -> RunRecord:
    """Execute ``spec`` on ``problem`` in a fresh ``run_dir``; never raises for a failing system."""
    run_dir = run_dir.resolve()  # the system runs from the repository root
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    if spec.needs_xc_text:
        problem.ensure_xc_text(problem.train_split)
    if spec.needs_texts:
        try:
            problem.ensure_texts()
        except ProblemError as exc:
            raise SystemSetupError(f"{spec.name} reads documents: {exc}") from exc
    argv = spec.argv() + [
        "--data",
        str(problem.data_dir),
        "--out",
        str(run_dir),
        "--train-split",
        problem.train_split,
        "--eval-split",
        problem.eval_split,
        "--topk",
        str(settings.topk),
        "--threads",
        str(settings.threads),
        "--seed",
        str(repeat),
        "--stop-after",
        settings.stop_after,
        *settings.extra_args.get(spec.name, []),
    ]
    log_path = run_dir / "log.txt"
    code, wall, rss, load, cpu = launch(argv, child_env(settings.threads, spec.is_peer), log_path, settings.timeout_s)
    record = RunRecord(spec.name, repeat, ok=code == 0, wall_s=wall, peak_rss_mb=rss, load=load, cpu_s=cpu)
    if code != 0:
        record.error = f"{exit_reason(code, wall > settings.timeout_s)}; log tail:\n{_tail(log_path)}"
        return record
    record.timings = load_json(run_dir / TIMINGS_FILE)
    record.peak_rss_mb = max(record.timings["peak_rss_mb"], rss or 0.0)
    variants = list(record.timings["predictions"])
    try:
        record.metrics = score(problem, run_dir, variants)
    except ImportError as exc:  # metrics module not landed yet: keep the timings
        record.error = f"metrics unavailable: {exc}"
    if not settings.keep_models:
        shutil.rmtree(run_dir / MODEL_DIR, ignore_errors=True)
    return record
