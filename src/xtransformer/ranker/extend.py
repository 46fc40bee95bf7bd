"""Labels added to a trained level: new weight columns and leaf rows, the old ones untouched.

A new label sits in leaf cluster(s) ``leaves`` (one row of ``n_new x K``) and trains one
weight vector per cluster, exactly as training trains a label: on the rows its cluster's mask
selects (``tfn``: the documents with a positive label in the cluster; ``man``: those the model
routes there; ``tfn+man``: both), positives where it is carried; or one weight vector a label
trained against every document given (``train_one_vs_all``), set in each of its clusters. The old
columns of ``W`` and rows of ``C`` are copied, never retrained, so every old label scores bit for
bit as before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from xtransformer.ranker.config import RankerConfig
from xtransformer.ranker.copies import LabelCopies
from xtransformer.ranker.errors import RankerError
from xtransformer.ranker.fit import LevelSpec, solver_params, train_level
from xtransformer.ranker.level import LinearLevel
from xtransformer.ranker.negatives import binarize, negative_mask
from xtransformer.ranker.solver import SolverParams


@dataclass
class Extended:
    """A level with labels appended, its copies (None: a partition) and what training them did."""

    level: LinearLevel
    copies: LabelCopies | None
    info: dict
    added: LinearLevel | None = None  # the appended columns alone (one per copy) and their clusters


def extend_level(
    level: LinearLevel,
    copies: LabelCopies | None,
    cfg: RankerConfig,
    X: sp.csr_matrix,
    Y: sp.csr_matrix,
    leaves: sp.csr_matrix,
    routes: sp.csr_matrix | None,
    one_vs_all: tuple[LinearLevel, dict] | None = None,
) -> Extended:
    """``level`` (its copies ``copies``) with the labels of ``Y``'s last ``leaves.shape[0]`` columns
    appended in ``leaves`` and trained on ``X``. ``Y`` (``N x L_all``) holds the old labels first, so
    that their clusters' documents are the new labels' negatives as in training; ``routes``
    (``N x K``): the leaf clusters the model itself reaches for each document (``man`` negatives).
    ``one_vs_all``: the new labels' weights trained against every document (``train_one_vs_all``),
    set in each of their clusters instead."""
    n_new = leaves.shape[0]
    n_old = copies.n_labels if copies is not None else level.n_labels
    if Y.shape[1] != n_old + n_new:
        raise RankerError(f"adding labels: Y has {Y.shape[1]} columns, expected {n_old} old + {n_new} new")
    new_copies, C_new = append_copies(copies, leaves, n_old)
    if one_vs_all is not None:
        trained, info = one_vs_all
        trained = LinearLevel(trained.W.tocsc()[:, _copy_labels(leaves)], C_new, trained.bias)
        return Extended(append_columns(level, trained, cfg.n_threads), new_copies, info, trained)
    Y_new = sp.csr_matrix(Y[:, n_old:])
    old_C = copies.collapse(level.C) if copies is not None else level.C
    C_all = sp.vstack([old_C, binarize(leaves)], format="csr")
    mask = negative_mask(cfg.negatives, Y, C_all, None if cfg.negatives == "tfn" else _routes(routes, cfg))
    if new_copies is not None:
        Y_new = sp.csr_matrix(sp.csc_matrix(Y_new)[:, _copy_labels(leaves)])
    trained, info = train_level(
        X, LevelSpec(Y_new, C_new, mask), added_params(cfg), cfg.bias, cfg.threshold, cfg.batch_nnz, cfg.n_threads
    )
    return Extended(append_columns(level, trained, cfg.n_threads), new_copies, info, trained)


def train_one_vs_all(X: sp.csr_matrix, Y: sp.csr_matrix, cfg: RankerConfig) -> tuple[LinearLevel, dict]:
    """One weight vector per column of ``Y`` trained on every row of ``X`` (one cluster holds them all)."""
    one = sp.csr_matrix(np.ones((Y.shape[1], 1), np.float32))
    every = sp.csr_matrix(np.ones((X.shape[0], 1), np.float32))
    spec = LevelSpec(Y, one, every)
    return train_level(X, spec, added_params(cfg), cfg.bias, cfg.threshold, cfg.batch_nnz, cfg.n_threads)


AddedSolver = Callable[[sp.csr_matrix, sp.csr_matrix, RankerConfig], tuple[LinearLevel, dict]]
_ADDED_SOLVERS: list[AddedSolver] = []  # put in place by added_labels_solver, the innermost last


@contextlib.contextmanager
def added_labels_solver(solve: AddedSolver) -> Iterator[None]:
    """Within the block, the labels a tree model adds against every document are trained by
    ``solve(X, Y, config)`` (their level of weights and a report, as :func:`train_one_vs_all`
    returns them) instead of :func:`train_one_vs_all`: a study of other solvers, everything else of
    adding unchanged."""
    _ADDED_SOLVERS.append(solve)
    try:
        yield
    finally:
        _ADDED_SOLVERS.pop()


def train_added(X: sp.csr_matrix, Y: sp.csr_matrix, cfg: RankerConfig) -> tuple[LinearLevel, dict]:
    """The one-vs-all weights of labels added to a tree model: :func:`train_one_vs_all`, or the
    solver of an enclosing :func:`added_labels_solver`."""
    solve = _ADDED_SOLVERS[-1] if _ADDED_SOLVERS else train_one_vs_all
    return solve(X, Y, cfg)


def added_params(cfg: RankerConfig) -> SolverParams:
    """The solver's settings for added labels (a tree model's: at most ``added_max_iter`` passes)."""
    return solver_params(cfg, cfg.added_passes())


def append_columns(level: LinearLevel, new: LinearLevel, threads: int = 1) -> LinearLevel:
    """A level whose first columns are ``level``'s weights, unchanged, and the last ``new``'s
    (a level that keeps only its scoring layout: that layout extended in ``threads`` threads)."""
    if new.n_features != level.n_features or new.bias != level.bias or new.n_clusters != level.n_clusters:
        raise RankerError("adding labels: the new weights do not fit the level (features, bias or clusters)")
    in_layout = level.appended_in_layout(new, threads)
    if in_layout is not None:
        return in_layout
    old, added = level.W, new.W
    if sp.isspmatrix_csr(old):  # as a fitted or loaded level holds it: stacked feature by feature
        W = side_by_side(old, sp.csr_matrix(added))
    else:
        W = sp.hstack([old.tocsc(), added.tocsc()], format="csc")
    W.sort_indices()  # a no-op where both parts come sorted, as they do from training and loading
    return LinearLevel(W, sp.vstack([level.C, new.C], format="csr"), level.bias)


def side_by_side(A: sp.csr_matrix, B: sp.csr_matrix) -> sp.csr_matrix:
    """``[A B]`` (csr, the same rows): each row's entries of ``A``, then ``B``'s, written in place
    (scipy's stack makes the same matrix: 0.93-1.62 s against 0.19-0.38 s on a leaf level of 36M weights)."""
    la, lb = np.diff(A.indptr), np.diff(B.indptr)
    indptr = np.zeros(A.shape[0] + 1, np.int64)
    np.cumsum(la + lb, out=indptr[1:])
    n, cols = int(indptr[-1]), A.shape[1] + B.shape[1]
    indices = np.empty(n, np.int32 if cols < 2**31 else np.int64)
    data = np.empty(n, np.result_type(A.dtype, B.dtype))
    at_b = np.repeat(indptr[:-1] + la - B.indptr[:-1], lb) + np.arange(B.nnz)  # B's places, row by row
    at_a = np.ones(n, bool)
    at_a[at_b] = False
    indices[at_a], data[at_a] = A.indices, A.data
    indices[at_b], data[at_b] = B.indices + A.shape[1], B.data
    return sp.csr_matrix((data, indices, indptr), shape=(A.shape[0], cols))


def append_copies(
    copies: LabelCopies | None, leaves: sp.csr_matrix, n_old: int
) -> tuple[LabelCopies | None, sp.csr_matrix]:
    """The copies after adding labels in ``leaves`` (``n_new x K``) and the new labels' one-cluster
    rows (one per copy). A partition stays one unless a new label sits in several clusters."""
    leaves = binarize(leaves)
    leaves.sort_indices()
    per_label = np.diff(leaves.indptr)
    if np.any(per_label == 0):
        raise RankerError(f"adding labels: new label {int(np.flatnonzero(per_label == 0)[0])} has no leaf cluster")
    P = leaves.nnz
    rows = sp.csr_matrix(
        (np.ones(P, np.float32), leaves.indices.copy(), np.arange(P + 1, dtype=np.int64)), shape=(P, leaves.shape[1])
    )
    if copies is None and np.all(per_label == 1):
        return None, rows
    old_of = copies.label_of if copies is not None else np.arange(n_old, dtype=np.int64)
    merge = copies.merge if copies is not None else "max"
    label_of = np.concatenate([old_of, n_old + _copy_labels(leaves)])
    return LabelCopies(label_of, n_old + leaves.shape[0], merge), rows


def _copy_labels(leaves: sp.csr_matrix) -> np.ndarray:
    """The new label (0-based among the new) of each copy, copies in row order."""
    return np.repeat(np.arange(leaves.shape[0], dtype=np.int64), np.diff(leaves.indptr))


def _routes(routes: sp.csr_matrix | None, cfg: RankerConfig) -> sp.csr_matrix:
    if routes is None:
        raise RankerError(f"adding labels: negatives {cfg.negatives!r} need the model's routes (N x K)")
    return routes
