"""``XMCMetrics``: P@k / R@k / nDCG@k / PSP@k as a streaming torchmetrics ``Metric``.

The matcher logs its validation precision through it (summed across DDP ranks); the per-document
terms and their reduction are :mod:`xtransformer.metrics`'s, so it reports what
:func:`xtransformer.metrics.evaluate` would on the same predictions.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
import torchmetrics

from xtransformer.metrics import (  # the shared per-document terms (one code path with evaluate)
    MetricsError,
    MetricSums,
    _as_csr,
    _binary_labels,
    _check_inv_propensity,
    _check_k,
    _check_topk_idx,
    _dense_hits,
    _fit_width,
    _hits,
    _metric_sums,
    _metrics_dict,
    topk_from_scores,
)

__all__ = ["XMCMetrics"]


def _torch_dense_topk(scores: torch.Tensor, k: int) -> np.ndarray:
    """Top-k indices of a dense ``B x L`` batch with ties broken by lower label index
    (``torch.topk`` alone does not guarantee which tied entry wins)."""
    if torch.isnan(scores).any():
        raise MetricsError("scores contains NaN")
    n_rows, n_labels = scores.shape
    kk = min(k, n_labels)
    out = np.full((n_rows, k), -1, dtype=np.int64)
    if n_rows == 0 or kk == 0:
        return out
    thr = torch.topk(scores, kk, dim=1).values[:, -1:]
    chosen = scores >= thr
    picked = chosen.nonzero()
    if picked.shape[0] != n_rows * kk:  # some row ties at its k-th value: rare for real scores
        tied = torch.bincount(picked[:, 0], minlength=n_rows) > kk
        chosen[tied] = _lowest_ties(scores[tied], thr[tied], kk)
        picked = chosen.nonzero()
    cols = picked[:, 1].view(n_rows, kk)  # row-major, so columns ascend within each row
    order = torch.sort(scores.gather(1, cols), dim=1, descending=True, stable=True).indices
    out[:, :kk] = cols.gather(1, order).cpu().numpy()
    return out


def _lowest_ties(scores: torch.Tensor, thr: torch.Tensor, k: int) -> torch.Tensor:
    """Mask of the top-k per row where entries equal to the k-th value ``thr`` fill the
    remaining slots in ascending column order."""
    above = scores > thr
    at = scores == thr
    need = k - above.sum(dim=1, keepdim=True)
    return above | (at & (at.cumsum(dim=1, dtype=torch.int32) <= need))


def _torch_sparse_to_scipy(t: torch.Tensor) -> sp.csr_matrix:
    t = t.detach().cpu().to_sparse_csr()
    return sp.csr_matrix(
        (t.values().numpy(), t.col_indices().numpy(), t.crow_indices().numpy()),
        shape=tuple(t.shape),
    )


def _batch_target(target: Any) -> tuple[sp.csr_matrix | None, np.ndarray | None]:
    """(sparse binary target, dense bool target): exactly one is set."""
    if isinstance(target, torch.Tensor):
        if target.layout != torch.strided:
            return _binary_labels(_torch_sparse_to_scipy(target), "target"), None
        target = target.detach().cpu().numpy()
    if sp.issparse(target):
        return _binary_labels(target, "target"), None
    arr = np.asarray(target)
    if arr.ndim != 2:
        raise MetricsError(f"target must be a 2-D batch (B x L), got shape {arr.shape}")
    return None, arr != 0


def _batch_topk(scores: Any, n_rows: int, n_labels: int, k: int) -> np.ndarray:
    """Ranked top-k indices for one batch from dense/sparse scores or an (idx, vals) pair."""
    if isinstance(scores, tuple):
        idx = scores[0]
        idx = idx.detach().cpu().numpy() if isinstance(idx, torch.Tensor) else np.asarray(idx)
        idx = _check_topk_idx(idx, n_rows, n_labels, "scores[0] (top-k indices)")
        return _fit_width(idx, k)
    if isinstance(scores, torch.Tensor) and scores.layout == torch.strided:
        if scores.ndim != 2 or tuple(scores.shape) != (n_rows, n_labels):
            raise MetricsError(f"scores has shape {tuple(scores.shape)} but target is {(n_rows, n_labels)}")
        return _torch_dense_topk(scores.detach(), k)
    if isinstance(scores, torch.Tensor):
        scores = _torch_sparse_to_scipy(scores)
    S = _as_csr(scores, "scores")
    if S.shape != (n_rows, n_labels):
        raise MetricsError(f"scores has shape {S.shape} but target is {(n_rows, n_labels)}")
    return topk_from_scores(S, k)[0]


class XMCMetrics(torchmetrics.Metric):
    """Streaming P@k / R@k / nDCG@k (and PSP@k given ``inv_propensity``) over batches.

    ``update(scores, target)``: ``scores`` a dense ``B x L`` tensor, a sparse (scipy or torch)
    ``B x L`` score matrix, or a ``(topk_idx, topk_vals)`` pair; ``target`` a scipy sparse or
    dense (bool/0-1) ``B x L`` batch. Each batch is reduced to its top-k hits and then to
    per-k sums of per-document terms, so the state is O(max_k) whatever the number of batches
    (summed across processes). ``compute()`` returns the same dict as :func:`evaluate`.
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(self, max_k: int = 5, inv_propensity: np.ndarray | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.max_k = _check_k(max_k, "max_k")
        self._w = None
        if inv_propensity is not None:
            self._w = _check_inv_propensity(inv_propensity, int(np.size(inv_propensity)))
        for f in fields(MetricSums):
            if f.name.startswith("n_docs"):
                default = torch.zeros((), dtype=torch.int64)
            else:
                default = torch.zeros(self.max_k, dtype=torch.float64)
            self.add_state(f.name, default=default, dist_reduce_fx="sum")

    def update(self, scores: Any, target: Any) -> None:  # type: ignore[override]
        Y, dense = _batch_target(target)
        n_rows, n_labels = (Y if Y is not None else dense).shape
        idx = _batch_topk(scores, n_rows, n_labels, self.max_k)
        if Y is not None:
            hits, n_true = _hits(Y, idx), np.diff(Y.indptr)
        else:
            hits, n_true = _dense_hits(dense, idx), dense.sum(axis=1)
        w = None
        if self._w is not None:
            if len(self._w) != n_labels:
                raise MetricsError(
                    f"inv_propensity must have shape ({n_labels},) to match the target batch, got ({len(self._w)},)"
                )
            w = self._w
            if Y is None:
                Y = sp.csr_matrix(dense)  # a batch only: B x L, already held densely
        sums = _metric_sums(Y, idx, hits, n_true, w)
        for f in fields(MetricSums):
            state = getattr(self, f.name)
            setattr(
                self, f.name, state + torch.as_tensor(getattr(sums, f.name), dtype=state.dtype, device=state.device)
            )

    def compute(self) -> dict[str, float]:  # type: ignore[override]
        sums = MetricSums(
            **{
                f.name: (
                    int(getattr(self, f.name).item())
                    if f.name.startswith("n_docs")
                    else getattr(self, f.name).detach().cpu().numpy()
                )
                for f in fields(MetricSums)
            }
        )
        return _metrics_dict(sums, range(1, self.max_k + 1), with_psp=self._w is not None)
