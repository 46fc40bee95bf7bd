"""The scoring layout of one level: raw scores of (document, cluster) pairs for every label slot.

Scoring a shortlist runs one compiled loop per chunk of documents (``kernels.pair_scores``) over
a feature-major copy of ``W``: each document's nonzeros meet the weight rows of the clusters in
its beam, written straight into a dense ``pairs x labels-per-cluster`` block, with no Python loop
over clusters or documents and no sparse intermediate.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import scipy.sparse as sp

from xtransformer.ranker.blocks import ranges
from xtransformer.ranker.errors import RankerError
from xtransformer.ranker.kernels import (
    layout_append_counts,
    layout_append_fill,
    layout_counts,
    layout_fill,
    layout_labels,
    pair_scores,
)
from xtransformer.topk import Candidates, run_starts

DENSE_BYTES = 64 << 20  # a level's W at most this big is also kept dense (see PairScorer.pair_scores) ...
DENSE_LAYOUT_SHARE = 1.0  # ... or at most this share of its scoring layout's bytes (memory at most doubled) ...
DENSE_MIN_FILL = 0.05  # ... if at least this share of it is nonzero: sparser, the compiled loop wins
DENSE_MIN_DOCS = 8  # ... and used for at least this many documents: below, scipy's call overhead loses
SCORE_CHUNK_COST = 4_000_000  # document nonzeros per pair plus (pair, slot) cells per scoring chunk
PARALLEL_MIN_COST = 200_000  # a batch with less work than this is scored in one chunk (a thread costs ~0.1 ms)


class PairScorer:
    """Raw scores of (document, cluster) pairs for every label slot of the cluster.

    The level's weights in the feature-major layout of :func:`kernels.pair_scores`: one row per
    (feature, cluster) that holds a weight, listing the (weight, slot) entries of the cluster's
    labels (slot ``j`` of cluster ``k`` is label ``slot_label[k, j]``). Row and entry fields are
    interleaved so that one cache line serves both. Built from ``W``'s rows in linear time
    (``kernels.layout_fill``); about the size of ``W`` itself.
    """

    def __init__(self, W: sp.csr_matrix | sp.csc_matrix, C: sp.csr_matrix, bias: float):
        Cc = C.tocsc()
        Cc.sort_indices()
        self.K, self.F1, self.n_labels, self.bias = C.shape[1], W.shape[0], W.shape[1], float(bias)
        sizes = np.diff(Cc.indptr)
        self.n_max = max(int(sizes.max(initial=0)), 1)
        self.hard = bool(np.all(np.diff(C.indptr) == 1))  # every label in one cluster (no copies)
        k_of = np.repeat(np.arange(self.K, dtype=np.int64), sizes)  # per (cluster, label) entry
        j_of = ranges(np.zeros(self.K), sizes)
        l_of = Cc.indices.astype(np.int64)
        self.slot_label = np.full((self.K, self.n_max), -1, dtype=np.int64)
        self.slot_label[k_of, j_of] = l_of
        by_label = np.argsort(l_of, kind="stable")  # label -> its (cluster, slot) entries
        lab_k, lab_j = k_of[by_label], j_of[by_label]
        lab_ptr = np.zeros(C.shape[0] + 1, np.int64)
        np.cumsum(np.bincount(l_of, minlength=C.shape[0]), out=lab_ptr[1:])
        # feature-major straight from W's rows (csr, as a model folder stores it): two compiled
        # passes, no reordered copy of W (at 1M labels that copy and its index arrays were 4x W)
        Wr = W if sp.isspmatrix_csr(W) else W.tocsr()
        count, n_entries = layout_counts(Wr.indptr, Wr.indices, lab_ptr, lab_k, self.K)
        idx = np.int32 if max(n_entries, int(count.sum())) < 2**31 - 1 else np.int64
        self.feat_ptr = np.zeros(self.F1 + 1, idx)
        np.cumsum(count, out=self.feat_ptr[1:])
        self.rows = np.empty((int(self.feat_ptr[-1]) + 1, 2), dtype=idx)
        self.entries = np.empty((n_entries, 2), dtype=np.float32)  # (weight, slot): slots < 2^24 are exact
        layout_fill(
            Wr.indptr, Wr.indices, Wr.data, lab_ptr, lab_k, lab_j, self.K, self.feat_ptr, self.rows, self.entries
        )
        # a small, not too sparse level (few labels, e.g. the top of the tree; or one as big dense
        # as its layout) is also kept as a dense F x L array: when the beams cover most of its
        # clusters, one csr @ dense product scores them fastest (C order: scipy's csr @ dense
        # copies a Fortran-ordered operand on every call). A sparse one is not: Reuters' flat
        # level, 0.9% nonzero, answers a request in 0.13 ms with the compiled loop against 0.18 ms
        # dense, at the same batch time. Nor is a request of a few documents: Bibtex, one
        # document, 121 us sparse against 170 us dense; the two meet at 4-16 documents.
        self.W_dense = _dense_copy(W, self.layout_bytes)

    @property
    def n_weights(self) -> int:
        return len(self.entries)

    @property
    def layout_bytes(self) -> int:
        return self.feat_ptr.nbytes + self.rows.nbytes + self.entries.nbytes

    def appended(self, W: sp.csr_matrix, C: sp.csr_matrix, threads: int = 1) -> PairScorer:
        """This layout with the labels of ``W``'s columns (csr ``F1 x n``) added, each in the one
        cluster its row of ``C`` (``n x K``) names, in the slots after the cluster's labels: the
        layout of the combined weights (columns in order), merged feature by feature from this
        one, the combined ``W`` never built (a fitted or loaded level holds only its layout), in
        ``threads`` feature ranges of about equal entries."""
        C = sp.csr_matrix(C)
        if not self.hard or W.shape[0] != self.F1 or C.shape != (W.shape[1], self.K) or np.any(np.diff(C.indptr) != 1):
            raise RankerError("scoring layout: appended labels must fit the level, one cluster each")
        new_k = C.indices.astype(np.int64)
        n_old = np.sum(self.slot_label >= 0, axis=1)  # a cluster's slots are filled from 0
        order = np.argsort(new_k, kind="stable")  # new labels by cluster, in label order within one
        sizes = np.bincount(new_k, minlength=self.K)
        new_j = np.empty(len(new_k), np.int64)
        new_j[order] = n_old[new_k[order]] + ranges(np.zeros(self.K), sizes)
        count = layout_append_counts(self.feat_ptr, self.rows, W.indptr, W.indices, new_k, self.K)
        n_entries = len(self.entries) + W.nnz
        idx = np.int32 if max(n_entries, int(count.sum())) < 2**31 - 1 else np.int64
        old_ptr, old_rows = self.feat_ptr.astype(idx, copy=False), self.rows.astype(idx, copy=False)
        out = object.__new__(PairScorer)
        out.K, out.F1, out.n_labels, out.bias, out.hard = self.K, self.F1, self.n_labels + W.shape[1], self.bias, True
        out.n_max = max(self.n_max, int((n_old + sizes).max(initial=1)))
        out.slot_label = np.full((self.K, out.n_max), -1, dtype=np.int64)
        out.slot_label[:, : self.n_max] = self.slot_label
        out.slot_label[new_k, new_j] = self.n_labels + np.arange(len(new_k))
        out.feat_ptr = np.zeros(self.F1 + 1, idx)
        np.cumsum(count, out=out.feat_ptr[1:])
        out.rows = np.empty((int(out.feat_ptr[-1]) + 1, 2), dtype=idx)
        out.entries = np.empty((n_entries, 2), dtype=np.float32)
        out.rows[-1] = (-1, n_entries)  # the end marker
        one_each = np.arange(len(new_k) + 1, dtype=np.int64)  # each new label in one cluster

        def fill(features: tuple[int, int]) -> None:  # the compiled merge releases the GIL
            layout_append_fill(
                old_ptr, old_rows, self.entries, W.indptr, W.indices, W.data, one_each, new_k, new_j,
                self.K, out.feat_ptr, out.rows, out.entries, *features,
            )  # fmt: skip

        parts = _feature_ranges(old_rows[old_ptr, 1].astype(np.int64) + W.indptr, threads)
        with ThreadPoolExecutor(len(parts)) as pool:
            list(pool.map(fill, parts))
        worth = _dense_worth(out.F1, out.n_labels, n_entries, out.layout_bytes)
        out.W_dense = _dense_copy(out.weights(), out.layout_bytes) if worth else None  # W rebuilt only then
        return out

    def weights(self, first: int = 0) -> sp.csr_matrix:
        """``W`` (csr, ``F1 x L``) rebuilt from the layout, or only its columns from ``first`` on
        (``F1 x (L - first)``); for a level where each label sits in one cluster (a label in
        several would be listed once per cluster)."""
        if not self.hard:
            raise RankerError("scoring layout: W cannot be rebuilt when labels sit in several clusters")
        label = np.empty(len(self.entries), self.rows.dtype)
        layout_labels(self.rows, self.entries, self.slot_label, label)
        indptr = self.rows[self.feat_ptr, 1].astype(np.int64)
        if first:
            keep = label >= first
            feature = np.repeat(np.arange(self.F1, dtype=np.int64), np.diff(indptr))[keep]
            W = sp.csr_matrix(
                (self.entries[keep, 0], (feature, label[keep] - first)), shape=(self.F1, self.n_labels - first)
            )
        else:
            W = sp.csr_matrix((self.entries[:, 0].copy(), label, indptr), shape=(self.F1, self.n_labels))
        W.sort_indices()
        return W

    def pair_scores(self, X: sp.csr_matrix, doc: np.ndarray, node: np.ndarray) -> np.ndarray:
        """Raw scores ``P x n_max`` of the label slots of clusters ``node`` for documents ``doc`` (grouped)."""
        starts = run_starts(doc)
        dense = self.W_dense is not None and len(starts) >= DENSE_MIN_DOCS
        if dense and 2 * len(doc) >= self.K * len(starts):  # beams hold most clusters
            F = self.F1 - (1 if self.bias > 0 else 0)
            docs = doc[starts]
            every = len(docs) == X.shape[0] and docs[-1] == len(docs) - 1  # sorted unique: all rows in order
            full = (X if every else X[docs]) @ self.W_dense[:F]
            if self.bias > 0:
                full += np.float32(self.bias) * self.W_dense[F]
            slots = self.slot_label[node]
            out = full[
                np.repeat(np.arange(len(starts)), np.diff(starts, append=len(doc)))[:, None], np.maximum(slots, 0)
            ]
            out[slots < 0] = 0.0
            return out
        out = np.zeros((len(doc), self.n_max), dtype=np.float32)
        pair_scores(
            X.indptr.astype(np.int64, copy=False),
            X.indices.astype(np.int32, copy=False),
            X.data,
            doc.astype(np.int64, copy=False),
            node.astype(np.int64, copy=False),
            self.feat_ptr,
            self.rows,
            self.entries,
            self.F1 - 1,
            np.float32(self.bias),
            self.K,
            out,
        )
        return out


def _feature_ranges(entries_before: np.ndarray, parts: int) -> list[tuple[int, int]]:
    """Feature ranges of about equal entries, ``parts`` at most (``entries_before[f]``: the
    entries of the features before ``f``, one more item than features)."""
    F = len(entries_before) - 1
    cuts = np.searchsorted(entries_before, np.linspace(0, entries_before[-1], max(parts, 1) + 1)[1:-1])
    bounds = np.unique(np.r_[0, np.clip(cuts, 0, F), F])
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])] or [(0, 0)]


def _dense_worth(n_rows: int, n_labels: int, nnz: int, layout_bytes: int) -> bool:
    """Whether a level's ``W`` is also kept dense: not too sparse, and small (``DENSE_BYTES``) or
    no bigger than ``DENSE_LAYOUT_SHARE`` of its scoring layout. EURLEX57K XR-Linear's middle level
    (64 labels, 44% filled: 71 MB dense, as big as its layout) scores 19,069 documents' beams in
    0.16 s dense against 0.93 s in the compiled loop."""
    cells = n_rows * n_labels
    small = cells * 4 <= max(DENSE_BYTES, DENSE_LAYOUT_SHARE * layout_bytes)
    return small and nnz >= DENSE_MIN_FILL * cells


def _dense_copy(W: sp.spmatrix, layout_bytes: int) -> np.ndarray | None:
    """``W`` dense (C order) where ``_dense_worth``, else None."""
    worth = _dense_worth(W.shape[0], W.shape[1], W.nnz, layout_bytes)
    return np.ascontiguousarray(W.toarray()) if worth else None


def pair_chunks(parents: Candidates, row_nnz: np.ndarray, n_max: int, threads: int = 1) -> list[slice]:
    """Split the (doc-grouped) pairs into slices of at most ``SCORE_CHUNK_COST`` work, cut between
    documents; a batch worth ``PARALLEL_MIN_COST`` or more is cut into at least ``threads`` slices."""
    P = len(parents.doc)
    if P == 0:
        return []
    bound = P * (n_max + int(row_nnz.max(initial=0)))  # cheap upper bound of the batch's work
    if bound < PARALLEL_MIN_COST or (threads <= 1 and bound <= SCORE_CHUNK_COST):  # one chunk
        return [slice(0, P)]
    cum = np.cumsum(row_nnz[parents.doc].astype(np.int64) + n_max)
    per_chunk = min(SCORE_CHUNK_COST, max(1, -(-int(cum[-1]) // max(1, threads))))
    starts = run_starts(parents.doc)
    chunk_of_doc = (cum[starts] - cum[starts[0]]) // per_chunk
    cuts = starts[run_starts(chunk_of_doc)]
    bounds = np.append(cuts, P)
    return [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
