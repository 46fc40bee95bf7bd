"""Where added labels go and in how many leaves, chosen on held-out training documents (never dev).

    python -m experiments.label_growth.choose_placement [--holdout 5000] [--seed 0]
    python -m experiments.label_growth.choose_placement --run RUN [--embeddings DIR] --tag eurlex57k-xrtransformer

EURLEX57K's training split is cut into fitted documents and ``--holdout`` seeded held-out ones. A
seeded ``--drop`` of the labels with at least ``--min-docs`` fitted documents is held back;
XR-Linear (``eurlex57k_xr_ensemble``'s) is fitted on all labels (``full``) and without the drawn
ones (``reduced``, their documents kept). ``reduced`` gets them back with ``add_labels`` under each
placement rule (``routes``: the leaves the beam reaches from the label's documents; ``centroid``:
the nearest centroids), number of leaves (1, 2, 3) and ``added_negatives`` (``leaf``: each copy
trained on its leaf's documents; ``all``: each label once against every document). Every grown
model scores the held-out documents (and dev, reported only) in the full label space under each
``added_reach`` (``beam``: the new labels only where the frozen beam reaches one of their leaves;
``all``: on every document under their leaves' path scores; ``alone``: on every document by their
own rankers). The choice: the fewest leaves, then the rule, then the negatives and reach with the
best held-out P@1 + P@5 + nDCG@5, whose held-out P@1, P@5 and nDCG@5 are all within 0.3 of
``full``; failing that, the best held-out P@1 + P@3 + P@5. Prints the table and writes
``<results>/label-placement-<tag>.{json,md}``.

With ``--run`` the same choice is made for a calibrated XR-Transformer run's final model (its
rows: TF-IDF ⊕ the fine-tuned encoder's embeddings): ``full`` is the run's own, ``reduced`` is
refitted on the run's training documents, and the held-out documents are the ones the run held
out of every model for its calibration.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..common import compose_settings, held_out_total, holdout_rows, public_args, rounded, save_table, selection_parser
from .bench_label_growth import draw, final_model_setup, in_space

GAP_KEYS = ("P@1", "P@5", "nDCG@5")
BAR = 0.3


def main(argv: list[str] | None = None) -> None:
    ap = selection_parser(__doc__)
    growth_options(ap)
    ap.add_argument("--leaves", default="1,2,3", help="leaves per new label to try")
    ap.add_argument("--reach", default="beam,all,alone", help="added_reach settings to score each grown model with")
    ap.add_argument("--negatives", default="leaf,all", help="added_negatives settings to grow a model with")
    args = ap.parse_args(argv)
    setup, dropped, reduced, rows = held_out_growth(args)
    Y_fit, X_fit, ids, names, splits = setup["Y_fit"], setup["X_fit"], setup["ids"], setup["names"], setup["splits"]
    for leaves in [int(x) for x in args.leaves.split(",")]:
        for rule, negatives in [(r, n) for r in ("routes", "centroid") for n in args.negatives.split(",")]:
            t0 = time.perf_counter()
            grown = reduced.add_labels(
                X_fit, Y_fit, label_ids=ids, label_names=names, placement=rule, leaves=leaves, negatives=negatives
            )
            seconds = round(time.perf_counter() - t0, 1)
            for reach in args.reach.split(","):
                row = {"name": f"{rule}, {leaves} leaves, {negatives} negatives, reach {reach}", "placement": rule}
                row |= {"leaves": leaves, "negatives": negatives, "reach": reach, "seconds": seconds}
                rows.append(scored(row, grown, splits, ids, added_reach=reach))
    for r in rows[1:]:
        r["gap"] = {k: round(r["holdout"][k] - rows[0]["holdout"][k], 2) for k in GAP_KEYS}
    best = choose(rows[1:])
    record = {"args": public_args(args), "n_dropped": len(dropped), "full_fit_s": rows[0]["seconds"]}
    save_table(args.results, f"label-placement-{args.tag}", record | {"best": best, "rows": rows}, table(rows, best))


def growth_options(ap) -> None:
    """The options of the held-out growth selections: the model (``--experiment`` or ``--run``) and the draw."""
    ap.add_argument("--experiment", default="eurlex57k_xr_ensemble")
    ap.add_argument(
        "--run",
        type=Path,
        default=None,
        help="a calibrated XR-Transformer run: choose for its final model, on the training documents the run "
        "held out of every model (its calibration.holdout; --holdout is then not used)",
    )
    ap.add_argument(
        "--embeddings", type=Path, default=None, help="with --run: its kept embeddings (as bench_label_growth.py)"
    )
    ap.add_argument("--drop", type=float, default=0.1, help="share of the eligible labels held back")
    ap.add_argument("--min-docs", type=int, default=5, help="fitted documents a label needs to be drawn")


def held_out_growth(args) -> tuple[dict, np.ndarray, Any, list[dict]]:
    """The selections' start: the setup (``--run``'s final model or XR-Linear's), the drawn labels,
    the model fitted without them and the full model's row, scored."""
    setup = (
        run_setup(args.run, args.embeddings) if args.run else xrlinear_setup(args.experiment, args.holdout, args.seed)
    )
    Y_fit, ids, names = setup["Y_fit"], setup["ids"], setup["names"]
    dropped = draw(Y_fit, args.drop, args.min_docs, args.seed)
    keep = np.setdiff1d(np.arange(len(ids)), dropped)
    held = setup["splits"]["holdout"][1].shape[0]
    print(f"{len(dropped)} of {len(ids)} labels held back; {Y_fit.shape[0]} fitted, {held} held out", flush=True)
    reduced = setup["fit"](Y_fit[:, keep], [ids[j] for j in keep], [names[j] for j in keep])
    full, t_full = setup["full"](reduced)
    return setup, dropped, reduced, [scored({"name": "full", "seconds": round(t_full, 1)}, full, setup["splits"], ids)]


def xrlinear_setup(experiment: str, holdout: int, seed: int) -> dict:
    """XR-Linear (``experiment``'s) on the training split less ``holdout`` seeded documents; ``full``
    is fitted on all labels here, ``fit`` refits on the given ones."""
    from xtransformer.api import XRLinear, load_dataset

    settings = compose_settings([], experiment)
    s, ds = settings.methods["xrlinear"], load_dataset(settings.data)
    train, dev = ds.splits["train"], ds.splits[ds.eval_split]
    fitted, held = holdout_rows(len(train.texts), holdout, seed)
    texts = [train.texts[i] for i in fitted]
    Y_fit, ids, names = train.Y[fitted], list(ds.vocab.ids), list(ds.label_text)
    t0 = time.perf_counter()
    full = XRLinear.fit(texts, Y_fit, s, label_ids=ids, label_names=names)
    t_full = time.perf_counter() - t0
    rows_of = full.tfidf.from_texts
    return {
        "Y_fit": Y_fit, "X_fit": rows_of(texts), "ids": ids, "names": names,
        "fit": lambda Y, label_ids, label_names: XRLinear.fit(
            texts, Y, s, label_ids=label_ids, label_names=label_names
        ),
        "full": lambda reduced: (full, t_full),
        "splits": {
            "holdout": (rows_of([train.texts[i] for i in held]), train.Y[held]), "dev": (rows_of(dev.texts), dev.Y)
        },
    }  # fmt: skip


def run_setup(run: Path, kept: Path | None) -> dict:
    """A calibrated XR-Transformer run's final model (``bench_label_growth.final_model_setup``), the
    training documents it held out of every model as the held-out split."""
    setup = final_model_setup(run, kept)
    held = setup["held_out"]
    if held is None:
        raise SystemExit(f"error: --run {run}: the run held no training documents out (calibration.holdout = 0)")
    return {
        "Y_fit": setup["train_Y"], "X_fit": setup["X_train"], "ids": setup["ids"], "names": setup["names"],
        "fit": setup["fit"], "full": setup["full"],
        "splits": {"holdout": (held["X"], held["Y"]), "dev": (setup["dev"]["X"], setup["dev"]["Y"])},
    }  # fmt: skip


def scored(row: dict, model, splits: dict, ids: list[str], **settings) -> dict:
    """``row`` with the model's P@k / nDCG@5 on each split (prediction ``settings``), in the full label space."""
    from xtransformer.api import evaluate

    for split, (X, Y) in splits.items():
        P = model.predict_features_csr(X, **settings)
        row[split] = rounded(evaluate(Y, in_space(P, model.label_ids, ids)))
    print(row, flush=True)
    return row


def choose(rows: list[dict]) -> str:
    """The fewest leaves (then routes before centroid, then the negatives and reach with the best
    held-out P@1 + P@5 + nDCG@5) within ``BAR`` of full on every gap key, held out; else the best
    held-out P@1 + P@3 + P@5."""
    within = [r for r in rows if all(g >= -BAR for g in r["gap"].values())]
    if within:
        return min(within, key=lambda r: (r["leaves"], r["placement"] != "routes", -bar_total(r)))["name"]
    return max(rows, key=held_out_total)["name"]


def bar_total(row: dict) -> float:
    """Held-out P@1 + P@5 + nDCG@5: the metrics of the bar."""
    return sum(row["holdout"][k] for k in GAP_KEYS)


def table(rows: list[dict], best: str, first: str = "model", extra: tuple[str, Callable] | None = None) -> str:
    """The held-out selection's table; ``extra``: one more column (its head, its cell of a row)."""
    head = f"| {first} | held-out P@1 / P@3 / P@5 | nDCG@5 | gap P@1 / P@5 / nDCG@5 | dev P@1 / P@5 / nDCG@5 | s |"
    lines = [head + (f" {extra[0]} |" if extra else ""), "|---" * (7 if extra else 6) + "|"]
    for r in rows:
        h, d = r["holdout"], r["dev"]
        gap = " / ".join(f"{r['gap'][k]:+.2f}" for k in GAP_KEYS) if "gap" in r else ""
        name = f"**{r['name']}**" if r["name"] == best else r["name"]
        lines.append(
            f"| {name} | {h['P@1']:.2f} / {h['P@3']:.2f} / {h['P@5']:.2f} | {h['nDCG@5']:.2f} | {gap} | "
            f"{d['P@1']:.2f} / {d['P@5']:.2f} / {d['nDCG@5']:.2f} | {r['seconds']:.1f} |"
            + (f" {extra[1](r)} |" if extra else "")
        )
    return "\n".join(lines) + f"\n\nchosen on the held-out documents: {best}"


if __name__ == "__main__":
    main()
