"""XMC metrics: ranking metrics (P@k, R@k, RP@k, nDCG@k, PSP@k) from sparse top-k predictions, and the
F1 scores of decided label sets (micro, macro, example).

Definitions follow pyxclib / the Extreme Classification Repository (and PECOS for P/R):
for a document with true label set ``T`` and ranked predictions ``l_1..l_k``,

* ``P@k   = |{l_1..l_k} ∩ T| / k`` (denominator ``k`` even when fewer than ``k`` predictions),
* ``R@k   = |{l_1..l_k} ∩ T| / |T|``, 0 when ``T`` is empty,
* ``RP@k  = |{l_1..l_k} ∩ T| / min(k, |T|)`` (R-Precision as Chalkidis et al., ACL 2019, report it
  on EURLEX57K: precision at k that does not punish a document with fewer than k labels), 0 when
  ``T`` is empty,
* ``nDCG@k = DCG@k / IDCG@min(k, |T|)`` with ``DCG@k = sum_j [l_j in T] / log2(j + 1)``, 0 when
  ``T`` is empty,
* ``PSP@k`` (Jain et al., KDD 2016) with inverse propensities ``w``: the *normalised* form used
  by the XC repository and pyxclib, ``sum_docs sum_{j<=k} [l_j in T] w_{l_j}`` divided by the
  best achievable value ``sum_docs (sum of the min(k, |T|) largest w over T)``; the
  unnormalised form ``mean_docs (1/k) sum_{j<=k} [l_j in T] w_{l_j}`` is reported as
  ``PSP_raw@k``.

Every metric is a mean over *all* documents, including those with no true label (they count
as 0 and are reported as ``n_docs_no_label``). All metrics reduce to per-document terms summed
over documents (:class:`MetricSums`), which lets :func:`evaluate` and the streaming torchmetrics
``XMCMetrics`` (``matcher/metrics.py``, the matcher's validation) share one code path. Nothing
here builds a dense ``N x L`` matrix, and nothing imports torch (the linear path stays light).

Decided label sets (a binary csr ``N x L``, :func:`decision_f1`): ``micro-F1`` = 2 TP / (2 TP + FP +
FN) over every (document, label) pair; ``macro-F1`` = the mean over *all* L labels of the label
space of each label's 2 TP / (2 TP + FP + FN), 0 where a label is neither true nor predicted
(LibMultiLabel's definition, so its published EURLEX57K rows compare); ``example-F1`` = the mean
over documents of 2 |P ∩ T| / (|P| + |T|), 1 for a document with neither (nothing to find, nothing
claimed) and 0 for one with true labels and no decided label.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from xtransformer.topk import Candidates, topk

__all__ = [
    "MetricsError",
    "MetricSums",
    "topk_from_scores",
    "precision_at_k",
    "recall_at_k",
    "rprecision_at_k",
    "ndcg_at_k",
    "decision_f1",
    "psp_at_k",
    "propensity",
    "evaluate",
    "format_metrics_table",
]


class MetricsError(ValueError):
    """Bad input to a metric function; the message names the offending argument."""


# --------------------------------------------------------------------------- input checks


def _as_csr(mat: Any, name: str) -> sp.csr_matrix:
    if not sp.issparse(mat):
        raise MetricsError(f"{name} must be a scipy sparse matrix, got {type(mat).__name__}")
    if mat.ndim != 2:
        raise MetricsError(f"{name} must be 2-D, got shape {mat.shape}")
    return sp.csr_matrix(mat)


def _binary_labels(Y: Any, name: str = "Y_true") -> sp.csr_matrix:
    """Canonical csr (sorted indices, no duplicates, no explicit zeros) with all-ones data."""
    Y = _as_csr(Y, name)
    if not Y.has_canonical_format or (Y.nnz and not np.all(Y.data)):
        Y = Y.copy()
        Y.sum_duplicates()
        Y.eliminate_zeros()
    return sp.csr_matrix((np.ones(Y.nnz, dtype=np.float32), Y.indices, Y.indptr), shape=Y.shape)


def _check_k(k: Any, name: str) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise MetricsError(f"{name} must be a positive integer, got {k!r}")
    return int(k)


def _check_topk_idx(topk_idx: Any, n_rows: int, n_labels: int, name: str) -> np.ndarray:
    """Validate a ranked index array: 2-D integers in [-1, L), rows matching, no duplicates."""
    idx = np.asarray(topk_idx)
    if idx.ndim != 2:
        raise MetricsError(f"{name} must be a 2-D (N x k) index array, got shape {idx.shape}")
    if idx.size and not np.issubdtype(idx.dtype, np.integer):
        raise MetricsError(f"{name} must hold integer label indices, got dtype {idx.dtype}")
    idx = idx.astype(np.int64, copy=False)
    if idx.shape[0] != n_rows:
        raise MetricsError(f"{name} has {idx.shape[0]} rows but Y_true has {n_rows} (documents must align)")
    if idx.size and (idx.min() < -1 or idx.max() >= n_labels):
        raise MetricsError(
            f"{name} holds label indices outside [-1, {n_labels}) "
            f"(min {idx.min()}, max {idx.max()}); Y_true has {n_labels} labels"
        )
    srt = np.sort(idx, axis=1)
    if np.any((srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] >= 0)):
        raise MetricsError(f"{name} repeats a label index within a row")
    return idx


def _fit_width(idx: np.ndarray, max_k: int) -> np.ndarray:
    """Truncate to ``max_k`` columns or pad with -1 (missing predictions count as misses)."""
    if idx.shape[1] >= max_k:
        return idx[:, :max_k]
    pad = np.full((idx.shape[0], max_k - idx.shape[1]), -1, dtype=np.int64)
    return np.hstack([idx, pad])


def _check_inv_propensity(inv_propensity: Any, n_labels: int) -> np.ndarray:
    w = np.asarray(inv_propensity, dtype=np.float64)
    if w.shape != (n_labels,):
        raise MetricsError(f"inv_propensity must have shape ({n_labels},) to match Y_true's labels, got {w.shape}")
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise MetricsError("inv_propensity must be finite and non-negative")
    return w


# --------------------------------------------------------------------------- top-k


def topk_from_scores(scores: sp.spmatrix, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the ``k`` largest *stored* entries of a sparse score matrix.

    Returns ``(idx, vals)``: ``int64`` and ``float32`` arrays of shape ``N x k`` sorted by
    decreasing score, ties broken by lower label index (``xtransformer.topk``); rows storing fewer
    than ``k`` entries are padded with index -1 and score ``-inf``.
    """
    k = _check_k(k, "k")
    S = _as_csr(scores, "scores")
    if not S.has_canonical_format:
        S = S.copy()
        S.sum_duplicates()
    if S.nnz and np.isnan(S.data).any():
        raise MetricsError("scores contains NaN")
    return topk(Candidates.from_csr(S), k).to_padded(k)


def _row_positions(indptr: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row id and position within the row of every stored entry of a CSR matrix."""
    nnz = int(indptr[-1])
    rows = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    pos = np.arange(nnz, dtype=np.int64) - np.repeat(indptr[:-1].astype(np.int64), counts)
    return rows, pos


# --------------------------------------------------------------------------- per-document terms


def _hits(Y: sp.csr_matrix, idx: np.ndarray) -> np.ndarray:
    """``N x k`` bool: is ``idx[i, j]`` a true label of document ``i``? (binary canonical Y)."""
    n_rows, n_labels = Y.shape
    if Y.nnz == 0 or idx.size == 0:
        return np.zeros(idx.shape, dtype=bool)
    # One sorted key per stored (row, label); membership by binary search, never densified.
    rows, _ = _row_positions(Y.indptr, np.diff(Y.indptr))
    y_keys = rows * n_labels + Y.indices
    q_keys = np.arange(n_rows, dtype=np.int64)[:, None] * n_labels + idx
    at = np.minimum(np.searchsorted(y_keys, q_keys), len(y_keys) - 1)
    return (y_keys[at] == q_keys) & (idx >= 0)


def _dense_hits(target: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Hits against a dense boolean ``B x L`` target (a batch, never a full N x L)."""
    picked = np.take_along_axis(target, np.maximum(idx, 0), axis=1)
    return picked & (idx >= 0)


def _discounts(max_k: int) -> np.ndarray:
    return 1.0 / np.log2(np.arange(2, max_k + 2, dtype=np.float64))


def _per_doc_precision(hits: np.ndarray) -> np.ndarray:
    return np.cumsum(hits, axis=1) / np.arange(1, hits.shape[1] + 1)


def _per_doc_recall(hits: np.ndarray, n_true: np.ndarray) -> np.ndarray:
    # Empty-truth documents have no hits, so dividing by max(|T|, 1) gives them 0.
    return np.cumsum(hits, axis=1) / np.maximum(n_true, 1)[:, None]


def _per_doc_rprecision(hits: np.ndarray, n_true: np.ndarray) -> np.ndarray:
    # min(k, |T|) is 0 only for empty-truth documents, which have no hits: they count 0.
    ks = np.arange(1, hits.shape[1] + 1)[None, :]
    return np.cumsum(hits, axis=1) / np.maximum(np.minimum(ks, n_true[:, None]), 1)


def _per_doc_ndcg(hits: np.ndarray, n_true: np.ndarray) -> np.ndarray:
    max_k = hits.shape[1]
    disc = _discounts(max_k)
    dcg = np.cumsum(hits * disc, axis=1)
    ideal_len = np.minimum(np.arange(1, max_k + 1)[None, :], n_true[:, None])
    idcg = np.where(ideal_len > 0, np.cumsum(disc)[np.maximum(ideal_len - 1, 0)], 1.0)
    return dcg / idcg


def _per_doc_psp(Y: sp.csr_matrix, idx: np.ndarray, hits: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cumulative propensity-weighted gain of the predictions and of the ideal ranking."""
    gain = np.cumsum(np.where(hits, w[np.maximum(idx, 0)], 0.0), axis=1)
    weighted = sp.csr_matrix((w[Y.indices], Y.indices, Y.indptr), shape=Y.shape)
    # The ideal ranking is the top-k of the true labels by weight; reuse the top-k kernel.
    best_idx, _ = topk_from_scores(weighted, idx.shape[1])
    # Re-read weights in float64 (the kernel returns float32 scores).
    best = np.where(best_idx >= 0, w[np.maximum(best_idx, 0)], 0.0)
    return gain, np.cumsum(best, axis=1)


@dataclass
class MetricSums:
    """Per-document metric terms summed over documents, for k = 1..max_k (arrays float64)."""

    precision: np.ndarray
    recall: np.ndarray
    rprecision: np.ndarray
    ndcg: np.ndarray
    psp_gain: np.ndarray  # sum of cumulative propensity-weighted hits
    psp_best: np.ndarray  # sum of the best achievable cumulative weighted gain
    psp_raw: np.ndarray  # sum of gain / k (Jain et al.'s unnormalised PSP)
    n_docs: int
    n_docs_no_label: int


def _metric_sums(
    Y: sp.csr_matrix | None,
    idx: np.ndarray,
    hits: np.ndarray,
    n_true: np.ndarray,
    w: np.ndarray | None,
) -> MetricSums:
    """Sum the per-document terms of every metric; PSP terms are zero when ``w`` is None."""
    max_k = idx.shape[1]
    if w is not None and Y is None:
        raise MetricsError("PSP needs the sparse Y_true batch")
    if w is not None:
        gain, best = _per_doc_psp(Y, idx, hits, w)
        psp = (gain.sum(0), best.sum(0), (gain / np.arange(1, max_k + 1)).sum(0))
    else:
        psp = (np.zeros(max_k),) * 3
    return MetricSums(
        precision=_per_doc_precision(hits).sum(0),
        recall=_per_doc_recall(hits, n_true).sum(0),
        rprecision=_per_doc_rprecision(hits, n_true).sum(0),
        ndcg=_per_doc_ndcg(hits, n_true).sum(0),
        psp_gain=psp[0],
        psp_best=psp[1],
        psp_raw=psp[2],
        n_docs=int(len(n_true)),
        n_docs_no_label=int(np.count_nonzero(n_true == 0)),
    )


def _safe_ratio(num: np.ndarray, den: np.ndarray | float) -> np.ndarray:
    den = np.broadcast_to(np.asarray(den, dtype=np.float64), np.shape(num))
    return np.divide(num, den, out=np.zeros(np.shape(num)), where=den > 0)


def _metric_curves(sums: MetricSums, with_psp: bool) -> dict[str, np.ndarray]:
    """Metric prefix -> array over k = 1..max_k, as fractions in [0, 1] (PSP_raw may exceed)."""
    curves = {
        "P": _safe_ratio(sums.precision, sums.n_docs),
        "R": _safe_ratio(sums.recall, sums.n_docs),
        "RP": _safe_ratio(sums.rprecision, sums.n_docs),
        "nDCG": _safe_ratio(sums.ndcg, sums.n_docs),
    }
    if with_psp:
        curves["PSP"] = _safe_ratio(sums.psp_gain, sums.psp_best)
        curves["PSP_raw"] = _safe_ratio(sums.psp_raw, sums.n_docs)
    return curves


def _metrics_dict(sums: MetricSums, ks: Sequence[int], with_psp: bool) -> dict[str, float]:
    out: dict[str, float] = {}
    for prefix, curve in _metric_curves(sums, with_psp).items():
        for k in ks:
            out[f"{prefix}@{k}"] = 100.0 * float(curve[k - 1])
    out["n_docs"] = sums.n_docs
    out["n_docs_no_label"] = sums.n_docs_no_label
    return out


# --------------------------------------------------------------------------- public metrics


def _prepare(Y_true: Any, topk_idx: Any, max_k: int | None) -> tuple[sp.csr_matrix, np.ndarray, np.ndarray, np.ndarray]:
    Y = _binary_labels(Y_true)
    idx = _check_topk_idx(topk_idx, Y.shape[0], Y.shape[1], "topk_idx")
    width = idx.shape[1] if max_k is None else _check_k(max_k, "max_k")
    if width < 1:
        raise MetricsError("topk_idx has no columns; pass max_k or at least one prediction")
    idx = _fit_width(idx, width)
    return Y, idx, _hits(Y, idx), np.diff(Y.indptr)


def _mean_over_docs(per_doc: np.ndarray) -> np.ndarray:
    return per_doc.mean(axis=0) if per_doc.shape[0] else np.zeros(per_doc.shape[1])


def precision_at_k(Y_true: sp.spmatrix, topk_idx: np.ndarray, max_k: int | None = None) -> np.ndarray:
    """P@k for k = 1..max_k (fractions), mean over all documents; ``max_k`` defaults to
    ``topk_idx.shape[1]`` (wider input is truncated, narrower padded with misses)."""
    _, _, hits, _ = _prepare(Y_true, topk_idx, max_k)
    return _mean_over_docs(_per_doc_precision(hits))


def recall_at_k(Y_true: sp.spmatrix, topk_idx: np.ndarray, max_k: int | None = None) -> np.ndarray:
    """R@k for k = 1..max_k; documents with no true label contribute 0 (and stay in the mean)."""
    _, _, hits, n_true = _prepare(Y_true, topk_idx, max_k)
    return _mean_over_docs(_per_doc_recall(hits, n_true))


def rprecision_at_k(Y_true: sp.spmatrix, topk_idx: np.ndarray, max_k: int | None = None) -> np.ndarray:
    """RP@k = hits in the top k / min(k, |T|) for k = 1..max_k; 0 for documents with no true label."""
    _, _, hits, n_true = _prepare(Y_true, topk_idx, max_k)
    return _mean_over_docs(_per_doc_rprecision(hits, n_true))


def ndcg_at_k(Y_true: sp.spmatrix, topk_idx: np.ndarray, max_k: int | None = None) -> np.ndarray:
    """nDCG@k = DCG@k / IDCG@min(k, |T|) for k = 1..max_k; 0 for documents with no true label."""
    _, _, hits, n_true = _prepare(Y_true, topk_idx, max_k)
    return _mean_over_docs(_per_doc_ndcg(hits, n_true))


def psp_at_k(
    Y_true: sp.spmatrix,
    topk_idx: np.ndarray,
    inv_propensity: np.ndarray,
    max_k: int | None = None,
    normalize: bool = True,
) -> np.ndarray:
    """Propensity-scored precision for k = 1..max_k (Jain et al. 2016).

    ``normalize=True`` (default, XC-repository / pyxclib form): total weighted hits over the
    total best achievable weighted hits, in [0, 1]. ``normalize=False``: Jain et al.'s
    ``mean_docs (1/k) sum_j [hit_j] w_{l_j}``, which is not bounded by 1.
    """
    Y, idx, hits, n_true = _prepare(Y_true, topk_idx, max_k)
    w = _check_inv_propensity(inv_propensity, Y.shape[1])
    curves = _metric_curves(_metric_sums(Y, idx, hits, n_true, w), with_psp=True)
    return curves["PSP" if normalize else "PSP_raw"]


def propensity(Y_train: sp.spmatrix, A: float = 0.55, B: float = 1.5) -> np.ndarray:
    """Inverse propensity per label (Jain et al. 2016): ``1 + C (N_l + B)^-A``,
    ``C = (ln N - 1)(B + 1)^A``, with ``N_l`` the number of training documents of label ``l``.

    Jain et al. use A=0.55, B=1.5 by default (0.5/0.4 for Wikipedia, 0.6/2.6 for Amazon).
    ``B > 0`` keeps labels never seen in training finite (they get the largest weight).
    """
    Y = _binary_labels(Y_train, "Y_train")
    n_docs = Y.shape[0]
    if n_docs < 1:
        raise MetricsError("Y_train has no rows; propensities need training documents")
    if not (np.isfinite(A) and A >= 0):
        raise MetricsError(f"A must be finite and non-negative, got {A!r}")
    if not (np.isfinite(B) and B > 0):
        raise MetricsError(f"B must be finite and positive, got {B!r}")
    label_counts = np.bincount(Y.indices, minlength=Y.shape[1]).astype(np.float64)
    C = (np.log(n_docs) - 1.0) * (B + 1.0) ** A
    return 1.0 + C * (label_counts + B) ** (-A)


# --------------------------------------------------------------------------- evaluate


def _resolve_ks(ks: Sequence[int] | None, max_k: int) -> tuple[list[int], int]:
    if ks is None:
        max_k = _check_k(max_k, "max_k")
        return list(range(1, max_k + 1)), max_k
    ks = sorted({_check_k(k, "ks") for k in ks})
    if not ks:
        raise MetricsError("ks is empty")
    return ks, ks[-1]


def _topk_from_input(scores: Any, Y: sp.csr_matrix, max_k: int) -> np.ndarray:
    """Ranked ``N x max_k`` label indices from a sparse score matrix or an ``(idx, vals)`` pair."""
    if isinstance(scores, tuple):
        if len(scores) != 2:
            raise MetricsError("scores as a tuple must be (topk_idx, topk_vals)")
        idx = _check_topk_idx(scores[0], Y.shape[0], Y.shape[1], "scores[0] (top-k indices)")
        vals = np.asarray(scores[1])
        if vals.shape != idx.shape:
            raise MetricsError(f"scores[1] (top-k values) has shape {vals.shape}, expected {idx.shape}")
        if np.isnan(vals).any() or np.any(vals[:, 1:] > vals[:, :-1]):
            raise MetricsError("scores[1] rows must be sorted by decreasing score (no NaN)")
        return _fit_width(idx, max_k)
    S = _as_csr(scores, "scores")
    if S.shape[0] != Y.shape[0]:
        raise MetricsError(f"scores has {S.shape[0]} rows but Y_true has {Y.shape[0]} (documents must align)")
    if S.shape[1] != Y.shape[1]:
        raise MetricsError(f"scores has {S.shape[1]} label columns but Y_true has {Y.shape[1]}")
    idx, _ = topk_from_scores(S, max_k)
    return idx


def evaluate(
    Y_true: sp.spmatrix,
    scores: sp.spmatrix | tuple[np.ndarray, np.ndarray],
    ks: Sequence[int] | None = None,
    max_k: int = 5,
    inv_propensity: np.ndarray | None = None,
) -> dict[str, float]:
    """All ranking metrics, as percentages (0-100), keyed ``P@k``, ``R@k``, ``RP@k``, ``nDCG@k`` (and ``PSP@k``,
    ``PSP_raw@k`` when ``inv_propensity`` is given), plus ``n_docs`` and ``n_docs_no_label``.

    ``scores`` is an ``N x L`` sparse score matrix (top-k of its stored entries is taken) or a
    ``(topk_idx, topk_vals)`` pair sorted by decreasing score as :func:`topk_from_scores`
    returns. Reports every k in ``ks`` if given, else every k in 1..max_k.
    """
    Y = _binary_labels(Y_true)
    if Y.shape[0] == 0:
        raise MetricsError("Y_true has no rows; nothing to evaluate")
    ks_list, width = _resolve_ks(ks, max_k)
    idx = _topk_from_input(scores, Y, width)
    w = None if inv_propensity is None else _check_inv_propensity(inv_propensity, Y.shape[1])
    n_true = np.diff(Y.indptr)
    sums = _metric_sums(Y, idx, _hits(Y, idx), n_true, w)
    return _metrics_dict(sums, ks_list, with_psp=w is not None)


def document_hits(
    Y_true: sp.spmatrix, scores: sp.spmatrix | tuple[np.ndarray, np.ndarray], max_k: int = 5
) -> tuple[np.ndarray, np.ndarray]:
    """Each document's ranked hits (``N x max_k`` bool: is its j-th prediction a true label?) and
    its number of true labels: all that its ``P@k`` and ``nDCG@k`` need, in a few bytes."""
    Y = _binary_labels(Y_true)
    max_k = _check_k(max_k, "max_k")
    idx = _topk_from_input(scores, Y, max_k)
    return _hits(Y, idx), np.diff(Y.indptr)


def per_document(
    Y_true: sp.spmatrix, scores: sp.spmatrix | tuple[np.ndarray, np.ndarray], max_k: int = 5
) -> dict[str, np.ndarray]:
    """Each document's ``P@k`` and ``nDCG@k`` for k = 1..max_k (``N`` float64 arrays, percentages):
    their means are :func:`evaluate`'s; per document they let two systems be compared pairwise
    (a paired bootstrap over documents)."""
    return per_document_from_hits(*document_hits(Y_true, scores, max_k))


def per_document_from_hits(hits: np.ndarray, n_true: np.ndarray) -> dict[str, np.ndarray]:
    """:func:`per_document` from :func:`document_hits`' output (e.g. a stored record of a run)."""
    hits, n_true = np.asarray(hits, dtype=bool), np.asarray(n_true)
    if hits.ndim != 2 or n_true.shape != (hits.shape[0],):
        raise MetricsError(f"hits must be N x k and n_true N long, got {hits.shape} and {n_true.shape}")
    curves = {"P": _per_doc_precision(hits), "nDCG": _per_doc_ndcg(hits, n_true)}
    return {
        f"{name}@{k}": 100.0 * curve[:, k - 1] for name, curve in curves.items() for k in range(1, hits.shape[1] + 1)
    }


# --------------------------------------------------------------------------- label groups

# Chalkidis et al. (EMNLP 2020) on EURLEX57K: frequent labels have more than 50 training documents,
# few-shot labels 1 to 50, zero-shot labels none
FREQUENT_ABOVE = 50


def label_groups(train_counts: Any, frequent_above: int = FREQUENT_ABOVE) -> dict[str, np.ndarray]:
    """Label indices of the ``frequent``, ``few`` (1..``frequent_above`` training documents) and
    ``zero`` (none) groups, from each label's training document count."""
    counts = np.asarray(train_counts).ravel()
    return {
        "frequent": np.flatnonzero(counts > frequent_above),
        "few": np.flatnonzero((counts >= 1) & (counts <= frequent_above)),
        "zero": np.flatnonzero(counts == 0),
    }


def group_metrics(Y_true: sp.spmatrix, scores: sp.spmatrix, train_counts: Any, k: int = 5) -> dict[str, dict]:
    """Per label group, the metrics of the ranking restricted to the group's labels over the
    documents with a true label in the group (Chalkidis et al. 2020): ``P@1..k``, ``RP@k``
    (hits / min(k, true labels)) and ``nDCG@k`` in percent, ``n_labels``, ``n_docs``."""
    Y, S = _binary_labels(Y_true), _as_csr(scores, "scores")
    if S.shape != Y.shape:
        raise MetricsError(f"scores have shape {S.shape} but Y_true {Y.shape}")
    out = {}
    for name, cols in label_groups(train_counts).items():
        Yg = Y[:, cols].tocsr()
        docs = np.flatnonzero(np.diff(Yg.indptr))
        out[name] = {"n_labels": len(cols), "n_docs": len(docs)}
        if len(docs):
            out[name] |= _group_terms(_binary_labels(Yg[docs]), S[docs][:, cols].tocsr(), k)
    return out


def _group_terms(Y: sp.csr_matrix, S: sp.csr_matrix, k: int) -> dict[str, float]:
    idx, _ = topk_from_scores(S, k)
    hits, n_true = _hits(Y, idx), np.diff(Y.indptr)
    precision = 100 * _mean_over_docs(_per_doc_precision(hits))
    terms = {f"P@{j}": float(precision[j - 1]) for j in range(1, k + 1)}
    terms[f"RP@{k}"] = float(100 * np.mean(hits.sum(axis=1) / np.minimum(k, n_true)))
    terms[f"nDCG@{k}"] = float(100 * _mean_over_docs(_per_doc_ndcg(hits, n_true))[k - 1])
    return terms


# --------------------------------------------------------------------------- decided label sets


def decision_f1(Y_true: sp.spmatrix, decided: sp.spmatrix) -> dict[str, float]:
    """``micro-F1``, ``macro-F1`` and ``example-F1`` (percentages) of decided label sets: ``decided``
    is ``N x L``, its stored entries the labels decided for each document (their values are ignored)."""
    Y = _binary_labels(Y_true)
    D = _binary_labels(decided, "decided")
    if D.shape != Y.shape:
        raise MetricsError(f"decided has shape {D.shape} but Y_true has {Y.shape} (documents and labels must align)")
    if Y.shape[0] == 0:
        raise MetricsError("Y_true has no rows; nothing to evaluate")
    both = Y.multiply(D).tocsr()
    n_true, n_pred, n_hit = (np.diff(M.indptr).astype(np.float64) for M in (Y, D, both))
    tp = np.bincount(both.indices, minlength=Y.shape[1]).astype(np.float64)
    fp = np.bincount(D.indices, minlength=Y.shape[1]) - tp
    fn = np.bincount(Y.indices, minlength=Y.shape[1]) - tp
    per_doc = np.where(n_true + n_pred > 0, 2 * n_hit / np.maximum(n_true + n_pred, 1), 1.0)
    return {
        "micro-F1": 100.0 * float(_safe_ratio(2 * tp.sum(), 2 * tp.sum() + fp.sum() + fn.sum())),
        "macro-F1": 100.0 * float(_safe_ratio(2 * tp, 2 * tp + fp + fn).mean()),
        "example-F1": 100.0 * float(per_doc.mean()),
    }


# --------------------------------------------------------------------------- reporting

_DEFAULT_TABLE_KEYS = ("P@1", "P@3", "P@5", "R@5", "RP@5", "nDCG@3", "nDCG@5", "PSP@1", "PSP@3", "PSP@5")


def format_metrics_table(
    metrics: dict[str, float],
    keys: Sequence[str] | None = None,
    style: str = "markdown",
    digits: int = 2,
) -> str:
    """Render metrics for logs: ``style="markdown"`` gives a header/separator/value table,
    ``style="line"`` a single ``P@1 91.85 | P@3 83.07 | ...`` line. ``keys=None`` shows the
    usual P/R/nDCG/PSP keys that are present; explicit keys must all be present."""
    if keys is None:
        keys = [k for k in _DEFAULT_TABLE_KEYS if k in metrics]
    else:
        missing = [k for k in keys if k not in metrics]
        if missing:
            raise MetricsError(f"keys not in metrics: {missing}")
    cells = [_format_value(metrics[k], digits) for k in keys]
    if style == "line":
        return " | ".join(f"{k} {v}" for k, v in zip(keys, cells))
    if style != "markdown":
        raise MetricsError(f"style must be 'markdown' or 'line', got {style!r}")
    header = "| " + " | ".join(keys) + " |"
    sep = "|" + "|".join("---:" for _ in keys) + "|"
    row = "| " + " | ".join(cells) + " |"
    return "\n".join([header, sep, row])


def _format_value(value: float, digits: int) -> str:
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    return f"{float(value):.{digits}f}"
