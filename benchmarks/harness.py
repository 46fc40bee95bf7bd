"""Run a set of systems on one problem, interleaving repeats, and render the result."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from benchmarks import report
from benchmarks.measure import RunRecord, RunSettings, run_once
from benchmarks.systems import SystemSetupError, SystemSpec
from benchmarks.workdata import Problem
from xtransformer.api import atomic_path, save_json

REPO = Path(__file__).resolve().parents[1]


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def split_available(systems: list[SystemSpec]) -> tuple[list[SystemSpec], dict[str, str]]:
    """Systems that can run now, and the reason each other one is skipped."""
    ready, skipped = [], {}
    for spec in systems:
        reason = spec.unavailable_reason()
        if reason is None:
            ready.append(spec)
        else:
            skipped[spec.name] = reason
            log(f"skipping {spec.name}: {reason}")
    return ready, skipped


def run_systems(
    problem: Problem, systems: list[SystemSpec], repeats: int, settings: RunSettings, work_root: Path
) -> tuple[list[RunRecord], dict[str, str]]:
    """Run every system ``repeats`` times, interleaved, repeat ``r`` with seed ``r`` (from
    ``settings.first_repeat``); a failing system never stops the others."""
    ready, skipped = split_available(systems)
    records: list[RunRecord] = []
    first = settings.first_repeat
    for repeat in range(first, first + repeats):
        for spec in list(ready):
            run_dir = work_root / problem.data_dir.parent.name / "runs" / spec.name / f"r{repeat}"
            log(f"{problem.name}: {spec.name} repeat {repeat - first + 1}/{repeats} (seed {repeat})")
            try:
                rec = run_once(spec, problem, run_dir, repeat, settings)
            except SystemSetupError as exc:
                skipped[spec.name] = str(exc)
                ready.remove(spec)
                log(f"skipping {spec.name}: {exc}")
                continue
            records.append(rec)
            status = "ok" if rec.ok else "FAILED"
            rss = "?" if rec.peak_rss_mb is None else f"{rec.peak_rss_mb:.0f}"
            log(f"  {status} in {rec.wall_s:.1f}s, peak RSS {rss} MiB" + (f"\n{rec.error}" if rec.error else ""))
    return records, skipped


def settings_record(problem: Problem, settings: RunSettings, repeats: int) -> dict[str, Any]:
    return {
        "problem": problem.name,
        "train_split": problem.train_split,
        "eval_split": problem.eval_split,
        "threads": settings.threads,
        "topk": settings.topk,
        "repeats": repeats,
        "first_repeat": settings.first_repeat,
        "stop_after": settings.stop_after,
        "date": report.now(),
    }


def benchmark(
    problem: Problem,
    systems: list[SystemSpec],
    repeats: int,
    settings: RunSettings,
    work_root: Path,
    reference: str | None,
) -> dict[str, Any]:
    """Run, aggregate and render one problem; returns the JSON-able result (table under ``markdown``)."""
    records, skipped = run_systems(problem, systems, repeats, settings, work_root)
    result = {
        "settings": settings_record(problem, settings, repeats),
        "machine": report.machine_info(),
        "commit": report.git_commit(REPO),
        "problem": problem.info,
        "runs": [r.as_dict() for r in records],
        "skipped": skipped,
    }
    return render(result, reference)


def render(result: dict[str, Any], reference: str | None) -> dict[str, Any]:
    """(Re)compute the summary and Markdown of a result from its raw runs, against ``reference``."""
    records = [RunRecord(**r) for r in result["runs"]]
    summary = report.summarize(records, reference)
    ref = reference if reference in summary else None
    lines = [
        report.header(result["problem"], result["settings"], result["machine"], result["commit"]),
        "",
        report.markdown_table(summary, ref),
    ]
    failed = {r.system: _failure(r.error or "") for r in records if not r.ok}
    notes = [f"- {name}: skipped ({why.splitlines()[0]})" for name, why in result["skipped"].items()]
    notes += [f"- {name}: failed ({why}; full log tail in the JSON)" for name, why in failed.items()]
    notes += _seeds_note(records) + _load_note(records) + [f"- merged: {src}" for src in result.get("sources", [])]
    if notes:
        lines += [""] + notes
    return {**result, "reference": ref, "summary": summary, "markdown": "\n".join(lines) + "\n"}


def _seeds_note(records: list[RunRecord]) -> list[str]:
    """The seeds behind each system's medians, where systems ran different ones (merged results)."""
    seeds: dict[str, list[int]] = {}
    for r in records:
        if r.ok:
            seeds.setdefault(r.system, []).append(r.repeat)
    if len({tuple(sorted(v)) for v in seeds.values()}) < 2:
        return []
    per_system = "; ".join(f"{k} {', '.join(map(str, sorted(v)))}" for k, v in seeds.items())
    return [f"- seeds (repeats) of each system: {per_system}"]


def _load_note(records: list[RunRecord]) -> list[str]:
    """The host's 1-min load average before / at most / after each run (a quiet 2-core host running
    a 2-thread system reads about 2; more means other work shared the cores), and each run's CPU
    seconds beside its wall seconds (wall grows with the load, CPU seconds hardly)."""
    runs = [
        f"{r.system} {r.load['before']:.1f} / {r.load['max']:.1f} / {r.load['after']:.1f}" for r in records if r.load
    ]
    cpu = [f"{r.system} {r.cpu_s:,.0f} / {r.wall_s:,.0f}" for r in records if r.cpu_s]
    notes = [f"- host load (1-min average before / max / after each run): {'; '.join(runs)}"] if runs else []
    if cpu:
        notes.append(f"- CPU s / wall s of each run (user + system, the system's processes): {'; '.join(cpu)}")
    return notes


def merge_results(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Several saved results of one problem as one (e.g. a peer that ran hours later, on its own):
    their runs side by side, each source named (date, commit) under the table."""
    first = results[0]
    names = {r["settings"]["problem"] for r in results}
    if len(names) > 1:
        raise ValueError(f"--rerender: the results are of different problems {sorted(names)}")
    runs = [run for r in results for run in _named_apart(r, results)]
    ran = {run["system"] for run in runs}
    skipped = {k: v for r in results for k, v in r["skipped"].items() if k not in ran}
    sources = [
        f"{r['settings']['date']}, commit {r['commit']}: {', '.join(sorted({x['system'] for x in r['runs']}))}"
        for r in results
    ]
    return {**first, "runs": runs, "skipped": skipped, "sources": sources}


def _named_apart(result: dict[str, Any], results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``result``'s runs, a system that another result also ran named by its steps scale (PECOS's
    recipe beside a tenth of it: two rows, not one row's repeats overwriting each other). The same
    system at the same scale in two results is one row when their seeds differ (``--first-repeat``),
    and refused when they share one: their repeats would collide."""
    out = []
    for run in result["runs"]:
        others = [r for r in results if r is not result and run["system"] in {x["system"] for x in r["runs"]}]
        if not others:
            out.append(run)
            continue
        scale = _steps_scale(run)
        same = [x for r in others for x in r["runs"] if x["system"] == run["system"] and _steps_scale(x) == scale]
        if any(x["repeat"] == run["repeat"] for x in same):
            raise ValueError(
                f"--rerender: {run['system']} ran seed {run['repeat']} in more than one of the results with the "
                "same settings; give one of them alone, or run other seeds with --first-repeat"
            )
        out.append(run if scale is None else run | {"system": f"{run['system']} (steps x{scale:g})"})
    return out


def _steps_scale(run: dict[str, Any]) -> float | None:
    return ((run.get("timings") or {}).get("info") or {}).get("steps_scale")


def _failure(error: str) -> str:
    """A failed run in one line: how it ended (the error's first line) and its log's last line that
    is not a warning."""
    lines = [ln.strip() for ln in error.splitlines() if ln.strip()]
    if not lines:
        return "no output"
    log = [ln for ln in lines[1:] if "warn" not in ln.lower()]
    return lines[0].removesuffix("; log tail:") + (f": {log[-1][:200]}" if log else "")


def write_result(result: dict[str, Any], out_dir: Path, stem: str) -> Path:
    md = out_dir / f"{stem}.md"
    with atomic_path(md) as tmp:
        tmp.write_text(result["markdown"])
    save_json(result, out_dir / f"{stem}.json")
    return md
