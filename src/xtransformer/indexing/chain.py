"""``ClusterChain``: a label tree as a list of sparse parent matrices (PECOS convention).

``chain[0]`` is ``K_1 x 1`` (children of the root), ``chain[d]`` is ``K_{d+1} x K_d`` (row ``i``
marks the parent of node ``i``), and ``chain[-1]`` is ``L x K`` (label -> leaf cluster). A hard
tree has exactly one nonzero per row; label disentanglement (``disentangle.py``) gives a leaf row
several: every method here accepts that.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, overload

import numpy as np
import scipy.sparse as sp

from xtransformer.data.vocab import vocab_difference
from xtransformer.indexing.errors import IndexingError
from xtransformer.utils.io import atomic_dir, is_complete, load_csr, load_json, save_csr, save_json

CHAIN_META = "chain.json"
LABEL_IDS = "label_ids.json"


class ClusterChain:
    """An immutable, validated list of csr float32 matrices forming a label tree."""

    def __init__(self, matrices: Sequence[sp.spmatrix]):
        if len(matrices) == 0:
            raise IndexingError("ClusterChain: `matrices` is empty; need at least the L x K leaf assignment")
        mats = [_as_clean_csr(m, f"chain[{i}]") for i, m in enumerate(matrices)]
        _validate_chain(mats)
        self._chain: list[sp.csr_matrix] = mats

    # ------------------------------------------------------------------ container protocol
    def __len__(self) -> int:
        return len(self._chain)

    @overload
    def __getitem__(self, i: int) -> sp.csr_matrix: ...
    @overload
    def __getitem__(self, i: slice) -> list[sp.csr_matrix]: ...
    def __getitem__(self, i):
        return self._chain[i]

    def __iter__(self) -> Iterator[sp.csr_matrix]:
        return iter(self._chain)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ClusterChain) or len(other) != len(self):
            return False
        return all(a.shape == b.shape and (a != b).nnz == 0 for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]  # mutable-looking value object: compare, do not hash

    def __repr__(self) -> str:
        return f"ClusterChain(level_sizes={self.level_sizes})"

    # ------------------------------------------------------------------ shape facts
    @property
    def leaf_assignment(self) -> sp.csr_matrix:
        """``C`` = ``chain[-1]``: ``L x K`` csr float32 label-to-leaf-cluster matrix."""
        return self._chain[-1]

    @property
    def n_labels(self) -> int:
        return self._chain[-1].shape[0]

    @property
    def n_clusters(self) -> int:
        """Number of leaf clusters ``K``."""
        return self._chain[-1].shape[1]

    @property
    def level_sizes(self) -> list[int]:
        """Row counts of each matrix: ``[K_1, K_2, ..., K_D (= K), L]``."""
        return [m.shape[0] for m in self._chain]

    @property
    def is_hard(self) -> bool:
        """True when every label and node has exactly one parent."""
        return all(m.nnz == m.shape[0] for m in self._chain)

    @property
    def leaf_codes(self) -> np.ndarray:
        """Leaf cluster of each (label, cluster) pair, label-major (int64): one per label (``L``) in a
        partition; with overlap, ``leaf_labels`` names each pair's label."""
        return self._chain[-1].indices.astype(np.int64)

    @property
    def leaf_labels(self) -> np.ndarray:
        """Label of each entry of :attr:`leaf_codes` (``arange(L)`` in a partition)."""
        return np.repeat(np.arange(self.n_labels, dtype=np.int64), np.diff(self._chain[-1].indptr))

    @property
    def cluster_sizes(self) -> np.ndarray:
        """Number of labels in each leaf cluster (``K`` int64)."""
        return np.bincount(self._chain[-1].indices, minlength=self.n_clusters).astype(np.int64)

    def label_to_level(self, i: int) -> sp.csr_matrix:
        """``L x chain[i].shape[0]`` matrix: which level-``i`` nodes each label descends from.

        ``label_to_level(len(chain) - 2)`` is the leaf assignment; the targets of a matcher at
        level ``i`` are ``Y @ label_to_level(i)``.
        """
        n = len(self) - 1
        if not -n <= i < n:
            raise IndexingError(f"label_to_level: level {i} out of range for a chain of length {len(self)}")
        i %= n
        return _compose(self._chain[i + 1 :])

    # ------------------------------------------------------------------ transforms
    def subsample(self, branching: int) -> ClusterChain:
        """A shallower chain with out-degree about ``branching``, keeping the leaf clusters.

        Walking up from the leaves, keep the deepest level with at most ``1/branching`` as many
        nodes as the last kept one, until at most ``branching`` nodes remain under the root (as
        PECOS's ``from_partial_chain(C, nr_splits=B)`` does for a binary tree: K = 64, B = 16 ->
        ``[4 x 1, 64 x 4, L x 64]``). Skipped levels are composed away.
        """
        kept = self.subsampled_levels([1] + [m.shape[0] for m in self._chain], branching)
        mats = [_compose(self._chain[u:v]) for u, v in zip(kept[:-1], kept[1:])]
        return ClusterChain(mats)

    @staticmethod
    def subsampled_levels(sizes: Sequence[int], branching: int) -> list[int]:
        """The levels :meth:`subsample` keeps, from the node counts of levels 0 (root) .. D+1
        (labels) alone, so a plan can be checked before any tree is built."""
        if not isinstance(branching, (int, np.integer)) or isinstance(branching, bool) or branching < 2:
            raise IndexingError(f"subsample: `branching` must be an int >= 2, got {branching!r}")
        depth = len(sizes) - 2  # level index of the leaf clusters
        kept = [depth + 1, depth]
        cur = depth
        while sizes[cur] > branching:
            target = sizes[cur] / branching
            fits = [t for t in range(1, cur) if sizes[t] <= target]
            if not fits:
                break
            cur = max(fits)
            kept.append(cur)
        if kept[-1] != 0:  # a flat chain's leaf level is already the root's children
            kept.append(0)
        return kept[::-1]

    # ------------------------------------------------------------------ construction helpers
    @classmethod
    def from_codes(cls, codes: np.ndarray, n_clusters: int | None = None) -> ClusterChain:
        """A flat chain ``[K x 1, L x K]`` from a leaf cluster id per label."""
        codes = np.asarray(codes)
        if codes.ndim != 1 or codes.size == 0 or not np.issubdtype(codes.dtype, np.integer):
            raise IndexingError("from_codes: `codes` must be a non-empty 1-D integer array")
        k = int(codes.max()) + 1 if n_clusters is None else int(n_clusters)
        if codes.min() < 0 or codes.max() >= k:
            raise IndexingError(f"from_codes: codes must lie in [0, {k}), got [{codes.min()}, {codes.max()}]")
        leaf = codes_to_csr(codes, k)
        return cls([sp.csr_matrix(np.ones((k, 1), dtype=np.float32)), leaf])

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | os.PathLike, vocab_ids: Sequence[str], settings: dict[str, Any] | None = None) -> None:
        """Write the chain atomically to folder ``path`` with the label vocabulary it indexes."""
        vocab_ids = [str(v) for v in vocab_ids]
        if len(vocab_ids) != self.n_labels:
            raise IndexingError(
                f"save: `vocab_ids` has {len(vocab_ids)} ids but the chain indexes {self.n_labels} labels"
            )
        meta = {
            "len": len(self),
            "level_sizes": self.level_sizes,
            "n_labels": self.n_labels,
            "n_clusters": self.n_clusters,
            "vocab_sha256": _vocab_hash(vocab_ids),
            "settings": settings or {},
        }
        with atomic_dir(path) as tmp:
            for i, m in enumerate(self._chain):
                save_csr(m, tmp / f"C{i}.npz")
            save_json(vocab_ids, tmp / LABEL_IDS)
            save_json(meta, tmp / CHAIN_META)

    @classmethod
    def load(cls, path: str | os.PathLike, vocab_ids: Sequence[str] | None = None) -> ClusterChain:
        """Read a chain written by :meth:`save`; check its label vocabulary against ``vocab_ids``."""
        path = Path(path)
        if not is_complete(path):
            raise IndexingError(f"{path}: not a complete ClusterChain folder (missing or half-written)")
        meta = load_json(path / CHAIN_META)
        chain = cls([load_csr(path / f"C{i}.npz") for i in range(int(meta["len"]))])
        if vocab_ids is not None:
            check_vocab(load_json(path / LABEL_IDS), [str(v) for v in vocab_ids], path)
        return chain

    @staticmethod
    def load_settings(path: str | os.PathLike) -> dict[str, Any]:
        """The ``settings`` dict saved with a chain."""
        return dict(load_json(Path(path) / CHAIN_META)["settings"])


def codes_to_csr(codes: np.ndarray, n_cols: int) -> sp.csr_matrix:
    """One-hot ``len(codes) x n_cols`` csr float32 matrix with a 1 at ``(i, codes[i])``."""
    n = len(codes)
    return sp.csr_matrix(
        (np.ones(n, dtype=np.float32), np.asarray(codes, dtype=np.int32), np.arange(n + 1, dtype=np.int64)),
        shape=(n, n_cols),
    )


def check_vocab(saved: Sequence[str], given: Sequence[str], where: str | os.PathLike) -> None:
    """Raise naming the first difference when two label vocabularies are not identical."""
    detail = vocab_difference(saved, given)
    if detail is not None:
        raise IndexingError(f"{where}: saved label vocabulary differs from `vocab_ids` (saved vs given: {detail})")


def _vocab_hash(ids: Sequence[str]) -> str:
    return hashlib.sha256(json.dumps(list(ids)).encode()).hexdigest()


def _as_clean_csr(m: Any, name: str) -> sp.csr_matrix:
    if not sp.issparse(m) or m.ndim != 2:
        raise IndexingError(f"ClusterChain: {name} must be a 2-D scipy sparse matrix, got {type(m).__name__}")
    out = sp.csr_matrix(m, dtype=np.float32, copy=True)
    out.sum_duplicates()
    out.eliminate_zeros()
    out.sort_indices()
    if out.nnz and not np.all(np.isfinite(out.data)):
        raise IndexingError(f"ClusterChain: {name} has non-finite values")
    return out


def _validate_chain(mats: list[sp.csr_matrix]) -> None:
    if mats[0].shape[1] != 1:
        raise IndexingError(f"ClusterChain: chain[0] must be K_1 x 1 (children of the root), got {mats[0].shape}")
    for i, m in enumerate(mats):
        if i > 0 and m.shape[1] != mats[i - 1].shape[0]:
            raise IndexingError(
                f"ClusterChain: chain[{i}] has {m.shape[1]} columns but chain[{i - 1}] has {mats[i - 1].shape[0]} rows"
            )
        empty_rows = np.flatnonzero(np.diff(m.indptr) == 0)
        if empty_rows.size:
            raise IndexingError(
                f"ClusterChain: chain[{i}] row {empty_rows[0]} has no parent ({empty_rows.size} such rows)"
            )
        empty_cols = np.flatnonzero(np.bincount(m.indices, minlength=m.shape[1]) == 0)
        if empty_cols.size:
            raise IndexingError(
                f"ClusterChain: chain[{i}] column {empty_cols[0]} has no child ({empty_cols.size} such)"
            )


def _compose(mats: Sequence[sp.csr_matrix]) -> sp.csr_matrix:
    """Binarised product ``mats[-1] @ ... @ mats[0]``: maps the last level straight to the first."""
    out = mats[-1]
    for m in reversed(mats[:-1]):
        out = out @ m
    out = sp.csr_matrix(out, dtype=np.float32)
    out.data[:] = 1.0
    out.sort_indices()
    return out
