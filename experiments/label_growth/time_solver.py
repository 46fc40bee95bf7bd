"""What the ranker's solver spends on adding labels: the one-vs-all problems of a label draw, and a
whole XR-Linear fit, on EURLEX57K's training TF-IDF rows.

    python -m experiments.label_growth.time_solver [--repeats 3] [--fit] [--tag NAME]

The draw is ``bench_label_growth.py``'s (``--drop`` of the labels with at least ``--min-docs``
training documents, ``--seed``): ``train_one_vs_all`` trains each drawn label against all 45,000
training documents, as ``add_labels`` does with ``added_negatives: all``. ``--fit`` also times
``XRLinear.fit`` on the same rows (every label, the experiment's recipe). Each repeat prints its
seconds and a checksum of the weights, so that two builds of the compiled loops can be compared
(the commit recorded is that of the imported ``xtransformer``: run it with another checkout's
``src`` on ``PYTHONPATH``, its loops built with ``python setup.py build_ext --inplace``, to time
that checkout's solver; a checkout from before ``xtransformer.api`` cannot serve).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from benchmarks.report import git_commit, machine_info

from ..common import RESULTS, compose_settings, public_args, save_table
from .bench_label_growth import draw


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--experiment", default="eurlex57k_xr_ensemble")
    ap.add_argument("--drop", type=float, default=0.1)
    ap.add_argument("--min-docs", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--fit", action="store_true", help="also time XRLinear.fit on the same rows")
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--tag", default=None, help="write <results>/solver-eurlex57k-<tag>.{json,md}")
    args = ap.parse_args(argv)

    import xtransformer
    from xtransformer.api import TfidfFeatures, XRLinear, load_dataset, train_one_vs_all

    settings = compose_settings([], args.experiment)
    s, ds = settings.methods["xrlinear"], load_dataset(settings.data)
    train = ds.splits["train"]
    X = TfidfFeatures.fit(train.texts, s.tfidf)[1]
    drawn = draw(train.Y, args.drop, args.min_docs, args.seed)
    Y = sp.csr_matrix(sp.csc_matrix(train.Y)[:, drawn])
    print(f"{X.shape[0]} rows, {X.shape[1]} features, {len(drawn)} drawn labels", flush=True)

    def fit() -> sp.spmatrix:
        return leaf_weights(XRLinear.fit(X, train.Y, label_ids=list(ds.vocab.ids), xrlinear=s.xrlinear))

    rows = []
    for rep in range(args.repeats):
        rows.append(timed_weights("one-vs-all", rep, lambda: train_one_vs_all(X, Y, s.xrlinear.model)[0].W))
        if args.fit:
            rows.append(timed_weights("XR-Linear fit", rep, fit))
    record = {"args": public_args(args), "commit": git_commit(Path(xtransformer.__file__).resolve().parents[2])}
    record |= {"machine": machine_info(), "labels": len(drawn), "rows": rows}
    if args.tag:
        save_table(args.results, f"solver-eurlex57k-{args.tag}", record, table(record))


def timed_weights(what: str, rep: int, fn) -> dict:
    """``fn()``'s wall seconds and a checksum of the weights it returns."""
    t0 = time.perf_counter()
    W = fn()
    seconds = time.perf_counter() - t0
    checksum = float(np.abs(W.data).astype(np.float64).sum())
    print(f"{what}, repeat {rep + 1}: {seconds:.2f} s, {W.nnz} weights, |W| sum {checksum:.6f}", flush=True)
    return {"what": what, "repeat": rep + 1, "seconds": round(seconds, 2), "weights": int(W.nnz), "abs_sum": checksum}


def leaf_weights(model) -> sp.spmatrix:
    """The label level's weights of a fitted XR-Linear (its first tree's)."""
    inner = model.model
    tree = inner.trees[0] if hasattr(inner, "trees") else inner
    return tree.levels[-1].W


def table(record: dict) -> str:
    lines = [
        f"commit {record['commit']} · {record['machine'].get('cpu')} · {record['labels']} drawn labels",
        "",
        "| what | repeat | s | weights | abs sum |",
        "|---|---|---|---|---|",
    ]
    for r in record["rows"]:
        lines.append(f"| {r['what']} | {r['repeat']} | {r['seconds']} | {r['weights']:,} | {r['abs_sum']:.6f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
