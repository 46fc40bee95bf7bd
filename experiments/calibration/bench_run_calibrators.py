"""The calibrators on a finished calibrated run's models: the study chose isotonic on XR-Linear's
held-out scores; this checks Platt (score; score and rank) and isotonic on every model of the run
(XR-Transformer and the combination too), each refitted on the run's own held-out training
documents (its ``calibration.holdout`` and ``seed``) and applied to the run's eval predictions.

    python -m experiments.calibration.bench_run_calibrators --run RUN [--tag eurlex57k]

RUN: the output folder of ``python train.py experiment=eurlex57k_xr_ensemble calibration=...``.
The eval split only reports (the choice was made on held-out documents). Prints the table and
writes ``<results>/calibration-run-<tag>.{json,md}``.
"""

from __future__ import annotations

import argparse

from ..common import RunFolder, results_option, run_option, save_table

CALIBRATORS = (("platt", "score"), ("platt", "score+rank"), ("isotonic", "score"))
KEYS = ("ECE", "ECE@1", "micro-F1", "macro-F1", "micro-F1 per-label", "threshold")


def held_out_documents(run: RunFolder):
    """The training documents the run held out of every model, drawn as the run drew them."""
    from xtransformer.api import LabeledData

    c = run.settings.calibration
    if not c.enabled:
        raise SystemExit(f"error: --run {run.folder}: not a calibrated run (train it with calibration=platt|isotonic)")
    return c.hold_out(LabeledData.from_split(run.dataset, "train"))[1]


def method_rows(run: RunFolder, name: str, held, split: str) -> list[dict]:
    """Each calibrator fitted on ``name``'s scores of the held-out documents, reported on ``split``."""
    from xtransformer.api import Calibration, CalibrationConfig, load_csr

    pred_held = run.model(name).predict_csr(held.texts)
    pred = load_csr(run.folder / "predictions" / name / f"{split}.npz")
    Y = load_csr(run.folder / "truth" / f"{split}.npz")
    source = {"source": "training documents the run held out", "seed": run.settings.calibration.seed}
    rows = []
    for method, features in CALIBRATORS:
        config = CalibrationConfig(method=method, features=features, holdout=len(held))
        cal, decision = Calibration.fit(pred_held, held.Y, config, source)
        report = cal.report(pred, Y, decision)
        cells = {k: round(report[k], 4 if k.startswith("ECE") else 2) for k in KEYS}
        rows.append({"model": name, "calibrator": f"{method} ({features})", **cells})
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    run_option(ap, "experiment=eurlex57k_xr_ensemble calibration=isotonic")
    ap.add_argument("--tag", default="eurlex57k")
    results_option(ap)
    args = ap.parse_args(argv)
    run = RunFolder(args.run)
    held, split = held_out_documents(run), run.metrics["eval_split"]
    rows = [r for name in run.metrics["calibration"]["models"] for r in method_rows(run, name, held, split)]
    lines = [
        f"# Calibrators on the models of a calibrated run ({len(held)} held-out training documents; {split})",
        "",
        "| model | calibrator | " + " | ".join(KEYS) + " |",
        "|---|---" + "|---:" * len(KEYS) + "|",
    ]
    lines += [f"| {r['model']} | {r['calibrator']} | " + " | ".join(str(r[k]) for k in KEYS) + " |" for r in rows]
    record = {"run": str(run.folder), "held_out": len(held), "split": split, "rows": rows}
    save_table(args.results, f"calibration-run-{args.tag}", record, "\n".join(lines))


if __name__ == "__main__":
    main()
