"""Compiled inner loops of the linear path (numba, ``nogil``: callers run them in their own threads).

Only loops that numpy/scipy cannot express without materialising a large intermediate live here;
everything around them stays vectorised numpy. Kernels are compiled once per machine and cached
next to this file (``cache=True``), so a later process loads them in milliseconds.
"""

from __future__ import annotations

import numpy as np
from numba import njit


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
