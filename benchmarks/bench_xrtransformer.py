"""XR-Transformer ablations: each variant is one `python train.py` run; the table is read from
the runs' metrics.json (quality on the eval split, fine-tuning seconds, predict docs/s).

    python -m benchmarks.bench_xrtransformer --experiment eurlex57k_xr               # every variant
    python -m benchmarks.bench_xrtransformer --experiment eurlex57k_xr --variants full,neural_only,same_tree
    python -m benchmarks.bench_xrtransformer --data reuters21578 --variants full,one_level,fresh,dense
    python -m benchmarks.bench_xrtransformer --rerender A.json B.json --out table.md   # rows of several runs

Runs share one stage cache (``--cache-dir``), so variants that differ only in the final linear
model (``neural_only``, ``same_tree``) reuse the fine-tuned encoder of ``full``; their fine-tuning
seconds are those of the run that trained it. ``predict docs/s`` is end to end for a new text:
encoding (the embedding pass's rate on the eval split) plus the linear model's beam search.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

# name -> (what it tests, overrides on top of the base run)
VARIANTS: dict[str, tuple[str, list[str]]] = {
    "full": (
        "multi-level, inherited heads, shortlist loss, TF-IDF ⊕ neural, re-clustered tree, final model on TFN + MAN",
        [],
    ),
    "one_level": ("one level (the finest, dense loss) with the same total steps", ["xrtransformer.levels=last"]),
    "fresh": ("fresh (random) heads at every level", ["xrtransformer.bootstrap=fresh"]),
    "weighted_linear": (
        "heads solved on the previous level's embeddings (eq. 11)",
        ["xrtransformer.bootstrap=weighted-linear"],
    ),
    "dense": ("dense loss over every cluster of each level", ["xrtransformer.shortlist=false"]),
    "neural_only": ("final features: fine-tuned embeddings alone", ["xrtransformer.final.features=neural"]),
    "same_tree": ("final model on the fine-tuning tree (no re-clustering)", ["xrtransformer.final.tree=same"]),
    "head_average": (
        "prediction also averages the label-level head's scores (final.combine_head)",
        ["xrtransformer.final.combine_head=average"],
    ),
    "threshold_0.001": (
        "final model pruned at abs(w) < 0.001 (PECOS's XR-Transformer ranker) instead of 0.01",
        ["xrtransformer.final.model.threshold=0.001"],
    ),
    "threshold_0.1": ("final model pruned at abs(w) < 0.1 (XR-Linear's)", ["xrtransformer.final.model.threshold=0.1"]),
    "final_tfn": (
        "final model trained on TFN negatives only (no negatives from its own beam)",
        ["xrtransformer.final.model.negatives=tfn"],
    ),
}


def total_steps(overrides: list[str]) -> int:
    """The run's total steps (for `one_level`, which must train as many steps on one level)."""
    from xtransformer.api import compose_settings

    matcher = compose_settings(*overrides).main.matcher
    return int(sum(matcher.level_steps)) if matcher.level_steps is not None else int(matcher.max_steps)


def run_variant(name: str, base: list[str], cache_dir: Path, out_root: Path) -> dict:
    why, extra = VARIANTS[name]
    overrides = [*base, *extra]
    if name == "one_level":
        overrides.append(f"matcher.level_steps=[{total_steps(base)}]")
    out = out_root / name
    cmd = [
        sys.executable,
        str(ROOT / "train.py"),
        *overrides,
        f"paths.cache_dir={cache_dir}",
        f"paths.output_dir={out}",
        "logger=csv",
    ]
    print("$", " ".join(cmd[1:]), flush=True)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"})
    if proc.returncode != 0:
        raise SystemExit(f"variant {name} failed (exit {proc.returncode})")
    m = json.loads((out / "metrics.json").read_text())
    res = m["results"]["xrtransformer"]
    # the run scores its eval split through the model's own predict (texts -> TF-IDF, encoder, beam search)
    docs_s = m.get("reports", {}).get("xrtransformer", {}).get("predict_docs_per_s")
    row = {
        "variant": name,
        "what": why,
        "overrides": extra,
        "P@1": res["P@1"],
        "P@3": res["P@3"],
        "P@5": res["P@5"],
        "R@5": res.get("R@5"),
        "finetune_s": sum(lv["seconds"] for lv in m["levels"]),
        "levels": [
            (lv["clusters"], lv["steps"], lv.get(next((k for k in lv if k.startswith("eval_recall")), ""), None))
            for lv in m["levels"]
        ],
        "predict_docs_s": docs_s,
        "run_wall_s": time.perf_counter() - start,
        "peak_rss_gib": m["peak_rss_gib"],
        "combined_P@1": m["results"].get("xrtransformer+xrlinear", {}).get("P@1"),
        "combined": {k: m["results"].get("xrtransformer+xrlinear", {}).get(k) for k in ("P@1", "P@3", "P@5", "nDCG@5")},
        "xrlinear": {k: m["results"].get("xrlinear", {}).get(k) for k in ("P@1", "P@3", "P@5", "nDCG@5")},
        "nDCG@5": res.get("nDCG@5"),
        "timings_s": m["timings_s"],
        "xrlinear_P@1": m["results"].get("xrlinear", {}).get("P@1"),
    }
    print(json.dumps(row), flush=True)
    return row


def render(rows: list[dict], title: str, command: str) -> str:
    lines = [
        f"# {title}",
        "",
        f"`{command}`",
        "",
        "| variant | P@1 | P@3 | P@5 | R@5 | fine-tuning s | predict docs/s | levels (clusters, steps, eval recall) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        docs = f"{r['predict_docs_s']:.0f}" if r.get("predict_docs_s") else "–"
        levels = "; ".join(f"{c}/{s}/{rec}" for c, s, rec in r["levels"])
        lines.append(
            f"| {r['variant']}: {r['what']} | {r['P@1']:.2f} | {r['P@3']:.2f} | {r['P@5']:.2f} | "
            f"{r['R@5']:.2f} | {r['finetune_s']:.0f} | {docs} | {levels} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experiment", help="experiment config, e.g. eurlex57k_xr")
    ap.add_argument("--data", help="data config when no experiment is given (method=xrtransformer)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {list(VARIANTS)}")
    ap.add_argument("--override", action="append", default=[], help="extra Hydra override (repeatable)")
    ap.add_argument("--cache-dir", type=Path, default=ROOT / "benchmarks" / "work" / "xrtransformer" / "cache")
    ap.add_argument("--tag", default=None, help="result file suffix (default: experiment or data name)")
    ap.add_argument(
        "--rerender", type=Path, nargs="+", help="print the table of saved JSON results (rows concatenated)"
    )
    ap.add_argument("--out", type=Path, help="with --rerender: also write the table here")
    args = ap.parse_args()
    if args.rerender:
        saved = [json.loads(f.read_text()) for f in args.rerender]
        rows = [r for one in saved for r in one["rows"]]
        table = render(rows, saved[0]["title"], "; ".join(one["command"] for one in saved))
        if args.out:
            args.out.write_text(table)
        print(table)
        return
    base = (
        [f"experiment={args.experiment}"]
        if args.experiment
        else ["method=xrtransformer"] + ([f"data={args.data}"] if args.data else [])
    )
    base += args.override
    tag = args.tag or args.experiment or args.data or "reuters21578"
    out_root = ROOT / "benchmarks" / "work" / "xrtransformer" / tag
    rows = [run_variant(v, base, args.cache_dir, out_root) for v in args.variants.split(",")]
    command = "python -m benchmarks.bench_xrtransformer " + " ".join(sys.argv[1:])
    title = f"XR-Transformer ablations ({tag}, eval split of the run)"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"xrtransformer-{tag}.json").write_text(
        json.dumps({"title": title, "command": command, "rows": rows}, indent=2) + "\n"
    )
    table = render(rows, title, command)
    (RESULTS / f"xrtransformer-{tag}.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
