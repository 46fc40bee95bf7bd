"""Scored (document, item) candidates and per-document top-k.

Ensembles, prediction and the metrics select their best items here; the beam search of a ranker
level keeps its own compiled top-k (``ranker.kernels.select_topk``, same order and ties).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp


def run_starts(keys: np.ndarray) -> np.ndarray:
    """Positions where a run of equal ``keys`` begins (``keys`` grouped); ``[]`` for no keys.
    (No ``np.r_``: this sits on the per-request path, where numpy call overhead is the cost.)"""
    new = np.empty(len(keys), dtype=bool)
    if len(keys):
        new[0] = True
        np.not_equal(keys[1:], keys[:-1], out=new[1:])
    return np.flatnonzero(new)


@dataclass
class Candidates:
    """Parallel arrays: document ``doc[p]`` scored ``score[p]`` for item ``item[p]``; grouped by doc."""

    doc: np.ndarray  # int64
    item: np.ndarray  # int64
    score: np.ndarray  # float32
    n_docs: int

    @classmethod
    def from_csr(cls, M: sp.spmatrix) -> Candidates:
        M = sp.csr_matrix(M)
        doc = np.repeat(np.arange(M.shape[0], dtype=np.int64), np.diff(M.indptr))
        return cls(doc, M.indices.astype(np.int64), M.data.astype(np.float32), M.shape[0])

    @classmethod
    def root(cls, n_docs: int, score: float) -> Candidates:
        """Every document under the single root node."""
        return cls(
            np.arange(n_docs, dtype=np.int64), np.zeros(n_docs, np.int64), np.full(n_docs, score, np.float32), n_docs
        )

    def to_padded(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(idx, vals)``, ``n_docs x k``, in stored order; missing slots are -1 / ``-inf``.
        Expects at most ``k`` entries a document, grouped by document (as :func:`topk` returns)."""
        idx = np.full((self.n_docs, k), -1, dtype=np.int64)
        vals = np.full((self.n_docs, k), -np.inf, dtype=np.float32)
        if len(self.doc):
            pos = np.arange(len(self.doc)) - np.searchsorted(self.doc, self.doc, side="left")
            idx[self.doc, pos] = self.item
            vals[self.doc, pos] = self.score
        return idx, vals

    def to_csr(self, n_items: int) -> sp.csr_matrix:
        order = np.lexsort((self.item, self.doc))
        indptr = np.concatenate([[0], np.cumsum(np.bincount(self.doc, minlength=self.n_docs))]).astype(np.int64)
        out = sp.csr_matrix(
            (self.score[order].astype(np.float32), self.item[order], indptr), shape=(self.n_docs, n_items)
        )
        out.has_sorted_indices = True
        return out


def concat(parts: list[Candidates], n_docs: int) -> Candidates:
    if not parts:
        return Candidates(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32), n_docs)
    return Candidates(
        np.concatenate([p.doc for p in parts]),
        np.concatenate([p.item for p in parts]),
        np.concatenate([p.score for p in parts]),
        n_docs,
    )


def dedupe_max(c: Candidates) -> Candidates:
    """One entry per (doc, item), keeping the highest score (an item reached by several parents)."""
    order = np.lexsort((-c.score, c.item, c.doc))
    d, it = c.doc[order], c.item[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = (d[1:] != d[:-1]) | (it[1:] != it[:-1])
    keep = order[first]
    return Candidates(c.doc[keep], c.item[keep], c.score[keep], c.n_docs)


def topk(c: Candidates, k: int) -> Candidates:
    """The ``k`` best-scored items of every document, sorted by doc then descending score.

    Ties keep the smaller item id first, so results are deterministic.
    """
    if k < 1:
        raise ValueError(f"topk: k must be >= 1, got {k!r}")
    order = np.lexsort((c.item, -c.score, c.doc))
    doc = c.doc[order]
    start = np.searchsorted(doc, doc, side="left")
    keep = order[(np.arange(len(order)) - start) < k]
    return Candidates(c.doc[keep], c.item[keep], c.score[keep], c.n_docs)


def topk_csr(M: sp.spmatrix, k: int) -> sp.csr_matrix:
    """Keep the ``k`` largest stored entries of every row of a sparse matrix."""
    return topk(Candidates.from_csr(M), k).to_csr(M.shape[1])
