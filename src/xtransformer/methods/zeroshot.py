"""Zero-shot labels: scores for labels no training document carries, from their text.

Every method scores a label without training documents zero (it has no weights). Such a label
still has a name and alternative names (``label_text.txt``): a document scores it by the cosine
between the document's row and the label text's row in the same space (TF-IDF for XR-Linear, the
fine-tuned encoder's embedding for the neural methods), less the label's mean cosine over the
calibration documents (a label text near every document says little about any one). Cosines and
trained scores live on different scales, so both are mapped to the chance that the label is
right, each by a logistic fit on training documents (cosines of the trained labels' texts, and the
model's own scores, against the documents' labels), and a cosine becomes the trained score of the
same chance. The
model's scores on documents it was trained on are optimistic, so zero-shot scores land low: a
zero-shot label displaces a trained one only when its text matches well.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from xtransformer.model.folder import ModelError
from xtransformer.topk import Candidates, concat, dedupe_max, topk
from xtransformer.utils.io import load_csr, load_json, save_csr, save_json
from xtransformer.utils.rows import dense_f32

ZERO_SHOT_DIR = "zero_shot"
PER_DOC = 5  # zero-shot labels a document may gain (the metrics read its top 5)
PAIRS_PER_DOC = 20  # best-matching trained label texts per calibration document


@dataclass
class ZeroShot:
    """The zero-shot labels (indices), their text rows (unit, ``n x D``, in the documents' row
    space) and the two logistic fits: relevance from a cosine, relevance from a trained score."""

    labels: np.ndarray
    rows: np.ndarray | sp.csr_matrix
    text_fit: tuple[float, float]
    score_fit: tuple[float, float]
    n_labels: int
    ceiling: float  # the highest trained score seen: a text match never outranks the surest trained label
    centre: np.ndarray  # each zero-shot label's mean cosine over the calibration documents (hubness)

    def scores(self, D: np.ndarray | sp.spmatrix) -> sp.csr_matrix:
        """``N x L`` (zero-shot columns only): each document's ``PER_DOC`` best-matching zero-shot
        labels, their cosines mapped onto the trained scores' scale (non-positive ones dropped)."""
        sims = dense_f32(D @ self.rows.T) - self.centre
        (a, b), (c, d) = self.text_fit, self.score_fit
        n, width = sims.shape
        keep = min(PER_DOC, width)
        top = np.argpartition(-sims, keep - 1, axis=1)[:, :keep] if width else np.zeros((n, 0), np.int64)
        cos = np.take_along_axis(sims, top, axis=1)
        score = np.clip((a * cos + b - d) / c, 0.0, self.ceiling).astype(np.float32)
        ok = score > 0
        rows = np.repeat(np.arange(n), keep).reshape(n, keep)
        return sp.csr_matrix((score[ok], (rows[ok], self.labels[top[ok]])), shape=(n, self.n_labels))

    def merge(self, pred: sp.csr_matrix, D: np.ndarray | sp.spmatrix, k: int) -> sp.csr_matrix:
        """``pred`` with the zero-shot labels' scores added (they have none there), top ``k`` kept."""
        both = concat([Candidates.from_csr(pred), Candidates.from_csr(self.scores(D))], pred.shape[0])
        return topk(dedupe_max(both), k).to_csr(pred.shape[1])  # grouped by document, one entry a label

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        np.save(folder / "labels.npy", self.labels)
        np.save(folder / "centre.npy", self.centre)
        if sp.issparse(self.rows):
            save_csr(sp.csr_matrix(self.rows), folder / "rows.npz")
        else:
            np.save(folder / "rows.npy", np.asarray(self.rows, dtype=np.float32))
        meta = {
            "text_fit": list(self.text_fit),
            "score_fit": list(self.score_fit),
            "n_labels": self.n_labels,
            "ceiling": self.ceiling,
        }
        save_json(meta, folder / "zero_shot.json")

    @classmethod
    def load(cls, folder: Path) -> ZeroShot | None:
        """The zero-shot part saved in ``folder``; None when the model has none."""
        if not (folder / "zero_shot.json").is_file():
            return None
        meta = load_json(folder / "zero_shot.json")
        rows = load_csr(folder / "rows.npz") if (folder / "rows.npz").is_file() else np.load(folder / "rows.npy")
        fits = tuple(meta["text_fit"]), tuple(meta["score_fit"])
        centre = np.load(folder / "centre.npy")
        return cls(np.load(folder / "labels.npy"), rows, *fits, meta["n_labels"], meta["ceiling"], centre)


def fit_zero_shot(
    D: np.ndarray | sp.spmatrix,
    V: np.ndarray | sp.spmatrix,
    Y: sp.csr_matrix,
    pred: sp.csr_matrix,
    zero: np.ndarray,
) -> ZeroShot:
    """Fit on calibration documents: their rows ``D``, every label's text row ``V`` (``L x D``),
    their labels ``Y`` and the model's scores ``pred``; ``zero``: the labels to score from text."""
    trained = np.setdiff1d(np.arange(Y.shape[1]), zero)
    raw = dense_f32(D @ V.T)
    centre = raw.mean(axis=0)  # a label text close to every document (a hub) says little about any one
    sims = raw[:, trained] - centre[trained]
    width = min(PAIRS_PER_DOC, len(trained))
    top = np.argpartition(-sims, width - 1, axis=1)[:, :width]
    rows = np.repeat(np.arange(sims.shape[0]), width)
    relevant = np.asarray(Y[:, trained][rows, top.ravel()]).ravel() > 0
    text_fit = logistic_1d(np.take_along_axis(sims, top, axis=1).ravel(), relevant)
    p = pred.tocoo()
    score_fit = logistic_1d(p.data, np.asarray(Y[p.row, p.col]).ravel() > 0)
    if score_fit[0] <= 0 or text_fit[0] <= 0:
        raise ModelError(f"zero-shot calibration: no rising fit (scores {score_fit}, label texts {text_fit})")
    ceiling = float(p.data.max(initial=0.0))
    zero = np.asarray(zero, np.int64)
    return ZeroShot(zero, V[zero], text_fit, score_fit, Y.shape[1], ceiling, centre[zero].astype(np.float32))


def logistic_1d(x: np.ndarray, y: np.ndarray, iters: int = 50, l2: float = 1e-3) -> tuple[float, float]:
    """``(w, b)`` of ``P(y) = sigmoid(w x + b)`` by Newton steps (a little l2 keeps a separable fit finite)."""
    X = np.stack([np.asarray(x, np.float64), np.ones(len(x))], axis=1)
    t = np.asarray(y, np.float64)
    theta = np.zeros(2)
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-(X @ theta)))
        grad = X.T @ (p - t) + l2 * theta
        hess = (X * (p * (1 - p))[:, None]).T @ X + l2 * np.eye(2)
        step = np.linalg.solve(hess, grad)
        theta -= step
        if np.abs(step).max() < 1e-8:
            break
    return float(theta[0]), float(theta[1])
