"""Paired comparison of systems that ran on one problem: per-document differences, over their seeds.

    python -m benchmarks.paired --problem eurlex57k-tfidf28173255 pecos-xrt ours-xrtransformer \\
        ours-xrtransformer:combined

The first system is the reference; each other one is compared with it on the eval split's documents.
Every seed of a system that ``python -m benchmarks.run`` left in ``<work>/<problem>/runs/<system>/r<seed>``
counts (``--first-repeat`` adds seeds): a document's P@k / nDCG@k is averaged over the system's
seeds, and the difference with the reference is resampled over documents (paired bootstrap), so the
interval shows how much of a gap the 6,000 documents of a dev split can tell apart; the per-seed
means beside it show how much the seed moves each system. ``SYSTEM:VARIANT`` names one of a run's
predictions (ours-xrtransformer: ``default`` = XR-Transformer, ``xrlinear``, ``combined``). Prints a
Markdown table and writes ``<out>/<problem>-paired[-<tag>].{md,json}``.

Each seed it reads is also kept as a record of a few bytes a document (which of its top 5 were true
labels, and how many it has) in ``<out>/per-document/<problem>/<system>[.<variant>]/r<seed>.npz``;
a seed whose predictions are gone from ``--work`` (a run on another machine, a cleaned work folder)
still counts through its record, so a comparison can grow by seeds over time.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import write_result
from benchmarks.phases import PROBLEM_FILE, TIMINGS_FILE, preds_file
from benchmarks.report import git_commit, now
from benchmarks.workdata import Problem, read_problem
from xtransformer.api import atomic_path, load_csr, load_json

BENCH_DIR = Path(__file__).resolve().parent
METRICS = ("P@1", "P@3", "P@5", "nDCG@5")
RECORD_K = 5  # the deepest metric above


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


@dataclass
class Record:
    """One seed's ranked hits on the eval split: ``hits`` N x RECORD_K bool, ``n_true`` N."""

    hits: np.ndarray
    n_true: np.ndarray
    eval_split: str
    steps_scale: float | None


def load_problem(work: Path, name: str) -> Problem | None:
    """The prepared problem, or None where ``--work`` holds none (records may stand in)."""
    folder = work / name / "data"
    return read_problem(folder) if (folder / PROBLEM_FILE).is_file() else None


def record_dir(records: Path, system: str, variant: str) -> Path:
    return records / (system if variant == "default" else f"{system}.{variant}")


def save_record(rec: Record, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    scale = np.nan if rec.steps_scale is None else rec.steps_scale
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        np.savez_compressed(
            fh,
            hits=np.packbits(rec.hits, axis=1),
            n_true=rec.n_true.astype(np.uint32),
            k=rec.hits.shape[1],
            eval_split=rec.eval_split,
            steps_scale=scale,
        )


def load_record(path: Path) -> Record:
    with np.load(path) as z:
        hits = np.unpackbits(z["hits"], axis=1, count=int(z["k"])).astype(bool)
        scale = float(z["steps_scale"])
        return Record(hits, z["n_true"].astype(np.int64), str(z["eval_split"]), None if np.isnan(scale) else scale)


def _seed_dirs(root: Path, pattern: str) -> dict[int, Path]:
    """``r<seed>`` entries under ``root`` matching ``pattern`` (``r*`` folders or ``r*.npz`` files)."""
    found = {}
    for path in root.glob(pattern):
        stem = path.name.split(".")[0]
        if stem[1:].isdigit():
            found[int(stem[1:])] = path
    return found


def seed_records(problem: Problem | None, records: Path, spec: str) -> dict[int, Record]:
    """``spec`` (``SYSTEM[:VARIANT]``): a record per seed, from its predictions in the problem's
    runs (saved as records on the way) or, for seeds whose predictions are gone, from its records."""
    system, _, variant = spec.partition(":")
    variant = variant or "default"
    kept = record_dir(records, system, variant)
    out = {seed: load_record(path) for seed, path in _seed_dirs(kept, "r*.npz").items()}
    runs = None
    if problem is not None:
        runs = problem.data_dir.parent / "runs" / system
        out |= _records_from_runs(problem, runs, variant, kept)
    if not out:
        where = "" if runs is None else f"no predictions {preds_file(variant)} under {runs}/r* and "
        raise PairedError(f"{spec}: {where}no records under {kept}")
    return dict(sorted(out.items()))


def _records_from_runs(problem: Problem, runs: Path, variant: str, kept: Path) -> dict[int, Record]:
    """The records of every seed whose predictions are under ``runs``, each saved in ``kept``."""
    from xtransformer.api import document_hits

    found = {s: d for s, d in _seed_dirs(runs, "r*").items() if (d / preds_file(variant)).is_file()}
    Y = problem.Y(problem.eval_split) if found else None
    out = {}
    for seed, run_dir in found.items():
        hits, n_true = document_hits(Y, load_csr(run_dir / preds_file(variant)), RECORD_K)
        out[seed] = Record(hits, n_true, problem.eval_split, _steps_scale(run_dir))
        save_record(out[seed], kept / f"r{seed}.npz")
    return out


def system_runs(name: str, records: dict[int, Record]) -> SystemRuns:
    """One system's records, each seed's per-document metrics and their mean over the seeds."""
    from xtransformer.api import per_document_from_hits

    scales = {r.steps_scale for r in records.values()}
    if len(scales) > 1:
        raise PairedError(f"{name}: its seeds ran at different steps scales {sorted(map(str, scales))}")
    docs = {s: per_document_from_hits(r.hits, r.n_true) for s, r in records.items()}
    seeds = sorted(docs)
    return SystemRuns(
        name,
        seeds,
        {s: {m: float(docs[s][m].mean()) for m in METRICS} for s in seeds},
        {m: np.mean([docs[s][m] for s in seeds], axis=0) for m in METRICS},
        scales.pop(),
    )


def display_name(spec: str) -> str:
    system, _, variant = spec.partition(":")
    return system if variant in ("", "default") else f"{system} ({variant})"  # as the harness names its rows


def check_aligned(specs: list[str], records: list[dict[int, Record]]) -> None:
    """Every seed of every system scored the same documents (the same truth, document by document)."""
    first = next(iter(records[0].values()))
    for spec, recs in zip(specs, records):
        for seed, rec in recs.items():
            if rec.eval_split != first.eval_split or not np.array_equal(rec.n_true, first.n_true):
                raise PairedError(f"{spec} seed {seed}: scored other documents than {specs[0]} ({rec.eval_split})")


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


def markdown(problem: str, eval_split: str, systems: list[SystemRuns], diffs: dict[str, Any], resamples: int) -> str:
    n_docs = systems[0].per_doc[METRICS[0]].size
    head = (
        f"**{problem}** ({eval_split}, {n_docs:,} documents) — {now()}, commit "
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
    p.add_argument("--problem", required=True, help="the problem's folder name under --work (benchmarks.run's)")
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
    records_root = args.out / "per-document" / args.problem
    if problem is None and not records_root.is_dir():
        raise PairedError(
            f"--problem: no prepared problem at {args.work / args.problem / 'data'} and no records at {records_root}"
        )
    records = [seed_records(problem, records_root, spec) for spec in args.systems]
    check_aligned(args.systems, records)
    systems = [system_runs(display_name(spec), recs) for spec, recs in zip(args.systems, records)]
    eval_split = next(iter(records[0].values())).eval_split
    diffs = compare(systems, args.resamples, args.seed)
    md = markdown(args.problem, eval_split, systems, diffs, args.resamples)
    result = {
        "problem": args.problem,
        "eval_split": eval_split,
        "resamples": args.resamples,
        "systems": {s.name: {"seeds": s.seeds, "per_seed": s.per_seed, "steps_scale": s.steps_scale} for s in systems},
        "against": systems[0].name,
        "diffs": diffs,
        "markdown": md,
    }
    write_result(result, args.out, f"{args.problem}-paired" + (f"-{args.tag}" if args.tag else ""))
    print(md)
    return result


if __name__ == "__main__":
    try:
        main()
    except PairedError as exc:
        sys.exit(f"error: {exc}")
