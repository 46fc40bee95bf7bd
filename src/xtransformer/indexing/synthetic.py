"""Synthetic problems with planted label groups, for tests and scale benchmarks of indexing.

Features are split into ``n_groups`` disjoint blocks; group ``g``'s labels (or documents) draw
most of their nonzeros from block ``g`` and the rest uniformly, so a good clustering recovers the
groups. Everything is generated vectorised (no loop over rows).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp


def planted_label_features(
    n_labels: int,
    n_features: int,
    n_groups: int,
    nnz_per_row: int = 30,
    noise: float = 0.2,
    seed: int = 0,
) -> tuple[sp.csr_matrix, np.ndarray]:
    """``L x D`` csr float32 with unit rows, and each label's planted group (label ``l`` is in ``l % n_groups``)."""
    groups = np.arange(n_labels) % n_groups
    return _planted_rows(groups, n_features, n_groups, nnz_per_row, noise, np.random.default_rng(seed)), groups


def planted_problem(
    n_docs: int,
    n_labels: int,
    n_features: int,
    n_groups: int,
    labels_per_doc: int = 3,
    words_per_doc: int = 20,
    noise: float = 0.2,
    seed: int = 0,
) -> tuple[sp.csr_matrix, sp.csr_matrix, np.ndarray]:
    """Documents ``X`` (``N x D``, unit rows) and labels ``Y`` (``N x L``) with planted label groups.

    Each document picks a group, ``labels_per_doc`` labels of that group and words mostly from the
    group's feature block. Returns ``(Y, X, label_groups)``.
    """
    rng = np.random.default_rng(seed)
    label_groups = np.arange(n_labels) % n_groups
    doc_groups = rng.integers(0, n_groups, n_docs)
    X = _planted_rows(doc_groups, n_features, n_groups, words_per_doc, noise, rng)
    per_group = np.bincount(label_groups, minlength=n_groups)  # labels l = g + n_groups * j
    j = rng.integers(0, per_group[doc_groups][:, None], (n_docs, labels_per_doc))
    cols = (doc_groups[:, None] + n_groups * j).ravel()
    rows = np.repeat(np.arange(n_docs), labels_per_doc)
    Y = sp.csr_matrix((np.ones(len(cols), dtype=np.float32), (rows, cols)), shape=(n_docs, n_labels))
    Y.data[:] = 1.0  # repeated picks were summed
    return Y, X, label_groups


def _planted_rows(
    groups: np.ndarray, n_features: int, n_groups: int, nnz: int, noise: float, rng: np.random.Generator
) -> sp.csr_matrix:
    n = len(groups)
    block = max(1, n_features // n_groups)
    in_block = rng.random((n, nnz)) >= noise
    cols = np.where(
        in_block,
        (groups[:, None] * block + rng.integers(0, block, (n, nnz))) % n_features,
        rng.integers(0, n_features, (n, nnz)),
    ).ravel()
    vals = rng.random(n * nnz).astype(np.float32) + 0.1
    X = sp.csr_matrix((vals, (np.repeat(np.arange(n), nnz), cols)), shape=(n, n_features), dtype=np.float32)
    norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
    return sp.csr_matrix(sp.diags((1.0 / norms).astype(np.float32)) @ X)
