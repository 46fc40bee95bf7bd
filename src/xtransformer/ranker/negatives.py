"""Negative sampling: which instances train the rankers of each cluster (X-Transformer Sec. 3.4).

A mask ``M`` (csr ``N x K``, binary) selects, for every cluster ``c``, the instances
``{i : M[i, c] != 0}``; every label of cluster ``c`` is trained on exactly those instances, with
positives where ``Y[i, l] = 1``.

* ``tfn`` (teacher-forcing negatives): ``M = binarize(Y @ C)``, the instances that have a
  positive label in the cluster;
* ``man`` (matcher-aware negatives): ``M = binarize(M_hat)``, the matcher's top-b clusters;
* ``tfn+man``: the union, ``binarize(Y @ C + M_hat)`` (the paper's best).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from xtransformer.ranker.errors import RankerError

SCHEMES = ("tfn", "man", "tfn+man")


def binarize(M: sp.spmatrix) -> sp.csr_matrix:
    """``M`` as csr float32 with every stored nonzero set to 1 (explicit zeros dropped)."""
    out = sp.csr_matrix(M, dtype=np.float32, copy=True)
    out.sum_duplicates()
    out.eliminate_zeros()
    out.data[:] = 1.0
    return out


def tfn_mask(Y: sp.spmatrix, C: sp.spmatrix) -> sp.csr_matrix:
    """Teacher-forcing mask ``binarize(Y @ C)`` (``N x K``)."""
    Y, C = _check_yc(Y, C)
    return binarize(binarize(Y) @ binarize(C))


def negative_mask(
    scheme: str,
    Y: sp.spmatrix,
    C: sp.spmatrix,
    matcher_pred: sp.spmatrix | None = None,
) -> sp.csr_matrix:
    """The training mask (csr ``N x K``) for ``scheme`` in ``tfn | man | tfn+man``.

    ``matcher_pred`` (csr ``N x K``, the matcher's top-b clusters per instance; values ignored)
    is required by ``man`` and ``tfn+man``.
    """
    if scheme not in SCHEMES:
        raise RankerError(f"negatives: scheme must be one of {list(SCHEMES)}, got {scheme!r}")
    Y, C = _check_yc(Y, C)
    mask = sp.csr_matrix((Y.shape[0], C.shape[1]), dtype=np.float32)
    if "tfn" in scheme:
        mask = tfn_mask(Y, C)
    if "man" in scheme:
        if matcher_pred is None:
            raise RankerError(f"negatives: scheme {scheme!r} needs `matcher_pred` (N x K matcher top-b clusters)")
        if not sp.issparse(matcher_pred) or matcher_pred.shape != mask.shape:
            raise RankerError(
                f"negatives: `matcher_pred` must be a sparse {mask.shape} matrix, got "
                f"{getattr(matcher_pred, 'shape', type(matcher_pred).__name__)}"
            )
        mask = binarize(mask + binarize(matcher_pred))
    return mask


def _check_yc(Y: sp.spmatrix, C: sp.spmatrix) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    if not sp.issparse(Y) or Y.ndim != 2:
        raise RankerError(f"negatives: `Y` must be a sparse N x L matrix, got {type(Y).__name__}")
    if not sp.issparse(C) or C.ndim != 2:
        raise RankerError(f"negatives: `C` must be a sparse L x K matrix, got {type(C).__name__}")
    if Y.shape[1] != C.shape[0]:
        raise RankerError(f"negatives: `Y` has {Y.shape[1]} labels but `C` has {C.shape[0]} rows")
    return sp.csr_matrix(Y), sp.csr_matrix(C)
