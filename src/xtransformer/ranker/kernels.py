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
def dual_cd_squared_hinge(indptr, indices, data, n_features, rows, row_len, col_feature, col_len, bias, Y, Cp, Cn,
                          eps, max_iter, seed, threshold, passes):  # pragma: no cover - compiled
    """LIBLINEAR's dual coordinate descent for the L2-regularised squared hinge (PECOS's solver).

    Task ``t`` trains on rows ``rows[sum(row_len[:t]) ..]`` of the source matrix (``indptr``,
    ``indices``, ``data``; ``n_features`` columns) plus a constant ``bias`` feature (id
    ``n_features`` in ``col_feature`` when ``bias > 0``), on its columns
    ``col_feature[sum(col_len[:t]) ..]``. While a task runs, its rows are copied into a compact
    csr on its own columns (``gather_task``): one task's rows per thread, never a whole level's.
    A task on at least half of all features (the root, the top levels) reads its rows in place
    instead, on global feature ids: no copy of (most of) the training matrix per worker.
    Each of the ``n`` label slots is one problem (``Y`` +1/-1 per block row, int8, costing ``Cp`` /
    ``Cn``; a slot of zeros is padding). Dual variables ``alpha_i >= 0``, ``D_ii = 1 / (2 C_i)``; a pass
    visits the active rows in a random order and takes the exact coordinate step; rows stuck at
    ``alpha = 0`` with a gradient above the last pass's largest are shrunk away. A problem stops
    when ``max PG - min PG <= eps`` over a full pass, or after ``max_iter`` passes.

    The slots of a task run in lockstep: a visit reads the row once and updates every slot (``w``
    is feature-major, a feature's slots side by side): with up to 64 slots, 3x faster than
    solving one problem at a time on EURLEX57K. Each slot keeps its own shrinking and stopping;
    a row leaves the pass order once every running slot has shrunk it. The shuffle is an xorshift stream seeded by
    (``seed``, task): the result does not depend on threads.
    Returns the weights with ``|w| >= threshold`` of the non-padding slots as triplets ``(col, slot,
    value)``, task by task, slot by slot, columns increasing: a block's dense ``Fb x n`` weights
    (50 MiB a chunk on a 64k-label level) are never held. ``passes[t, j]`` counts the passes made.
    """
    n_tasks, S = len(row_len), Y.shape[1]
    max_rows = 0
    max_cols = 0
    for t in range(n_tasks):
        max_rows = max(max_rows, row_len[t])
        max_cols = max(max_cols, col_len[t])
    has_bias = bias > 0
    for t in range(n_tasks):
        if 2 * col_len[t] >= n_features + 1:  # read in place: columns are global feature ids
            max_cols = max(max_cols, n_features + 1)
    local = np.zeros(n_features + 1, np.int64)  # source feature -> column of the current task
    w = np.zeros((max_cols, S), np.float32)  # float32, as PECOS: half the cache footprint
    alpha = np.zeros((max_rows, S), np.float64)
    row_start = np.zeros(max_rows, np.int64)  # the current task's rows in (ti, tv)
    row_end = np.zeros(max_rows, np.int64)
    sq_norm = np.zeros(max_rows, np.float64)  # ||x_i||^2; D_ii = 0.5 / C_i is taken from Cp / Cn as needed
    shrunk = np.zeros((max_rows, S), np.bool_)
    index = np.zeros(max_rows, np.int64)
    g = np.zeros(S, np.float32)
    d = np.zeros(S, np.float32)
    done = np.zeros(S, np.bool_)
    n_shrunk = np.zeros(S, np.int64)
    pg_max_old = np.zeros(S, np.float64)
    pg_max_new = np.zeros(S, np.float64)
    pg_min_new = np.zeros(S, np.float64)
    cap = 1024
    kept_col = np.empty(cap, np.int32)  # a block's columns and slots fit int32
    kept_slot = np.empty(cap, np.int32)
    kept_val = np.empty(cap, np.float32)
    n_kept = 0
    r0, c0 = 0, 0
    for t in range(n_tasks):
        nr, nc = row_len[t], col_len[t]
        in_place = 2 * nc >= n_features + 1
        if in_place:
            ti, tv = indices, data
            for i in range(nr):
                row_start[i] = indptr[rows[r0 + i]]
                row_end[i] = indptr[rows[r0 + i] + 1]
            n_w, bias_col = n_features + 1, n_features
        else:  # the bias is not stored: it is added below, as for a row read in place
            tp, ti, tv = gather_task(indptr, indices, data, n_features, rows[r0:r0 + nr], col_feature[c0:c0 + nc],
                                     local, 0.0)
            for i in range(nr):
                row_start[i] = tp[i]
                row_end[i] = tp[i + 1]
            n_w, bias_col = nc, nc - 1
        w[:n_w, :] = 0.0
        n_done = 0
        for j in range(S):
            done[j] = Y[r0, j] == 0  # padding slot (a task's slots share their validity)
            n_done += done[j]
            n_shrunk[j] = 0
            pg_max_old[j] = np.inf  # the squared hinge's dual has no upper bound: only alpha = 0 shrinks
        for i in range(nr):
            xx = bias * bias if has_bias else 0.0
            for e in range(row_start[i], row_end[i]):
                xx += tv[e] * tv[e]
            sq_norm[i] = xx
            index[i] = i
            for j in range(S):
                alpha[i, j] = 0.0
                shrunk[i, j] = False
        state = np.uint64(seed * 1000003 + t * 7919 + 1) * np.uint64(0x9E3779B97F4A7C15) | np.uint64(1)
        active = nr
        it = 0
        while it < max_iter and n_done < S:
            for j in range(S):
                pg_max_new[j] = -np.inf
                pg_min_new[j] = np.inf
            for s in range(active - 1):  # Fisher-Yates over the active rows
                state ^= state << np.uint64(13)
                state ^= state >> np.uint64(7)
                state ^= state << np.uint64(17)
                k = s + np.int64(state % np.uint64(active - s))
                index[s], index[k] = index[k], index[s]
            s = 0
            while s < active:
                i = index[s]
                g[:] = 0.0
                for e in range(row_start[i], row_end[i]):
                    x = tv[e]
                    f = ti[e]
                    for j in range(S):
                        g[j] += w[f, j] * x
                if has_bias:
                    for j in range(S):
                        g[j] += w[bias_col, j] * bias
                moved = False
                live = False
                for j in range(S):
                    d[j] = 0.0
                    if done[j] or shrunk[i, j]:
                        continue
                    y = np.float32(Y[r0 + i, j])
                    diag = 0.5 / (Cp if y > 0 else Cn)
                    G = y * g[j] - 1.0 + alpha[i, j] * diag
                    pg = 0.0
                    if alpha[i, j] == 0.0:
                        if G > pg_max_old[j]:
                            shrunk[i, j] = True
                            n_shrunk[j] += 1
                            continue
                        if G < 0.0:
                            pg = G
                    else:
                        pg = G
                    live = True
                    pg_max_new[j] = max(pg_max_new[j], pg)
                    pg_min_new[j] = min(pg_min_new[j], pg)
                    if abs(pg) > 1e-12:
                        old = alpha[i, j]
                        alpha[i, j] = max(old - G / (sq_norm[i] + diag), 0.0)
                        d[j] = (alpha[i, j] - old) * y
                        moved = True
                if moved:
                    for e in range(row_start[i], row_end[i]):
                        x = tv[e]
                        f = ti[e]
                        for j in range(S):
                            w[f, j] += d[j] * x
                    if has_bias:
                        for j in range(S):
                            w[bias_col, j] += d[j] * bias
                if not live:  # shrunk for every running slot: out of this pass order
                    active -= 1
                    index[s], index[active] = index[active], index[s]
                    continue
                s += 1
            it += 1
            restore = False
            for j in range(S):
                if done[j]:
                    continue
                if pg_max_new[j] - pg_min_new[j] <= eps:
                    if n_shrunk[j] == 0:
                        done[j] = True
                        n_done += 1
                        passes[t, j] = it
                    else:  # converged on the shrunk set: check every row once more
                        for i in range(nr):
                            shrunk[i, j] = False
                        n_shrunk[j] = 0
                        pg_max_old[j] = np.inf
                        restore = True
                else:
                    pg_max_old[j] = pg_max_new[j] if pg_max_new[j] > 0 else np.inf
            if restore:
                active = nr
        for j in range(S):
            if not done[j] and Y[r0, j] != 0:
                passes[t, j] = it
        for j in range(S):
            if Y[r0, j] == 0:  # padding slot
                continue
            if n_kept + nc > cap:  # grow the triplet buffers (by half)
                cap = max(cap + cap // 2, n_kept + nc)
                kept_col = _grown(kept_col, n_kept, cap)
                kept_slot = _grown(kept_slot, n_kept, cap)
                kept_val = _grown(kept_val, n_kept, cap)
            for c in range(nc):
                v = w[col_feature[c0 + c] if in_place else c, j]
                if abs(v) >= threshold:
                    kept_col[n_kept] = c0 + c
                    kept_slot[n_kept] = j
                    kept_val[n_kept] = v
                    n_kept += 1
        r0 += nr
        c0 += nc
    return kept_col[:n_kept], kept_slot[:n_kept], kept_val[:n_kept]  # views: the caller converts them at once


@njit(nogil=True, cache=True)
def _grown(a, n, cap):  # pragma: no cover - compiled
    out = np.empty(cap, a.dtype)
    out[:n] = a[:n]
    return out


@njit(nogil=True, cache=True)
def block_columns(indptr, indices, rows, row_len, n_features, has_bias):  # pragma: no cover - compiled
    """The columns of each task of a block: the features occurring in its rows, in increasing id
    (plus the bias, id ``n_features``, last). Returns ``(col_len, col_feature)``."""
    T = len(row_len)
    seen = np.zeros(n_features + 1, np.bool_)
    touched = np.empty(n_features + 1, np.int64)
    col_len = np.zeros(T, np.int64)
    parts = []
    r0 = 0
    for t in range(T):
        n_cols = 0
        for r in rows[r0:r0 + row_len[t]]:
            for e in range(indptr[r], indptr[r + 1]):
                f = indices[e]
                if not seen[f]:
                    seen[f] = True
                    touched[n_cols] = f
                    n_cols += 1
        if has_bias:
            touched[n_cols] = n_features
            n_cols += 1
        cols = np.sort(touched[:n_cols])
        seen[cols] = False
        parts.append(cols)
        col_len[t] = n_cols
        r0 += row_len[t]
    col_feature = np.empty(col_len.sum(), np.int64)
    c0 = 0
    for t in range(T):
        col_feature[c0:c0 + col_len[t]] = parts[t]
        c0 += col_len[t]
    return col_len, col_feature


@njit(nogil=True, cache=True)
def gather_task(indptr, indices, data, n_features, rows, cols, local, bias):  # pragma: no cover - compiled
    """Rows ``rows`` of the source on columns ``cols`` (increasing ids, as ``block_columns``
    gives them, numbered 0..; the bias is column id ``n_features``, added with value ``bias`` when
    ``bias > 0``): a compact csr, its rows' column ids sorted as the source's are.
    ``local`` is scratch of ``n_features + 1`` entries. Returns ``(indptr, indices, data)``.
    """
    R, nc = len(rows), len(cols)
    has_bias = bias > 0
    for q in range(nc):
        local[cols[q]] = q
    out_ptr = np.empty(R + 1, np.int64)
    out_ptr[0] = 0
    for i in range(R):
        out_ptr[i + 1] = out_ptr[i] + indptr[rows[i] + 1] - indptr[rows[i]] + (1 if has_bias else 0)
    out_idx = np.empty(out_ptr[R], indices.dtype)  # as the source: the solver reads either in one loop
    out_val = np.empty(out_ptr[R], np.float32)
    for i in range(R):
        r = rows[i]
        o = out_ptr[i]
        for e in range(indptr[r], indptr[r + 1]):
            out_idx[o] = local[indices[e]]
            out_val[o] = data[e]
            o += 1
        if has_bias:
            out_idx[o] = local[n_features]
            out_val[o] = bias
    return out_ptr, out_idx, out_val


@njit(nogil=True, cache=True)
def gather_block(indptr, indices, data, n_features, rows, row_len, col_feature, col_len, bias):  # pragma: no cover
    """The block matrix itself (csr, rows with sorted column ids), for solvers that need one:
    task by task, ``gather_task`` with the columns shifted by the earlier tasks' columns."""
    R, T = len(rows), len(row_len)
    out_ptr = np.zeros(R + 1, np.int64)
    total = 0
    for i in range(R):
        total += indptr[rows[i] + 1] - indptr[rows[i]] + (1 if bias > 0 else 0)
    out_idx = np.empty(total, np.int32)
    out_val = np.empty(total, np.float32)
    local = np.zeros(n_features + 1, np.int64)
    r0, c0, e0 = 0, 0, 0
    for t in range(T):
        ptr, idx, val = gather_task(indptr, indices, data, n_features, rows[r0:r0 + row_len[t]],
                                    col_feature[c0:c0 + col_len[t]], local, bias)
        m = ptr[-1]
        out_idx[e0:e0 + m] = idx + c0
        out_val[e0:e0 + m] = val
        out_ptr[r0 + 1:r0 + row_len[t] + 1] = ptr[1:] + e0
        r0, c0, e0 = r0 + row_len[t], c0 + col_len[t], e0 + m
    return out_ptr, out_idx, out_val


@njit(nogil=True, cache=True)
def layout_counts(indptr, indices, lab_ptr, lab_k, n_clusters):  # pragma: no cover - compiled
    """Per feature (row of ``W``, csr), its number of distinct clusters (rows of the scoring layout),
    and the number of (weight, slot) entries in all. Label ``l`` sits in clusters
    ``lab_k[lab_ptr[l]:lab_ptr[l + 1]]``."""
    F = len(indptr) - 1
    last = np.full(n_clusters, -1, np.int64)
    count = np.zeros(F, np.int64)
    n_entries = 0
    for f in range(F):
        for e in range(indptr[f], indptr[f + 1]):
            l = indices[e]
            for p in range(lab_ptr[l], lab_ptr[l + 1]):
                k = lab_k[p]
                n_entries += 1
                if last[k] != f:
                    last[k] = f
                    count[f] += 1
    return count, n_entries


@njit(nogil=True, cache=True)
def layout_fill(indptr, indices, data, lab_ptr, lab_k, lab_j, n_clusters, feat_ptr, rows, entries):  # pragma: no cover
    """Write the scoring layout of ``PairScorer`` straight from ``W`` (csr): feature ``f``'s rows
    ``feat_ptr[f] ..`` are its clusters in increasing id, ``rows[r] = (cluster, first entry)``, and
    a row's ``(weight, slot)`` entries end where the next row's begin (``rows[-1]`` is the end).
    One pass per feature with cluster-sized scratch: no copy of ``W`` in another order."""
    F = len(indptr) - 1
    last = np.full(n_clusters, -1, np.int64)
    cursor = np.zeros(n_clusters, np.int64)
    ks = np.empty(n_clusters, np.int64)
    e_out = 0
    for f in range(F):
        m = 0
        for e in range(indptr[f], indptr[f + 1]):  # the feature's clusters and their entry counts
            l = indices[e]
            for p in range(lab_ptr[l], lab_ptr[l + 1]):
                k = lab_k[p]
                if last[k] != f:
                    last[k] = f
                    cursor[k] = 0
                    ks[m] = k
                    m += 1
                cursor[k] += 1
        order = np.sort(ks[:m])
        r = feat_ptr[f]
        for q in range(m):  # rows in increasing cluster id; each row's entries start after the last's
            k = order[q]
            n_k = cursor[k]
            rows[r + q, 0] = k
            rows[r + q, 1] = e_out
            cursor[k] = e_out
            e_out += n_k
        for e in range(indptr[f], indptr[f + 1]):
            l = indices[e]
            for p in range(lab_ptr[l], lab_ptr[l + 1]):
                k = lab_k[p]
                entries[cursor[k], 0] = data[e]
                entries[cursor[k], 1] = lab_j[p]
                cursor[k] += 1
    rows[len(rows) - 1, 0] = -1
    rows[len(rows) - 1, 1] = e_out


@njit(nogil=True, cache=True)
def _keep_best(s, item, m, k, best_s, best_i):  # pragma: no cover - compiled
    """Offer ``(s, item)`` to the best-first lists ``best_s`` / ``best_i`` holding ``m`` of at most
    ``k`` entries (higher score first; ties: smaller item first). Returns the new ``m``."""
    if m == k:
        if s < best_s[k - 1] or (s == best_s[k - 1] and item > best_i[k - 1]) or s != s:
            return m
        b = k - 1
    else:
        b = m
        m += 1
    while b > 0 and (best_s[b - 1] < s or (best_s[b - 1] == s and best_i[b - 1] > item)):
        best_s[b] = best_s[b - 1]
        best_i[b] = best_i[b - 1]
        b -= 1
    best_s[b] = s
    best_i[b] = item
    return m


@njit(nogil=True, cache=True)
def _emit_best(d, m, best_s, best_i, out_doc, out_item, out_score, kept):  # pragma: no cover - compiled
    """Append document ``d``'s ``m`` best entries to the ``out_*`` arrays at ``kept``; the new length."""
    for q in range(m):
        out_doc[kept] = d
        out_item[kept] = best_i[q]
        out_score[kept] = best_s[q]
        kept += 1
    return kept


@njit(nogil=True, cache=True)
def select_topk(doc, score, item, k, out_doc, out_item, out_score):  # pragma: no cover - compiled
    """The ``k`` best cells of each document's rows, best first (ties: smaller item first).

    Row ``p`` of ``score`` / ``item`` (``P x S``) belongs to document ``doc[p]`` (rows grouped by
    document); cells with ``item < 0`` are padding. One pass over the cells with a running best-k
    list: no sort of all candidates, no padded per-document table. Writes the ``out_*`` arrays
    (room for ``min(k, cells)`` a document); returns their length.
    """
    P, S = score.shape
    best_s = np.empty(k, np.float32)
    best_i = np.empty(k, np.int64)
    kept = 0
    p0 = 0
    while p0 < P:
        d = doc[p0]
        m = 0
        p1 = p0
        while p1 < P and doc[p1] == d:
            for j in range(S):
                if item[p1, j] >= 0:
                    m = _keep_best(score[p1, j], item[p1, j], m, k, best_s, best_i)
            p1 += 1
        kept = _emit_best(d, m, best_s, best_i, out_doc, out_item, out_score, kept)
        p0 = p1
    return kept


@njit(nogil=True, cache=True)
def merge_copies(doc, item, score, label_of, n_labels, k, mean, out_doc, out_label, out_score):  # pragma: no cover
    """One score per (document, label) from its copies' scores (``mean``: their average, else the
    max), the best ``k`` labels of each document kept in descending score (ties: smaller label
    first). Candidates come grouped by document. Writes the ``out_*`` arrays; returns their length.

    One pass per document with a label -> entry map (no sort of all candidates), then the best
    ``k`` of the document's distinct labels.
    """
    slot = np.full(n_labels, -1, np.int64)
    n = len(doc)
    total = np.zeros(n, np.float64)
    count = np.zeros(n, np.int64)
    lab = np.empty(n, np.int64)
    best_s = np.empty(k, np.float32)
    best_i = np.empty(k, np.int64)
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
        b = 0
        for e in range(m):
            slot[lab[e]] = -1
            merged = np.float32(total[e] / count[e] if mean else total[e])  # the scale scores are reported in
            b = _keep_best(merged, lab[e], b, k, best_s, best_i)
        kept = _emit_best(d, b, best_s, best_i, out_doc, out_label, out_score, kept)
        p0 = p1
    return kept
