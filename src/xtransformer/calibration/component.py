"""A model folder's ``calibration/`` component: the calibrator, the per-label thresholds and how
they were fitted.

``calibration.json`` holds the calibrator's parameters (Platt) or names its arrays (isotonic:
``isotonic.npz``), the fitting record (documents, candidates, where the documents came from, the
held-out figures) and the tuned global threshold; ``label_thresholds.npz`` one threshold a label
(NaN: the global one). The folder's ``predict_settings.json`` holds the decision defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from xtransformer.calibration.calibrator import (
    Calibrator,
    entry_targets,
    fit_calibrator,
    load_calibrator,
    row_ranks,
)
from xtransformer.calibration.config import CalibrationConfig
from xtransformer.calibration.decide import decide
from xtransformer.calibration.reliability import reliability
from xtransformer.calibration.thresholds import tune_label_thresholds, tune_threshold
from xtransformer.errors import UserError
from xtransformer.utils.io import atomic_path, save_json

RECORD, THRESHOLDS = "calibration.json", "label_thresholds.npz"
RULES = {"threshold": "", "per_label": " per-label"}  # decision rule -> suffix of its metric names


class CalibrationError(UserError):
    """Documents a calibrator cannot be fitted on; the message says why."""


@dataclass
class Calibration:
    calibrator: Calibrator
    label_thresholds: np.ndarray  # float32, one a label; NaN: the global threshold
    record: dict[str, Any]

    # ------------------------------------------------------------------ fitting
    @classmethod
    def fit(
        cls, pred: sp.csr_matrix, Y: sp.csr_matrix, config: CalibrationConfig, source: Mapping[str, Any]
    ) -> tuple[Calibration, dict[str, Any]]:
        """Fit on held-out documents' candidate scores ``pred`` (what the model predicts for them)
        and their labels ``Y``; returns the component and the decision defaults (the threshold tuned
        for held-out micro-F1 unless ``config`` sets one)."""
        pred = canonical(pred)
        target = entry_targets(pred, Y)
        if not 0 < target.sum() < len(target):
            raise CalibrationError(
                f"calibration: the {pred.shape[0]} held-out documents give {int(target.sum())} true and "
                f"{int(len(target) - target.sum())} false candidate labels; a calibrator needs both"
            )
        calibrator = fit_calibrator(config.method, pred.data, row_ranks(pred), target, config.features)
        out = cls(calibrator, np.full(pred.shape[1], np.nan, np.float32), {})
        prob = out.probabilities(pred)
        decision = config.decision_settings()
        if decision["threshold"] is None:
            decision["threshold"] = tune_threshold(prob, Y, decision)
        out.label_thresholds = tune_label_thresholds(prob, Y, decision["threshold"], config.min_positives)
        out.record = {
            **calibrator.to_record(),
            "fitted_on": {
                **source,
                "documents": pred.shape[0],
                "candidates": pred.nnz,
                "true_candidates": int(target.sum()),
            },
            "threshold": decision["threshold"],
            "threshold_tuned": config.threshold is None,
            "min_positives": config.min_positives,
            "labels_with_own_threshold": int(np.isfinite(out.label_thresholds).sum()),
            "bins": config.bins,
        }
        out.record["held_out"] = out.report(pred, Y, decision)
        return out, decision

    # ------------------------------------------------------------------ use
    def probabilities(self, pred: sp.csr_matrix) -> sp.csr_matrix:
        """The candidates of ``pred`` (csr ``N x L`` of scores) with probabilities for values."""
        pred = canonical(pred)
        prob = self.calibrator.apply(pred.data, row_ranks(pred)).astype(np.float32)
        return sp.csr_matrix((prob, pred.indices, pred.indptr), shape=pred.shape)

    def decide(self, prob: sp.csr_matrix, settings: Mapping[str, Any]) -> sp.csr_matrix:
        return decide(prob, settings, self.label_thresholds)

    def report(self, pred: sp.csr_matrix, Y: sp.spmatrix, settings: Mapping[str, Any]) -> dict[str, float]:
        """Expected calibration errors and the F1 scores of both decision rules (``settings``' threshold,
        ``min_labels``, ``max_labels``) on documents with labels ``Y``: what ``metrics.json`` reports."""
        from xtransformer.metrics import decision_f1

        prob = self.probabilities(pred)
        bins = int(self.record.get("bins", 15))
        out = {"ECE": reliability(prob, Y, bins).ece, "ECE@1": reliability(prob, Y, bins, top1=True).ece}
        for rule, suffix in RULES.items():
            decided = self.decide(prob, {**settings, "decision": rule})
            out |= {f"{k}{suffix}": v for k, v in decision_f1(Y, decided).items()}
            out[f"labels_per_doc{suffix}"] = decided.nnz / max(decided.shape[0], 1)
        return out | {"threshold": float(settings["threshold"])}

    # ------------------------------------------------------------------ folder
    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.calibrator.save_arrays(folder)
        with atomic_path(folder / THRESHOLDS) as tmp, open(tmp, "wb") as fh:
            np.savez(fh, thresholds=self.label_thresholds)
        save_json(self.record, folder / RECORD)

    @classmethod
    def load(cls, folder: Path) -> Calibration:
        from xtransformer.model.folder import load_record

        record = load_record(folder, RECORD)
        with np.load(folder / THRESHOLDS) as z:
            thresholds = z["thresholds"]
        return cls(load_calibrator(record, folder), thresholds, record)


def canonical(pred: sp.spmatrix) -> sp.csr_matrix:
    pred = sp.csr_matrix(pred)
    if not pred.has_canonical_format:
        pred = pred.copy()
        pred.sum_duplicates()
    return pred
