"""How to combine XR-Transformer with XR-Linear (``combine_weight``, final-model trees), chosen by
K-fold cross-validation on the training documents.

    # RUN: the output folder of `python train.py experiment=eurlex57k_xr_ensemble`
    python -m experiments.xr_combination.bench_xr_combination --run RUN

One held-out split of 5,000 documents moves P@1 by 0.02 per document, as much as the choices
differ, so every training document is held out once: for each of ``--folds`` folds, XR-Linear and
XR-Transformer's final model (``--trees`` re-clustered trees, the run's settings otherwise: read
from its ``metrics.json``) are trained with ``XRLinear.fit`` on the other folds (TF-IDF rows from
the run's model folders, TF-IDF ⊕ the run's encoder's embeddings, ``model.embed``, for the final
model) and predict the fold; the table scores every (trees, share) pair on all folds' predictions
together. Then the eval split is scored with the run's own models, loaded from ``RUN/model/``
(the check; nothing is chosen on it). The encoder was fine-tuned on every training document, so
held-out embeddings are a little easier than new ones. Each fold's predictions and the embeddings
are kept in ``--work`` (default ``benchmarks/work/``; a rerun goes on from there). Prints the
table and writes ``<results>/xr-combination-<tag>.{json,md}`` (default ``benchmarks/results/``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..common import (
    METRICS,
    WORK,
    RunFolder,
    final_model_settings,
    fit_rows,
    held_out_total,
    rounded,
    run_option,
    run_rows,
    save_selection,
    selection_parser,
    trees,
)

SHARES = (0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def main(argv: list[str] | None = None) -> None:
    from xtransformer.api import ensemble_predictions, evaluate

    ap = selection_parser(__doc__)
    run_option(ap, "experiment=eurlex57k_xr_ensemble")
    ap.add_argument("--folds", type=int, default=5, help="cross-validation folds of the training documents")
    ap.add_argument("--trees", type=int, default=2, help="final-model trees trained per fold (1..trees scored)")
    ap.add_argument("--work", type=Path, default=WORK, help="where fold predictions and embeddings are kept")
    args = ap.parse_args(argv)
    run = RunFolder(args.run)
    s, ds = run.settings, run.dataset
    xrt, xrl, X, F = run_rows(run, args.work)
    Y = ds.splits["train"].Y.tocsr()
    configs = {
        "xrlinear": s.methods["xrlinear"].xrlinear,
        "final": final_model_settings(s.methods["xrtransformer"].xrtransformer.final, n_trees=args.trees),
    }
    folds = np.array_split(np.random.default_rng(args.seed).permutation(Y.shape[0]), args.folds)
    work = args.work / f"xr-combination-{args.tag}"
    work.mkdir(parents=True, exist_ok=True)
    held, xrl_held, xrt_held = [], [], [[] for _ in range(args.trees)]
    for k, rows in enumerate(folds):
        rows = np.sort(rows)
        fit = np.setdiff1d(np.arange(Y.shape[0]), rows)
        preds = fold_predictions(
            work / f"fold{k}-of-{args.folds}-trees{args.trees}",
            configs,
            {"xrlinear": X["train"], "final": F["train"]},
            Y,
            xrl.label_ids,
            fit,
            rows,
        )
        held.append(rows)
        xrl_held.append(preds["xrlinear"])
        for t in range(args.trees):
            xrt_held[t].append(preds[f"tree{t}"])
        print(f"fold {k + 1}/{args.folds}: {len(rows)} documents held out", flush=True)
    truth = Y[np.concatenate(held)]
    xrl_all = sp.vstack(xrl_held).tocsr()
    topk = configs["final"].model.topk
    # t final-model trees: the mean of the first t trees' predictions (a LinearForest's prediction)
    xrt_all = [
        ensemble_predictions([sp.vstack(xrt_held[i]).tocsr() for i in range(t)], "average", topk)
        if t > 1
        else sp.vstack(xrt_held[0]).tocsr()
        for t in range(1, args.trees + 1)
    ]
    run_trees = list(xrt.final.trees) if hasattr(xrt.final, "trees") else [xrt.final]
    ev_trees = [t.predict(F[ds.eval_split]) for t in run_trees]
    ev_xrl = xrl.predict_features_csr(X[ds.eval_split])
    ev_y = ds.splits[ds.eval_split].Y

    rows_out = [
        {
            "model": "xrlinear",
            "trees": configs["xrlinear"].n_trees,
            "share": 0.0,
            "holdout": rounded(evaluate(truth, xrl_all)),
            ds.eval_split: rounded(evaluate(ev_y, ev_xrl)),
        }
    ]
    for t, pred in enumerate(xrt_all, start=1):
        ev_t = ensemble_predictions(ev_trees[:t], "average", topk) if t > 1 else ev_trees[0]
        have_ev = t <= len(ev_trees)
        for share in (1.0, *SHARES):
            both = ensemble_predictions([pred, xrl_all], "average", topk, weights=[share, 1 - share])
            row = {
                "model": "xrtransformer" if share == 1.0 else "xrtransformer+xrlinear",
                "trees": t,
                "share": share,
                "holdout": rounded(evaluate(truth, both)),
            }
            if have_ev:
                row[ds.eval_split] = rounded(
                    evaluate(ev_y, ensemble_predictions([ev_t, ev_xrl], "average", topk, weights=[share, 1 - share]))
                )
            rows_out.append(row)
            print(row, flush=True)

    best = {
        t: max((r for r in rows_out if r["model"] == "xrtransformer+xrlinear" and r["trees"] == t), key=held_out_total)
        for t in range(1, args.trees + 1)
    }
    lines = [
        f"held out: every training document once ({args.folds} folds, seed {args.seed}); eval: {ds.eval_split} "
        f"(the run's own models); best share on the held-out documents by P@1 + P@3 + P@5: "
        + "; ".join(f"{t} tree{'s' if t > 1 else ''}: {r['share']} ({held_out_total(r):.2f})" for t, r in best.items()),
        "",
        f"| model | final trees | XR-Transformer share | held-out P@1 | P@3 | P@5 | nDCG@5 | "
        f"{ds.eval_split} P@1 | P@3 | P@5 | nDCG@5 |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows_out:
        h, e = r["holdout"], r.get(ds.eval_split)
        cells = (
            " | ".join(f"{h[m]:.2f}" for m in METRICS)
            + " | "
            + (" | ".join(f"{e[m]:.2f}" for m in METRICS) if e else "– | – | – | –")
        )
        lines.append(f"| {r['model']} | {r['trees']} | {r['share']} | {cells} |")
    save_selection(
        args.results, f"xr-combination-{args.tag}", {t: r["share"] for t, r in best.items()}, rows_out, lines
    )


def fold_predictions(
    path: Path,
    configs: dict[str, Any],
    feats: dict[str, sp.csr_matrix],
    Y: sp.csr_matrix,
    label_ids: list[str],
    fit: np.ndarray,
    rows: np.ndarray,
) -> dict[str, sp.csr_matrix]:
    """XR-Linear's and each final-model tree's predictions for ``rows``, trained on ``fit`` (read back
    from the folder ``path`` when an earlier run finished it)."""
    from xtransformer.api import atomic_dir, is_complete, load_csr, save_csr

    if is_complete(path):
        return {f.stem: load_csr(f) for f in sorted(path.glob("*.npz"))}
    t0 = time.perf_counter()
    xrl = fit_rows(feats["xrlinear"][fit], Y[fit], label_ids, configs["xrlinear"])
    out = {"xrlinear": xrl.predict_features_csr(feats["xrlinear"][rows])}
    final = fit_rows(feats["final"][fit], Y[fit], label_ids, configs["final"])
    for t, tree in enumerate(trees(final)):
        out[f"tree{t}"] = tree.predict(feats["final"][rows])
    with atomic_dir(path) as tmp:  # a killed run leaves no half-written fold
        for name, m in out.items():
            save_csr(sp.csr_matrix(m), tmp / f"{name}.npz")
    print(f"trained and predicted in {time.perf_counter() - t0:.0f} s", flush=True)
    return out


if __name__ == "__main__":
    main()
