# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: language = c++
"""PIFA's product ``Yw.T @ X`` for sparse ``X`` (Cython): each label's document rows summed.

scipy's sparse product runs in one thread, its time going to cache misses on the documents'
rows (1M labels: 0.67 s for 28M multiply-adds); this one splits the labels over threads. It
makes the same sums in the same order and float32 type, and lists each row's columns in scipy's
order (reverse first touch), so the result is scipy's to the bit, but for one thing: a sum that
cancels to exactly 0 is kept as an explicit zero (scipy drops it), which no use of PIFA sees.
"""

from concurrent.futures import ThreadPoolExecutor

cimport cython
from libc.math cimport sqrt
from libc.stdint cimport int32_t, int64_t

import numpy as np
import scipy.sparse as sp


@cython.wraparound(True)  # plain Python below: numpy's negative indices (work[-1], indptr[-1])
def label_sums(Yt: sp.csr_matrix, X: sp.csr_matrix, threads: int = 1) -> sp.csr_matrix:
    """``Yt @ X`` for csr ``Yt`` (``L x N``) and ``X`` (``N x D``), as csr float32; label ranges of
    about equal work run in ``threads`` threads (the loops run without the GIL)."""
    if Yt.shape[1] != X.shape[0]:
        raise ValueError(f"label_sums: Yt is {Yt.shape}, X is {X.shape}")
    L, D = Yt.shape[0], X.shape[1]
    args = (Yt.indptr.astype(np.int64, copy=False), Yt.indices.astype(np.int32, copy=False),
            Yt.data.astype(np.float32, copy=False), X.indptr.astype(np.int64, copy=False),
            X.indices.astype(np.int32, copy=False), X.data.astype(np.float32, copy=False))
    work = np.r_[0, np.cumsum(np.diff(args[3])[args[1]])][args[0][1:]]  # multiply-adds through each label
    cuts = np.searchsorted(work, np.linspace(0, work[-1] if L else 0, max(int(threads), 1) + 1)[1:-1])
    ranges = list(zip(np.r_[0, cuts].tolist(), np.r_[cuts, L].tolist()))
    indptr = np.zeros(L + 1, np.int64)
    with ThreadPoolExecutor(len(ranges)) as pool:
        list(pool.map(lambda r: _count(*args[:2], *args[3:5], D, r[0], r[1], indptr), ranges))
        np.cumsum(indptr, out=indptr)
        indices = np.empty(int(indptr[-1]), np.int32)
        data = np.empty(int(indptr[-1]), np.float32)
        list(pool.map(lambda r: _fill(*args, D, r[0], r[1], indptr, indices, data), ranges))
    return sp.csr_matrix((data, indices, indptr), shape=(L, D))


def _count(const int64_t[::1] yt_ptr, const int32_t[::1] yt_idx, const int64_t[::1] x_ptr,
           const int32_t[::1] x_idx, int64_t n_features, int64_t first, int64_t last_label, int64_t[::1] out):
    """``out[l + 1]`` = distinct columns of row ``l`` of the product, for labels ``first ..``."""
    cdef int64_t l, jj, d, kk, k
    cdef int64_t[::1] last = np.full(n_features, -1, np.int64)
    with nogil:
        for l in range(first, last_label):
            for jj in range(yt_ptr[l], yt_ptr[l + 1]):
                d = yt_idx[jj]
                for kk in range(x_ptr[d], x_ptr[d + 1]):
                    k = x_idx[kk]
                    if last[k] != l:
                        last[k] = l
                        out[l + 1] += 1


cdef inline int64_t _label_row(int64_t l, const int64_t[::1] yt_ptr, const int32_t[::1] yt_idx,
                               const float[::1] yt_val, const int64_t[::1] x_ptr, const int32_t[::1] x_idx,
                               const float[::1] x_val, float[::1] sums, int32_t[::1] link,
                               int64_t *head) noexcept nogil:
    """Row ``l`` of the product summed into ``sums``, its columns listed from ``head`` along
    ``link`` (scipy's "next": last touched first, -1 = untouched); returns how many."""
    cdef int64_t jj, d, kk, k, length = 0
    cdef float v
    head[0] = -2
    for jj in range(yt_ptr[l], yt_ptr[l + 1]):
        d = yt_idx[jj]
        v = yt_val[jj]
        for kk in range(x_ptr[d], x_ptr[d + 1]):
            k = x_idx[kk]
            sums[k] += v * x_val[kk]
            if link[k] == -1:
                link[k] = <int32_t>head[0]
                head[0] = k
                length += 1
    return length


def _fill(const int64_t[::1] yt_ptr, const int32_t[::1] yt_idx, const float[::1] yt_val, const int64_t[::1] x_ptr,
          const int32_t[::1] x_idx, const float[::1] x_val, int64_t n_features, int64_t first, int64_t last_label,
          const int64_t[::1] indptr, int32_t[::1] indices, float[::1] data):
    """Write rows ``first ..`` of the product at ``indptr``."""
    cdef int64_t l, head, length, q, nxt, o
    cdef float[::1] sums = np.zeros(n_features, np.float32)
    cdef int32_t[::1] link = np.full(n_features, -1, np.int32)  # int32: half the cache lines of int64
    with nogil:
        for l in range(first, last_label):
            length = _label_row(l, yt_ptr, yt_idx, yt_val, x_ptr, x_idx, x_val, sums, link, &head)
            o = indptr[l]
            for q in range(length):  # last touched first, as scipy lists them
                indices[o] = <int32_t>head
                data[o] = sums[head]
                o += 1
                nxt = link[head]
                link[head] = -1
                sums[head] = 0
                head = nxt


@cython.wraparound(True)
def leaf_centroids(Yt: sp.csr_matrix, X: sp.csr_matrix, leaves: sp.csr_matrix, first: int, last: int,
                   threads: int = 1) -> np.ndarray:
    """The unit centroids of leaves ``first .. last`` as a dense feature-major ``D x (last - first)``
    float32 array: a leaf's centroid is the unit sum of its labels' PIFA rows (each the unit sum of
    its documents' rows: ``Yt`` (``L x N``) times ``X`` (``N x D``)); ``leaves`` (``K x L``, csr)
    lists each leaf's labels.

    What ``unit_rows(label_sums(leaves, unit_rows(label_sums(Yt, X))))`` gives, to the bit (the
    same float32 sums in the same order, the norms summed pairwise in float64 as numpy sums them),
    without the ``L x D`` PIFA matrix: each label's row lives in one thread's scratch while it is
    added to its leaf's. Leaf ranges run in ``threads`` threads."""
    if Yt.shape[1] != X.shape[0] or leaves.shape[1] != Yt.shape[0]:
        raise ValueError(f"leaf_centroids: Yt is {Yt.shape}, X is {X.shape}, leaves {leaves.shape}")
    D = X.shape[1]
    args = (Yt.indptr.astype(np.int64, copy=False), Yt.indices.astype(np.int32, copy=False),
            Yt.data.astype(np.float32, copy=False), X.indptr.astype(np.int64, copy=False),
            X.indices.astype(np.int32, copy=False), X.data.astype(np.float32, copy=False),
            leaves.indptr.astype(np.int64, copy=False), leaves.indices.astype(np.int32, copy=False))
    through = np.r_[0, np.cumsum(np.diff(args[3])[args[1]])]  # multiply-adds through each label's documents
    per_label = through[args[0][1:]] - through[args[0][:-1]]
    work = np.r_[0, np.cumsum(per_label[args[7]])][args[6][first:last + 1]]  # multiply-adds through each leaf
    cuts = np.searchsorted(work - work[0], np.linspace(0, work[-1] - work[0], max(int(threads), 1) + 1)[1:-1])
    bounds = np.unique(np.r_[0, cuts, last - first]) + first
    out = np.zeros((D, last - first), np.float32)
    with ThreadPoolExecutor(max(len(bounds) - 1, 1)) as pool:
        list(pool.map(lambda r: _centroids(*args, D, r[0], r[1], first, out), zip(bounds[:-1], bounds[1:])))
    return out


cdef double _pairwise(const double *a, int64_t n) noexcept nogil:
    """numpy's pairwise float64 sum of ``a[:n]`` (blocks of 128 in eight running sums), to the bit."""
    cdef double r[8]
    cdef double res
    cdef int64_t i, j, n2
    if n < 8:
        res = 0.0
        for i in range(n):
            res += a[i]
        return res
    if n <= 128:
        for j in range(8):
            r[j] = a[j]
        i = 8
        while i < n - (n % 8):
            for j in range(8):
                r[j] += a[i + j]
            i += 8
        res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
        while i < n:
            res += a[i]
            i += 1
        return res
    n2 = n // 2
    n2 -= n2 % 8
    return _pairwise(a, n2) + _pairwise(a + n2, n - n2)


cdef float _inverse_norm(const int32_t[::1] link, const float[::1] sums, int64_t head, int64_t length,
                         double[::1] sq) noexcept nogil:
    """1 / the l2 norm (float32; 0 for a zero row) of a row held as ``sums`` along the list ``head``."""
    cdef int64_t q, f = head
    cdef double total
    for q in range(length):
        sq[q] = <double>sums[f] * <double>sums[f]
        f = link[f]
    total = _pairwise(&sq[0], length)
    return <float>(1.0 / sqrt(total)) if total > 0 else 0.0


def _centroids(const int64_t[::1] yt_ptr, const int32_t[::1] yt_idx, const float[::1] yt_val, const int64_t[::1] x_ptr,
               const int32_t[::1] x_idx, const float[::1] x_val, const int64_t[::1] leaf_ptr,
               const int32_t[::1] leaf_idx, int64_t n_features, int64_t k0, int64_t k1, int64_t first,
               float[:, ::1] out):
    """Write the centroids of leaves ``k0 .. k1`` into columns ``k - first`` of ``out``."""
    cdef int64_t k, p, f, head, length, chead, clen, q, nxt
    cdef float inv
    cdef float[::1] sums = np.zeros(n_features, np.float32)  # a label's row
    cdef int32_t[::1] link = np.full(n_features, -1, np.int32)  # its columns, last touched first (scipy's order)
    cdef float[::1] csum = np.zeros(n_features, np.float32)  # the leaf's sum of unit label rows
    cdef int32_t[::1] clink = np.full(n_features, -1, np.int32)
    cdef double[::1] sq = np.zeros(max(n_features, 1), np.float64)
    with nogil:
        for k in range(k0, k1):
            chead, clen = -2, 0
            for p in range(leaf_ptr[k], leaf_ptr[k + 1]):
                length = _label_row(leaf_idx[p], yt_ptr, yt_idx, yt_val, x_ptr, x_idx, x_val, sums, link, &head)
                inv = _inverse_norm(link, sums, head, length, sq)
                f = head
                for q in range(length):  # the unit row added to the leaf's, in the row's order
                    csum[f] += sums[f] * inv
                    if clink[f] == -1:
                        clink[f] = <int32_t>chead
                        chead = f
                        clen += 1
                    nxt = link[f]
                    link[f] = -1
                    sums[f] = 0
                    f = nxt
            inv = _inverse_norm(clink, csum, chead, clen, sq)
            f = chead
            for q in range(clen):
                out[f, k - first] = csum[f] * inv
                nxt = clink[f]
                clink[f] = -1
                csum[f] = 0
                f = nxt
