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
zero-shot label displaces a trained one only when its text matches well. Two prediction settings
bound what a document gains: ``zero_shot_per_doc`` labels at most, each with a chance of at least
``zero_shot_floor`` by the cosine's fit (labels without documents are rare, so the fit, made on
trained labels, overrates them).
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
# What a document may gain, chosen on held-out training documents (experiments/label_growth/choose_zero_shot.py):
PER_DOC = 2  # zero-shot labels at most
FLOOR = 0.3  # the least chance (by the cosine's fit) a zero-shot label needs to enter a document's list
BOUNDS = ("zero_shot_per_doc", "zero_shot_floor")
SETTINGS = {"zero_shot_labels": False, BOUNDS[0]: PER_DOC, BOUNDS[1]: FLOOR}  # what fit_zero_shot adds
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

    def scores(self, D: np.ndarray | sp.spmatrix, per_doc: int = PER_DOC, floor: float = FLOOR) -> sp.csr_matrix:
        """``N x L`` (zero-shot columns only): each document's ``per_doc`` best-matching zero-shot
        labels whose cosine gives a chance of at least ``floor``, mapped onto the trained scores'
        scale (non-positive ones dropped)."""
        sims = dense_f32(D @ self.rows.T) - self.centre
        (a, b), (c, d) = self.text_fit, self.score_fit
        n, width = sims.shape
        keep = min(per_doc, width)
        if keep == 0:
            return sp.csr_matrix((n, self.n_labels), dtype=np.float32)
        top = np.argpartition(-sims, keep - 1, axis=1)[:, :keep]
        cos = np.take_along_axis(sims, top, axis=1)
        logit = a * cos + b
        score = np.clip((logit - d) / c, 0.0, self.ceiling).astype(np.float32)
        ok = (score > 0) & (logit >= _logit(floor))
        rows = np.repeat(np.arange(n), keep).reshape(n, keep)
        return sp.csr_matrix((score[ok], (rows[ok], self.labels[top[ok]])), shape=(n, self.n_labels))

    def merge(self, pred: sp.csr_matrix, D: np.ndarray | sp.spmatrix, settings: dict) -> sp.csr_matrix:
        """``pred`` with the zero-shot labels' scores added (they have none there), top ``topk`` kept;
        ``settings``: the call's prediction settings (``topk`` and the two zero-shot bounds)."""
        per_doc, floor = zero_shot_bounds(settings)
        extra = self.scores(D, per_doc, floor)
        both = concat([Candidates.from_csr(pred), Candidates.from_csr(extra)], pred.shape[0])
        return topk(dedupe_max(both), int(settings["topk"])).to_csr(pred.shape[1])  # one entry a label

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


def zero_shot_bounds(settings: dict) -> tuple[int, float]:
    """``zero_shot_per_doc`` and ``zero_shot_floor`` of ``settings`` (defaults for models saved
    without them), checked: one line naming the setting."""
    per_doc, floor = settings.get("zero_shot_per_doc", PER_DOC), settings.get("zero_shot_floor", FLOOR)
    if isinstance(per_doc, bool) or not isinstance(per_doc, int) or per_doc < 0:
        raise ModelError(f"zero_shot_per_doc must be an integer >= 0, got {per_doc!r}")
    if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not 0.0 <= floor < 1.0:
        raise ModelError(f"zero_shot_floor must be a chance in [0, 1), got {floor!r}")
    return per_doc, float(floor)


def _logit(p: float) -> float:
    return -np.inf if p <= 0.0 else float(np.log(p / (1.0 - p)))


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
