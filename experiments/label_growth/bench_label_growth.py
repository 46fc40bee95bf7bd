"""Adding labels to a trained XR-Linear instead of retraining it, on EURLEX57K.

    python -m experiments.label_growth.bench_label_growth [--drop 0.1] [--min-docs 5] [--seed 0]

A seeded draw of ``--drop`` of the labels with at least ``--min-docs`` training documents is held
back: XR-Linear (the settings of ``--experiment``, default ``eurlex57k_xr_ensemble``'s XR-Linear)
is trained on all labels (``full``) and without the drawn ones (``reduced``); the reduced model
then gets them back with ``add_labels``, once from all training documents (``grown``: the other
labels' documents are the new labels' negatives, as in training) and once from only the documents
that carry a drawn label (``grown-own-docs``). Every model scores the dev split; each row also
counts what its top 5s hold (right on a held-back label, a held-back label there but wrong, right
on another label: where a P@5 gap comes from). The check of the old labels: for dev documents that
carry no drawn label, every (document, old label) score both the reduced and a grown model return
is compared bit for bit, and the share of documents whose top-5 old labels are unchanged is counted
(a new label that enters a document's top 5 pushes an old one out). Prints the table and writes
``<results>/label-growth-<tag>.{json,md}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from xtransformer.api import ADDED_REACH

from ..common import METRICS, RESULTS, compose_settings, public_args, rounded, save_table, trees


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--experiment", default="eurlex57k_xr_ensemble")
    ap.add_argument("--run", type=Path, default=None, help="an XR-Transformer run: grow its final model instead")
    ap.add_argument(
        "--embeddings",
        type=Path,
        default=None,
        help="with --run: a folder with the run's own embeddings of its documents, train.npy and/or dev.npy "
        "(its stage cache's), instead of encoding them again (a split without its file is encoded)",
    )
    ap.add_argument(
        "--cache",
        type=Path,
        default=None,
        help="with --run: the run's stage cache; the reduced model, as an XR-Transformer with the run's encoder, "
        "also grows through the public XRTransformer.add_labels from the training texts, its TF-IDF rows and "
        "embeddings taken from there (row 'grown from texts')",
    )
    ap.add_argument(
        "--full-train-s",
        type=float,
        default=None,
        help="with --run: the full model's training seconds, where the run reused its stages from an earlier "
        "run (default: the run's own xrtransformer_train)",
    )
    ap.add_argument("--drop", type=float, default=0.1, help="share of the eligible labels held back")
    ap.add_argument("--min-docs", type=int, default=5, help="training documents a label needs to be drawn")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--placement", default=None, help="placement rule: centroid or routes (default: the method's)")
    ap.add_argument("--leaves", type=int, default=None, help="leaves per added label (default: add_labels')")
    ap.add_argument(
        "--negatives", default=None, help="added_negatives to grow with: leaf or all (default: the model's setting)"
    )
    ap.add_argument("--reach", default=None, help="added_reach the grown models predict with (default: the model's)")
    ap.add_argument(
        "--passes", type=int, default=None, help="added_max_iter the grown models train with (default: the model's)"
    )
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--tag", default="eurlex57k")
    args = ap.parse_args(argv)
    setup = final_model_setup(args.run, args.embeddings) if args.run else xrlinear_setup(args.experiment)
    train_Y, ids, names = setup["train_Y"], setup["ids"], setup["names"]
    dropped = draw(train_Y, args.drop, args.min_docs, args.seed)
    keep = np.setdiff1d(np.arange(len(ids)), dropped)
    print(f"{len(dropped)} of {len(ids)} labels held back (seed {args.seed})", flush=True)
    fit, X_train = setup["fit"], setup["X_train"]
    reduced, t_reduced = timed(lambda: fit(train_Y[:, keep], [ids[j] for j in keep], [names[j] for j in keep]))
    for tree in trees(reduced) if args.passes is not None else []:  # e.g. a run saved before the setting
        tree.config = dataclasses.replace(tree.config, added_max_iter=args.passes)
    full, t_full = setup["full"](reduced)
    t_full = args.full_train_s if args.full_train_s is not None else t_full
    placing = {"label_ids": ids, "label_names": names, "placement": args.placement, "leaves": args.leaves,
               "negatives": args.negatives}  # fmt: skip
    grown, t_grown = timed(lambda: reduced.add_labels(X_train, train_Y, **placing))
    carriers = np.flatnonzero(np.diff(sp.csr_matrix(train_Y[:, dropped]).indptr) > 0)
    own, t_own = timed(lambda: reduced.add_labels(X_train[carriers], train_Y[carriers], **placing))
    dev = setup["dev"]
    models = {"full": (full, t_full), "reduced": (reduced, t_reduced), "grown": (grown, t_grown)}
    models["grown-own-docs"] = (own, t_own)
    if args.cache is not None:
        if not args.run:
            raise SystemExit("error: --cache goes with --run (an XR-Transformer run)")
        models["grown from texts"] = grown_from_texts(setup, reduced, args.cache, placing)
    reach = {"added_reach": args.reach or grown.predict_settings["added_reach"]}
    rows = [
        row(name, m, dev, ids, t, dropped, **(reach if name.startswith("grown") else {}))
        for name, (m, t) in models.items()
    ]
    for other in [r for r in ADDED_REACH if r != reach["added_reach"]]:  # the same grown model, the other reaches
        rows.append(row(f"grown, added_reach {other}", grown, dev, ids, t_grown, dropped, added_reach=other))
    plain = np.flatnonzero(np.diff(sp.csr_matrix(dev["Y"][:, dropped]).indptr) == 0)
    checks = {name: old_labels_check(reduced, models[name][0], dev["X"], plain) for name in models if "grown" in name}
    if "grown from texts" in models:  # the same rows up to rounding (rows given are l2-normalised once more)
        a, b = (models[n][0].predict_features_csr(dev["X"]) for n in ("grown", "grown from texts"))
        tops = [models[n][0].top_labels(P, 5) for n, P in (("grown", a), ("grown from texts", b))]
        checks["grown from texts"]["as_grown"] = {
            "max_abs_score_difference": float(abs(a - b).max()) if (a - b).nnz else 0.0,
            "top5_same_docs": int(sum(x["labels"] == y["labels"] for x, y in zip(*tops))),
            "docs": a.shape[0],
        }
    record = {
        "args": public_args(args),
        "rows_prepared_s": setup["rows_s"],
        "n_dropped": len(dropped),
        "rows": rows,
        "old_labels": checks,
        "add_reports": {n: m.training_run.report["added_labels"] for n, (m, _) in models.items() if "grown" in n},
        "dropped": [ids[j] for j in dropped],
    }
    save_table(args.results, f"label-growth-{args.tag}", record, table(record))


def xrlinear_setup(experiment: str) -> dict:
    """XR-Linear with ``experiment``'s settings on the TF-IDF rows of its data (the vectoriser one
    fit on the training texts gives; every model here shares it, as each fit would give it)."""
    from xtransformer.api import XRLinear, load_dataset

    settings = compose_settings([], experiment)
    s = settings.methods["xrlinear"]
    ds = load_dataset(settings.data)
    train, dev = ds.splits["train"], ds.splits[ds.eval_split]
    ids, names = list(ds.vocab.ids), list(ds.label_text)
    t0 = time.perf_counter()
    full = XRLinear.fit(train.texts, train.Y, s, label_ids=ids, label_names=names)
    t_full = time.perf_counter() - t0
    X_train, t_rows = timed(lambda: full.tfidf.from_texts(train.texts))

    def fit(Y, label_ids, label_names):
        return XRLinear.fit(train.texts, Y, s, label_ids=label_ids, label_names=label_names)

    return {
        "train_Y": train.Y, "ids": ids, "names": names, "fit": fit, "X_train": X_train, "rows_s": round(t_rows, 1),
        "full": lambda reduced: (full, t_full), "dev": {"X": full.tfidf.from_texts(dev.texts), "Y": dev.Y},
    }  # fmt: skip


def final_model_setup(run_dir: Path, kept: Path | None = None) -> dict:
    """A finished XR-Transformer run's final model on its rows (``common.final_model_rows``): the
    full model is the run's own (its training time the run's), the reduced one retrains only the
    final model, on the same encoder."""
    from xtransformer.api import XRLinear

    from ..common import final_model_rows, fit_rows

    r = final_model_rows(run_dir, kept)
    ids, names = list(r.train.label_ids), list(r.train.label_names)

    def fit(Y, label_ids, label_names):
        return fit_rows(r.X_train, Y, label_ids, r.config)

    def full(reduced):  # the run's final model, read through the reduced model's feature-row vectoriser
        return XRLinear.from_tree_model(r.model.final, reduced.tfidf, ids, names), r.train_s

    held = None if r.held is None else {"X": r.X_held, "Y": r.held.Y}
    return {
        "train_Y": r.train.Y, "ids": ids, "names": names, "fit": fit, "X_train": r.X_train, "rows_s": r.rows_s,
        "full": full, "dev": {"X": r.X_eval, "Y": r.eval_Y}, "held_out": held, "xrt": r.model,
        "texts": r.train.texts,
    }  # fmt: skip


def grown_from_texts(setup: dict, reduced, cache: Path, placing: dict) -> tuple:
    """The reduced final model inside an XR-Transformer with the run's encoder and records (its
    training stages included), grown by ``XRTransformer.add_labels`` from the training texts with
    the run's stage ``cache``; returned as the rows model the table scores (its final model), and
    the seconds ``add_labels`` took."""
    from xtransformer.api import XRLinear

    model = setup["xrt"].with_final_model(reduced.model, reduced.label_ids, reduced.label_names)
    grown, seconds = timed(lambda: model.add_labels(setup["texts"], setup["train_Y"], cache=cache, **placing))
    added = grown.training_run.report["added_labels"]["n_added"]
    print(f"grown from texts: {added} labels in {seconds:.1f} s", flush=True)
    rows_model = XRLinear.from_tree_model(grown.final, reduced.tfidf, grown.label_ids, grown.label_names)
    rows_model.predict_settings["added_reach"] = grown.predict_settings["added_reach"]
    rows_model.training_run = grown.training_run
    return rows_model, seconds


def draw(Y: sp.csr_matrix, share: float, min_docs: int, seed: int) -> np.ndarray:
    """A seeded ``share`` of the labels with at least ``min_docs`` training documents (sorted)."""
    counts = np.diff(sp.csc_matrix(Y).indptr)
    eligible = np.flatnonzero(counts >= min_docs)
    n = int(round(share * len(eligible)))
    return np.sort(np.random.default_rng(seed).choice(eligible, size=n, replace=False))


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def row(name: str, model, dev, ids: list[str], seconds: float, dropped: np.ndarray, **settings) -> dict:
    """Dev metrics in the full label space (a held-back label the model lacks counts as a miss),
    with these prediction ``settings``; the seconds the dev predictions took (after a first call
    on one document, which builds the scoring layouts a loaded model builds as it loads); and what
    the top 5s hold (``top5_split``)."""
    from xtransformer.api import evaluate

    model.predict_features_csr(dev["X"][:1], **settings)  # builds the scoring layouts: the timing is of predicting
    P, predict_s = timed(lambda: model.predict_features_csr(dev["X"], **settings))
    P = in_space(P, model.label_ids, ids)
    metrics = evaluate(dev["Y"], P)
    print(f"{name}: {rounded(metrics)} in {seconds:.1f} s (dev predicted in {predict_s:.1f} s)", flush=True)
    out = {"name": name, "seconds": round(seconds, 2), "predict_s": round(predict_s, 2), "n_labels": model.n_labels}
    return out | rounded(metrics) | top5_split(P, dev["Y"], dropped)


def top5_split(P: sp.csr_matrix, Y: sp.spmatrix, dropped: np.ndarray) -> dict:
    """Where a P@5 gap comes from: the (document, label) pairs of the top 5s that are right, on the
    held-back labels and on the others, and the held-back labels that are there but wrong."""
    from xtransformer.api import topk_csr

    top = topk_csr(P, 5)
    top.data[:] = 1.0
    right = top.multiply(sp.csr_matrix(Y) > 0).tocsc()
    top = top.tocsc()
    held = np.zeros(P.shape[1], bool)
    held[dropped] = True
    per_label = np.diff(right.indptr)
    return {
        "top5_held_back_right": int(per_label[held].sum()),
        "top5_held_back_wrong": int(np.diff(top.indptr)[held].sum() - per_label[held].sum()),
        "top5_others_right": int(per_label[~held].sum()),
    }


def in_space(pred: sp.csr_matrix, model_ids: list[str], ids: list[str]) -> sp.csr_matrix:
    """``pred``'s columns moved to their place in ``ids``."""
    where = {label: j for j, label in enumerate(ids)}
    cols = np.array([where[label] for label in model_ids], dtype=np.int64)
    return sp.csr_matrix((pred.data, cols[pred.indices], pred.indptr), shape=(pred.shape[0], len(ids)))


def old_labels_check(reduced, grown, X: sp.csr_matrix, docs: np.ndarray) -> dict:
    """On ``docs``: are the old labels' scores bit-identical wherever both models return them, and
    how many documents keep their top 5 (a new label in a document's top 5 pushes an old one out)."""
    a, g = reduced.predict_features_csr(X[docs]).tocoo(), grown.predict_features_csr(X[docs]).tocsr()
    b = np.asarray(g[:, : reduced.n_labels][a.row, a.col]).ravel()
    shared = b != 0
    top_a, top_g = reduced.top_labels(a.tocsr(), 5), grown.top_labels(g, 5)
    unchanged = sum(x["labels"] == y["labels"] for x, y in zip(top_a, top_g))
    first = sum(x["labels"][:1] == y["labels"][:1] for x, y in zip(top_a, top_g))
    return {
        "top1_unchanged_docs": int(first),
        "docs": len(docs),
        "shared_scores": int(shared.sum()),
        "shared_scores_identical": bool(np.array_equal(a.data[shared], b[shared])),
        "top5_unchanged_docs": int(unchanged),
    }


def table(record: dict) -> str:
    head = (
        "| model | labels | P@1 | P@3 | P@5 | nDCG@5 | training / adding s | dev predicted in s "
        "| top 5: held-back right / wrong, others right |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    for r in record["rows"]:
        lines.append(
            f"| {r['name']} | {r['n_labels']} | "
            + " | ".join(f"{r[k]:.2f}" for k in METRICS)
            + f" | {r['seconds']:.1f} | {r['predict_s']:.1f} | {r['top5_held_back_right']} / "
            + f"{r['top5_held_back_wrong']} / {r['top5_others_right']} |"
        )
    for name, c in record["old_labels"].items():
        lines.append(
            f"\n{name}: {c['docs']} dev documents without a held-back label; {c['shared_scores']} "
            f"(document, old label) scores returned by both, identical: {c['shared_scores_identical']}; "
            f"top-5 unchanged: "
            f"{c['top5_unchanged_docs']} ({100 * c['top5_unchanged_docs'] / max(c['docs'], 1):.2f}%), top 1 unchanged: "
            f"{c['top1_unchanged_docs']} ({100 * c['top1_unchanged_docs'] / max(c['docs'], 1):.2f}%)"
        )
        if "as_grown" in c:
            s = c["as_grown"]
            lines.append(
                f"{name} against grown, on all {s['docs']} dev documents: largest score difference "
                f"{s['max_abs_score_difference']:.2g}, same top 5 on {s['top5_same_docs']}"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
