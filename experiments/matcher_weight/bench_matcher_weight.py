"""The weight of the tree's path score at the label level (``matcher_weight`` w of the hierarchical
linear model: a label scores t(label) * path^w), chosen on held-out training documents.

    python experiments/matcher_weight/bench_matcher_weight.py --cache-dir CACHE   # CACHE: the stage cache of `python train.py experiment=eurlex57k_xr`

For XR-Transformer's final model (TF-IDF ⊕ the run's fine-tuned embeddings) and for XR-Linear
(TF-IDF), each with the run's settings (``stages.train_final`` / ``stages.tree_model``): train on all
but ``--holdout`` random training documents and score those for every weight (the selection), then
score the eval split with the run's own cached models (the check; nothing is chosen on it). The
encoder was fine-tuned on the held-out documents too, so their embeddings are a little easier than
new ones: the selection reads the shape of the curve, not its level. Prints the table and writes
``benchmarks/results/matcher-weight-<tag>.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

EXPERIMENTS = Path(__file__).resolve().parents[1]  # the studies import each other across their folders
sys.path[:0] = [str(EXPERIMENTS / "xr_budget")]
from bench_xr_budget import holdout_rows, settings, stage_folder  # noqa: E402

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
WEIGHTS = (0.0, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0)
METRICS = ("P@1", "P@3", "P@5", "nDCG@5")


def main(argv: list[str] | None = None) -> None:
    from xtransformer.indexing.chain import ClusterChain
    from xtransformer.metrics import evaluate
    from xtransformer.pipeline.stages import train_final, tree_model
    from xtransformer.ranker import HierarchicalLinear, LinearForest, load_tree_model
    from xtransformer.xrtransformer.model import final_features

    args = selection_parser(__doc__, "stage cache of a finished eurlex57k_xr run").parse_args(argv)
    s, ds, X, Y, fit, held = holdout_problem(args)
    ev = ds.splits[ds.eval_split]
    emb = stage_folder(args.cache_dir, "xrembed") / "embeddings"
    fcfg = s.xrtransformer.final
    F = {n: final_features(fcfg.features, X[n], np.load(emb / f"{n}.npy"), fcfg.model.neural_weight) for n in X}
    chain = ClusterChain.load(stage_folder(args.cache_dir, "indexing") / "chain", ds.vocab.ids)

    def xrt_holdout() -> HierarchicalLinear | LinearForest:
        return train_final(fcfg, F["train"][fit], Y[fit], ds.vocab.ids, chain.subsample(s.xrtransformer.nr_splits),
                           s.indexing.merge)[0]

    def xrl_holdout() -> HierarchicalLinear | LinearForest:
        x = s.xrlinear
        return tree_model(x.indexing, x.nr_splits, x.model, X["train"][fit], Y[fit], ds.vocab.ids, x.n_trees)[0]

    models = {  # name -> (features, eval-split model of the run, held-out model builder)
        "xrtransformer": ("F", load_tree_model(stage_folder(args.cache_dir, "xrfinal") / "model"), xrt_holdout),
        "xrlinear": ("X", load_tree_model(stage_folder(args.cache_dir, "xrlinear") / "model"), xrl_holdout),
    }
    rows = []
    for name, (kind, run_model, build) in models.items():
        feats = F if kind == "F" else X
        t0 = time.perf_counter()
        held_model = build()
        print(f"{name}: model on {len(fit)} training documents in {time.perf_counter() - t0:.0f} s", flush=True)
        for w in WEIGHTS:
            h = evaluate(Y[held], held_model.predict(feats["train"][held], matcher_weight=w))
            e = evaluate(ev.Y, run_model.predict(feats[ds.eval_split], matcher_weight=w))
            rows.append({"model": name, "matcher_weight": w, "holdout": {m: round(h[m], 2) for m in METRICS},
                         ds.eval_split: {m: round(e[m], 2) for m in METRICS}})
            print(json.dumps(rows[-1]), flush=True)
    best = {n: max((r for r in rows if r["model"] == n), key=lambda r: (r["holdout"]["P@1"] + r["holdout"]["P@3"]
                                                                       + r["holdout"]["P@5"]))["matcher_weight"]
            for n in models}
    lines = [f"held out: {args.holdout} random training documents (seed {args.seed}); eval: {ds.eval_split}; "
             f"best on the held-out documents by P@1 + P@3 + P@5: {best}", "",
             f"| model | matcher_weight | held-out P@1 | P@3 | P@5 | {ds.eval_split} P@1 | P@3 | P@5 | nDCG@5 |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['matcher_weight']} | {score_cells(r, ds.eval_split)} |" for r in rows]
    save_selection(f"matcher-weight-{args.tag}", best, rows, lines)


def selection_parser(doc: str, cache_help: str) -> argparse.ArgumentParser:
    """The options every held-out selection on a run's stage cache takes."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--cache-dir", type=Path, required=True, help=cache_help)
    ap.add_argument("--holdout", type=int, default=5000, help="random training documents held out for the selection")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tag", default="eurlex57k")
    return ap


def holdout_problem(args: argparse.Namespace) -> tuple:
    """experiment=eurlex57k_xr's settings and data, the run's cached TF-IDF of train and the eval
    split, the training labels, and the rows fitted on / held out (``args.holdout`` random ones)."""
    from xtransformer.data import load_dataset

    s = settings([])  # experiment=eurlex57k_xr, as bench_xr_budget.py
    ds = load_dataset(s.data)
    tfidf = stage_folder(args.cache_dir, "tfidf")
    X = {n: sp.load_npz(tfidf / f"X.{n}.npz").tocsr() for n in ("train", ds.eval_split)}
    Y = ds.splits["train"].Y.tocsr()
    return s, ds, X, Y, *holdout_rows(Y.shape[0], args.holdout, args.seed)


def score_cells(r: dict, split: str) -> str:
    """A selection row's held-out P@1 / P@3 / P@5 and eval-split P@1 / P@3 / P@5 / nDCG@5 cells."""
    h, e = r["holdout"], r.get(split)
    tail = f"{e['P@1']:.2f} | {e['P@3']:.2f} | {e['P@5']:.2f} | {e['nDCG@5']:.2f}" if e else "– | – | – | –"
    return f"{h['P@1']:.2f} | {h['P@3']:.2f} | {h['P@5']:.2f} | {tail}"


def save_selection(stem: str, best: object, rows: list[dict], lines: list[str]) -> None:
    """Print a held-out selection's table; write ``results/<stem>.{json,md}``."""
    table = "\n".join(lines)
    print(table)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps({"best": best, "rows": rows}, indent=1))
    (RESULTS / f"{stem}.md").write_text(table + "\n")


if __name__ == "__main__":
    main()
