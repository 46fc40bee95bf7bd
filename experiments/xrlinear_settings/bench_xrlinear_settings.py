"""XR-Linear's negatives, weight pruning, number of trees and label weighting for the EURLEX57K
experiment, chosen on held-out training documents.

    # RUN: the output folder of `python train.py experiment=eurlex57k_xr`
    python -m experiments.xrlinear_settings.bench_xrlinear_settings --run RUN

XR-Linear (``XRLinear.fit`` on the run's TF-IDF rows, from ``RUN/model/xrlinear``'s vectoriser;
the run's tree and solver otherwise) is trained on all but ``--holdout`` random training documents
and scores those: first one tree for each of ``xrlinear.model.negatives`` tfn / tfn+man ×
``xrlinear.model.threshold`` 0.1 / 0.01 (PECOS's recipe is tfn, 0.1; XR-Transformer's final model
already uses tfn+man, 0.01), then the best of them by held-out P@1 + P@3 + P@5 with
``xrlinear.n_trees`` 3 and 5 (trees seeded 0, 1, ..., the first the single tree's; a forest scores
the mean of its trees, so the forests are read off the same five trees), each also with
``xrlinear.model.matcher_weight`` 0.75 / 0.5 / 0.2 below PECOS's 1 (prediction only: the same
trees). Best of all rows by held-out P@1 + P@3 + P@5. The check (skipped with ``--no-check``: the
run of the selected settings gives it) trains PECOS's recipe and the selection on all training
documents and scores the eval split (nothing is chosen on it). Prints the table and writes
``<results>/xrlinear-settings-<tag>.{json,md}`` (default ``benchmarks/results/``).
"""

from __future__ import annotations

import dataclasses
import json
import time

import numpy as np

from ..common import (
    RunFolder,
    fit_rows,
    held_out_total,
    holdout_rows,
    rounded,
    run_option,
    save_selection,
    score_cells,
    selection_parser,
    trees,
)

SOLVERS = (("tfn", 0.1), ("tfn", 0.01), ("tfn+man", 0.1), ("tfn+man", 0.01))
TREES = (1, 3, 5)
WEIGHTS = (1.0, 0.75, 0.5, 0.2)


def main(argv: list[str] | None = None) -> None:
    from xtransformer.api import LinearForest, evaluate

    ap = selection_parser(__doc__)
    run_option(ap, "experiment=eurlex57k_xr")
    ap.add_argument("--no-check", dest="check", action="store_false", help="skip the eval-split check")
    args = ap.parse_args(argv)
    run = RunFolder(args.run)
    ds = run.dataset
    ev = ds.splits[ds.eval_split]
    xrl = run.model("xrlinear")  # its TF-IDF vectoriser
    X = {n: xrl.tfidf.from_texts(ds.splits[n].texts) for n in ("train", ds.eval_split)}
    Y = ds.splits["train"].Y.tocsr()
    fit, held = holdout_rows(Y.shape[0], args.holdout, args.seed)
    x = run.settings.methods["xrlinear"].xrlinear

    def grow(negatives: str, threshold: float, rows: np.ndarray, n: int, first: int = 0) -> list:
        config = dataclasses.replace(
            x,
            n_trees=n,
            model=dataclasses.replace(x.model, negatives=negatives, threshold=threshold),
            indexing=dataclasses.replace(x.indexing, seed=x.indexing.seed + first),
        )
        t0 = time.perf_counter()
        model = fit_rows(X["train"][rows], Y[rows], xrl.label_ids, config)
        print(
            f"{negatives}, {threshold}: {n} tree(s) on {len(rows)} documents in {time.perf_counter() - t0:.0f} s",
            flush=True,
        )
        return trees(model)

    def scores(models: list, on: str, w: float = 1.0) -> dict:
        model = models[0] if len(models) == 1 else LinearForest(models)
        got = (
            evaluate(Y[held], model.predict(X["train"][held], matcher_weight=w))
            if on == "held"
            else evaluate(ev.Y, model.predict(X[ds.eval_split], matcher_weight=w))
        )
        return rounded(got)

    rows, grown = [], {}
    for neg, thr in SOLVERS:
        grown[neg, thr] = grow(neg, thr, fit, 1)
        rows.append(
            {
                "negatives": neg,
                "threshold": thr,
                "n_trees": 1,
                "matcher_weight": 1.0,
                "holdout": scores(grown[neg, thr], "held"),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    solver = max(rows, key=held_out_total)
    neg, thr = solver["negatives"], solver["threshold"]
    grown[neg, thr] += grow(neg, thr, fit, max(TREES) - 1, first=1)
    for n in TREES[1:]:
        rows.append(
            {
                "negatives": neg,
                "threshold": thr,
                "n_trees": n,
                "matcher_weight": 1.0,
                "holdout": scores(grown[neg, thr][:n], "held"),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    for n in TREES:  # the label weighting is prediction only: every forest at every weight
        for w in WEIGHTS[1:]:
            rows.append(
                {
                    "negatives": neg,
                    "threshold": thr,
                    "n_trees": n,
                    "matcher_weight": w,
                    "holdout": scores(grown[neg, thr][:n], "held", w),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    best = max(rows, key=held_out_total)
    everything = np.arange(Y.shape[0])
    for r in (rows[0], best) if args.check else ():  # PECOS's recipe and the selection, on all training documents
        r[ds.eval_split] = scores(
            grow(r["negatives"], r["threshold"], everything, r["n_trees"]), "eval", r["matcher_weight"]
        )
        print(json.dumps(r), flush=True)
    lines = [
        f"held out: {args.holdout} random training documents (seed {args.seed}); XR-Linear on "
        f"the run's TF-IDF and tree settings; best by held-out P@1 + P@3 + P@5: negatives "
        f"{best['negatives']}, threshold {best['threshold']}, n_trees {best['n_trees']}, matcher_weight "
        f"{best['matcher_weight']}",
        "",
        f"| negatives | threshold | n_trees | matcher_weight | held-out P@1 | P@3 | P@5 | {ds.eval_split} P@1 | "
        "P@3 | P@5 | nDCG@5 |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['negatives']} | {r['threshold']} | {r['n_trees']} | {r['matcher_weight']} | "
        f"{score_cells(r, ds.eval_split)} |"
        for r in rows
    ]
    save_selection(args.results, f"xrlinear-settings-{args.tag}", best, rows, lines)


if __name__ == "__main__":
    main()
