"""Maps from a model's label scores to probabilities, fitted on held-out documents.

A document's candidates are the labels its prediction stores (the model's top ``topk``); each is an
event "this label is one of the document's" with a score and a rank (0 = the document's best label).
:class:`Platt` is a logistic regression on the score (and ``log(1 + rank)`` with ``score+rank``: the
same score means less far down a document's list); :class:`Isotonic` is a monotone step function of
the score (pool adjacent violators). Both keep probabilities in the order of the scores within a
document, so the ranking (P@k, nDCG@k) is the model's own. Parameters are plain numbers (JSON) or
arrays (npz); nothing is pickled, and applying them needs numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from xtransformer.utils.io import atomic_path

ISOTONIC_FILE = "isotonic.npz"


def row_ranks(pred: sp.csr_matrix) -> np.ndarray:
    """0-based rank of every stored entry within its row, aligned with ``pred.data`` (highest value
    first; ties: the lower label index first, as :mod:`xtransformer.topk` orders them)."""
    counts = np.diff(pred.indptr)
    rows = np.repeat(np.arange(pred.shape[0], dtype=np.int64), counts)
    order = np.lexsort((pred.indices, -pred.data, rows))
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order), dtype=np.int64) - pred.indptr[rows[order]]
    return rank


def entry_targets(pred: sp.csr_matrix, Y: sp.csr_matrix) -> np.ndarray:
    """1.0 where a stored entry of ``pred`` is a true label of its document, else 0.0 (aligned with
    ``pred.data``); ``Y`` binary, same shape. Membership by binary search: nothing densified."""
    Y = sp.csr_matrix(Y)
    Y.sum_duplicates()
    n_labels = pred.shape[1]
    y_keys = np.repeat(np.arange(Y.shape[0], dtype=np.int64), np.diff(Y.indptr)) * n_labels + Y.indices
    keys = np.repeat(np.arange(pred.shape[0], dtype=np.int64), np.diff(pred.indptr)) * n_labels + pred.indices
    if not len(y_keys):
        return np.zeros(len(keys))
    at = np.minimum(np.searchsorted(y_keys, keys), len(y_keys) - 1)
    return (y_keys[at] == keys).astype(np.float64)


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # no overflow warnings for large |z|


@dataclass
class Platt:
    """``p = sigmoid(w . x + b)``, ``x`` = the score (and ``log(1 + rank)``); fitted by Newton's method."""

    features: str  # score | score+rank
    weights: list[float]  # one per feature
    bias: float

    @staticmethod
    def design(score: np.ndarray, rank: np.ndarray, features: str) -> np.ndarray:
        cols = [score.astype(np.float64)]
        if features == "score+rank":
            cols.append(np.log1p(rank.astype(np.float64)))
        return np.stack(cols, axis=1)

    @classmethod
    def fit(cls, score: np.ndarray, rank: np.ndarray, target: np.ndarray, features: str) -> Platt:
        """Maximum likelihood (a tiny ridge keeps separable data finite). A weight of the wrong sign
        (a higher score or a better rank less probable) is dropped and the rest refitted, so the
        probabilities always keep a document's ranking."""
        X = cls.design(score, rank, features)
        keep = np.ones(X.shape[1], dtype=bool)
        sign = np.array([1.0, -1.0])[: X.shape[1]]  # score up, rank down
        while True:
            w = _newton_logistic(X[:, keep], target.astype(np.float64))
            full = np.zeros(X.shape[1])
            full[keep] = w[:-1]
            wrong = keep & (full * sign < 0)
            if not wrong.any():
                return cls(features, [float(v) for v in full], float(w[-1]))
            keep &= ~wrong

    def apply(self, score: np.ndarray, rank: np.ndarray) -> np.ndarray:
        return sigmoid(self.design(score, rank, self.features) @ np.asarray(self.weights) + self.bias)

    def to_record(self) -> dict[str, Any]:
        return {"method": "platt", "features": self.features, "weights": self.weights, "bias": self.bias}

    def save_arrays(self, folder: Path) -> None:
        """Platt's parameters are all in its record."""


def _newton_logistic(X: np.ndarray, y: np.ndarray, ridge: float = 1e-6, iters: int = 50) -> np.ndarray:
    """Weights then bias of the logistic regression of ``y`` on ``X`` (columns standardised while
    solving, so the ridge and the stopping rule do not depend on the score's scale)."""
    mu, sd = X.mean(axis=0), X.std(axis=0)
    sd = np.where(sd > 0, sd, 1.0)
    Z = np.hstack([(X - mu) / sd, np.ones((len(X), 1))])
    w = np.zeros(Z.shape[1])
    w[-1] = np.log((y.mean() + 1e-9) / (1 - y.mean() + 1e-9))
    for _ in range(iters):
        p = sigmoid(Z @ w)
        grad = Z.T @ (p - y) + ridge * w
        hess = (Z * (p * (1 - p))[:, None]).T @ Z + ridge * np.eye(len(w))
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.abs(step).max() < 1e-9:
            break
    weights = w[:-1] / sd
    return np.append(weights, w[-1] - weights @ mu)


@dataclass
class Isotonic:
    """A non-decreasing step function of the score (interpolated between the fitted points, held
    flat beyond them), fitted by pooling adjacent violators."""

    x: np.ndarray  # scores, increasing
    y: np.ndarray  # probabilities, non-decreasing

    @classmethod
    def fit(cls, score: np.ndarray, rank: np.ndarray, target: np.ndarray, features: str = "score") -> Isotonic:
        xs, inverse = np.unique(score.astype(np.float64), return_inverse=True)
        weight = np.bincount(inverse).astype(np.float64)
        mean = np.bincount(inverse, weights=target.astype(np.float64)) / weight
        values, weights, sizes = [], [], []
        for m, wt in zip(mean, weight):  # pool adjacent violators over the distinct scores
            values.append(m)
            weights.append(wt)
            sizes.append(1)
            while len(values) > 1 and values[-2] > values[-1]:
                wsum = weights[-2] + weights[-1]
                values[-2] = (values[-2] * weights[-2] + values[-1] * weights[-1]) / wsum
                weights[-2], sizes[-2] = wsum, sizes[-2] + sizes[-1]
                del values[-1], weights[-1], sizes[-1]
        return cls(xs, np.repeat(values, sizes))

    def apply(self, score: np.ndarray, rank: np.ndarray) -> np.ndarray:
        return np.interp(score.astype(np.float64), self.x, self.y)

    def to_record(self) -> dict[str, Any]:
        return {"method": "isotonic", "features": "score", "points": len(self.x), "file": ISOTONIC_FILE}

    def save_arrays(self, folder: Path) -> None:
        with atomic_path(folder / ISOTONIC_FILE) as tmp, open(tmp, "wb") as fh:
            np.savez(fh, x=self.x, y=self.y)


Calibrator = Platt | Isotonic


def fit_calibrator(method: str, score: np.ndarray, rank: np.ndarray, target: np.ndarray, features: str) -> Calibrator:
    return {"platt": Platt, "isotonic": Isotonic}[method].fit(score, rank, target, features)


def load_calibrator(record: dict[str, Any], folder: Path) -> Calibrator:
    if record["method"] == "platt":
        return Platt(record["features"], [float(v) for v in record["weights"]], float(record["bias"]))
    with np.load(folder / record["file"]) as z:
        return Isotonic(z["x"], z["y"])
