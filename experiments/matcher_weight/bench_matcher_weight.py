"""The weight of the tree's path score at the label level (``matcher_weight`` w of the hierarchical
linear model: a label scores t(label) * path^w), chosen on held-out training documents.

    # RUN: the output folder of `python train.py experiment=eurlex57k_xr`
    python -m experiments.matcher_weight.bench_matcher_weight --run RUN

For XR-Transformer's final model (TF-IDF ⊕ the run's fine-tuned embeddings) and for XR-Linear
(TF-IDF), each with the run's settings (read from its ``metrics.json``): train on all but
``--holdout`` random training documents and score those for every weight (the selection), then
score the eval split with the run's own models, loaded from ``RUN/model/`` (the check; nothing is
chosen on it). The final model on feature rows is ``XRLinear.fit`` with ``xrtransformer.final``'s
tree and linear model (``tree: recluster``); the TF-IDF rows come from each model folder's
vectoriser and the embeddings from the run's encoder (``model.embed``, kept in ``--work``). The
encoder was fine-tuned on the held-out documents too, so their embeddings are a little easier than
new ones: the selection reads the shape of the curve, not its level. Prints the table and writes
``<results>/matcher-weight-<tag>.{json,md}`` (default ``benchmarks/results/``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from ..common import (
    WORK,
    RunFolder,
    final_model_settings,
    fit_rows,
    held_out_total,
    holdout_rows,
    rounded,
    run_option,
    run_rows,
    save_selection,
    score_cells,
    selection_parser,
)

WEIGHTS = (0.0, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0)


def main(argv: list[str] | None = None) -> None:
    from xtransformer.api import evaluate

    ap = selection_parser(__doc__)
    run_option(ap, "experiment=eurlex57k_xr")
    ap.add_argument("--work", type=Path, default=WORK, help="where the run's embeddings are kept between runs")
    args = ap.parse_args(argv)
    run = RunFolder(args.run)
    ds, s = run.dataset, run.settings
    Y, ev_y = ds.splits["train"].Y.tocsr(), ds.splits[ds.eval_split].Y
    fit, held = holdout_rows(Y.shape[0], args.holdout, args.seed)
    xrt, xrl, X, F = run_rows(run, args.work)
    final = final_model_settings(s.methods["xrtransformer"].xrtransformer.final)
    models = {  # name -> (features, the run's eval-split predictor at weight w, settings of the held-out model)
        "xrtransformer": (F, lambda w: xrt.final.predict(F[ds.eval_split], matcher_weight=w), final),
        "xrlinear": (
            X,
            lambda w: xrl.predict_features_csr(X[ds.eval_split], matcher_weight=w),
            s.methods["xrlinear"].xrlinear,
        ),
    }
    rows = []
    for name, (feats, run_predict, config) in models.items():
        t0 = time.perf_counter()
        held_model = fit_rows(feats["train"][fit], Y[fit], xrl.label_ids, config)
        print(f"{name}: model on {len(fit)} training documents in {time.perf_counter() - t0:.0f} s", flush=True)
        for w in WEIGHTS:
            h = evaluate(Y[held], held_model.predict_features_csr(feats["train"][held], matcher_weight=w))
            rows.append(
                {
                    "model": name,
                    "matcher_weight": w,
                    "holdout": rounded(h),
                    ds.eval_split: rounded(evaluate(ev_y, run_predict(w))),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    best = {n: max((r for r in rows if r["model"] == n), key=held_out_total)["matcher_weight"] for n in models}
    lines = [
        f"held out: {args.holdout} random training documents (seed {args.seed}); eval: {ds.eval_split}; "
        f"best on the held-out documents by P@1 + P@3 + P@5: {best}",
        "",
        f"| model | matcher_weight | held-out P@1 | P@3 | P@5 | {ds.eval_split} P@1 | P@3 | P@5 | nDCG@5 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [f"| {r['model']} | {r['matcher_weight']} | {score_cells(r, ds.eval_split)} |" for r in rows]
    save_selection(args.results, f"matcher-weight-{args.tag}", best, rows, lines)


if __name__ == "__main__":
    main()
