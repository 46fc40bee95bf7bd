# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: language = c++
"""Compiled inner loops of the linear path (Cython, built at install; every loop runs without the
GIL, so callers run them in their own threads).

Only loops that numpy/scipy cannot express without materialising a large intermediate live here;
everything around them stays vectorised numpy. Index arrays may be int32 or int64 (fused types:
a loaded or built matrix is never widened just to be read); values are float32.
"""

from libc.math cimport INFINITY, fabs
from libc.stdint cimport int8_t, int32_t, int64_t, uint64_t
from libc.stdlib cimport free, malloc, realloc
from libcpp.algorithm cimport sort as std_sort

import numpy as np

cdef extern from *:
    void __builtin_prefetch(const void *addr) nogil

cdef extern from *:
    """
    #if defined(__GNUC__)
    #define XMC_INLINE __attribute__((always_inline)) inline  // into each compiled variant below
    #else
    #define XMC_INLINE inline
    #endif
    // The solver's two row loops over a task's label slots: the number of lanes (slots, padded to
    // 1, 2, 4, 8 or a multiple of 16: xmc_lanes) is a template constant, so each slot's sum stays in a
    // register for the whole row (a loop over a run-time slot count loads and stores it at every
    // nonzero). Each lane sums in the same order as a plain loop would: the results are the same.
    static inline long long xmc_lanes(long long n) {  // w's row width for n slots: under 2x n
        return n <= 2 ? n : n <= 4 ? 4 : n <= 8 ? 8 : (n + 15) / 16 * 16;
    }
    struct XmcRowDot {  // v[0 .. W) = the row (ti, tv)[e0, e1) times w's first W columns
        template <int W, typename I>
        XMC_INLINE static void run(const I *ti, const float *tv, long long e0, long long e1, float *w, long long ld,
                                   float *v) {
            float acc[W] = {0};
            for (long long e = e0; e < e1; ++e) {
                if (e + 8 < e1) {  // w's rows are random reads: ask for them early
                    const float *p = w + (long long)ti[e + 8] * ld;
                    for (int c = 0; c < W; c += 16) __builtin_prefetch(p + c);  // a cache line each
                }
                const float *r = w + (long long)ti[e] * ld;
                const float x = tv[e];
                for (int j = 0; j < W; ++j) acc[j] += r[j] * x;
            }
            for (int j = 0; j < W; ++j) v[j] = acc[j];
        }
    };
    struct XmcRowAxpy {  // w's first W columns += v[0 .. W) times the row
        template <int W, typename I>
        XMC_INLINE static void run(const I *ti, const float *tv, long long e0, long long e1, float *w, long long ld,
                                   float *v) {
            float dl[W];
            for (int j = 0; j < W; ++j) dl[j] = v[j];
            for (long long e = e0; e < e1; ++e) {
                float *r = w + (long long)ti[e] * ld;
                const float x = tv[e];
                for (int j = 0; j < W; ++j) r[j] += dl[j] * x;
            }
        }
    };
    // Op over w's columns 0 .. n, 64 at a time, each block at its lane count (w has ld >= xmc_lanes(n))
    template <class Op, typename I>
    XMC_INLINE static void xmc_by_lanes(const I *ti, const float *tv, long long e0, long long e1, float *w,
                                        long long ld, long long n, float *v) {
        for (long long c = 0; c < n; c += 64, w += 64, v += 64) {
            switch (xmc_lanes(n - c < 64 ? n - c : 64)) {
                case 1: Op::template run<1>(ti, tv, e0, e1, w, ld, v); break;
                case 2: Op::template run<2>(ti, tv, e0, e1, w, ld, v); break;
                case 4: Op::template run<4>(ti, tv, e0, e1, w, ld, v); break;
                case 8: Op::template run<8>(ti, tv, e0, e1, w, ld, v); break;
                case 16: Op::template run<16>(ti, tv, e0, e1, w, ld, v); break;
                case 32: Op::template run<32>(ti, tv, e0, e1, w, ld, v); break;
                case 48: Op::template run<48>(ti, tv, e0, e1, w, ld, v); break;
                default: Op::template run<64>(ti, tv, e0, e1, w, ld, v);
            }
        }
    }
    // g[0 .. n) = the row times w's columns 0 .. n; w's columns 0 .. n += d times the row (d is 0
    // in the lanes past n)
    // Compiled for AVX-512, AVX2 and the baseline, the one this CPU runs picked when the module loads
    // (lanes are independent sums and contraction is off: every build gives the same weights)
    #if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__)
    #define XMC_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
    #else
    #define XMC_CLONES
    #endif
    #define XMC_ROW_LOOPS(I)                                                                                   \
    XMC_CLONES static void xmc_row_dot(const I *ti, const float *tv, long long e0, long long e1, const float *w, \
                                       long long ld, long long n, float *g) {                                  \
        xmc_by_lanes<XmcRowDot>(ti, tv, e0, e1, const_cast<float *>(w), ld, n, g); /* reads w only */          \
    }                                                                                                           \
    XMC_CLONES static void xmc_row_axpy(const I *ti, const float *tv, long long e0, long long e1, float *w,     \
                                        long long ld, long long n, const float *d) {                           \
        xmc_by_lanes<XmcRowAxpy>(ti, tv, e0, e1, w, ld, n, const_cast<float *>(d)); /* reads d only */         \
    }
    XMC_ROW_LOOPS(int32_t)
    XMC_ROW_LOOPS(int64_t)
    """
    long long xmc_lanes(long long n) nogil
    void xmc_row_dot(const int32_t *ti, const float *tv, long long e0, long long e1, const float *w, long long ld,
                     long long n, float *g) nogil
    void xmc_row_dot(const int64_t *ti, const float *tv, long long e0, long long e1, const float *w, long long ld,
                     long long n, float *g) nogil
    void xmc_row_axpy(const int32_t *ti, const float *tv, long long e0, long long e1, float *w, long long ld,
                      long long n, const float *d) nogil
    void xmc_row_axpy(const int64_t *ti, const float *tv, long long e0, long long e1, float *w, long long ld,
                      long long n, const float *d) nogil

ctypedef fused ptr_t:  # a csr matrix's indptr
    int32_t
    int64_t

ctypedef fused ind_t:  # a csr matrix's indices
    int32_t
    int64_t

ctypedef fused lay_t:  # the scoring layout's offsets
    int32_t
    int64_t


def pair_scores(const int64_t[::1] x_ptr, const int32_t[::1] x_idx, const float[::1] x_val, const int64_t[::1] doc,
                const int64_t[::1] node, const lay_t[::1] feat_ptr, const lay_t[:, ::1] rows,
                const float[:, ::1] entries, int64_t bias_feat, float bias, int64_t n_clusters, float[:, ::1] out):
    """``out[p, j]`` += raw score of label slot ``j`` of cluster ``node[p]`` for document ``doc[p]``.

    The weights are a feature-major sparse layout: feature ``f`` owns rows ``feat_ptr[f] ..
    feat_ptr[f + 1]``; row ``r`` is ``(cluster, first entry)`` (clusters ascending within a
    feature; its entries end where row ``r + 1``'s begin) and entry ``e`` is ``(weight, slot)``.
    Pairs are grouped by document; for each document a cluster -> pair map is set, then every
    feature of the document adds its rows of the beam's clusters. The work is the document's
    nonzeros times the rows they meet, read in ascending address order (features are sorted),
    with no copy of the document per pair.
    """
    cdef int64_t[::1] pos = np.full(n_clusters, -1, np.int64)
    cdef int64_t n_pairs = doc.shape[0], n_slots = out.shape[1]
    cdef int64_t p0 = 0, p1, p, q, d, width, i, i_end, f, r, r0, r1, e, k, lo, hi, mid, j
    cdef float x
    with nogil:
        while p0 < n_pairs:
            d = doc[p0]
            p1 = p0
            while p1 < n_pairs and doc[p1] == d:
                if pos[node[p1]] < 0:
                    pos[node[p1]] = p1
                p1 += 1
            width = p1 - p0
            i_end = x_ptr[d + 1] + (1 if bias > 0 else 0)
            for i in range(x_ptr[d], i_end):
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
                                out[q, <int64_t>entries[e, 1]] += x * entries[e, 0]
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
                                out[p, <int64_t>entries[e, 1]] += x * entries[e, 0]
            for p in range(p0, p1):  # a cluster listed twice for one document: same scores
                q = pos[node[p]]
                if q != p:
                    for j in range(n_slots):
                        out[p, j] = out[q, j]
            for p in range(p0, p1):
                pos[node[p]] = -1
            p0 = p1


cdef struct Kept:  # the solver's kept weights, grown by half as needed
    int32_t *col
    int32_t *slot
    float *val
    int64_t n, cap


cdef int _reserve(Kept *kept, int64_t need) noexcept nogil:
    """Room for ``need`` triplets; -1 when memory ran out (the buffers held so far stay valid)."""
    cdef int64_t cap
    cdef void *p
    if need <= kept.cap:
        return 0
    cap = max(kept.cap + kept.cap // 2, need)
    p = realloc(kept.col, cap * sizeof(int32_t))
    if p == NULL:
        return -1
    kept.col = <int32_t *>p
    p = realloc(kept.slot, cap * sizeof(int32_t))
    if p == NULL:
        return -1
    kept.slot = <int32_t *>p
    p = realloc(kept.val, cap * sizeof(float))
    if p == NULL:
        return -1
    kept.val = <float *>p
    kept.cap = cap
    return 0


cdef int64_t _gather_rows(const ptr_t[::1] indptr, const ind_t[::1] indices, const float[::1] data, int64_t n_features,
                          const int64_t[::1] rows, const int64_t[::1] cols, int64_t[::1] local, float bias,
                          int64_t *out_ptr, ind_t *out_idx, float *out_val) noexcept nogil:
    """Rows ``rows`` of the source on columns ``cols`` (increasing ids, numbered 0..; the bias is
    column id ``n_features``, added with value ``bias`` when ``bias > 0``) into ``out_*`` (room for
    the rows' nonzeros, plus one a row with a bias): a compact csr, each row's column ids sorted as
    the source's are. ``local`` is scratch of ``n_features + 1`` entries. Returns the entries."""
    cdef int64_t R = rows.shape[0], q, i, r, o, e
    for q in range(cols.shape[0]):
        local[cols[q]] = q
    out_ptr[0] = 0
    o = 0
    for i in range(R):
        r = rows[i]
        for e in range(indptr[r], indptr[r + 1]):
            out_idx[o] = <ind_t>local[indices[e]]
            out_val[o] = data[e]
            o += 1
        if bias > 0:
            out_idx[o] = <ind_t>local[n_features]
            out_val[o] = bias
            o += 1
        out_ptr[i + 1] = o
    return o


def dual_cd_squared_hinge(const ptr_t[::1] indptr, const ind_t[::1] indices, const float[::1] data,
                          int64_t n_features, const int64_t[::1] rows, const int64_t[::1] row_len,
                          const int64_t[::1] col_feature, const int64_t[::1] col_len, float bias,
                          const int8_t[:, ::1] Y, double Cp, double Cn, const double[::1] row_cost, double eps,
                          int64_t max_iter, int64_t seed, double threshold, int64_t[:, ::1] passes):
    """LIBLINEAR's dual coordinate descent for the L2-regularised squared hinge (PECOS's solver).

    Task ``t`` trains on rows ``rows[sum(row_len[:t]) ..]`` of the source matrix (``indptr``,
    ``indices``, ``data``; ``n_features`` columns) plus a constant ``bias`` feature (id
    ``n_features`` in ``col_feature`` when ``bias > 0``), on its columns
    ``col_feature[sum(col_len[:t]) ..]``. While a task runs, its rows are copied into a compact
    csr on its own columns: one task's rows per thread, never a whole level's. A task on at least
    half of all features (the root, the top levels) reads its rows in place instead, on global
    feature ids: no copy of (most of) the training matrix per worker.
    Each of the ``n`` label slots is one problem (``Y`` +1/-1 per block row, int8, costing ``Cp`` /
    ``Cn`` times the row's ``row_cost``, or times 1 where ``row_cost`` is empty; a slot of zeros is
    padding). Dual variables ``alpha_i >= 0``, ``D_ii = 1 / (2 C_i)``; a pass
    visits the active rows in a random order and takes the exact coordinate step; rows stuck at
    ``alpha = 0`` with a gradient above the last pass's largest are shrunk away. A problem stops
    when ``max PG - min PG <= eps`` over a full pass, or after ``max_iter`` passes.

    The slots of a task run in lockstep: a visit reads the row once and updates every slot (``w``
    is feature-major, a feature's slots side by side): with up to 64 slots, 3x faster than
    solving one problem at a time on EURLEX57K. Each slot keeps its own shrinking and stopping;
    a row leaves the pass order once every running slot has shrunk it. The shuffle is an xorshift
    stream seeded by (``seed``, task): the result does not depend on threads. A slot that finishes
    (or is padding) moves behind the running ones (``_retire``): the lockstep loops run over the
    running slots only, so a row visit costs what the problems still solving need. The two row
    loops (``xmc_row_dot``, ``xmc_row_axpy``) keep each slot's sum in a register for the whole
    row, ``w``'s rows padded to a lane count (under twice the slots): the same weights, bit for
    bit, 1.3x as fast on EURLEX57K's one-vs-all problems of added labels; compiled for AVX-512 and
    AVX2 besides (picked at load, the same weights again): their 253 problems in 2 passes took
    2.9-3.2 s against 3.4-3.9 s for the baseline build on an AVX-512 host.
    Returns the weights with ``|w| >= threshold`` of the non-padding slots as triplets ``(col, slot,
    value)``, task by task, slot by slot, columns increasing: a block's dense ``Fb x n`` weights
    are never held. ``passes[t, j]`` counts the passes made.
    """
    cdef int64_t n_tasks = row_len.shape[0], S = Y.shape[1], max_rows = 0, max_cols = 0, max_nnz = 0
    cdef int64_t SP = xmc_lanes(S)  # w's row: the slots, padded for the row loops
    cdef int64_t t, i, j, e, c, r0 = 0, c0 = 0, nr, nc, n_w, bias_col, n_live, active, it, s, k, m
    cdef bint has_bias = bias > 0, in_place, moved, live, restore, costed = row_cost.shape[0] > 0
    r0 = 0
    for t in range(n_tasks):
        max_rows = max(max_rows, row_len[t])
        max_cols = max(max_cols, col_len[t])
        if 2 * col_len[t] >= n_features + 1:  # read in place: columns are global feature ids
            max_cols = max(max_cols, n_features + 1)
        else:
            m = 0
            for i in range(r0, r0 + row_len[t]):
                m += indptr[rows[i] + 1] - indptr[rows[i]]
            max_nnz = max(max_nnz, m + row_len[t])
        r0 += row_len[t]
    cdef int64_t[::1] local = np.zeros(n_features + 1, np.int64)  # source feature -> column of the current task
    cdef float[:, ::1] w = np.zeros((max_cols, SP), np.float32)  # float32, as PECOS: half the cache footprint
    cdef double[:, ::1] alpha = np.zeros((max_rows, S), np.float64)
    cdef int64_t[::1] row_start = np.zeros(max_rows, np.int64)  # the current task's rows in (ti, tv)
    cdef int64_t[::1] row_end = np.zeros(max_rows, np.int64)
    cdef double[::1] sq_norm = np.zeros(max_rows, np.float64)  # ||x_i||^2; D_ii = 0.5 / C_i from Cp / Cn
    cdef int8_t[:, ::1] shrunk = np.zeros((max_rows, S), np.int8)
    cdef int64_t[::1] index = np.zeros(max_rows, np.int64)
    cdef float[::1] g = np.zeros(SP, np.float32)
    cdef float[::1] dlt = np.zeros(SP, np.float32)  # 0 past the running slots: the row update leaves them
    cdef int64_t[::1] slot_of = np.zeros(S, np.int64)  # position -> slot; running slots first
    cdef int64_t[::1] pos_of = np.zeros(S, np.int64)  # slot -> position
    cdef int64_t[::1] n_shrunk = np.zeros(S, np.int64)
    cdef double[::1] pg_max_old = np.zeros(S, np.float64)
    cdef double[::1] pg_max_new = np.zeros(S, np.float64)
    cdef double[::1] pg_min_new = np.zeros(S, np.float64)
    cdef int64_t[::1] tp = np.zeros(max_rows + 1, np.int64)  # a copied task's rows (compact csr)
    cdef ind_t[::1] ti_own = np.zeros(max(max_nnz, 1), np.asarray(indices).dtype)
    cdef float[::1] tv_own = np.zeros(max(max_nnz, 1), np.float32)
    cdef const ind_t *ti
    cdef const float *tv
    cdef Kept kept
    cdef uint64_t state
    cdef float y, v
    cdef double diag, G, pg, old, scale
    kept.col = NULL
    kept.slot = NULL
    kept.val = NULL
    kept.n = 0
    kept.cap = 0
    cdef int failed = _reserve(&kept, 1024)
    with nogil:
        r0, c0 = 0, 0
        for t in range(n_tasks):
            if failed:
                break
            nr, nc = row_len[t], col_len[t]
            in_place = 2 * nc >= n_features + 1
            if in_place:
                ti, tv = &indices[0], &data[0]
                for i in range(nr):
                    row_start[i] = indptr[rows[r0 + i]]
                    row_end[i] = indptr[rows[r0 + i] + 1]
                n_w, bias_col = n_features + 1, n_features
            else:  # the bias is not stored: it is added below, as for a row read in place
                _gather_rows(indptr, indices, data, n_features, rows[r0:r0 + nr], col_feature[c0:c0 + nc], local,
                             0.0, &tp[0], &ti_own[0], &tv_own[0])
                ti, tv = &ti_own[0], &tv_own[0]
                for i in range(nr):
                    row_start[i] = tp[i]
                    row_end[i] = tp[i + 1]
                n_w, bias_col = nc, nc - 1
            for i in range(n_w):
                for j in range(SP):
                    w[i, j] = 0.0
            for j in range(S):
                slot_of[j] = j
                pos_of[j] = j
                n_shrunk[j] = 0
                pg_max_old[j] = INFINITY  # the squared hinge's dual has no upper bound: only alpha = 0 shrinks
            for i in range(nr):
                diag = <double>(bias * bias) if has_bias else 0.0
                for e in range(row_start[i], row_end[i]):
                    diag += tv[e] * tv[e]
                sq_norm[i] = diag
                index[i] = i
                for j in range(S):
                    alpha[i, j] = 0.0
                    shrunk[i, j] = False
            n_live = S
            for j in range(S - 1, -1, -1):
                if Y[r0, j] == 0:  # padding slot (a task's slots share their validity): never runs
                    n_live -= 1
                    _retire(pos_of[j], n_live, n_w, nr, w, alpha, shrunk, n_shrunk, pg_max_old, pg_max_new,
                            pg_min_new, slot_of, pos_of)
            for j in range(SP):  # the row update adds dlt in every lane: 0 but where a slot moved
                dlt[j] = 0.0
            state = (<uint64_t>(seed * 1000003 + t * 7919 + 1)) * <uint64_t>0x9E3779B97F4A7C15ULL | <uint64_t>1
            active = nr
            it = 0
            while it < max_iter and n_live > 0:
                for j in range(n_live):
                    pg_max_new[j] = -INFINITY
                    pg_min_new[j] = INFINITY
                for s in range(active - 1):  # Fisher-Yates over the active rows
                    state ^= state << 13
                    state ^= state >> 7
                    state ^= state << 17
                    k = s + <int64_t>(state % <uint64_t>(active - s))
                    index[s], index[k] = index[k], index[s]
                s = 0
                while s < active:
                    i = index[s]
                    xmc_row_dot(ti, tv, row_start[i], row_end[i], &w[0, 0], SP, n_live, &g[0])
                    if has_bias:
                        for j in range(n_live):
                            g[j] += w[bias_col, j] * bias
                    moved = False
                    live = False
                    scale = row_cost[r0 + i] if costed else 1.0  # x 1.0 is exact: unweighted rows as before
                    for j in range(n_live):
                        dlt[j] = 0.0
                        if shrunk[i, j]:
                            continue
                        y = <float>Y[r0 + i, slot_of[j]]
                        diag = 0.5 / ((Cp if y > 0 else Cn) * scale)
                        G = <double>(y * g[j]) - 1.0 + alpha[i, j] * diag
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
                        if fabs(pg) > 1e-12:
                            old = alpha[i, j]
                            alpha[i, j] = max(old - G / (sq_norm[i] + diag), 0.0)
                            dlt[j] = <float>((alpha[i, j] - old) * y)
                            moved = True
                    if moved:
                        xmc_row_axpy(ti, tv, row_start[i], row_end[i], &w[0, 0], SP, n_live, &dlt[0])
                        if has_bias:
                            for j in range(n_live):
                                w[bias_col, j] += dlt[j] * bias
                    if not live:  # shrunk for every running slot: out of this pass order
                        active -= 1
                        index[s], index[active] = index[active], index[s]
                        continue
                    s += 1
                it += 1
                restore = False
                for j in range(n_live - 1, -1, -1):  # backwards: the slot retired into j was already checked
                    if pg_max_new[j] - pg_min_new[j] <= eps:
                        if n_shrunk[j] == 0:
                            passes[t, slot_of[j]] = it
                            n_live -= 1
                            _retire(j, n_live, n_w, nr, w, alpha, shrunk, n_shrunk, pg_max_old, pg_max_new,
                                    pg_min_new, slot_of, pos_of)
                        else:  # converged on the shrunk set: check every row once more
                            for i in range(nr):
                                shrunk[i, j] = False
                            n_shrunk[j] = 0
                            pg_max_old[j] = INFINITY
                            restore = True
                    else:
                        pg_max_old[j] = pg_max_new[j] if pg_max_new[j] > 0 else INFINITY
                if restore:
                    active = nr
                for j in range(n_live, SP):  # a retired slot's last step must not move its weights again
                    dlt[j] = 0.0
            for j in range(n_live):  # stopped at max_iter
                passes[t, slot_of[j]] = it
            for j in range(S):
                if Y[r0, j] == 0:  # padding slot
                    continue
                if _reserve(&kept, kept.n + nc):
                    failed = 1
                    break
                for c in range(nc):
                    v = w[col_feature[c0 + c] if in_place else c, pos_of[j]]
                    if fabs(v) >= threshold:
                        kept.col[kept.n] = <int32_t>(c0 + c)
                        kept.slot[kept.n] = <int32_t>j
                        kept.val[kept.n] = v
                        kept.n += 1
            r0 += nr
            c0 += nc
    try:
        if failed:
            raise MemoryError("ranker solver: out of memory for the kept weights")
        col = np.empty(kept.n, np.int32)  # a block's columns and slots fit int32
        slot = np.empty(kept.n, np.int32)
        val = np.empty(kept.n, np.float32)
        if kept.n:
            _copy_kept(kept, col, slot, val)
        return col, slot, val
    finally:
        free(kept.col)
        free(kept.slot)
        free(kept.val)


cdef void _retire(int64_t a, int64_t b, int64_t n_w, int64_t nr, float[:, ::1] w, double[:, ::1] alpha,
                  int8_t[:, ::1] shrunk, int64_t[::1] n_shrunk, double[::1] pg_max_old, double[::1] pg_max_new,
                  double[::1] pg_min_new, int64_t[::1] slot_of, int64_t[::1] pos_of) noexcept nogil:
    """Swap the state of positions ``a`` and ``b`` of the dual coordinate descent (``b``: the first
    position behind the running slots), so that the slot at ``a`` stops running."""
    cdef int64_t i
    if a == b:
        return
    for i in range(n_w):
        w[i, a], w[i, b] = w[i, b], w[i, a]
    for i in range(nr):
        alpha[i, a], alpha[i, b] = alpha[i, b], alpha[i, a]
        shrunk[i, a], shrunk[i, b] = shrunk[i, b], shrunk[i, a]
    n_shrunk[a], n_shrunk[b] = n_shrunk[b], n_shrunk[a]
    pg_max_old[a], pg_max_old[b] = pg_max_old[b], pg_max_old[a]
    pg_max_new[a], pg_max_new[b] = pg_max_new[b], pg_max_new[a]
    pg_min_new[a], pg_min_new[b] = pg_min_new[b], pg_min_new[a]
    slot_of[a], slot_of[b] = slot_of[b], slot_of[a]
    pos_of[slot_of[a]] = a
    pos_of[slot_of[b]] = b


cdef void _copy_kept(Kept kept, int32_t[::1] col, int32_t[::1] slot, float[::1] val) noexcept:
    cdef int64_t q
    for q in range(kept.n):
        col[q] = kept.col[q]
        slot[q] = kept.slot[q]
        val[q] = kept.val[q]


def block_columns(const ptr_t[::1] indptr, const ind_t[::1] indices, const int64_t[::1] rows,
                  const int64_t[::1] row_len, int64_t n_features, bint has_bias):
    """The columns of each task of a block: the features occurring in its rows, in increasing id
    (plus the bias, id ``n_features``, last). Returns ``(col_len, col_feature)``."""
    cdef int64_t T = row_len.shape[0], t, r, i, e, f, n_cols, r0 = 0, total = 0, nnz
    for t in range(T):  # a task has at most min(its nonzeros, all features) columns, plus the bias
        nnz = 0
        for i in range(r0, r0 + row_len[t]):
            nnz += indptr[rows[i] + 1] - indptr[rows[i]]
        total += min(nnz, n_features) + (1 if has_bias else 0)
        r0 += row_len[t]
    r0 = 0
    cdef int8_t[::1] seen = np.zeros(n_features + 1, np.int8)
    cdef int64_t[::1] col_len = np.zeros(T, np.int64)
    cdef int64_t[::1] cols = np.empty(max(total, 1), np.int64)
    cdef int64_t c0 = 0
    with nogil:
        for t in range(T):
            n_cols = 0
            for i in range(r0, r0 + row_len[t]):
                r = rows[i]
                for e in range(indptr[r], indptr[r + 1]):
                    f = indices[e]
                    if not seen[f]:
                        seen[f] = True
                        cols[c0 + n_cols] = f
                        n_cols += 1
            if has_bias:
                cols[c0 + n_cols] = n_features
                n_cols += 1
            std_sort(&cols[c0], &cols[c0] + n_cols)
            for i in range(c0, c0 + n_cols):
                seen[cols[i]] = False
            col_len[t] = n_cols
            c0 += n_cols
            r0 += row_len[t]
    return np.asarray(col_len), np.asarray(cols)[:c0].copy()


def gather_block(const ptr_t[::1] indptr, const ind_t[::1] indices, const float[::1] data, int64_t n_features,
                 const int64_t[::1] rows, const int64_t[::1] row_len, const int64_t[::1] col_feature,
                 const int64_t[::1] col_len, float bias):
    """The block matrix itself (csr, rows with sorted column ids, indices of the source's dtype),
    for solvers that need one: task by task, the rows on the task's columns, shifted by the earlier
    tasks' columns."""
    cdef int64_t R = rows.shape[0], T = row_len.shape[0], i, t, q, r0 = 0, c0 = 0, e0 = 0, m, total = 0
    for i in range(R):
        total += indptr[rows[i] + 1] - indptr[rows[i]] + (1 if bias > 0 else 0)
    out_ptr = np.zeros(R + 1, np.int64)
    out_idx = np.empty(total, np.asarray(indices).dtype)
    out_val = np.empty(total, np.float32)
    cdef int64_t[::1] p = out_ptr
    cdef ind_t[::1] ix = out_idx
    cdef float[::1] v = out_val
    cdef int64_t[::1] local = np.zeros(n_features + 1, np.int64)
    with nogil:
        for t in range(T):
            m = _gather_rows(indptr, indices, data, n_features, rows[r0:r0 + row_len[t]],
                             col_feature[c0:c0 + col_len[t]], local, bias, &p[r0],
                             &ix[e0] if total else NULL, &v[e0] if total else NULL)
            for q in range(e0, e0 + m):
                ix[q] += <ind_t>c0
            for q in range(r0, r0 + row_len[t] + 1):  # _gather_rows numbered this task's entries from 0
                p[q] += e0
            r0, c0, e0 = r0 + row_len[t], c0 + col_len[t], e0 + m
    return out_ptr, out_idx, out_val


cdef inline int64_t _feature_clusters(const ptr_t[::1] indptr, const ind_t[::1] indices, const int64_t[::1] lab_ptr,
                                      const int64_t[::1] lab_k, int64_t f, int64_t[::1] last, int64_t[::1] cursor,
                                      int64_t[::1] ks) noexcept nogil:
    """The clusters of row ``f`` of ``W`` (its labels' clusters) into ``ks``, in increasing id, and
    each one's entry count into ``cursor`` (``last``: the row a cluster was last seen in); how many."""
    cdef int64_t e, l, p, k, m = 0
    for e in range(indptr[f], indptr[f + 1]):
        l = indices[e]
        for p in range(lab_ptr[l], lab_ptr[l + 1]):
            k = lab_k[p]
            if last[k] != f:
                last[k] = f
                cursor[k] = 0
                ks[m] = k
                m += 1
            cursor[k] += 1
    std_sort(&ks[0], &ks[0] + m)
    return m


cdef inline void _write_entries(const ptr_t[::1] indptr, const ind_t[::1] indices, const float[::1] data,
                                const int64_t[::1] lab_ptr, const int64_t[::1] lab_k, const int64_t[::1] lab_j,
                                int64_t f, int64_t[::1] cursor, float[:, ::1] entries) noexcept nogil:
    """Row ``f`` of ``W`` as (weight, slot) entries, each at its cluster's ``cursor`` (advanced)."""
    cdef int64_t e, l, p, k
    for e in range(indptr[f], indptr[f + 1]):
        l = indices[e]
        for p in range(lab_ptr[l], lab_ptr[l + 1]):
            k = lab_k[p]
            entries[cursor[k], 0] = data[e]
            entries[cursor[k], 1] = <float>lab_j[p]
            cursor[k] += 1


def layout_counts(const ptr_t[::1] indptr, const ind_t[::1] indices, const int64_t[::1] lab_ptr,
                  const int64_t[::1] lab_k, int64_t n_clusters):
    """Per feature (row of ``W``, csr), its number of distinct clusters (rows of the scoring layout),
    and the number of (weight, slot) entries in all. Label ``l`` sits in clusters
    ``lab_k[lab_ptr[l]:lab_ptr[l + 1]]``."""
    cdef int64_t F = indptr.shape[0] - 1, f, e, l, p, k, n_entries = 0
    cdef int64_t[::1] last = np.full(n_clusters, -1, np.int64)
    count = np.zeros(F, np.int64)
    cdef int64_t[::1] cnt = count
    with nogil:
        for f in range(F):
            for e in range(indptr[f], indptr[f + 1]):
                l = indices[e]
                for p in range(lab_ptr[l], lab_ptr[l + 1]):
                    k = lab_k[p]
                    n_entries += 1
                    if last[k] != f:
                        last[k] = f
                        cnt[f] += 1
    return count, n_entries


def layout_labels(const lay_t[:, ::1] rows, const float[:, ::1] entries, const int64_t[:, ::1] slot_label,
                  lay_t[::1] out):
    """``out[e]``: the label of entry ``e`` of a scoring layout (``PairScorer``): entry ``e`` of row
    ``r`` is slot ``entries[e, 1]`` of cluster ``rows[r, 0]``; row ``r``'s entries end where row
    ``r + 1``'s begin (the last row is the end marker). One pass, no per-entry index arrays."""
    cdef int64_t r, e, k, n_rows = rows.shape[0] - 1
    with nogil:
        for r in range(n_rows):
            k = rows[r, 0]
            for e in range(rows[r, 1], rows[r + 1, 1]):
                out[e] = <lay_t>slot_label[k, <int64_t>entries[e, 1]]


def layout_fill(const ptr_t[::1] indptr, const ind_t[::1] indices, const float[::1] data, const int64_t[::1] lab_ptr,
                const int64_t[::1] lab_k, const int64_t[::1] lab_j, int64_t n_clusters, const lay_t[::1] feat_ptr,
                lay_t[:, ::1] rows, float[:, ::1] entries):
    """Write the scoring layout of ``PairScorer`` straight from ``W`` (csr): feature ``f``'s rows
    ``feat_ptr[f] ..`` are its clusters in increasing id, ``rows[r] = (cluster, first entry)``, and
    a row's ``(weight, slot)`` entries end where the next row's begin (``rows[-1]`` is the end).
    One pass per feature with cluster-sized scratch: no copy of ``W`` in another order."""
    cdef int64_t F = indptr.shape[0] - 1, f, k, m, q, r, n_k, e_out = 0
    cdef int64_t[::1] last = np.full(n_clusters, -1, np.int64)
    cdef int64_t[::1] cursor = np.zeros(n_clusters, np.int64)
    cdef int64_t[::1] ks = np.empty(max(n_clusters, 1), np.int64)
    with nogil:
        for f in range(F):
            m = _feature_clusters(indptr, indices, lab_ptr, lab_k, f, last, cursor, ks)
            r = feat_ptr[f]
            for q in range(m):  # rows in increasing cluster id; each row's entries start after the last's
                k = ks[q]
                n_k = cursor[k]
                rows[r + q, 0] = <lay_t>k
                rows[r + q, 1] = <lay_t>e_out
                cursor[k] = e_out
                e_out += n_k
            _write_entries(indptr, indices, data, lab_ptr, lab_k, lab_j, f, cursor, entries)
        rows[rows.shape[0] - 1, 0] = -1
        rows[rows.shape[0] - 1, 1] = <lay_t>e_out


def layout_append_counts(const lay_t[::1] feat_ptr, const lay_t[:, ::1] rows, const ptr_t[::1] indptr,
                         const ind_t[::1] indices, const int64_t[::1] new_k, int64_t n_clusters):
    """Per feature, the rows of a scoring layout (``feat_ptr``, ``rows``) once the labels of ``W``'s
    columns (csr ``indptr``, ``indices``; column ``c`` in cluster ``new_k[c]``) are added: its
    clusters and the new ones it lacks (see ``layout_append_fill``)."""
    cdef int64_t F = indptr.shape[0] - 1, f, e, r, k
    cdef int64_t[::1] seen = np.full(n_clusters, -1, np.int64)
    count = np.zeros(F, np.int64)
    cdef int64_t[::1] cnt = count
    with nogil:
        for f in range(F):
            for r in range(feat_ptr[f], feat_ptr[f + 1]):
                seen[rows[r, 0]] = f
            cnt[f] = feat_ptr[f + 1] - feat_ptr[f]
            for e in range(indptr[f], indptr[f + 1]):
                k = new_k[indices[e]]
                if seen[k] != f:
                    seen[k] = f
                    cnt[f] += 1
    return count


def layout_append_fill(const lay_t[::1] feat_ptr, const lay_t[:, ::1] rows, const float[:, ::1] entries,
                       const ptr_t[::1] indptr, const ind_t[::1] indices, const float[::1] data,
                       const int64_t[::1] lab_ptr, const int64_t[::1] lab_k, const int64_t[::1] lab_j,
                       int64_t n_clusters, const lay_t[::1] out_ptr, lay_t[:, ::1] out_rows,
                       float[:, ::1] out_entries, int64_t f0, int64_t f1):
    """Write features ``f0 .. f1`` of the scoring layout (``out_*``, sized by
    ``layout_append_counts``) of the old one plus the labels of ``W``'s columns (csr; column ``c``
    is slot ``lab_j[p]`` of cluster ``lab_k[p]`` for ``p`` in ``lab_ptr[c] ..``, after the
    cluster's old slots). Feature by feature, the old rows and the new clusters merge in increasing
    cluster id, a row's old entries first: the layout ``layout_fill`` writes from the combined ``W``
    (its columns sorted), without that ``W``. Disjoint feature ranges may be written by concurrent
    calls; the caller writes the end marker (the last row)."""
    cdef int64_t f, e, r, r1, k, m, q, o, n_k, e_out = rows[feat_ptr[f0], 1] + indptr[f0]  # entries before f0
    cdef int64_t[::1] last = np.full(n_clusters, -1, np.int64)
    cdef int64_t[::1] cursor = np.zeros(n_clusters, np.int64)
    cdef int64_t[::1] ks = np.empty(max(n_clusters, 1), np.int64)
    with nogil:
        for f in range(f0, f1):
            m = _feature_clusters(indptr, indices, lab_ptr, lab_k, f, last, cursor, ks)  # the new labels' here
            r, r1, q, o = feat_ptr[f], feat_ptr[f + 1], 0, out_ptr[f]
            while r < r1 or q < m:  # merge the old rows and the new clusters, increasing cluster id
                k = rows[r, 0] if r < r1 and (q == m or rows[r, 0] <= ks[q]) else ks[q]
                out_rows[o, 0] = <lay_t>k
                out_rows[o, 1] = <lay_t>e_out
                o += 1
                if r < r1 and rows[r, 0] == k:  # the old entries, as they were
                    for e in range(rows[r, 1], rows[r + 1, 1]):
                        out_entries[e_out, 0] = entries[e, 0]
                        out_entries[e_out, 1] = entries[e, 1]
                        e_out += 1
                    r += 1
                if q < m and ks[q] == k:  # room for the new entries, written below
                    n_k = cursor[k]
                    cursor[k] = e_out
                    e_out += n_k
                    q += 1
            _write_entries(indptr, indices, data, lab_ptr, lab_k, lab_j, f, cursor, out_entries)


cdef inline int64_t _keep_best(float s, int64_t item, int64_t m, int64_t k, float *best_s,
                               int64_t *best_i) noexcept nogil:
    """Offer ``(s, item)`` to the best-first lists ``best_s`` / ``best_i`` holding ``m`` of at most
    ``k`` entries (higher score first; ties: smaller item first). Returns the new ``m``."""
    cdef int64_t b
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


cdef inline int64_t _emit_best(int64_t d, int64_t m, const float *best_s, const int64_t *best_i, int64_t[::1] out_doc,
                               int64_t[::1] out_item, float[::1] out_score, int64_t kept) noexcept nogil:
    """Append document ``d``'s ``m`` best entries to the ``out_*`` arrays at ``kept``; the new length."""
    cdef int64_t q
    for q in range(m):
        out_doc[kept] = d
        out_item[kept] = best_i[q]
        out_score[kept] = best_s[q]
        kept += 1
    return kept


def select_topk(const int64_t[::1] doc, const float[:, ::1] score, const int64_t[:, ::1] item, int64_t k,
                int64_t[::1] out_doc, int64_t[::1] out_item, float[::1] out_score):
    """The ``k`` best cells of each document's rows, best first (ties: smaller item first).

    Row ``p`` of ``score`` / ``item`` (``P x S``) belongs to document ``doc[p]`` (rows grouped by
    document); cells with ``item < 0`` are padding. One pass over the cells with a running best-k
    list: no sort of all candidates, no padded per-document table. Writes the ``out_*`` arrays
    (room for ``min(k, cells)`` a document); returns their length.
    """
    cdef int64_t P = score.shape[0], S = score.shape[1], kept = 0, p0 = 0, p1, d, m, j
    cdef float[::1] best_s = np.empty(k, np.float32)
    cdef int64_t[::1] best_i = np.empty(k, np.int64)
    with nogil:
        while p0 < P:
            d = doc[p0]
            m = 0
            p1 = p0
            while p1 < P and doc[p1] == d:
                for j in range(S):
                    if item[p1, j] >= 0:
                        m = _keep_best(score[p1, j], item[p1, j], m, k, &best_s[0], &best_i[0])
                p1 += 1
            kept = _emit_best(d, m, &best_s[0], &best_i[0], out_doc, out_item, out_score, kept)
            p0 = p1
    return kept


def merge_copies(const int64_t[::1] doc, const int64_t[::1] item, const float[::1] score, const int64_t[::1] label_of,
                 int64_t n_labels, int64_t k, bint mean, int64_t[::1] out_doc, int64_t[::1] out_label,
                 float[::1] out_score):
    """One score per (document, label) from its copies' scores (``mean``: their average, else the
    max), the best ``k`` labels of each document kept in descending score (ties: smaller label
    first). Candidates come grouped by document. Writes the ``out_*`` arrays; returns their length.

    One pass per document with a label -> entry map (no sort of all candidates), then the best
    ``k`` of the document's distinct labels.
    """
    cdef int64_t n = doc.shape[0], kept = 0, p0 = 0, p1, d, m, b, e, label
    cdef int64_t[::1] slot = np.full(n_labels, -1, np.int64)
    cdef double[::1] total = np.zeros(max(n, 1), np.float64)
    cdef int64_t[::1] count = np.zeros(max(n, 1), np.int64)
    cdef int64_t[::1] lab = np.empty(max(n, 1), np.int64)
    cdef float[::1] best_s = np.empty(k, np.float32)
    cdef int64_t[::1] best_i = np.empty(k, np.int64)
    cdef float merged
    with nogil:
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
                merged = <float>(total[e] / count[e] if mean else total[e])  # the scale scores are reported in
                b = _keep_best(merged, lab[e], b, k, &best_s[0], &best_i[0])
            kept = _emit_best(d, b, &best_s[0], &best_i[0], out_doc, out_label, out_score, kept)
            p0 = p1
    return kept
