"""How to combine XR-Transformer with XR-Linear (``combine_weight``, final-model trees), chosen by
K-fold cross-validation on the training documents.

    python experiments/xr_combination/bench_xr_combination.py --cache-dir CACHE   # CACHE: the stage cache of `python train.py experiment=eurlex57k_xr_ensemble`

One held-out split of 5,000 documents moves P@1 by 0.02 per document, as much as the choices
differ, so every training document is held out once: for each of ``--folds`` folds, XR-Linear and
XR-Transformer's final model (``--trees`` re-clustered trees, run settings otherwise) are trained on
the other folds (TF-IDF and the run's cached embeddings) and predict the fold; the table scores
every (trees, share) pair on all folds' predictions together. Then the eval split is scored with the
run's own cached models (the check; nothing is chosen on it). The encoder was fine-tuned on every
training document, so held-out embeddings are a little easier than new ones. Each fold's
predictions are kept in ``benchmarks/work/xr-combination-<tag>/`` (a rerun goes on from there).
Prints the table and writes ``benchmarks/results/xr-combination-<tag>.{json,md}``.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

EXPERIMENTS = Path(__file__).resolve().parents[1]  # the studies import each other across their folders
sys.path[:0] = [str(EXPERIMENTS / "matcher_weight"), str(EXPERIMENTS / "xr_budget")]
from bench_matcher_weight import METRICS, save_selection, selection_parser  # noqa: E402
from bench_xr_budget import settings, stage_folder  # noqa: E402

WORK = Path(__file__).resolve().parents[2] / "benchmarks" / "work"
SHARES = (0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def main(argv: list[str] | None = None) -> None:
    from xtransformer.data import load_dataset
    from xtransformer.ensemble import ensemble_predictions
    from xtransformer.indexing.chain import ClusterChain
    from xtransformer.metrics import evaluate
    from xtransformer.ranker import LinearForest, load_tree_model
    from xtransformer.xrtransformer.model import final_features

    ap = selection_parser(__doc__, "stage cache of a finished eurlex57k_xr_ensemble run")
    ap.add_argument("--folds", type=int, default=5, help="cross-validation folds of the training documents")
    ap.add_argument("--trees", type=int, default=2, help="final-model trees trained per fold (1..trees scored)")
    args = ap.parse_args(argv)
    s = settings([], experiment="eurlex57k_xr_ensemble")
    ds = load_dataset(s.data)
    tfidf = stage_folder(args.cache_dir, "tfidf")
    X = {n: sp.load_npz(tfidf / f"X.{n}.npz").tocsr() for n in ("train", ds.eval_split)}
    Y = ds.splits["train"].Y.tocsr()
    emb = stage_folder(args.cache_dir, "xrembed") / "embeddings"
    fcfg = dataclasses.replace(s.xrtransformer.final, n_trees=args.trees)
    F = {n: final_features(fcfg.features, X[n], np.load(emb / f"{n}.npy"), fcfg.model.neural_weight) for n in X}
    chain = ClusterChain.load(stage_folder(args.cache_dir, "indexing") / "chain", ds.vocab.ids)
    folds = np.array_split(np.random.default_rng(args.seed).permutation(Y.shape[0]), args.folds)
    work = WORK / f"xr-combination-{args.tag}"
    work.mkdir(parents=True, exist_ok=True)
    held, xrl, xrt = [], [], [[] for _ in range(args.trees)]
    for k, rows in enumerate(folds):
        rows = np.sort(rows)
        fit = np.setdiff1d(np.arange(Y.shape[0]), rows)
        preds = fold_predictions(work / f"fold{k}-of-{args.folds}-trees{args.trees}", s, fcfg, chain, X["train"],
                                 F["train"], Y, ds.vocab.ids, fit, rows)
        held.append(rows)
        xrl.append(preds["xrlinear"])
        for t in range(args.trees):
            xrt[t].append(preds[f"tree{t}"])
        print(f"fold {k + 1}/{args.folds}: {len(rows)} documents held out", flush=True)
    truth = Y[np.concatenate(held)]
    xrl_all = sp.vstack(xrl).tocsr()
    topk = s.xrtransformer.final.model.topk
    # t final-model trees: the mean of the first t trees' predictions (a LinearForest's prediction)
    xrt_all = [ensemble_predictions([sp.vstack(xrt[i]).tocsr() for i in range(t)], "average", topk) if t > 1
               else sp.vstack(xrt[0]).tocsr() for t in range(1, args.trees + 1)]
    run_xrt = load_tree_model(stage_folder(args.cache_dir, "xrfinal") / "model")
    run_trees = run_xrt.trees if isinstance(run_xrt, LinearForest) else [run_xrt]
    ev_trees = [t.predict(F[ds.eval_split]) for t in run_trees]
    ev_xrl = load_tree_model(stage_folder(args.cache_dir, "xrlinear") / "model").predict(X[ds.eval_split])
    ev_y = ds.splits[ds.eval_split].Y

    def scores(y: sp.spmatrix, p: sp.spmatrix) -> dict[str, float]:
        r = evaluate(y, p)
        return {m: round(r[m], 2) for m in METRICS}

    rows_out = [{"model": "xrlinear", "trees": s.xrlinear.n_trees, "share": 0.0, "holdout": scores(truth, xrl_all),
                 ds.eval_split: scores(ev_y, ev_xrl)}]
    for t, pred in enumerate(xrt_all, start=1):
        ev_t = ensemble_predictions(ev_trees[:t], "average", topk) if t > 1 else ev_trees[0]
        have_ev = t <= len(ev_trees)
        for share in (1.0, *SHARES):
            both = ensemble_predictions([pred, xrl_all], "average", topk, weights=[share, 1 - share])
            row = {"model": "xrtransformer" if share == 1.0 else "xrtransformer+xrlinear", "trees": t, "share": share,
                   "holdout": scores(truth, both)}
            if have_ev:
                row[ds.eval_split] = scores(ev_y, ensemble_predictions([ev_t, ev_xrl], "average", topk,
                                                                       weights=[share, 1 - share]))
            rows_out.append(row)
            print(row, flush=True)
    def total(r: dict) -> float:  # the criterion of the other selections (bench_matcher_weight.py)
        return round(sum(r["holdout"][m] for m in ("P@1", "P@3", "P@5")), 2)

    best = {t: max((r for r in rows_out if r["model"] == "xrtransformer+xrlinear" and r["trees"] == t), key=total)
            for t in range(1, args.trees + 1)}
    lines = [f"held out: every training document once ({args.folds} folds, seed {args.seed}); eval: {ds.eval_split} "
             f"(the run's own models); best share on the held-out documents by P@1 + P@3 + P@5: "
             + "; ".join(f"{t} tree{'s' if t > 1 else ''}: {r['share']} ({total(r):.2f})" for t, r in best.items()), "",
             f"| model | final trees | XR-Transformer share | held-out P@1 | P@3 | P@5 | nDCG@5 | "
             f"{ds.eval_split} P@1 | P@3 | P@5 | nDCG@5 |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows_out:
        h, e = r["holdout"], r.get(ds.eval_split)
        cells = " | ".join(f"{h[m]:.2f}" for m in METRICS) + " | " + (
            " | ".join(f"{e[m]:.2f}" for m in METRICS) if e else "– | – | – | –")
        lines.append(f"| {r['model']} | {r['trees']} | {r['share']} | {cells} |")
    save_selection(f"xr-combination-{args.tag}", {t: r["share"] for t, r in best.items()}, rows_out, lines)


def fold_predictions(path: Path, s, fcfg, chain, X: sp.csr_matrix, F: sp.csr_matrix, Y: sp.csr_matrix, label_ids,
                     fit: np.ndarray, rows: np.ndarray) -> dict[str, sp.csr_matrix]:
    """XR-Linear's and each final-model tree's predictions for ``rows``, trained on ``fit`` (read back
    from the folder ``path`` when an earlier run finished it)."""
    from xtransformer.pipeline.stages import train_final, tree_model
    from xtransformer.ranker import LinearForest
    from xtransformer.utils.io import atomic_dir, is_complete, load_csr, save_csr

    if is_complete(path):
        return {f.stem: load_csr(f) for f in sorted(path.glob("*.npz"))}
    t0 = time.perf_counter()
    x = s.xrlinear
    out = {"xrlinear": tree_model(x.indexing, x.nr_splits, x.model, X[fit], Y[fit], label_ids, x.n_trees)[0]
           .predict(X[rows])}
    model = train_final(fcfg, F[fit], Y[fit], label_ids, chain.subsample(s.xrtransformer.nr_splits), s.indexing.merge)[0]
    for t, tree in enumerate(model.trees if isinstance(model, LinearForest) else [model]):
        out[f"tree{t}"] = tree.predict(F[rows])
    with atomic_dir(path) as tmp:  # a killed run leaves no half-written fold
        for name, m in out.items():
            save_csr(sp.csr_matrix(m), tmp / f"{name}.npz")
    print(f"trained and predicted in {time.perf_counter() - t0:.0f} s", flush=True)
    return out


if __name__ == "__main__":
    main()
