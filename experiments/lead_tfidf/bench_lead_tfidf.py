"""The TF-IDF lead block (``tfidf.lead_chars`` / ``tfidf.lead_weight``: a second block from each
document's first characters), chosen on held-out training documents with XR-Linear.

    python experiments/lead_tfidf/bench_lead_tfidf.py            # EURLEX57K (experiment=eurlex57k_xr's settings)

For every opening length and weight: the body and lead vectorisers of ``xtransformer.data.tfidf``
fit on the training texts (no labels), XR-Linear with the run's settings (``stages.tree_model``)
trained on all but ``--holdout`` random training documents and scored on those (the selection);
then, for no lead block and for the selected one, XR-Linear on all training documents scored on
the eval split (the check; nothing is chosen on it). Prints the table and writes
``benchmarks/results/lead-tfidf-<tag>.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

EXPERIMENTS = Path(__file__).resolve().parents[1]  # the studies import each other across their folders
sys.path[:0] = [str(EXPERIMENTS / "matcher_weight"), str(EXPERIMENTS / "xr_budget")]
from bench_matcher_weight import save_selection, score_cells  # noqa: E402
from bench_xr_budget import settings  # noqa: E402

CHARS = (300, 600, 1200)
WEIGHTS = (0.5, 0.7, 1.0)
METRICS = ("P@1", "P@3", "P@5", "nDCG@5")


def main(argv: list[str] | None = None) -> None:
    from xtransformer.data import load_dataset
    from xtransformer.data.tfidf import LeadTfidf, _vectorizer
    from xtransformer.metrics import evaluate
    from xtransformer.pipeline.stages import tree_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--holdout", type=int, default=5000, help="random training documents held out for the selection")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tag", default="eurlex57k")
    args = ap.parse_args(argv)

    s = settings(["tfidf.lead_chars=0"])
    ds = load_dataset(s.data)
    train, ev = ds.splits["train"], ds.splits[ds.eval_split]
    t0 = time.perf_counter()
    body = _vectorizer(s.tfidf)
    B = {"train": body.fit_transform(train.texts).tocsr(), "eval": body.transform(ev.texts).tocsr()}
    print(f"body TF-IDF: {B['train'].shape[1]} features in {time.perf_counter() - t0:.0f} s", flush=True)
    perm = np.random.default_rng(args.seed).permutation(train.Y.shape[0])
    fit, held = np.sort(perm[args.holdout:]), np.sort(perm[: args.holdout])
    Y = train.Y.tocsr()
    x = s.xrlinear

    def xrlinear(X: dict, rows: np.ndarray, on: str) -> dict:
        model = tree_model(x.indexing, x.nr_splits, x.model, X["train"][rows], Y[rows], ds.vocab.ids)[0]
        got = evaluate(Y[held], model.predict(X["train"][held])) if on == "held" else evaluate(ev.Y, model.predict(X["eval"]))
        return {m: round(got[m], 2) for m in METRICS}

    rows, features = [], {(0, 0.0): B}
    rows.append({"lead_chars": 0, "lead_weight": 0.0, "holdout": xrlinear(B, fit, "held")})
    print(json.dumps(rows[-1]), flush=True)
    for chars in CHARS:
        lead = LeadTfidf(body, _vectorizer(s.tfidf), chars, 1.0)
        L = {"train": lead.lead.fit_transform(lead.leads(train.texts)), "eval": lead.lead.transform(lead.leads(ev.texts))}
        for w in WEIGHTS:
            lead.weight = w
            features[chars, w] = {k: lead.stack(B[k], L[k]) for k in B}
            rows.append({"lead_chars": chars, "lead_weight": w, "n_features": features[chars, w]["train"].shape[1],
                         "holdout": xrlinear(features[chars, w], fit, "held")})
            print(json.dumps(rows[-1]), flush=True)
    best = max(rows, key=lambda r: r["holdout"]["P@1"] + r["holdout"]["P@3"] + r["holdout"]["P@5"])
    for r in (rows[0], best):
        r[ds.eval_split] = xrlinear(features[r["lead_chars"], r["lead_weight"]], np.arange(Y.shape[0]), "eval")
        print(json.dumps(r), flush=True)
    lines = [f"held out: {args.holdout} random training documents (seed {args.seed}); XR-Linear with "
             f"experiment=eurlex57k_xr's settings; best by held-out P@1 + P@3 + P@5: lead_chars "
             f"{best['lead_chars']}, lead_weight {best['lead_weight']}", "",
             f"| lead_chars | lead_weight | held-out P@1 | P@3 | P@5 | {ds.eval_split} P@1 | P@3 | P@5 | nDCG@5 |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['lead_chars'] or 'none'} | {r['lead_weight'] if r['lead_chars'] else '–'} | "
              f"{score_cells(r, ds.eval_split)} |" for r in rows]
    save_selection(f"lead-tfidf-{args.tag}", best, rows, lines)


if __name__ == "__main__":
    main()
