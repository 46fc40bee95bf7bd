"""Our XR-Transformer's seeds averaged: how much P@1 an ensemble of encoders buys, and at what time.

    python -m experiments.seed_ensemble.ensemble_seeds --problem eurlex57k-tfidf28173255 \\
        --reference benchmarks/results/eurlex57k-tfidf28173255-pecos-xrt-recipe{,-seed1}.json --tag dev

Reads the predictions that ``python -m benchmarks.run --systems ours-xrtransformer`` left for each seed in
``<work>/<problem>/runs/ours-xrtransformer/r<seed>`` (``preds.default.npz``: XR-Transformer;
``preds.combined.npz``: with XR-Linear) and averages them over every set of seeds
(``xtransformer.ensemble.ensemble_predictions``, ``average``): an ensemble of K encoders, each with
its own tree and final model, as X-Transformer and XR-Transformer ensemble theirs. Its seconds are
its members' (each member's training and prediction, as the harness timed them: an upper bound, as
each member also built the TF-IDF). The reference is the mean of the given harness results' P@k
and the first one's whole-run seconds. Dev only reports: nothing here sets a default.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import numpy as np

from benchmarks.phases import TIMINGS_FILE, preds_file
from benchmarks.workdata import read_problem
from xtransformer.api import atomic_path, ensemble_predictions, evaluate, load_csr, load_json, save_json

ROOT = Path(__file__).resolve().parents[2]
METRICS = ("P@1", "P@3", "P@5", "nDCG@5")
VARIANTS = {"default": "XR-Transformer", "combined": "XR-Transformer + XR-Linear"}


def member_seconds(run_dir: Path, variant: str) -> float:
    """A member's training plus its prediction of the eval split, as the harness timed them."""
    p = load_json(run_dir / TIMINGS_FILE)["predictions"][variant]
    return float(p["fit_seconds"]["train"] + p["predict_s"])


def reference(paths: list[Path]) -> dict[str, float]:
    """The mean over the given harness results of their one system's P@k; the first one's whole-run
    seconds (the clean timing: list it first)."""
    rows = [next(iter(load_json(p)["summary"].values())) for p in paths]
    return {m: float(np.mean([r[m]["median"] for r in rows])) for m in METRICS} | {"run_s": rows[0]["run_s"]["median"]}


def ensembles(run_dirs: dict[int, Path], Y, variant: str) -> list[dict]:
    """Every non-empty set of seeds: its averaged predictions' metrics and its members' seconds."""
    preds = {s: load_csr(d / preds_file(variant)) for s, d in run_dirs.items()}
    rows = []
    for size in range(1, len(preds) + 1):
        for seeds in itertools.combinations(sorted(preds), size):
            scores = ensemble_predictions([preds[s] for s in seeds], "average", topk=20)
            m = evaluate(Y, scores, ks=(1, 3, 5))
            rows.append(
                {
                    "variant": variant,
                    "seeds": list(seeds),
                    **{k: float(m[k]) for k in METRICS},
                    "seconds": sum(member_seconds(run_dirs[s], variant) for s in seeds),
                }
            )
    return rows


def table(rows: list[dict], ref: dict[str, float]) -> str:
    head = "| members | seeds | P@1 | P@3 | P@5 | nDCG@5 | − reference P@1 / P@3 / P@5 | seconds | of reference's |"
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        gaps = " / ".join(f"{r[m] - ref[m]:+.2f}" for m in METRICS[:3])
        cells = " | ".join(f"{r[m]:.2f}" for m in METRICS)
        seeds = ", ".join(map(str, r["seeds"]))
        share = r["seconds"] / ref["run_s"]
        lines.append(
            f"| {VARIANTS[r['variant']]} × {len(r['seeds'])} | {seeds} | {cells} | {gaps} | "
            f"{r['seconds']:,.0f} | {share:.2f} |"
        )
    ref_cells = " | ".join(f"{ref[m]:.2f}" for m in METRICS)
    lines.append(f"| reference (mean) | | {ref_cells} | | {ref['run_s']:,.0f} | 1.00 |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problem", required=True, help="the harness's problem folder name under --work")
    ap.add_argument("--work", type=Path, default=ROOT / "benchmarks" / "work")
    ap.add_argument("--system", default="ours-xrtransformer")
    ap.add_argument("--reference", type=Path, nargs="+", required=True, help="harness result JSON files")
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--tag", default="dev")
    args = ap.parse_args(argv)
    problem = read_problem(args.work / args.problem / "data")
    runs = args.work / args.problem / "runs" / args.system
    run_dirs = {int(d.name[1:]): d for d in sorted(runs.glob("r*")) if d.name[1:].isdigit()}
    if not run_dirs:
        sys.exit(f"{runs}: no r<seed> folders; run python -m benchmarks.run --systems {args.system} first")
    Y = problem.Y(problem.eval_split)
    rows = [r for v in VARIANTS for r in ensembles(run_dirs, Y, v)]
    ref = reference(args.reference)
    text = table(rows, ref)
    print(text)
    stem = args.results / f"seed-ensemble-{args.problem}-{args.tag}"
    save_json(
        {"problem": args.problem, "reference": [str(p) for p in args.reference], "rows": rows, "ref": ref},
        stem.with_suffix(".json"),
    )
    with atomic_path(stem.with_suffix(".md")) as tmp:
        tmp.write_text(text + "\n")


if __name__ == "__main__":
    main()
