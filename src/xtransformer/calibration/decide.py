"""From probabilities to a label set: the decision rules of :class:`~.config.DecisionSettings`.

A label is decided when its probability reaches its threshold (the global ``threshold``, or the
label's own under ``per_label``) or when it is among the document's ``min_labels`` most probable
labels; then at most ``max_labels`` decided labels are kept, the most probable first. Only the
labels the model ranked (its top ``topk``) are candidates: a label it never scored is never decided.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import scipy.sparse as sp

from xtransformer.calibration.calibrator import row_ranks


def entry_thresholds(
    prob: sp.csr_matrix, settings: Mapping[str, Any], label_thresholds: np.ndarray | None
) -> np.ndarray:
    """The threshold each stored entry must reach (aligned with ``prob.data``)."""
    glob = float(settings["threshold"])
    if settings["decision"] != "per_label" or label_thresholds is None:
        return np.full(prob.nnz, glob)
    own = label_thresholds[prob.indices].astype(np.float64)
    return np.where(np.isnan(own), glob, own)  # NaN: too few held-out positives, the global one


def decide(
    prob: sp.csr_matrix, settings: Mapping[str, Any], label_thresholds: np.ndarray | None = None
) -> sp.csr_matrix:
    """The decided labels of every row of ``prob`` (csr ``N x L`` of candidate probabilities), as a
    csr of the same shape holding their probabilities."""
    prob = sp.csr_matrix(prob)
    return _masked(prob, decided_mask(prob, settings, label_thresholds))


def decided_mask(prob: sp.csr_matrix, settings: Mapping[str, Any], label_thresholds: np.ndarray | None) -> np.ndarray:
    """Whether each stored entry of ``prob`` is decided (aligned with ``prob.data``)."""
    rank = row_ranks(prob)
    keep = (prob.data >= entry_thresholds(prob, settings, label_thresholds)) | (rank < int(settings["min_labels"]))
    cap = settings.get("max_labels")
    if cap is not None:
        kept = np.flatnonzero(keep)
        keep[kept[row_ranks(_masked(prob, keep)) >= int(cap)]] = False
    return keep


def _masked(M: sp.csr_matrix, keep: np.ndarray) -> sp.csr_matrix:
    """The entries of ``M`` where ``keep`` (aligned with ``M.data``) holds."""
    rows = np.repeat(np.arange(M.shape[0]), np.diff(M.indptr))[keep]
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=M.shape[0]))])
    return sp.csr_matrix((M.data[keep], M.indices[keep], indptr), shape=M.shape)
