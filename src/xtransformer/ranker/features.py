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
        dense = unit_rows(emb.astype(np.float32)) * np.float32(weight)
        blocks.append(sp.csr_matrix(dense))
    out = sp.hstack(blocks, format="csr", dtype=np.float32) if len(blocks) > 1 else blocks[0]
    out = unit_rows(out)
    out.sort_indices()
    return out.astype(np.float32, copy=False)


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
