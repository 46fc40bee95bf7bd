"""Compiled inner loops of the linear path (numba, ``nogil``: callers run them in their own threads).

Only loops that numpy/scipy cannot express without materialising a large intermediate live here;
everything around them stays vectorised numpy. Kernels are compiled once per machine and cached
next to this file (``cache=True``), so a later process loads them in milliseconds.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# LLVM may reorder float sums (vectorised dot products) but must keep infinities: the dual solver
# starts its shrinking bounds at +-inf.
FAST = {"nnan", "nsz", "reassoc", "contract", "arcp", "afn"}


@njit(nogil=True, cache=True)
def pair_scores(x_ptr, x_idx, x_val, doc, node, feat_ptr, rows, entries, bias_feat, bias, n_clusters,
                out):  # pragma: no cover - compiled
    """``out[p, j]`` += raw score of label slot ``j`` of cluster ``node[p]`` for document ``doc[p]``.

    The weights are a feature-major sparse layout: feature ``f`` owns rows ``feat_ptr[f] ..
    feat_ptr[f + 1]``; row ``r`` is ``(cluster, first entry)`` (clusters ascending within a
    feature; its entries end where row ``r + 1``'s begin) and entry ``e`` is ``(weight, slot)``.
    Pairs are grouped by document; for each document a cluster -> pair map is set, then every
    feature of the document adds its rows of the beam's clusters. The work is the document's
    nonzeros times the rows they meet, read in ascending address order (features are sorted),
    with no copy of the document per pair.
    """
    pos = np.full(n_clusters, -1, np.int64)
    n_pairs = doc.shape[0]
    p0 = 0
    while p0 < n_pairs:
        d = doc[p0]
        p1 = p0
        while p1 < n_pairs and doc[p1] == d:
            if pos[node[p1]] < 0:
                pos[node[p1]] = p1
            p1 += 1
        width = p1 - p0
        for i in range(x_ptr[d], x_ptr[d + 1] + (1 if bias > 0 else 0)):
            if i < x_ptr[d + 1]:
                f, x = x_idx[i], x_val[i]
            else:
                f, x = bias_feat, bias
            r0, r1 = feat_ptr[f], feat_ptr[f + 1]
            if r1 - r0 <= 8 * width:  # few rows: test each row's cluster
                for r in range(r0, r1):
                    q = pos[rows[r, 0]]
                    if q >= 0:
                        for e in range(rows[r, 1], rows[r + 1, 1]):
                            out[q, int(entries[e, 1])] += x * entries[e, 0]
            else:  # many rows (a common feature of a wide level): find the beam's clusters by bisection
                for p in range(p0, p1):
                    k = node[p]
                    lo, hi = r0, r1
                    while lo < hi:
                        mid = (lo + hi) >> 1
                        if rows[mid, 0] < k:
                            lo = mid + 1
                        else:
                            hi = mid
                    if lo < r1 and rows[lo, 0] == k and pos[k] == p:
                        for e in range(rows[lo, 1], rows[lo + 1, 1]):
                            out[p, int(entries[e, 1])] += x * entries[e, 0]
        for p in range(p0, p1):  # a cluster listed twice for one document: same scores
            q = pos[node[p]]
            if q != p:
                out[p, :] = out[q, :]
        for p in range(p0, p1):
            pos[node[p]] = -1
        p0 = p1


@njit(nogil=True, cache=True, fastmath=FAST)
def dual_cd_squared_hinge(indptr, indices, data, row_start, row_len, col_start, col_len, Y, cost, eps, max_iter,
                          seed, W, passes):  # pragma: no cover - compiled
    """LIBLINEAR's dual coordinate descent for the L2-regularised squared hinge (PECOS's solver).

    For every task ``t`` and label slot ``j`` with a cost: rows ``row_start[t] ..`` of the block
    matrix, whose columns lie in ``col_start[t] .. + col_len[t]``; ``Y`` is +1/-1, ``cost`` the
    C of each row. Dual variables ``alpha_i >= 0``, ``D_ii = 1 / (2 C_i)``; one pass visits the
    active rows in a random order, takes the exact coordinate step and moves ``w``; rows stuck at
    ``alpha = 0`` with a gradient above the last pass's largest are shrunk away. A problem stops
    when ``max PG - min PG <= eps`` over a full pass, or after ``max_iter`` passes. The shuffle is
    an xorshift stream seeded by (``seed``, task, slot): the result does not depend on threads.
    Writes ``W[col, j]``; ``passes[t, j]`` counts the passes made.
    """
    n_tasks, n_slots = len(row_len), Y.shape[1]
    max_rows = 0
    max_cols = 0
    for t in range(n_tasks):
        max_rows = max(max_rows, row_len[t])
        max_cols = max(max_cols, col_len[t])
    w = np.zeros(max_cols, np.float32)  # float32, as PECOS: half the cache footprint, ~2x faster here
    alpha = np.zeros(max_rows, np.float64)
    qd = np.zeros(max_rows, np.float64)
    xx = np.zeros(max_rows, np.float64)
    index = np.zeros(max_rows, np.int64)
    for t in range(n_tasks):
        r0, nr, c0, nc = row_start[t], row_len[t], col_start[t], col_len[t]
        for i in range(nr):
            s = 0.0
            for e in range(indptr[r0 + i], indptr[r0 + i + 1]):
                s += data[e] * data[e]
            xx[i] = s
        for j in range(n_slots):
            if cost[r0, j] <= 0:  # padding slot (a task's slots share their validity)
                continue
            w[:nc] = 0.0
            for i in range(nr):
                alpha[i] = 0.0
                qd[i] = xx[i] + 0.5 / cost[r0 + i, j]
                index[i] = i
            state = np.uint64(seed * 1000003 + t * 7919 + j + 1) * np.uint64(0x9E3779B97F4A7C15) | np.uint64(1)
            pg_max_old = np.inf  # the squared hinge's dual has no upper bound: only alpha = 0 shrinks
            active = nr
            it = 0
            while it < max_iter:
                pg_max_new, pg_min_new = -np.inf, np.inf
                for s in range(active - 1):  # Fisher-Yates over the active rows
                    state ^= state << np.uint64(13)
                    state ^= state >> np.uint64(7)
                    state ^= state << np.uint64(17)
                    k = s + np.int64(state % np.uint64(active - s))
                    index[s], index[k] = index[k], index[s]
                s = 0
                while s < active:
                    i = index[s]
                    r = r0 + i
                    y = Y[r, j]
                    g = 0.0
                    for e in range(indptr[r], indptr[r + 1]):
                        g += w[indices[e] - c0] * data[e]
                    g = y * g - 1.0 + alpha[i] * (0.5 / cost[r, j])
                    pg = 0.0
                    if alpha[i] == 0.0:
                        if g > pg_max_old:
                            active -= 1
                            index[s], index[active] = index[active], index[s]
                            continue
                        if g < 0.0:
                            pg = g
                    else:
                        pg = g
                    pg_max_new = max(pg_max_new, pg)
                    pg_min_new = min(pg_min_new, pg)
                    if abs(pg) > 1e-12:
                        old = alpha[i]
                        alpha[i] = max(old - g / qd[i], 0.0)
                        d = (alpha[i] - old) * y
                        for e in range(indptr[r], indptr[r + 1]):
                            w[indices[e] - c0] += d * data[e]
                    s += 1
                it += 1
                if pg_max_new - pg_min_new <= eps:
                    if active == nr:
                        break
                    active = nr  # converged on the shrunk set: check every row once more
                    pg_max_old = np.inf
                    continue
                pg_max_old = pg_max_new if pg_max_new > 0 else np.inf
            passes[t, j] = it
            for c in range(nc):
                W[c0 + c, j] = w[c]


@njit(nogil=True, cache=True)
def merge_copies(doc, item, score, label_of, n_labels, k, mean, out_doc, out_label, out_score):  # pragma: no cover
    """One score per (document, label) from its copies' scores (``mean``: their average, else the
    max), the best ``k`` labels of each document kept in descending score (ties: smaller label
    first). Candidates come grouped by document. Writes the ``out_*`` arrays; returns their length.

    One pass per document with a label -> entry map (no sort of all candidates), then a sort of
    the document's few distinct labels.
    """
    slot = np.full(n_labels, -1, np.int64)
    n = len(doc)
    total = np.zeros(n, np.float64)
    count = np.zeros(n, np.int64)
    lab = np.empty(n, np.int64)
    kept = 0
    p0 = 0
    while p0 < n:
        d = doc[p0]
        p1 = p0
        m = 0  # distinct labels of this document
        while p1 < n and doc[p1] == d:
            label = label_of[item[p1]]
            e = slot[label]
            if e < 0:
                slot[label] = m
                lab[m] = label
                total[m] = score[p1]
                count[m] = 1
                m += 1
            elif mean:
                total[e] += score[p1]
                count[e] += 1
            elif score[p1] > total[e]:
                total[e] = score[p1]
            p1 += 1
        merged = np.empty(m, np.float64)
        for e in range(m):
            slot[lab[e]] = -1
            merged[e] = total[e] / count[e] if mean else total[e]
            merged[e] = np.float32(merged[e])  # the scale the scores are reported in
        order = np.arange(m)
        if m <= 64:  # insertion sort: a document's handful of labels, no sort call per document
            for a in range(1, m):
                e = order[a]
                b = a - 1
                while b >= 0 and (merged[order[b]] < merged[e] or
                                  (merged[order[b]] == merged[e] and lab[order[b]] > lab[e])):
                    order[b + 1] = order[b]
                    b -= 1
                order[b + 1] = e
        else:
            by_label = np.argsort(lab[:m], kind="mergesort")
            order = by_label[np.argsort(-merged[by_label], kind="mergesort")]
        for q in range(min(k, m)):
            e = order[q]
            out_doc[kept] = d
            out_label[kept] = lab[e]
            out_score[kept] = merged[e]
            kept += 1
        p0 = p1
    return kept
