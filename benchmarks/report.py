"""Aggregate repeated runs into medians (min–max), ratios to a reference, a Markdown table, JSON.

The machine is shared and noisy, so absolute seconds move between runs; a ratio to the
reference system is taken within each repeat (the systems run interleaved) and its median
reported, which is the comparison to trust.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import statistics
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from benchmarks.measure import RunRecord

METRICS = ("P@1", "P@3", "P@5", "R@5", "nDCG@5")
# (row field, column title, decimals); timings in seconds, memory in MiB
TIMING_FIELDS = (
    ("index_s", "index s", 2),
    ("train_s", "train s", 2),
    ("finetune_s", "fine-tune s", 1),
    ("predict_s", "predict s", 2),
    ("run_s", "run s", 1),
    ("docs_per_s", "docs/s", 0),
    ("single_ms", "1-doc ms", 2),
    ("peak_rss_mb", "peak RSS MiB", 0),
    ("model_mb", "model MiB", 1),
)
RATIO_FIELDS = (
    ("index_s", "index ×"),
    ("train_s", "train ×"),
    ("fit_s", "index+train ×"),
    ("run_s", "run ×"),
    ("docs_per_s", "docs/s ×"),
    ("single_ms", "1-doc ms ×"),
    ("peak_rss_mb", "RSS ×"),
)


def row_label(system: str, variant: str) -> str:
    return system if variant == "default" else f"{system} ({variant})"


def _fit_fields(sec: dict[str, float]) -> dict[str, float | None]:
    """Index, train (+ save), their sum and the fine-tuning seconds, from a run's phase seconds."""
    index_s = sec.get("index")
    train_s = sec["train"] + sec.get("save", 0.0) if "train" in sec else None
    return {
        "index_s": index_s,
        "train_s": train_s,
        "fit_s": (index_s or 0.0) + train_s if train_s is not None else None,  # index-only rows have none
        "finetune_s": sec.get("finetune"),
    }


def _rows_of(record: RunRecord) -> dict[str, dict[str, float | None]]:
    """Flatten one run into one row per prediction variant (one row if it did not predict); a
    variant's own fit seconds (different models trained in one run) replace the run's."""
    sec = record.timings.get("seconds", {})
    base = _fit_fields(sec) | {
        "peak_rss_mb": record.peak_rss_mb,
        "model_mb": None
        if "train" not in sec or record.timings.get("model_bytes") is None
        else record.timings["model_bytes"] / 2**20,
    }
    preds = record.timings.get("predictions", {})
    if not preds:
        return {row_label(record.system, "default"): base}
    rows = {}
    for variant in record.timings.get("variants", sorted(preds)):
        p = preds[variant]
        timed = p["predict_s"] is not None
        own = p.get("fit_seconds")
        row = base | _fit_fields({"save": sec.get("save", 0.0), **own} if own else sec)
        row |= {
            "load_s": p["load_s"],
            "predict_s": p["predict_s"],
            "single_ms": p.get("single_ms_p50"),
            "docs_per_s": p["n_docs"] / max(p["predict_s"], 1e-9) if timed else None,
            "run_s": row["fit_s"] + p["predict_s"] if timed and row["fit_s"] is not None else None,
        }
        row.update(record.metrics.get(variant, {}))
        rows[row_label(record.system, variant)] = row
    return rows


def _stat(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "values": values}


def summarize(records: Iterable[RunRecord], reference: str | None) -> dict[str, dict[str, Any]]:
    """``{row label: {field: {median, min, max, values}}}`` plus ``ratio_<field>`` vs ``reference``."""
    per_repeat: dict[str, dict[int, dict[str, float | None]]] = {}
    for rec in records:
        if rec.ok:
            for label, row in _rows_of(rec).items():
                per_repeat.setdefault(label, {})[rec.repeat] = row
    if reference is not None and reference not in per_repeat:
        reference = None
    summary: dict[str, dict[str, Any]] = {}
    for label, by_rep in per_repeat.items():
        fields = {k for row in by_rep.values() for k, v in row.items() if v is not None}
        out = {f: _stat([row[f] for row in by_rep.values() if row.get(f) is not None]) for f in sorted(fields)}
        out["repeats"] = len(by_rep)
        if reference is not None:
            ref = per_repeat[reference]
            for f, _ in RATIO_FIELDS:
                ratios = [row[f] / ref[r][f] for r, row in by_rep.items() if r in ref and row.get(f) and ref[r].get(f)]
                if ratios:
                    out[f"ratio_{f}"] = _stat(ratios)
        summary[label] = out
    return summary


def _fmt(stat: dict[str, Any] | None, decimals: int, show_range: bool) -> str:
    if not stat:
        return "–"
    med = f"{stat['median']:,.{decimals}f}"
    if show_range and stat["min"] != stat["max"]:
        return f"{med} ({stat['min']:,.{decimals}f}–{stat['max']:,.{decimals}f})"
    return med


def markdown_table(summary: dict[str, dict[str, Any]], reference: str | None) -> str:
    cols = ["system"] + [t for _, t, _ in TIMING_FIELDS] + list(METRICS)
    if reference:
        cols += [f"{t} vs {reference}" for _, t in RATIO_FIELDS]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for label, s in summary.items():
        cells = [label]
        cells += [_fmt(s.get(f), d, True) for f, _, d in TIMING_FIELDS]
        cells += [_fmt(s.get(m), 2, False) for m in METRICS]
        if reference:
            cells += [_fmt(s.get(f"ratio_{f}"), 2, True) for f, _ in RATIO_FIELDS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def machine_info() -> dict[str, Any]:
    mem_kib, flags = 0, set()
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not line.strip():
                break  # the first processor's block names the model and its flags
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                cpu = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    return {
        "cores": os.cpu_count(),
        "ram_gib": round(mem_kib / 2**20, 1),
        "cpu": cpu,
        "native_bf16": bool(flags & {"amx_bf16", "avx512_bf16"}) if flags else None,
        "gpus": visible_gpus(),
        "python": platform.python_version(),
    }


def visible_gpus() -> list[str]:
    """The names of the NVIDIA GPUs that ``nvidia-smi`` lists (none where it is missing or fails)."""
    try:
        cmd = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [name.strip() for name in out.splitlines() if name.strip()]


def describe_host(machine: dict[str, Any]) -> str:
    """``2 cores / 23.5 GiB (CPU model, native bf16)``, then the GPUs where there are any: the host of
    a table's timings, as its header names it (older results lack the bf16 and GPU keys)."""
    bf16 = {True: ", native bf16", False: ", no native bf16"}.get(machine.get("native_bf16"), "")
    gpus = machine.get("gpus") or []
    gpu = f", {len(gpus)} x {gpus[0]}" if len(set(gpus)) == 1 else "".join(f", {g}" for g in gpus)
    return f"{machine['cores']} cores / {machine['ram_gib']} GiB ({machine['cpu']}{bf16}){gpu}"


def git_commit(repo: Path) -> str:
    """Short HEAD hash, ``+dirty`` when the tree has changes; ``unknown`` outside git."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "unknown (no commit)"
    try:
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except subprocess.CalledProcessError:
        dirty = False
    return head + ("+dirty" if dirty else "")


def header(problem_info: dict[str, Any], settings: dict[str, Any], machine: dict[str, Any], commit: str) -> str:
    splits = problem_info.get("splits", {})
    sizes = ", ".join(f"{s} {v['docs']:,}" for s, v in splits.items())
    return (
        f"**{settings['problem']}** ({settings['train_split']} → {settings['eval_split']}; {sizes}; "
        f"L={problem_info.get('n_labels', 0):,}, F={problem_info.get('n_features', 0):,}) — "
        f"{settings['date']}, {describe_host(machine)}, "
        f"commit {commit}; {settings['threads']} threads, top-{settings['topk']}, "
        f"repeats {settings['repeats']} (median, min–max); metrics in %."
    )


def now() -> str:
    return dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
