"""Paired comparison of systems that ran on one problem: per-document differences, over their seeds.

    python benchmarks/paired.py --problem eurlex57k-tfidf28173255 pecos-xrt ours-xrtransformer \\
        ours-xrtransformer:combined

The first system is the reference; each other one is compared with it on the eval split's documents.
Every seed of a system that ``benchmarks/run.py`` left in ``<work>/<problem>/runs/<system>/r<seed>``
counts (``--first-repeat`` adds seeds): a document's P@k / nDCG@k is averaged over the system's
seeds, and the difference with the reference is resampled over documents (paired bootstrap), so the
interval shows how much of a gap the 6,000 documents of a dev split can tell apart; the per-seed
means beside it show how much the seed moves each system. ``SYSTEM:VARIANT`` names one of a run's
predictions (ours-xrtransformer: ``default`` = XR-Transformer, ``xrlinear``, ``combined``). Prints a
Markdown table and writes ``<out>/<problem>-paired[-<tag>].{md,json}``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import write_result
from benchmarks.phases import PROBLEM_FILE, TIMINGS_FILE, preds_file
from benchmarks.report import git_commit, now
from benchmarks.workdata import Problem, read_problem
from xtransformer.utils.io import load_csr, load_json

BENCH_DIR = Path(__file__).resolve().parent
METRICS = ("P@1", "P@3", "P@5", "nDCG@5")


class PairedError(ValueError):
    """A system, problem or setting the comparison cannot use (one line)."""


@dataclass
class SystemRuns:
    """One system's (variant's) per-document metrics, averaged over its seeds."""

    name: str
    seeds: list[int]
    per_seed: dict[int, dict[str, float]]  # seed -> metric means
    per_doc: dict[str, np.ndarray]  # metric -> N values, mean over seeds
    steps_scale: float | None


def load_problem(work: Path, name: str) -> Problem:
    folder = work / name / "data"
    if not (folder / PROBLEM_FILE).is_file():
        raise PairedError(f"--problem: no prepared problem at {folder} (run benchmarks/run.py on it first)")
    return read_problem(folder)


def system_runs(problem: Problem, runs_root: Path, spec: str) -> SystemRuns:
    """``spec`` (``SYSTEM[:VARIANT]``): every seed's predictions of it under ``runs_root``."""
    from xtransformer.metrics import per_document

    system, _, variant = spec.partition(":")
    variant = variant or "default"
    dirs = sorted(
        (d for d in (runs_root / system).glob("r*") if d.name[1:].isdigit() and (d / preds_file(variant)).is_file()),
        key=lambda d: int(d.name[1:]),
    )
    if not dirs:
        raise PairedError(f"{spec}: no predictions {preds_file(variant)} under {runs_root / system}/r*")
    scales = {_steps_scale(d) for d in dirs}
    if len(scales) > 1:
        raise PairedError(f"{spec}: its seeds ran at different steps scales {sorted(map(str, scales))}")
    Y = problem.Y(problem.eval_split)
    docs = {int(d.name[1:]): per_document(Y, load_csr(d / preds_file(variant))) for d in dirs}
    seeds = sorted(docs)
    return SystemRuns(
        system if variant == "default" else f"{system} ({variant})",  # as the harness names its rows
        seeds,
        {s: {m: float(docs[s][m].mean()) for m in METRICS} for s in seeds},
        {m: np.mean([docs[s][m] for s in seeds], axis=0) for m in METRICS},
        scales.pop(),
    )


def _steps_scale(run_dir: Path) -> float | None:
    path = run_dir / TIMINGS_FILE
    return (load_json(path).get("info") or {}).get("steps_scale") if path.is_file() else None


def paired_bootstrap(diff: np.ndarray, resamples: int, seed: int, chunk: int = 1000) -> dict[str, float]:
    """Mean of ``diff`` (one value per document), its 95% interval over ``resamples`` resamplings
    of the documents, and the share of resamplings where it is above 0."""
    rng = np.random.default_rng(seed)
    means = np.concatenate(
        [
            diff[rng.integers(0, diff.size, size=(min(chunk, resamples - i), diff.size))].mean(axis=1)
            for i in range(0, resamples, chunk)
        ]
    )
    lo, hi = np.percentile(means, [2.5, 97.5])
    return {"diff": float(diff.mean()), "lo": float(lo), "hi": float(hi), "above_0": float(np.mean(means > 0))}


def compare(systems: list[SystemRuns], resamples: int, seed: int) -> dict[str, dict[str, dict[str, float]]]:
    """Each system after the first against the first, per metric."""
    ref = systems[0]
    return {
        s.name: {m: paired_bootstrap(s.per_doc[m] - ref.per_doc[m], resamples, seed) for m in METRICS}
        for s in systems[1:]
    }


def markdown(problem: Problem, systems: list[SystemRuns], diffs: dict[str, Any], resamples: int) -> str:
    n_docs = systems[0].per_doc[METRICS[0]].size
    head = (
        f"**{problem.name}** ({problem.eval_split}, {n_docs:,} documents) — {now()}, commit "
        f"{git_commit(BENCH_DIR.parent)}; metrics in %, each "
        f"system's mean over its seeds; against **{systems[0].name}**: the mean per-document difference "
        f"[95% interval, paired bootstrap over documents, {resamples:,} resamples] (share of resamples above 0)"
    )
    lines = [head, "", "| system | seeds | " + " | ".join(METRICS) + " |", "|---" * (len(METRICS) + 2) + "|"]
    for s in systems:
        label = s.name + ("" if s.steps_scale is None else f" (steps x{s.steps_scale:g})")
        cells = [_seed_cell(s, m) for m in METRICS]
        lines.append(f"| {label} | {', '.join(map(str, s.seeds))} | " + " | ".join(cells) + " |")
        if s.name in diffs:
            cells = [_diff_cell(diffs[s.name][m]) for m in METRICS]
            lines.append(f"| − {systems[0].name} | | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _seed_cell(s: SystemRuns, metric: str) -> str:
    mean = float(s.per_doc[metric].mean())
    if len(s.seeds) == 1:
        return f"{mean:.2f}"
    return f"{mean:.2f} ({' / '.join(f'{s.per_seed[k][metric]:.2f}' for k in s.seeds)})"


def _diff_cell(d: dict[str, float]) -> str:
    return f"{d['diff']:+.2f} [{d['lo']:+.2f}, {d['hi']:+.2f}] ({d['above_0']:.0%})"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("systems", nargs="+", metavar="SYSTEM[:VARIANT]", help="the reference first, then the others")
    p.add_argument("--problem", required=True, help="the problem's folder name under --work (benchmarks/run.py's)")
    p.add_argument("--work", type=Path, default=BENCH_DIR / "work")
    p.add_argument("--resamples", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=0, help="the bootstrap's seed")
    p.add_argument("--out", type=Path, default=BENCH_DIR / "results")
    p.add_argument("--tag", default="", help="suffix of the result files")
    return p


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    if len(args.systems) < 2:
        raise PairedError("name at least two systems: the reference, then one to compare with it")
    if args.resamples < 100:
        raise PairedError(f"--resamples must be >= 100, got {args.resamples}")
    problem = load_problem(args.work.resolve(), args.problem)
    systems = [system_runs(problem, problem.data_dir.parent / "runs", spec) for spec in args.systems]
    diffs = compare(systems, args.resamples, args.seed)
    md = markdown(problem, systems, diffs, args.resamples)
    result = {
        "problem": problem.name,
        "eval_split": problem.eval_split,
        "resamples": args.resamples,
        "systems": {s.name: {"seeds": s.seeds, "per_seed": s.per_seed, "steps_scale": s.steps_scale} for s in systems},
        "against": systems[0].name,
        "diffs": diffs,
        "markdown": md,
    }
    write_result(result, args.out, f"{problem.name}-paired" + (f"-{args.tag}" if args.tag else ""))
    print(md)
    return result


if __name__ == "__main__":
    try:
        main()
    except PairedError as exc:
        sys.exit(f"error: {exc}")
