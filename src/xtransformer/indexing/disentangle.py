"""Label disentanglement (Liu et al., NeurIPS 2021): a label in up to λ leaf clusters, learned.

A partition puts an ambiguous label ("apple": fruit, computers) in one cluster, so documents of
its other sense are searched elsewhere and the label is missed. The recipe (PECOS
``examples/overlap-xmc``, the paper's eq. 10):

1. train XR-Linear on the partition;
2. beam-search the training documents down to the leaf clusters: ``M`` (``N x K``, binarised);
3. count, for every (label, cluster), the label's positive documents the search sent there:
   ``counts = Yᵀ·M`` (``L x K``, sparse);
4. walk all counts in descending order: a label's first hit becomes its cluster (it may move),
   later hits add clusters until it has λ; a label no search reached keeps its cluster.

Only the leaf level changes; the tree above it stays. Without a cap on cluster growth the walk
gives every label its λ best clusters, so it is done per label with one sort (``reassign``),
ties going to the label's current cluster, then to the lower cluster id. The cap
(``max_cluster_growth``) refuses the extra copies beyond it, lowest counts first; a label's first
cluster is never refused, so no row of the result is empty. A leaf cluster that every label left
takes back the one of its own labels with the highest count there (the tree keeps no childless
node), which may cost that label its weakest extra cluster.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import scipy.sparse as sp

from xtransformer.indexing.chain import ClusterChain
from xtransformer.indexing.config import IndexingConfig
from xtransformer.indexing.errors import IndexingError
from xtransformer.indexing.quality import overlap_summary
from xtransformer.ranker import HierarchicalLinear, HierarchicalLinearConfig
from xtransformer.ranker.blocks import ranges
from xtransformer.ranker.negatives import binarize


def cluster_counts(Y: sp.spmatrix, M: sp.spmatrix) -> sp.csr_matrix:
    """``Yᵀ·M`` (``L x K``): how many of each label's positive documents the search sent to each cluster."""
    if Y.shape[0] != M.shape[0]:
        raise IndexingError(f"cluster_counts: `Y` has {Y.shape[0]} documents but `M` has {M.shape[0]}")
    out = (binarize(Y).T.tocsr() @ binarize(M)).tocsr()
    out.eliminate_zeros()
    return out


def reassign(
    C: sp.spmatrix,
    counts: sp.spmatrix,
    n_copies: int,
    min_count: int = 1,
    max_cluster_growth: float | None = None,
) -> sp.csr_matrix:
    """The overlapping leaf assignment (``L x K``, at most ``n_copies`` clusters a label) from ``counts``.

    ``C``: the current assignment (``L x K``); labels without a count >= ``min_count`` keep their row.
    """
    C = binarize(C)
    L, K = C.shape
    if counts.shape != (L, K):
        raise IndexingError(f"reassign: `counts` must be {L} x {K} (labels x leaf clusters), got {counts.shape}")
    if not isinstance(n_copies, (int, np.integer)) or not 1 <= n_copies <= K:
        raise IndexingError(f"reassign: n_copies must be an int in [1, {K}], got {n_copies!r}")
    cnt = sp.coo_matrix(counts)
    keep = cnt.data >= min_count
    row, col, val = cnt.row[keep].astype(np.int64), cnt.col[keep].astype(np.int64), cnt.data[keep]
    current = _has(C, row, col)
    # per label: highest count first, its current cluster first on ties, then the lower cluster id
    order = np.lexsort((col, ~current, -val, row))
    row, col, val = row[order], col[order], val[order]
    rank = _rank_in_group(row)
    sel = rank < n_copies
    # labels the search never reached (or only below min_count) keep their clusters
    reached = np.zeros(L, dtype=bool)
    reached[row] = True
    Ck = C[~reached].tocoo()
    if max_cluster_growth is not None:  # the labels that stay put take their room first
        sel &= _within_cap(row, col, val, rank, sel, C, max_cluster_growth, np.bincount(Ck.col, minlength=K))
    row, col, val, rank = row[sel], col[sel], val[sel], rank[sel]
    kept_rows = np.flatnonzero(~reached)[Ck.row]
    row = np.concatenate([row, kept_rows])
    col = np.concatenate([col, Ck.col.astype(np.int64)])
    val = np.concatenate([val, np.zeros(len(kept_rows), val.dtype)])
    rank = np.concatenate([rank, _rank_in_group(kept_rows)])
    row, col, rank = _refill_empty_clusters(row, col, rank, C, counts, n_copies)
    out = sp.csr_matrix((np.ones(len(row), np.float32), (row, col)), shape=(L, K))
    out.sum_duplicates()
    out.data[:] = 1.0
    return out


def _has(C: sp.csr_matrix, row: np.ndarray, col: np.ndarray) -> np.ndarray:
    """Whether ``C[row[i], col[i]]`` is set, for all ``i`` at once (sorted-key lookup)."""
    Cc = C.tocoo()
    keys = np.sort(Cc.row.astype(np.int64) * C.shape[1] + Cc.col)
    q = row * C.shape[1] + col
    pos = np.minimum(np.searchsorted(keys, q), max(len(keys) - 1, 0))
    return (keys[pos] == q) if len(keys) else np.zeros(len(q), dtype=bool)


def _rank_in_group(group: np.ndarray) -> np.ndarray:
    """Position of each entry within its run of equal ``group`` values (``group`` sorted)."""
    if len(group) == 0:
        return np.zeros(0, dtype=np.int64)
    start = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    return np.arange(len(group)) - np.repeat(start, np.diff(np.r_[start, len(group)]))


def _within_cap(row, col, val, rank, sel, C: sp.csr_matrix, growth: float, taken: np.ndarray) -> np.ndarray:
    """Which selected entries fit the cap: first clusters always, extra copies by count while room is left."""
    size = np.bincount(C.indices, minlength=C.shape[1])
    cap = np.maximum(1, np.floor(growth * size)).astype(np.int64) - taken
    idx = np.flatnonzero(sel)
    # per cluster: first clusters, then extra copies by descending count, then label id
    order = idx[np.lexsort((row[idx], -val[idx], rank[idx] > 0, col[idx]))]
    pos = _rank_in_group(col[order])
    ok = np.ones(len(row), dtype=bool)
    ok[order] = (rank[order] == 0) | (pos < cap[col[order]])
    return ok


def _refill_empty_clusters(row, col, rank, C: sp.csr_matrix, counts: sp.spmatrix, n_copies: int):
    """Give every leaf cluster left without labels back one of its own labels (see the module doc)."""
    K = C.shape[1]
    Cc = C.tocsc()
    had_labels = np.diff(Cc.indptr) > 0  # a cluster empty from the start has nothing to take back
    counts = sp.csr_matrix(counts)
    for _ in range(C.shape[0]):  # rounds, not labels: each round restores current pairs only, so it ends
        empty = np.flatnonzero((np.bincount(col, minlength=K) == 0) & had_labels)
        if len(empty) == 0:
            break
        n = np.diff(Cc.indptr)[empty]
        k = np.repeat(empty, n)
        labels = Cc.indices[ranges(Cc.indptr[empty], n)].astype(np.int64)
        c = np.asarray(counts[labels, k]).ravel() if len(labels) else np.zeros(0)
        pick = np.lexsort((labels, -c, k))
        first = pick[np.r_[True, k[pick][1:] != k[pick][:-1]]]
        lab, k = labels[first], k[first]
        lab, u = np.unique(lab, return_index=True)  # a label refills one cluster per round
        k = k[u]
        # a label already at n_copies gives up its weakest cluster (its last rank)
        n_now = np.bincount(row, minlength=C.shape[0])
        full = lab[n_now[lab] >= n_copies]
        if len(full):
            top = np.full(C.shape[0], -1, dtype=np.int64)
            np.maximum.at(top, row, rank)
            drop = np.isin(row, full) & (rank == top[row])
            row, col, rank = row[~drop], col[~drop], rank[~drop]
        n_now = np.bincount(row, minlength=C.shape[0])
        row = np.concatenate([row, lab])
        col = np.concatenate([col, k])
        rank = np.concatenate([rank, n_now[lab]])
    return row, col, rank


def learn_overlap(
    chain: ClusterChain,
    X: sp.csr_matrix,
    Y: sp.csr_matrix,
    icfg: IndexingConfig,
    model_cfg: HierarchicalLinearConfig,
    nr_splits: int | None = None,
) -> tuple[ClusterChain, dict[str, Any]]:
    """``chain`` with its leaf level disentangled to ``icfg.n_copies`` clusters a label.

    The counts come from an XR-Linear model (``model_cfg``) trained on ``chain`` (made
    ``nr_splits``-ary first when given) and its beam search (``model_cfg.beam_size``) over the
    training documents ``X`` / ``Y``.
    """
    t0 = time.perf_counter()
    tree = chain.subsample(nr_splits) if nr_splits else chain
    model = HierarchicalLinear.train(X, Y, list(tree), model_cfg)
    t1 = time.perf_counter()
    M = model.predict_clusters(X, model_cfg.beam_size)
    t2 = time.perf_counter()
    C0 = chain.leaf_assignment
    counts = cluster_counts(Y, M)
    C = reassign(C0, counts, icfg.n_copies, icfg.min_count, icfg.max_cluster_growth)
    first_moved = np.asarray((C0.multiply(C)).sum(axis=1)).ravel() == 0
    report = {
        "n_copies": icfg.n_copies,
        "merge": icfg.merge,
        "search_beam": model_cfg.beam_size,
        "labels_not_reached": int((np.diff(counts.indptr) == 0).sum()),
        "labels_leaving_their_cluster": int(first_moved.sum()),
        **overlap_summary(C),
        "seconds_train_partition": round(t1 - t0, 3),
        "seconds_search": round(t2 - t1, 3),
        "seconds_reassign": round(time.perf_counter() - t2, 3),
    }
    return ClusterChain([*chain[:-1], C]), report
