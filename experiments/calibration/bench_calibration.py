"""Calibration and decisions for EURLEX57K, chosen on held-out training documents: the calibrator
(Platt on the score, on score and rank, isotonic; the lowest held-out ECE is kept for the rest), how
many held-out documents it and the per-label thresholds need, the per-label back-off
(``min_positives``), ``min_labels``, and what holding documents out costs the model.

    python -m experiments.calibration.bench_calibration [--holdout 6000] [--assess 2000]

XR-Linear of ``--experiment``'s recipe (``XRLinear.fit`` on the texts, the run's TF-IDF settings)
is trained on all but ``--holdout`` random training documents, which it then scores once. Of those,
``--assess`` documents judge every choice; calibrators and thresholds are fitted on (a prefix of)
the others. Dev is scored as the check only (nothing is chosen on it). The cost of holding out is
measured by training the same model on all training documents and on all but each ``--cost`` size
(dev P@k and nDCG@5). Prints the tables and writes ``<results>/calibration-<tag>.{json,md}``.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from ..common import (
    WORK,
    compose_settings,
    describe,
    experiment_options,
    holdout_rows,
    results_option,
    rounded,
    save_table,
)

CALIBRATORS = (("platt", "score"), ("platt", "score+rank"), ("isotonic", "score"))
SIZES = (250, 500, 1000, 2000, 4000)
MIN_POSITIVES = (3, 5, 10, 20, 50)


def fit_xrlinear(data, settings, cache: Path):
    from xtransformer.api import StageCache, TrainContext, XRLinear

    t0 = time.perf_counter()
    with TrainContext(cache=StageCache(cache)) as ctx:
        model = XRLinear.fit(data, settings=settings, context=ctx)
    print(f"XR-Linear on {len(data)} documents in {time.perf_counter() - t0:.0f} s", flush=True)
    return model


def log_loss(cal, pred: sp.csr_matrix, Y: sp.csr_matrix) -> float:
    from xtransformer.api import entry_targets

    p = np.clip(cal.probabilities(pred).data.astype(np.float64), 1e-7, 1 - 1e-7)
    t = entry_targets(sp.csr_matrix(pred), Y)
    return float(-(t * np.log(p) + (1 - t) * np.log(1 - p)).mean())


def assess(cal, decision: dict, pred: sp.csr_matrix, Y: sp.csr_matrix) -> dict:
    out = cal.report(pred, Y, decision)
    return {
        "ECE": round(out["ECE"], 4),
        "ECE@1": round(out["ECE@1"], 4),
        "NLL": round(log_loss(cal, pred, Y), 4),
        "micro-F1": round(out["micro-F1"], 2),
        "micro-F1 per-label": round(out["micro-F1 per-label"], 2),
        "macro-F1 per-label": round(out["macro-F1 per-label"], 2),
        "threshold": decision["threshold"],
    }


def fitted(pred, Y, **fields):
    from xtransformer.api import Calibration, CalibrationConfig

    config = CalibrationConfig(**{"method": "platt", "holdout": pred.shape[0], **fields})
    return Calibration.fit(pred, Y, config, {"source": "study"})


def main(argv: list[str] | None = None) -> None:
    import argparse

    from xtransformer.api import LabeledData, load_dataset

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--holdout", type=int, default=6000)
    ap.add_argument("--assess", type=int, default=2000)
    ap.add_argument("--cost", type=int, nargs="*", default=[3000])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tag", default="eurlex57k")
    ap.add_argument("--cache", type=Path, default=WORK / "calibration-cache")
    results_option(ap)
    experiment_options(ap, default="eurlex57k_xr_ensemble")
    args = ap.parse_args(argv)
    s = compose_settings(args.overrides, args.experiment)
    ds = load_dataset(s.data)
    train, dev = LabeledData.from_split(ds, "train"), LabeledData.from_split(ds, ds.eval_split)
    keep, held_rows = holdout_rows(len(train), args.holdout, args.seed)
    model = fit_xrlinear(train.take(keep), s.methods["xrlinear"], args.cache)
    held = train.take(held_rows[np.random.default_rng(args.seed).permutation(len(held_rows))])
    pred_held, pred_dev = model.predict_csr(held.texts), model.predict_csr(dev.texts)
    n_fit = len(held) - args.assess
    fit_pred, fit_Y = pred_held[:n_fit], held.Y[:n_fit]
    b_pred, b_Y = pred_held[n_fit:], held.Y[n_fit:]
    record: dict = {"settings": describe(args.experiment, args.overrides), "trained_on": len(keep)}
    lines = [f"# Calibration and decisions ({record['settings']}, XR-Linear on {len(keep)} documents)", ""]
    lines += calibrator_rows(record, fit_pred, fit_Y, (b_pred, b_Y), (pred_dev, dev.Y))
    chosen = record["chosen"]
    lines += size_rows(record, fit_pred, fit_Y, (b_pred, b_Y), chosen)
    lines += backoff_rows(record, fit_pred, fit_Y, (b_pred, b_Y), (pred_dev, dev.Y), chosen)
    lines += cost_rows(record, train, dev, s, args, {args.holdout: model.evaluate(dev).metrics})
    save_table(args.results, f"calibration-{args.tag}", record, "\n".join(lines))


HEAD = "| ECE | ECE@1 | NLL | micro-F1 (threshold) | micro-F1 per-label | macro-F1 per-label | threshold |"


def cells(r: dict) -> str:
    keys = ("ECE", "ECE@1", "NLL", "micro-F1", "micro-F1 per-label", "macro-F1 per-label", "threshold")
    return " | ".join(str(r[k]) for k in keys)


def calibrator_rows(record: dict, pred, Y, assessed, check) -> list[str]:
    lines = ["## Calibrator (fitted on the held-out fit part; assessed on the assessment part; dev: check)", ""]
    lines += [f"| calibrator | split {HEAD}", "|---|---" + "|---:" * 7 + "|"]
    rows = []
    for method, features in CALIBRATORS:
        cal, decision = fitted(pred, Y, method=method, features=features)
        for split, (p, y) in (("held-out", assessed), ("dev", check)):
            r = {"calibrator": f"{method} ({features})", "split": split, **assess(cal, decision, p, y)}
            rows.append(r)
            lines.append(f"| {r['calibrator']} | {split} | {cells(r)} |")
    held = [(r["ECE"], i) for i, r in enumerate(rows) if r["split"] == "held-out"]
    method, features = CALIBRATORS[min(held)[1] // 2]  # the lowest held-out ECE; dev plays no part
    record["calibrators"], record["chosen"] = rows, {"method": method, "features": features}
    return [*lines, "", f"Chosen (lowest held-out ECE): {method} ({features}).", ""]


def size_rows(record: dict, pred, Y, assessed, chosen: dict) -> list[str]:
    name = f"{chosen['method']} ({chosen['features']})"
    lines = [f"## Held-out documents the calibrator and the thresholds are fitted on ({name})", ""]
    lines += [f"| documents {HEAD}", "|---:" * 8 + "|"]
    rows = []
    for n in SIZES:
        if n > pred.shape[0]:
            continue
        cal, decision = fitted(pred[:n], Y[:n], **chosen)
        r = {"documents": n, **assess(cal, decision, *assessed)}
        rows.append(r)
        lines.append(f"| {n} | {cells(r)} |")
    record["sizes"] = rows
    return [*lines, ""]


def backoff_rows(record: dict, pred, Y, assessed, check, chosen: dict) -> list[str]:
    name = f"{chosen['method']} ({chosen['features']})"
    lines = [f"## Per-label back-off and min_labels ({name}, all fit documents)", ""]
    lines += [f"| min_positives | min_labels | split {HEAD}", "|---:|---:|---" + "|---:" * 7 + "|"]
    rows = []
    for min_labels in (0, 1):
        for m in MIN_POSITIVES:
            cal, decision = fitted(pred, Y, min_positives=m, min_labels=min_labels, **chosen)
            for split, (p, y) in (("held-out", assessed), ("dev", check)):
                r = {"min_positives": m, "min_labels": min_labels, "split": split, **assess(cal, decision, p, y)}
                r["labels_with_own_threshold"] = cal.record["labels_with_own_threshold"]
                rows.append(r)
                lines.append(f"| {m} | {min_labels} | {split} | {cells(r)} |")
    record["backoff"] = rows
    return [*lines, ""]


def cost_rows(record: dict, train, dev, s, args, known: dict) -> list[str]:
    lines = ["## What holding documents out costs XR-Linear (dev)", ""]
    lines += ["| held out | trained on | P@1 | P@3 | P@5 | nDCG@5 |", "|---:|---:|---:|---:|---:|---:|"]
    rows = []
    for n in sorted({0, *args.cost, *known}):
        keep, _ = holdout_rows(len(train), n, args.seed)
        if n not in known:
            known[n] = fit_xrlinear(train.take(keep), s.methods["xrlinear"], args.cache).evaluate(dev).metrics
        m = rounded(known[n])
        rows.append({"held_out": n, "trained_on": len(keep), **m})
        lines.append(f"| {n} | {len(keep)} | {m['P@1']} | {m['P@3']} | {m['P@5']} | {m['nDCG@5']} |")
    record["cost"] = rows
    return [*lines, ""]


if __name__ == "__main__":
    main()
