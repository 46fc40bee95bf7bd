"""One tree level of balanced spherical k-means: every node of the level split at once (numba).

A level holds the labels of several tree nodes, stored node after node (``node_start``). Each
node is an independent problem: its rows split into ``n_children <= B`` children of exact sizes
``caps``, starting from one seed row per child. The kernel keeps, per node, the unnormalised child
sums on the node's own features only (a feature list built once per node), updates them from
the rows that moved, and scores each row with one sparse dot: ``<x, c_0 - c_1>`` for ``B = 2``
(PECOS's rule), one dot per child otherwise. Work per iteration is about one pass over the node's
nonzeros plus its feature list; memory is ``O(B x D)`` per worker, never per node or per nonzero.

Nodes run in worker threads (the kernels release the GIL); a level with fewer nodes than threads
(the top of the tree) splits each node's scoring pass over rows instead. Each node's result
depends on its rows and seeds only, so the tree is the same for any thread count.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import scipy.sparse as sp
from numba import njit, prange


@njit(nogil=True, cache=True)
def _node_features(indptr, indices, rows, mark):  # pragma: no cover - compiled
    """The distinct features of ``rows`` (``mark`` is all False on entry and on exit)."""
    n = 0
    for r in range(len(rows)):
        for p in range(indptr[rows[r]], indptr[rows[r] + 1]):
            if not mark[indices[p]]:
                mark[indices[p]] = True
                n += 1
    feats = np.empty(n, np.int64)
    k = 0
    for r in range(len(rows)):
        for p in range(indptr[rows[r]], indptr[rows[r] + 1]):
            if mark[indices[p]]:
                mark[indices[p]] = False
                feats[k] = indices[p]
                k += 1
    return feats


@njit(nogil=True, cache=True)
def _dots(indptr, indices, data, rows, center, out):  # pragma: no cover - compiled
    for r in range(len(rows)):
        s = 0.0
        for p in range(indptr[rows[r]], indptr[rows[r] + 1]):
            s += data[p] * center[indices[p]]
        out[r] = s


# The same loop over rows in numba's thread pool, for the few big nodes at the top of the tree; a
# separate function because nodes running in Python threads must not launch parallel regions.
@njit(nogil=True, parallel=True, cache=True)
def _dots_parallel(indptr, indices, data, rows, center, out):  # pragma: no cover - compiled
    for r in prange(len(rows)):
        s = 0.0
        for p in range(indptr[rows[r]], indptr[rows[r] + 1]):
            s += data[p] * center[indices[p]]
        out[r] = s


@njit(nogil=True, cache=True)
def node_seeds(key, node_start, n_seeds):  # pragma: no cover - compiled
    """Per node, the positions (within the node) of its ``n_seeds`` highest ``key`` values,
    highest first, ties by position: one pass per node instead of a sort of the whole level."""
    n_nodes = len(node_start) - 1
    seeds = np.zeros((n_nodes, n_seeds), np.int64)
    best = np.empty(n_seeds, np.float64)
    for n in range(n_nodes):
        a, b = node_start[n], node_start[n + 1]
        m = 0
        for r in range(a, b):  # insertion into the (short) sorted list of the best so far
            v = key[r]
            if m == n_seeds and v <= best[m - 1]:
                continue
            q = min(m, n_seeds - 1)
            while q > 0 and best[q - 1] < v:
                best[q] = best[q - 1]
                seeds[n, q] = seeds[n, q - 1]
                q -= 1
            best[q] = v
            seeds[n, q] = r - a
            m = min(m + 1, n_seeds)
    return seeds


@njit(nogil=True, cache=True)
def _rank(key):  # pragma: no cover - compiled
    """``np.argsort(-key, kind="mergesort")`` (descending, ties in row order), sorting only the
    nonzero keys: rows with key exactly 0 (all-zero feature rows, e.g. labels without positives,
    which are most rows of a large sparse problem) keep their order between the positive and the
    negative ones without entering the sort."""
    n = len(key)
    n_pos = 0
    n_neg = 0
    for r in range(n):
        if key[r] > 0:
            n_pos += 1
        elif key[r] < 0:
            n_neg += 1
    pos = np.empty(n_pos, np.int64)
    neg = np.empty(n_neg, np.int64)
    order = np.empty(n, np.int64)
    a, b, z = 0, 0, n_pos
    for r in range(n):
        if key[r] > 0:
            pos[a] = r
            a += 1
        elif key[r] < 0:
            neg[b] = r
            b += 1
        else:
            order[z] = r
            z += 1
    order[:n_pos] = pos[np.argsort(-key[pos], kind="mergesort")]
    order[n - n_neg:] = neg[np.argsort(-key[neg], kind="mergesort")]
    return order


@njit(nogil=True, cache=True)
def _split_node(indptr, indices, data, rows, caps, n_children, seeds, max_iter, assign, parallel, mark, sums,
                center):  # pragma: no cover - compiled
    """Balanced k-means of one node; writes each row's child into ``assign``; returns the
    number of assignments made. ``sums`` (``B x D``) and ``center`` (``B x D``) are zero on
    entry and on exit."""
    n, B = len(rows), n_children
    feats = _node_features(indptr, indices, rows, mark)
    cur = np.full(n, -1, np.int64)
    prev = np.full(n, -1, np.int64)
    new = np.empty(n, np.int64)
    key = np.empty(n, np.float64)
    scores = np.empty((B, n), np.float64)
    inv = np.empty(B, np.float32)
    for b in range(B):
        cur[seeds[b]] = b  # the first centroids: one seed row per child
    it = 0
    for it in range(max_iter):
        for r in range(n):  # child sums follow the rows that moved
            b, o = cur[r], prev[r]
            if b != o:
                for p in range(indptr[rows[r]], indptr[rows[r] + 1]):
                    if b >= 0:
                        sums[b, indices[p]] += data[p]
                    if o >= 0:
                        sums[o, indices[p]] -= data[p]
                prev[r] = b
        for b in range(B):
            sq = 0.0
            for f in feats:
                sq += np.float64(sums[b, f]) ** 2
            inv[b] = np.float32(1.0 / np.sqrt(sq)) if sq > 0 else np.float32(0.0)
        if B == 2:  # rank on <x, c_0 - c_1>; child 0 takes its quota from the top
            for f in feats:
                center[0, f] = sums[0, f] * inv[0] - sums[1, f] * inv[1]
            if parallel:
                _dots_parallel(indptr, indices, data, rows, center[0], key)
            else:
                _dots(indptr, indices, data, rows, center[0], key)
            order = _rank(key)
            for q in range(n):
                new[order[q]] = 0 if q < caps[0] else 1
        else:  # peel child b: the rows most in favour of b over every later child
            for b in range(B):
                for f in feats:
                    center[b, f] = sums[b, f] * inv[b]
                if parallel:
                    _dots_parallel(indptr, indices, data, rows, center[b], scores[b])
                else:
                    _dots(indptr, indices, data, rows, center[b], scores[b])
            new[:] = -1
            for b in range(B - 1):
                for r in range(n):
                    if new[r] >= 0:
                        key[r] = -np.inf
                    else:
                        rest = -np.inf
                        for c in range(b + 1, B):
                            rest = max(rest, scores[c, r])
                        key[r] = scores[b, r] - rest
                order = np.argsort(-key, kind="mergesort")
                for q in range(caps[b]):
                    new[order[q]] = b
            for r in range(n):
                if new[r] < 0:
                    new[r] = B - 1
        changed = False
        for r in range(n):
            changed = changed or new[r] != cur[r]
            cur[r] = new[r]
        if not changed:
            break
    assign[:] = cur
    for f in feats:
        for b in range(B):
            sums[b, f] = 0.0
            center[b, f] = 0.0
    return it + 1


@njit(nogil=True, cache=True)
def _split_nodes(indptr, indices, data, labels, node_start, caps, n_children, seeds, max_iter, n_features, first,
                 last, parallel, assign, iters):  # pragma: no cover - compiled
    """Nodes ``first .. last - 1`` one after the other, sharing one set of buffers."""
    B = caps.shape[1]
    mark = np.zeros(n_features, np.bool_)
    sums = np.zeros((B, n_features), np.float32)
    center = np.zeros((B, n_features), np.float32)
    for n in range(first, last):
        a, b = node_start[n], node_start[n + 1]
        iters[n] = _split_node(indptr, indices, data, labels[a:b], caps[n], n_children[n], seeds[n], max_iter,
                               assign[a:b], parallel, mark, sums, center)


def split_level(X: sp.csr_matrix, labels: np.ndarray, node_start: np.ndarray, caps: np.ndarray, seeds: np.ndarray,
                max_iter: int, threads: int) -> tuple[np.ndarray, np.ndarray]:
    """Split every node of a level. ``X``: csr ``L x D`` (unit rows); ``labels``: the level's rows
    in node order; node ``n`` owns ``labels[node_start[n]:node_start[n + 1]]``; ``caps[n, b]``:
    the exact size of its child ``b`` (0 beyond its children); ``seeds[n, b]``: the position
    (within the node) of child ``b``'s seed row. Returns each row's child and each node's
    number of assignments."""
    n_nodes = len(node_start) - 1
    n_children = (caps > 0).sum(axis=1).astype(np.int64)
    assign = np.empty(len(labels), np.int64)
    iters = np.zeros(n_nodes, np.int64)
    args = (X.indptr.astype(np.int64, copy=False), X.indices.astype(np.int32, copy=False),
            X.data.astype(np.float32, copy=False), labels.astype(np.int64, copy=False),
            node_start.astype(np.int64, copy=False), caps.astype(np.int64, copy=False), n_children,
            seeds.astype(np.int64, copy=False), int(max_iter), X.shape[1])
    if n_nodes < 2 * threads:  # few big nodes: split each node's scoring pass over rows instead
        _split_nodes(*args, 0, n_nodes, threads > 1, assign, iters)
        return assign, iters
    # contiguous groups of about equal nonzeros, a few per thread so that uneven nodes even out
    nnz = np.diff(X.indptr)[labels]
    cum = np.r_[0, np.cumsum(nnz)][node_start]
    bounds = np.unique(np.searchsorted(cum, np.linspace(0, cum[-1], 4 * threads + 1)[1:-1]).clip(1, n_nodes - 1))
    groups = list(zip(np.r_[0, bounds], np.r_[bounds, n_nodes]))
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda g: _split_nodes(*args, int(g[0]), int(g[1]), False, assign, iters), groups))
    return assign, iters
