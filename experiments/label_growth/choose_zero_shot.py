"""How many zero-shot labels a document may gain, and how sure each must be: chosen on held-out
training documents, never on dev.

    python -m experiments.label_growth.choose_zero_shot [--holdout 5000] [--seed 0] [--drop 0.25]

EURLEX57K's training split is cut into fitted documents and ``--holdout`` seeded held-out ones. A
seeded ``--drop`` share of the rare labels (1 to ``--max-docs`` fitted documents) becomes the
stand-in for labels without documents: their documents are kept, the labels removed, so that the
model (XR-Linear, ``--experiment``'s) has no document for them, as for EURLEX57K's true zero-shot
labels, which are rarer still. ``fit_zero_shot`` is fitted on 2,000 seeded fitted documents, as the
product does. Every setting of ``zero_shot_per_doc`` x ``zero_shot_floor`` scores the held-out
documents: P@1 / P@5 / nDCG@5 over all labels and RP@5 / nDCG@5 of the labels without fitted
documents. The choice (fixed before any result): among the settings whose held-out P@1, P@5 and
nDCG@5 are each no more than 0.1 below ``zero_shot_labels: false``, the highest zero-shot RP@5
(then nDCG@5 over all labels, then fewer labels a document, then a higher floor). Writes
``<results>/zero-shot-bounds-<tag>.{json,md}``.
"""

from __future__ import annotations

import time

import numpy as np
import scipy.sparse as sp

from ..common import compose_settings, holdout_rows, public_args, save_table, selection_parser

PER_DOC = (1, 2, 3, 5)
FLOORS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7)
BAR = 0.1  # what the zero-shot labels may cost the others, held out (the target: at most 0.1 of P@1)
OVERALL = ("P@1", "P@5", "nDCG@5")


def main(argv: list[str] | None = None) -> None:
    ap = selection_parser(__doc__)
    ap.add_argument("--experiment", default="eurlex57k_xr")
    ap.add_argument("--drop", type=float, default=0.25, help="share of the rare labels made label-less")
    ap.add_argument("--max-docs", type=int, default=5, help="fitted documents a rare label has at most")
    ap.add_argument("--sample", type=int, default=2000, help="fitted documents the calibration reads")
    args = ap.parse_args(argv)
    from xtransformer.api import XRLinear, load_dataset

    settings = compose_settings([], args.experiment)
    ds = load_dataset(settings.data)
    train = ds.splits["train"]
    fitted, held = holdout_rows(len(train.texts), args.holdout, args.seed)
    texts, Y_fit = [train.texts[i] for i in fitted], sp.csr_matrix(train.Y[fitted])
    dropped = rare_draw(Y_fit, args.drop, args.max_docs, args.seed)
    Y_fit = without(Y_fit, dropped)
    counts = Y_fit.getnnz(axis=0)
    Y_held = train.Y[held]
    n_zero = int((counts == 0).sum())
    occ = int(Y_held[:, np.flatnonzero(counts == 0)].nnz)
    print(
        f"{len(dropped)} rare labels made label-less ({n_zero} without fitted documents in all); "
        f"{len(fitted)} fitted, {len(held)} held out, {occ} held-out occurrences of them",
        flush=True,
    )
    t0 = time.perf_counter()
    ids, names = list(ds.vocab.ids), list(ds.label_text)
    model = XRLinear.fit(texts, Y_fit, settings.methods["xrlinear"], label_ids=ids, label_names=names)
    fit_s = time.perf_counter() - t0
    model = model.fit_zero_shot(texts, Y_fit, sample=args.sample, seed=args.seed)
    X = model.tfidf.from_texts([train.texts[i] for i in held])
    base = model.predict_features_csr(X)
    rows = [scored({"per_doc": 0, "floor": None}, base, Y_held, counts)]
    for per_doc in PER_DOC:
        for floor in FLOORS:
            call = {**model.predict_settings, "zero_shot_per_doc": per_doc, "zero_shot_floor": floor}
            pred = model.zero_shot.merge(base, X, call)
            rows.append(scored({"per_doc": per_doc, "floor": floor}, pred, Y_held, counts))
    best = choose(rows[0], rows[1:])
    record = {
        "args": public_args(args),
        "n_dropped": len(dropped),
        "n_zero": n_zero,
        "held_out_occurrences": occ,
        "fit_s": round(fit_s, 1),
        "calibration": {"text": model.zero_shot.text_fit, "score": model.zero_shot.score_fit},
        "best": best,
        "rows": rows,
    }
    save_table(args.results, f"zero-shot-bounds-{args.tag}", record, table(record))


def rare_draw(Y: sp.csr_matrix, share: float, max_docs: int, seed: int) -> np.ndarray:
    """A seeded ``share`` of the labels with 1 to ``max_docs`` documents in ``Y``."""
    counts = Y.getnnz(axis=0)
    rare = np.flatnonzero((counts >= 1) & (counts <= max_docs))
    n = int(round(share * len(rare)))
    return np.sort(np.random.default_rng(seed).choice(rare, size=n, replace=False))


def without(Y: sp.csr_matrix, labels: np.ndarray) -> sp.csr_matrix:
    """``Y`` with the columns ``labels`` emptied (the documents stay)."""
    keep = np.ones(Y.shape[1], np.float32)
    keep[labels] = 0
    out = sp.csr_matrix(Y @ sp.diags(keep))
    out.eliminate_zeros()
    return out


def scored(row: dict, pred: sp.csr_matrix, Y: sp.csr_matrix, counts: np.ndarray) -> dict:
    from xtransformer.api import evaluate, group_metrics

    overall = evaluate(Y, pred)
    zero = group_metrics(Y, pred, counts)["zero"]
    row |= {k: round(overall[k], 2) for k in OVERALL}
    row |= {f"zero/{k}": round(zero.get(k, 0.0), 2) for k in ("RP@5", "nDCG@5")}
    print(row, flush=True)
    return row


def choose(off: dict, rows: list[dict]) -> dict:
    """The highest zero-shot RP@5 among the settings within ``BAR`` of ``off`` on every overall key."""
    within = [r for r in rows if all(r[k] >= off[k] - BAR for k in OVERALL)]
    if not within:
        return {"per_doc": 0, "floor": None}
    best = max(within, key=lambda r: (r["zero/RP@5"], r["nDCG@5"], -r["per_doc"], r["floor"]))
    return {"per_doc": best["per_doc"], "floor": best["floor"]}


def table(record: dict) -> str:
    rows, best = record["rows"], record["best"]
    lines = ["| per doc | floor | P@1 | P@5 | nDCG@5 | zero RP@5 | zero nDCG@5 |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        mark = "**" if r["per_doc"] == best["per_doc"] and r["floor"] == best["floor"] else ""
        floor = "off" if r["floor"] is None else f"{r['floor']:g}"
        cells = [f"{mark}{r['per_doc']}{mark}", floor, *(f"{r[k]:.2f}" for k in (*OVERALL, "zero/RP@5", "zero/nDCG@5"))]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append(
        f"\n{record['n_dropped']} rare labels made label-less, {record['n_zero']} without fitted documents in all, "
        f"{record['held_out_occurrences']} held-out occurrences of them; XR-Linear fitted in {record['fit_s']} s"
    )
    return "\n".join(lines) + f"\n\nchosen on the held-out documents: {best}"


if __name__ == "__main__":
    main()
