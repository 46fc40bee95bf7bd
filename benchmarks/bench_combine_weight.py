"""XR-Transformer + XR-Linear: the combination's share (``combine_weight``) and the tree count of
each model, chosen on held-out training documents.

    python benchmarks/bench_combine_weight.py --cache-dir CACHE   # CACHE: the stage cache of `python train.py experiment=eurlex57k_xr_ensemble`

With the experiment's settings and the run's cached TF-IDF and embeddings: XR-Linear as a forest of
``--xrlinear-trees`` trees and XR-Transformer's final model as a forest of ``--final-trees``, both
trained on all but ``--holdout`` random training documents. The first n trees of a forest are the
n-tree model (tree i is seeded ``seed + i``), so every tree count is scored from one training. For
every pair of tree counts and XR-Transformer share w, the held-out documents are ranked by
``w · XR-T + (1 - w) · XR-L`` as the run combines them (the selection: best held-out P@1, then
P@1 + P@3 + P@5). Then the eval split with the run's own cached models at every share (the check;
nothing is chosen on it). The encoder was fine-tuned on the held-out documents too, so their
embeddings are a little easier than new ones. Prints the table and writes
``benchmarks/results/combine-weight-<tag>.{json,md}``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_matcher_weight import holdout_problem, save_selection, score_cells, selection_parser  # noqa: E402
from bench_xr_budget import stage_folder  # noqa: E402

SHARES = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
METRICS = ("P@1", "P@3", "P@5", "nDCG@5")


def main(argv: list[str] | None = None) -> None:
    from xtransformer.ensemble import ensemble_predictions
    from xtransformer.indexing.chain import ClusterChain
    from xtransformer.metrics import evaluate
    from xtransformer.pipeline.stages import train_final, tree_model
    from xtransformer.ranker import load_tree_model
    from xtransformer.xrtransformer.model import final_features

    ap = selection_parser(__doc__, "stage cache of a finished run of the experiment")
    ap.add_argument("--experiment", default="eurlex57k_xr_ensemble")
    ap.add_argument("--xrlinear-trees", type=int, default=3, help="largest XR-Linear forest scored")
    ap.add_argument("--final-trees", type=int, default=2, help="largest XR-Transformer final forest scored")
    args = ap.parse_args(argv)
    s, ds, X, Y, fit, held = holdout_problem(args, args.experiment)
    ev = ds.eval_split
    emb = stage_folder(args.cache_dir, "xrembed") / "embeddings"
    fcfg, x = s.xrtransformer.final, s.xrlinear
    F = {n: final_features(fcfg.features, X[n], np.load(emb / f"{n}.npy"), fcfg.model.neural_weight) for n in X}
    tree = ClusterChain.load(stage_folder(args.cache_dir, "indexing") / "chain", ds.vocab.ids).subsample(
        s.xrtransformer.nr_splits)

    def trees(model):
        return getattr(model, "trees", [model])

    def forest(preds: list, n: int):
        return preds[0] if n == 1 else ensemble_predictions(preds[:n], "average", x.model.topk)

    t0 = time.perf_counter()
    xrl = tree_model(x.indexing, x.nr_splits, x.model, X["train"][fit], Y[fit], ds.vocab.ids, args.xrlinear_trees)[0]
    print(f"XR-Linear, {args.xrlinear_trees} trees on {len(fit)} documents: {time.perf_counter() - t0:.0f} s", flush=True)
    xrt = train_final(dataclasses.replace(fcfg, n_trees=args.final_trees), F["train"][fit], Y[fit], ds.vocab.ids,
                      tree, s.indexing.merge)[0]
    print(f"XR-Transformer final model, {args.final_trees} trees: {time.perf_counter() - t0:.0f} s", flush=True)
    held_preds = {"xrlinear": [t.predict(X["train"][held]) for t in trees(xrl)],
                  "xrtransformer": [t.predict(F["train"][held]) for t in trees(xrt)]}
    run_models = {"xrlinear": load_tree_model(stage_folder(args.cache_dir, "xrlinear") / "model"),
                  "xrtransformer": load_tree_model(stage_folder(args.cache_dir, "xrfinal") / "model")}
    ev_preds = {"xrlinear": run_models["xrlinear"].predict(X[ev]), "xrtransformer": run_models["xrtransformer"].predict(F[ev])}
    run_trees = (len(trees(run_models["xrlinear"])), len(trees(run_models["xrtransformer"])))

    def scores(Y_true, pred) -> dict[str, float]:
        r = evaluate(Y_true, pred)
        return {m: round(r[m], 2) for m in METRICS}

    def combine(t, l, w: float):
        return t if w == 1.0 else l if w == 0.0 else ensemble_predictions([t, l], "average", weights=[w, 1.0 - w])

    rows = []
    for nl in range(1, args.xrlinear_trees + 1):
        for nt in range(1, args.final_trees + 1):
            hl, ht = forest(held_preds["xrlinear"], nl), forest(held_preds["xrtransformer"], nt)
            for w in (0.0, *SHARES, 1.0):
                if (w == 1.0 and nl != 1) or (w == 0.0 and nt != 1):
                    continue  # each model alone once per tree count
                row = {"xrlinear_trees": nl, "final_trees": nt, "share": w,
                       "holdout": scores(Y[held], combine(ht, hl, w))}
                if (w == 1.0 or nl == run_trees[0]) and (w == 0.0 or nt == run_trees[1]):  # the run's models
                    row[ev] = scores(ds.splits[ev].Y, combine(ev_preds["xrtransformer"], ev_preds["xrlinear"], w))
                rows.append(row)
                print(json.dumps(row), flush=True)
    mixed = [r for r in rows if 0.0 < r["share"] < 1.0]
    best_row = max(mixed, key=lambda r: (r["holdout"]["P@1"], r["holdout"]["P@1"] + r["holdout"]["P@3"]
                                         + r["holdout"]["P@5"]))
    best = {k: best_row[k] for k in ("xrlinear_trees", "final_trees", "share")}
    lines = [f"held out: {args.holdout} random training documents (seed {args.seed}); eval: {ev} (the run's models: "
             f"{run_trees[0]} XR-Linear tree(s), {run_trees[1]} final tree(s)); best on the held-out documents by "
             f"P@1, then P@1 + P@3 + P@5: {best}. Share 1: XR-Transformer alone, 0: XR-Linear alone.", "",
             f"| XR-L trees | XR-T trees | XR-T share | held-out P@1 | P@3 | P@5 | {ev} P@1 | P@3 | P@5 | nDCG@5 |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        nl = "–" if r["share"] == 1.0 else r["xrlinear_trees"]
        nt = "–" if r["share"] == 0.0 else r["final_trees"]
        lines.append(f"| {nl} | {nt} | {r['share']} | {score_cells(r, ev)} |")
    save_selection(f"combine-weight-{args.tag}", best, rows, lines)


if __name__ == "__main__":
    main()
