"""Turn one level's training data into solver blocks (see ``solver.py``).

Labels are grouped into *tasks*: the labels of one cluster share one training set of instances
(its rows of the negative mask). Tasks are packed into blocks of bounded size; a block's matrix
is the block-diagonal stack of each task's rows restricted to the features that occur in them
(plus the bias column), so the solver's weight tensors hold no column that is always zero. A
block is described by its rows and columns (a view of ``X``), not copied. Everything here is
vectorised over tasks, rows and nonzeros, or a compiled loop (``kernels.block_columns``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from xtransformer.ranker.errors import RankerError
from xtransformer.ranker.kernels import block_columns
from xtransformer.ranker.negatives import binarize


def ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + n)`` for every pair, without a Python loop."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.cumsum(lengths) - lengths
    return np.repeat(np.asarray(starts, dtype=np.int64) - offsets, lengths) + np.arange(total, dtype=np.int64)


@dataclass
class TaskGroups:
    """Labels grouped by identical training rows; CSR-like lists per group."""

    label_ptr: np.ndarray  # G + 1
    labels: np.ndarray  # labels of group g: labels[label_ptr[g]:label_ptr[g + 1]] (slot order)
    row_ptr: np.ndarray  # G + 1
    rows: np.ndarray  # training rows of group g, sorted
    row_cost: np.ndarray | None = None  # each row's cost multiplier (float64, as ``rows``); None: all 1

    @property
    def n_groups(self) -> int:
        return len(self.label_ptr) - 1

    @property
    def n_labels(self) -> np.ndarray:
        return np.diff(self.label_ptr)

    @property
    def n_rows(self) -> np.ndarray:
        return np.diff(self.row_ptr)


def make_groups(C: sp.csr_matrix, M: sp.csr_matrix) -> TaskGroups:
    """Groups of labels (rows of ``C``, ``L x K``) that share a training set under mask ``M`` (``N x K``).

    In a hard tree a group is a cluster. A label in several clusters trains on the union of their
    rows; labels with the same set of clusters form one group. A mask whose values are not all 1
    weighs its rows: each value multiplies that row's cost in that cluster (a partition only: a
    union of clusters has no one weight).
    """
    C = binarize(C)
    weighted = bool(M.nnz) and not np.all(M.data == 1)
    if np.all(np.diff(C.indptr) == 1):
        A, Mg = C, (sp.csr_matrix(M, dtype=np.float64) if weighted else binarize(M))
    elif weighted:
        raise RankerError("ranker: a weighted mask needs each label in one cluster")
    else:
        # one group per distinct set of clusters: hash each row pattern with random weights
        weights = np.random.default_rng(0).random(C.shape[1]) + 0.5
        _, group = np.unique(np.round(C @ weights, 9), return_inverse=True)
        A = sp.csr_matrix(
            (np.ones(C.shape[0], np.float32), group.astype(np.int64), np.arange(C.shape[0] + 1)),
            shape=(C.shape[0], int(group.max()) + 1),
        )
        Mg = binarize(binarize(M) @ binarize(C.T @ A))
    A = A.tocsc()
    A.sort_indices()
    Mg = Mg.tocsc()
    Mg.sort_indices()
    return TaskGroups(
        A.indptr.astype(np.int64),
        A.indices.astype(np.int64),
        Mg.indptr.astype(np.int64),
        Mg.indices.astype(np.int64),
        Mg.data.astype(np.float64) if weighted else None,
    )


def plan_batches(groups: TaskGroups, row_nnz: np.ndarray, min_nnz: int) -> list[np.ndarray]:
    """Pack the trainable groups into lists of group ids, each list one solver block.

    Groups are ordered by label count (a block then pads few label slots) and packed until a block
    holds ``min_nnz`` nonzeros of X: a large group gets a block of its own, small ones share one
    (a block's fixed per-iteration overhead is then amortised over several clusters).
    """
    live = np.flatnonzero((groups.n_labels > 0) & (groups.n_rows > 0))
    if live.size == 0:
        return []
    group_nnz = _group_nnz(groups, row_nnz)
    order = live[np.argsort(groups.n_labels[live], kind="stable")]
    batches, start, acc = [], 0, 0
    for i, g in enumerate(order):  # loop over clusters (not labels) to cut the sequence
        if i > start and acc >= min_nnz:
            batches.append(order[start:i])
            start, acc = i, 0
        acc += int(group_nnz[g])
    batches.append(order[start:])
    return batches


def batch_costs(groups: TaskGroups, batches: list[np.ndarray], row_nnz: np.ndarray) -> np.ndarray:
    """Each batch's solver work, estimated as its groups' nonzeros of X times their labels (what
    orders the blocks largest first)."""
    work = _group_nnz(groups, row_nnz) * groups.n_labels
    return np.array([int(work[b].sum()) for b in batches], dtype=np.int64)


def _group_nnz(groups: TaskGroups, row_nnz: np.ndarray) -> np.ndarray:
    """Nonzeros of X (the bias counted) in each group's training rows."""
    nnz_cum = np.concatenate([[0], np.cumsum(row_nnz[groups.rows] + 1, dtype=np.int64)])
    return nnz_cum[groups.row_ptr[1:]] - nnz_cum[groups.row_ptr[:-1]]


@dataclass
class BlockData:
    """A block as a view of ``X``: its rows, its columns per task, targets, and label ids.

    The block matrix (block-diagonal over tasks) is never built for the dual coordinate descent,
    whose workers read a big task's rows in place and copy a small one's while they solve it;
    ``solver.Block.from_rows`` builds it only for the Newton solver.
    """

    rows: np.ndarray  # R, rows of X, task by task
    row_len: np.ndarray  # T
    col_len: np.ndarray  # T
    col_feature: np.ndarray  # Fb, global feature id (the bias column is id F)
    slot_label: np.ndarray  # T x n, global label id or -1 for padding
    Y: np.ndarray  # R x n int8: +1 / -1, 0 in a padding slot (one byte a cell: costs come from Cp / Cn)
    row_cost: np.ndarray | None = None  # R float64: each row's cost multiplier; None: all 1

    @property
    def col_task(self) -> np.ndarray:
        return np.repeat(np.arange(len(self.col_len)), self.col_len)


def build_block(X: sp.csr_matrix, Y: sp.csr_matrix, groups: TaskGroups, batch: np.ndarray, bias: float) -> BlockData:
    """The block of groups ``batch`` from features ``X`` (plus the bias column) and targets ``Y``."""

    T = len(batch)
    row_len = groups.n_rows[batch]
    at = ranges(groups.row_ptr[batch], row_len)
    rows = groups.rows[at]
    row_task = np.repeat(np.arange(T), row_len)
    col_len, col_feature = block_columns(X.indptr, X.indices, rows, row_len.astype(np.int64), X.shape[1], bias > 0)
    n_lab = groups.n_labels[batch]
    n = int(n_lab.max())
    slot_label = np.full((T, n), -1, dtype=np.int64)
    slot_label[np.repeat(np.arange(T), n_lab), ranges(np.zeros(T), n_lab)] = groups.labels[
        ranges(groups.label_ptr[batch], n_lab)
    ]
    cost = None if groups.row_cost is None else groups.row_cost[at]
    return BlockData(rows, row_len, col_len, col_feature, slot_label, _targets(Y[rows], row_task, slot_label), cost)


def _targets(Yr: sp.csr_matrix, row_task: np.ndarray, slot_label: np.ndarray) -> np.ndarray:
    """Dense targets (``R x n`` int8) of a block: +1 / -1, 0 in padding slots."""
    T, n = slot_label.shape
    R = Yr.shape[0]
    valid = slot_label >= 0
    label_task = np.full(Yr.shape[1], -1, dtype=np.int64)
    label_slot = np.zeros(Yr.shape[1], dtype=np.int64)
    tt, jj = np.nonzero(valid)
    label_task[slot_label[tt, jj]] = tt
    label_slot[slot_label[tt, jj]] = jj
    r = np.repeat(np.arange(R), np.diff(Yr.indptr))
    lab = Yr.indices
    hit = label_task[lab] == row_task[r]
    Yd = np.full((R, n), -1, dtype=np.int8)
    Yd[r[hit], label_slot[lab[hit]]] = 1
    Yd *= valid[row_task]
    return Yd
