"""Ranker input features: TF-IDF alone, or TF-IDF concatenated with neural embeddings."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from xtransformer.ranker.errors import RankerError
from xtransformer.utils.rows import unit_rows


def concat_features(X_tfidf: sp.spmatrix, emb: np.ndarray | None = None, weight: float = 1.0) -> sp.csr_matrix:
    """``[X_tfidf | weight * emb]`` with each block and the result l2-row-normalised (csr float32).

    With ``emb=None`` this is the row-normalised TF-IDF alone (the ``tfidf`` feature setting).
    """
    if not sp.issparse(X_tfidf) or X_tfidf.ndim != 2:
        raise RankerError(f"concat_features: `X_tfidf` must be a sparse N x F matrix, got {type(X_tfidf).__name__}")
    blocks = [unit_rows(X_tfidf)]
    if emb is not None:
        emb = np.asarray(emb)
        if emb.ndim != 2 or emb.shape[0] != X_tfidf.shape[0]:
            raise RankerError(
                f"concat_features: `emb` must be N x H with N = {X_tfidf.shape[0]}, got shape {emb.shape}"
            )
        if not weight >= 0:
            raise RankerError(f"concat_features: `weight` must be >= 0, got {weight!r}")
        blocks.append(unit_rows(emb.astype(np.float32)) * np.float32(weight))
    out = with_dense_block(*blocks) if len(blocks) > 1 else blocks[0]
    out = unit_rows(out, inplace=len(blocks) > 1)  # the joined matrix is this call's own
    out.sort_indices()
    return out.astype(np.float32, copy=False)


def with_dense_block(A: sp.csr_matrix, D: np.ndarray) -> sp.csr_matrix:
    """``[A | D]`` as csr float32: ``sp.hstack([A, sp.csr_matrix(D)])``, entry for entry. Where no
    entry of ``D`` is 0 (embeddings) every row's block is ``D``'s width, so the arrays are laid out
    directly, in a fraction of scipy's time (EURLEX57K's training rows: docs/results.md, "Adding from
    texts with the run's stage cache")."""
    if not np.all(D):  # zeros would be dropped: scipy's general path
        return sp.hstack([A, sp.csr_matrix(D)], format="csr", dtype=np.float32)
    (n, F), H = A.shape, D.shape[1]
    nz_a = np.diff(A.indptr)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(nz_a + H, out=indptr[1:])
    index = np.int32 if max(int(indptr[-1]), F + H) < 2**31 else np.int64  # as scipy would choose
    data, indices = np.empty(indptr[-1], np.float32), np.empty(indptr[-1], index)
    dense = ((indptr[:-1] + nz_a)[:, None] + np.arange(H)).ravel()  # each row's block, after its A entries
    data[dense], indices[dense] = D.ravel(), np.tile(np.arange(F, F + H, dtype=index), n)
    sparse = np.ones(len(data), dtype=bool)
    sparse[dense] = False
    data[sparse], indices[sparse] = A.data, A.indices
    out = sp.csr_matrix((data, indices, indptr.astype(index)), shape=(n, F + H))
    out.has_sorted_indices = A.has_sorted_indices
    return out


def as_features(X: sp.spmatrix | np.ndarray, name: str = "X") -> sp.csr_matrix:
    """Any csr/dense feature matrix as csr float32 with sorted indices (no copy when already so)."""
    if isinstance(X, sp.csr_matrix) and X.dtype == np.float32 and X.has_sorted_indices:
        return X  # the common case, on every request: no new matrix object
    if sp.issparse(X):
        X = sp.csr_matrix(X, dtype=np.float32)
    elif isinstance(X, np.ndarray) and X.ndim == 2:
        X = sp.csr_matrix(X.astype(np.float32, copy=False))
    else:
        raise RankerError(f"`{name}` must be a 2-D scipy sparse matrix or numpy array, got {type(X).__name__}")
    if not X.has_sorted_indices:
        X = X.copy()
        X.sort_indices()
    return X
