"""The TF-IDF lead block (``tfidf.lead_chars`` / ``tfidf.lead_weight``: a second block from each
document's first characters), chosen on held-out training documents with XR-Linear.

    python -m experiments.lead_tfidf.bench_lead_tfidf            # EURLEX57K (experiment=eurlex57k_xr's settings)
    python -m experiments.lead_tfidf.bench_lead_tfidf --experiment '' data=reuters21578 --holdout 500 --results /tmp/r

For every opening length and weight: the body and lead vectorisers (``TfidfFeatures.fit`` with the
experiment's ``tfidf`` settings, the lead one on the openings; ``LeadTfidf.stack`` weights and
joins the blocks as ``tfidf.lead_chars`` does) fit on the training texts (no labels), XR-Linear
with the experiment's settings (``XRLinear.fit`` on the feature rows, one tree) trained on all but
``--holdout`` random training documents and scored on those (the selection); then, for no lead
block and for the selected one, XR-Linear on all training documents scored on the eval split (the
check; nothing is chosen on it). Hydra overrides after the options amend the experiment (e.g.
``data=reuters21578`` for a quick trial). Prints the table and writes
``<results>/lead-tfidf-<tag>.{json,md}`` (default ``benchmarks/results/``).
"""

from __future__ import annotations

import dataclasses
import json
import time

import numpy as np

from ..common import (
    compose_settings,
    describe,
    experiment_options,
    fit_rows,
    held_out_total,
    holdout_rows,
    rounded,
    save_selection,
    score_cells,
    selection_parser,
)

CHARS = (300, 600, 1200)
WEIGHTS = (0.5, 0.7, 1.0)


def main(argv: list[str] | None = None) -> None:
    from xtransformer.api import LeadTfidf, TfidfFeatures, evaluate, load_dataset

    ap = selection_parser(__doc__)
    experiment_options(ap)
    args = ap.parse_args(argv)
    s = compose_settings(["tfidf.lead_chars=0", *args.overrides], args.experiment)
    rec = s.methods["xrlinear"]
    x = dataclasses.replace(rec.xrlinear, n_trees=1)  # one tree per cell, as the table was made
    ds = load_dataset(s.data)
    train, ev = ds.splits["train"], ds.splits[ds.eval_split]
    t0 = time.perf_counter()
    body, B_train = TfidfFeatures.fit(train.texts, rec.tfidf)
    B = {"train": B_train, "eval": body.from_texts(ev.texts)}
    print(f"body TF-IDF: {B['train'].shape[1]} features in {time.perf_counter() - t0:.0f} s", flush=True)
    Y = train.Y.tocsr()
    fit, held = holdout_rows(Y.shape[0], args.holdout, args.seed)

    def xrlinear(X: dict, rows: np.ndarray, on: str) -> dict:
        model = fit_rows(X["train"][rows], Y[rows], ds.vocab.ids, x)
        got = (
            evaluate(Y[held], model.predict_features_csr(X["train"][held]))
            if on == "held"
            else evaluate(ev.Y, model.predict_features_csr(X["eval"]))
        )
        return rounded(got)

    rows, features = [], {(0, 0.0): B}
    rows.append({"lead_chars": 0, "lead_weight": 0.0, "holdout": xrlinear(B, fit, "held")})
    print(json.dumps(rows[-1]), flush=True)
    for chars in CHARS:
        lead = LeadTfidf(body.vectorizer, None, chars, 1.0)  # its leads() and stack(): the block as tfidf.lead_chars
        opening, L_train = TfidfFeatures.fit(lead.leads(train.texts), rec.tfidf)
        L = {"train": L_train, "eval": opening.from_texts(lead.leads(ev.texts))}
        for w in WEIGHTS:
            lead.weight = w
            features[chars, w] = {k: lead.stack(B[k], L[k]) for k in B}
            rows.append(
                {
                    "lead_chars": chars,
                    "lead_weight": w,
                    "n_features": features[chars, w]["train"].shape[1],
                    "holdout": xrlinear(features[chars, w], fit, "held"),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    best = max(rows, key=held_out_total)
    for r in (rows[0], best):
        r[ds.eval_split] = xrlinear(features[r["lead_chars"], r["lead_weight"]], np.arange(Y.shape[0]), "eval")
        print(json.dumps(r), flush=True)
    lines = [
        f"held out: {args.holdout} random training documents (seed {args.seed}); XR-Linear with "
        f"the settings of {describe(args.experiment, args.overrides)}; best by held-out P@1 + P@3 + P@5: "
        "lead_chars "
        f"{best['lead_chars']}, lead_weight {best['lead_weight']}",
        "",
        f"| lead_chars | lead_weight | held-out P@1 | P@3 | P@5 | {ds.eval_split} P@1 | P@3 | P@5 | nDCG@5 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['lead_chars'] or 'none'} | {r['lead_weight'] if r['lead_chars'] else '–'} | "
        f"{score_cells(r, ds.eval_split)} |"
        for r in rows
    ]
    save_selection(args.results, f"lead-tfidf-{args.tag}", best, rows, lines)


if __name__ == "__main__":
    main()
