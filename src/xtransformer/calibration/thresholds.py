"""Thresholds tuned on held-out documents for micro-F1: one global, and one per label.

micro-F1 = 2 TP / (TP + FP + P) with P the held-out true labels (those no candidate reaches count
as misses too), so a label's threshold changes the global counts only through its own TP and FP.
The per-label thresholds come from coordinate ascent from the global one: each label in turn takes
the cut of its held-out candidates (sorted by probability) that maximises micro-F1 given every other
label's, over a few passes. A label with fewer than ``min_positives`` held-out positives keeps the
global threshold (stored as NaN, so a call's ``threshold`` moves it too): its few documents would
choose a cut by chance. A chosen cut leaves the global threshold where the cut allows it, and
otherwise takes the middle of the gap between the last kept and the first dropped probability.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import scipy.sparse as sp

from xtransformer.calibration.calibrator import entry_targets
from xtransformer.calibration.decide import decide

GRID = np.round(np.arange(0.01, 1.0, 0.01), 2)  # global thresholds tried
PASSES = 2


def micro_f1(decided: sp.csr_matrix, Y: sp.csr_matrix) -> float:
    tp = entry_targets(decided, Y).sum()
    return 2 * tp / max(decided.nnz + Y.nnz, 1)


def tune_threshold(prob: sp.csr_matrix, Y: sp.csr_matrix, settings: Mapping[str, Any]) -> float:
    """The grid threshold (0.01 steps) with the best held-out micro-F1 under ``settings``'s
    ``min_labels`` / ``max_labels``; the lower one on a tie."""
    base = {**settings, "decision": "threshold"}
    scores = [micro_f1(decide(prob, {**base, "threshold": float(t)}), Y) for t in GRID]
    return float(GRID[int(np.argmax(scores))])


def tune_label_thresholds(prob: sp.csr_matrix, Y: sp.csr_matrix, threshold: float, min_positives: int) -> np.ndarray:
    """Per-label thresholds (float32, one per label; NaN: the global one) by coordinate ascent on
    held-out micro-F1, starting from ``threshold`` for every label."""
    n_labels = prob.shape[1]
    out = np.full(n_labels, np.nan, dtype=np.float32)
    positives = np.bincount(sp.csr_matrix(Y).indices, minlength=n_labels)
    hit = entry_targets(prob, Y)
    order = np.lexsort((-prob.data, prob.indices))
    label, p, h = prob.indices[order], prob.data[order].astype(np.float64), hit[order]
    starts = np.searchsorted(label, np.arange(n_labels + 1))
    kept = p >= threshold
    totals = [float(h[kept].sum()), float(kept.sum()), float(Y.nnz)]  # TP, predicted, true labels
    eligible = np.flatnonzero((positives >= min_positives) & (np.diff(starts) > 0))
    current = np.full(n_labels, threshold)
    for _ in range(PASSES):
        for lab in eligible:
            a, b = starts[lab], starts[lab + 1]
            current[lab] = _best_cut(p[a:b], h[a:b], current[lab], threshold, totals)
    out[eligible] = current[eligible]
    return out


def _best_cut(p: np.ndarray, h: np.ndarray, now: float, threshold: float, totals: list[float]) -> float:
    """The threshold of one label (``p`` its candidates' probabilities, decreasing; ``h`` hits) that
    maximises micro-F1 given the other labels (``totals``: TP, predicted, true; updated here)."""
    n = len(p)
    tp = np.concatenate([[0.0], np.cumsum(h)])
    j_now = int((p >= now).sum())
    rest_tp, rest_pred = totals[0] - tp[j_now], totals[1] - j_now
    j = np.arange(n + 1)
    valid = np.ones(n + 1, dtype=bool)
    valid[1:n] = p[:-1] > p[1:]  # a cut between two equal probabilities is no cut
    valid[0] = p[0] < 1.0
    f1 = np.where(valid, 2 * (rest_tp + tp) / np.maximum(rest_pred + j + totals[2], 1), -1.0)
    best = np.flatnonzero(f1 >= f1.max() - 1e-12)
    cut = int(best[np.argmin(np.abs(best - j_now))])  # on a tie, the least change
    totals[0], totals[1] = rest_tp + tp[cut], rest_pred + cut
    upper = 1.0 if cut == 0 else p[cut - 1]
    lower = 0.0 if cut == n else p[cut]
    return threshold if lower < threshold <= upper else (lower + upper) / 2
