# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: language = c++
"""One tree level of balanced spherical k-means: every node of the level split at once (Cython).

A level holds the labels of several tree nodes, stored node after node (``node_start``). Each
node is an independent problem: its rows split into ``n_children <= B`` children of exact sizes
``caps``, starting from one seed row per child. The kernel keeps, per node, the unnormalised child
sums on the node's own features only (a feature list built once per node), updates them from
the rows that moved, and scores each row with one sparse dot: ``<x, c_0 - c_1>`` for ``B = 2``
(PECOS's rule), one dot per child otherwise. Work per iteration is about one pass over the node's
nonzeros plus its feature list; memory is ``O(B x D)`` per worker, never per node or per nonzero.

Nodes run in worker threads (the loops run without the GIL); a level with fewer nodes than
threads (the top of the tree) splits each node's scoring pass over rows instead. Each node's
result depends on its rows and seeds only, so the tree is the same for any thread count.
"""

from concurrent.futures import ThreadPoolExecutor

cimport cython
from libc.math cimport INFINITY, sqrt
from libc.stdint cimport int8_t, int32_t, int64_t
from libcpp.algorithm cimport nth_element, sort as std_sort
from libcpp.pair cimport pair
from libcpp.vector cimport vector

import numpy as np
import scipy.sparse as sp


cdef extern from "<pthread.h>" nogil:
    ctypedef unsigned long pthread_t
    int pthread_create(pthread_t *thread, const void *attr, void *(*start)(void *) noexcept nogil, void *arg)
    int pthread_join(pthread_t thread, void **retval)


cdef struct Dots:  # one thread's share of a node's dot products
    const int64_t *indptr
    const int32_t *indices
    const float *data
    const int64_t *rows
    const float *center
    double *out
    int64_t first, last


cdef void _dots(const int64_t *indptr, const int32_t *indices, const float *data, const int64_t *rows,
                const float *center, double *out, int64_t first, int64_t last) noexcept nogil:
    """``out[r] = <x_rows[r], center>`` for ``r`` in ``first .. last - 1``."""
    cdef int64_t r, p
    cdef double s
    for r in range(first, last):
        s = 0.0
        for p in range(indptr[rows[r]], indptr[rows[r] + 1]):
            s += data[p] * center[indices[p]]
        out[r] = s


cdef void *_dots_share(void *arg) noexcept nogil:
    cdef Dots *a = <Dots *>arg
    _dots(a.indptr, a.indices, a.data, a.rows, a.center, a.out, a.first, a.last)
    return NULL


cdef void _dots_threads(const int64_t *indptr, const int32_t *indices, const float *data, const int64_t *rows,
                        int64_t n, const float *center, double *out, int threads) noexcept nogil:
    """The dots of ``n`` rows, split into ``threads`` ranges of about equal rows: for the few big
    nodes at the top of the tree, where nodes alone would leave threads idle. A thread that cannot
    start leaves its range to this one."""
    cdef Dots shares[64]
    cdef pthread_t ids[64]
    cdef int started[64]
    cdef int t, T = max(1, min(threads, 64))
    for t in range(T):
        shares[t].indptr, shares[t].indices, shares[t].data = indptr, indices, data
        shares[t].rows, shares[t].center, shares[t].out = rows, center, out
        shares[t].first, shares[t].last = n * t // T, n * (t + 1) // T
    for t in range(1, T):
        started[t] = pthread_create(&ids[t], NULL, _dots_share, &shares[t]) == 0
    _dots_share(&shares[0])
    for t in range(1, T):
        if started[t]:
            pthread_join(ids[t], NULL)
        else:
            _dots_share(&shares[t])


def node_seeds(const double[::1] key, const int64_t[::1] node_start, int64_t n_seeds):
    """Per node, the positions (within the node) of its ``n_seeds`` highest ``key`` values,
    highest first, ties by position: one pass per node instead of a sort of the whole level."""
    cdef int64_t n_nodes = node_start.shape[0] - 1, n, a, b, m, r, q
    seeds_arr = np.zeros((n_nodes, n_seeds), np.int64)
    cdef int64_t[:, ::1] seeds = seeds_arr
    cdef double[::1] best = np.empty(max(n_seeds, 1), np.float64)
    cdef double v
    with nogil:
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
    return seeds_arr


cdef void _take_top(const double *key, int64_t n, int64_t cap, int64_t label, int64_t *child,
                    vector[pair[double, int64_t]] &buf) noexcept nogil:
    """``child[r] = label`` for the ``cap`` first rows of ``np.argsort(-key, kind="mergesort")``
    (descending, ties in row order), by selection, not a sort. Rows with key exactly 0 (all-zero
    feature rows, e.g. labels without positives, which are most rows of a large sparse problem)
    sit between the positive and the negative ones in row order without entering the selection.
    (``(-key, row)`` pairs are distinct, so the ``cap`` smallest are the stable order's first.)"""
    cdef int64_t r, n_pos = 0
    for r in range(n):
        if key[r] > 0:
            n_pos += 1
    buf.clear()
    if cap <= n_pos:
        for r in range(n):
            if key[r] > 0:
                buf.push_back(pair[double, int64_t](-key[r], r))
    else:  # every positive row, then zero rows in row order, then the best negatives
        cap -= n_pos
        for r in range(n):
            if key[r] > 0:
                child[r] = label
            elif cap > 0 and not key[r] < 0:
                child[r] = label
                cap -= 1
        if cap > 0:
            for r in range(n):
                if key[r] < 0:
                    buf.push_back(pair[double, int64_t](-key[r], r))
    if cap <= 0:
        return
    if cap < <int64_t>buf.size():
        nth_element(buf.begin(), buf.begin() + cap, buf.end())
    for r in range(min(cap, <int64_t>buf.size())):
        child[buf[r].second] = label


def _split_rows(const double[::1] key, int64_t cap):
    """Each row's child when child 0 takes the ``cap`` best rows, as B = 2 splits (for the tests)."""
    child = np.ones(key.shape[0], np.int64)
    cdef int64_t[::1] c = child
    cdef vector[pair[double, int64_t]] buf
    if key.shape[0]:
        with nogil:
            _take_top(&key[0], key.shape[0], cap, 0, &c[0], buf)
    return child


cdef int64_t _split_node(const int64_t *indptr, const int32_t *indices, const float *data, const int64_t *rows,
                         int64_t n, const int64_t *caps, int64_t B, const int64_t *seeds, int64_t max_iter,
                         int64_t *assign, int threads, int8_t *mark, float *sums, float *center,
                         int64_t D) noexcept nogil:
    """Balanced k-means of one node; writes each row's child into ``assign``; returns the
    number of assignments made. ``sums`` (``B x D``) and ``center`` (``B x D``) are zero on
    entry and on exit; so is ``mark`` (``D``)."""
    cdef vector[int64_t] feats
    cdef vector[int64_t] cur, prev, new
    cdef vector[double] key, scores
    cdef vector[float] inv
    cdef vector[pair[double, int64_t]] buf
    cdef int64_t r, p, b, o, f, q, c, it = 0, n_it = 0
    cdef double sq, rest
    cdef bint changed
    for r in range(n):  # the node's distinct features
        for p in range(indptr[rows[r]], indptr[rows[r] + 1]):
            if not mark[indices[p]]:
                mark[indices[p]] = 1
                feats.push_back(indices[p])
    for f in feats:
        mark[f] = 0
    cur.assign(n, -1)
    prev.assign(n, -1)
    new.assign(n, 0)
    key.assign(n, 0.0)
    scores.assign(B * n, 0.0)
    inv.assign(B, 0.0)
    for b in range(B):
        cur[seeds[b]] = b  # the first centroids: one seed row per child
    for it in range(max_iter):
        n_it = it + 1
        for r in range(n):  # child sums follow the rows that moved
            b, o = cur[r], prev[r]
            if b != o:
                for p in range(indptr[rows[r]], indptr[rows[r] + 1]):
                    if b >= 0:
                        sums[b * D + indices[p]] += data[p]
                    if o >= 0:
                        sums[o * D + indices[p]] -= data[p]
                prev[r] = b
        for b in range(B):
            sq = 0.0
            for f in feats:
                sq += (<double>sums[b * D + f]) ** 2
            inv[b] = <float>(1.0 / sqrt(sq)) if sq > 0 else <float>0.0
        if B == 2:  # rank on <x, c_0 - c_1>; child 0 takes its quota from the top
            for f in feats:
                center[f] = sums[f] * inv[0] - sums[D + f] * inv[1]
            _dots_threads(indptr, indices, data, rows, n, center, key.data(), threads)
            for r in range(n):
                new[r] = 1
            _take_top(key.data(), n, caps[0], 0, new.data(), buf)
        else:  # peel child b: the rows most in favour of b over every later child
            for b in range(B):
                for f in feats:
                    center[b * D + f] = sums[b * D + f] * inv[b]
                _dots_threads(indptr, indices, data, rows, n, center + b * D, scores.data() + b * n, threads)
            for r in range(n):
                new[r] = -1
            for b in range(B - 1):
                for r in range(n):
                    if new[r] >= 0:
                        key[r] = -INFINITY
                    else:
                        rest = -INFINITY
                        for c in range(b + 1, B):
                            rest = max(rest, scores[c * n + r])
                        key[r] = scores[b * n + r] - rest
                _take_top(key.data(), n, caps[b], b, new.data(), buf)
            for r in range(n):
                if new[r] < 0:
                    new[r] = B - 1
        changed = False
        for r in range(n):
            changed = changed or new[r] != cur[r]
            cur[r] = new[r]
        if not changed:
            break
    for r in range(n):
        assign[r] = cur[r]
    for f in feats:
        for b in range(B):
            sums[b * D + f] = 0.0
            center[b * D + f] = 0.0
    return n_it


def _split_nodes(const int64_t[::1] indptr, const int32_t[::1] indices, const float[::1] data,
                 const int64_t[::1] labels, const int64_t[::1] node_start, const int64_t[:, ::1] caps,
                 const int64_t[::1] n_children, const int64_t[:, ::1] seeds, int64_t max_iter, int64_t n_features,
                 int64_t first, int64_t last, int threads, int64_t[::1] assign, int64_t[::1] iters):
    """Nodes ``first .. last - 1`` one after the other, sharing one set of buffers; each node's
    dots split over ``threads`` threads (1: this thread only)."""
    cdef int64_t B = caps.shape[1], n, a, b
    cdef int8_t[::1] mark = np.zeros(n_features, np.int8)
    cdef float[:, ::1] sums = np.zeros((B, n_features), np.float32)
    cdef float[:, ::1] center = np.zeros((B, n_features), np.float32)
    with nogil:
        for n in range(first, last):
            a, b = node_start[n], node_start[n + 1]
            if b == a:
                iters[n] = 0
                continue
            iters[n] = _split_node(&indptr[0], &indices[0] if indices.shape[0] else NULL,
                                   &data[0] if data.shape[0] else NULL, &labels[a], b - a, &caps[n, 0],
                                   n_children[n], &seeds[n, 0], max_iter, &assign[a], threads, &mark[0], &sums[0, 0],
                                   &center[0, 0], n_features)


def children_order(const int64_t[::1] node_start, const int64_t[::1] assign, int64_t branching):
    """The level's rows regrouped node by node, child by child, each group in row order: what
    ``np.argsort(node * branching + assign, kind="stable")`` gives, in one pass per child."""
    cdef int64_t n_nodes = node_start.shape[0] - 1, n, b, r, o = 0
    order = np.empty(assign.shape[0], np.int64)
    cdef int64_t[::1] out = order
    with nogil:
        for n in range(n_nodes):
            for b in range(branching):
                for r in range(node_start[n], node_start[n + 1]):
                    if assign[r] == b:
                        out[o] = r
                        o += 1
    return order


@cython.wraparound(True)  # plain Python below: numpy's negative indices
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
            node_start.astype(np.int64, copy=False), np.ascontiguousarray(caps, dtype=np.int64), n_children,
            np.ascontiguousarray(seeds, dtype=np.int64), int(max_iter), X.shape[1])
    if n_nodes < 2 * threads:  # fewer nodes than threads: split each node's scoring pass over rows instead
        _split_nodes(*args, 0, n_nodes, max(int(threads), 1), assign, iters)
        return assign, iters
    # contiguous groups of about equal nonzeros, a few per thread so that uneven nodes even out
    nnz = np.diff(X.indptr)[labels]
    cum = np.r_[0, np.cumsum(nnz)][node_start]
    bounds = np.unique(np.searchsorted(cum, np.linspace(0, cum[-1], 4 * threads + 1)[1:-1]).clip(1, n_nodes - 1))
    groups = list(zip(np.r_[0, bounds], np.r_[bounds, n_nodes]))
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda g: _split_nodes(*args, int(g[0]), int(g[1]), 1, assign, iters), groups))
    return assign, iters
