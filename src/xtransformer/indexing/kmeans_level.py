"""Centroid and score kernels for one tree level of balanced k-means, all nodes at once.

A level holds the labels of several tree nodes, stored node after node. Node ``n`` splits into
``n_children[n] <= B`` children; ``assign(a)`` sets each row's child (``-1``: not counted, used
for seeding) and ``scores()`` returns the ``n_rows x B`` cosine of every row with the centroids
(l2-normalised label sums) of its own node's children. Neither loops over nodes or labels.

Sparse features: each nonzero of the level is re-indexed to a (node, feature) *cell*, giving a
matrix ``P`` (``n_rows x V``). Then one scipy mat-vec does a whole level's work:
``P.T @ onehot(a == b)`` sums every node's child-``b`` rows into its cells, and ``P @ S_b`` dots
every row with its own node's child-``b`` sum. Cells form the dense ``n_nodes x D`` grid while
that is no larger than the level's nonzeros; deeper levels number only the (node, feature)
pairs that occur, refining the parent level's cells in one linear pass, so memory stays
``O(nnz)``. Sums are updated from the rows that moved (few after the first iterations), the last
child's sum is the node total minus the others, and mat-vecs run in threads over row shards
fixed by size (results are identical for any ``threads``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import scipy.sparse as sp

# A level indexes cells on the full node x feature grid when that has no more cells than the
# level has nonzeros (within these bounds), else it numbers the (node, feature) pairs that occur.
_GRID_CELLS_MIN = 1 << 20
_GRID_CELLS_MAX = 1 << 26
# Nonzeros per row shard of the sparse mat-vecs (fixed, so sums never depend on thread count).
_SHARD_NNZ = 1 << 22
# Recompute the child sums from scratch when more than this fraction of rows moved.
_REFRESH_FRACTION = 0.25
# Rows per chunk for dense-feature scoring (bounds the gathered centroid block).
_DENSE_CHUNK_ROWS = 1 << 14


class Workers:
    """A thread pool that knows its size; ``map`` runs inline with one thread."""

    def __init__(self, n_threads: int):
        self.n_threads = max(1, int(n_threads))
        self._pool = ThreadPoolExecutor(self.n_threads) if self.n_threads > 1 else None

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Any]:
        return map(fn, items) if self._pool is None else self._pool.map(fn, items)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()

    def __enter__(self) -> "Workers":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LevelBackend(Protocol):
    n_rows: int

    def assign(self, a: np.ndarray) -> None: ...

    def scores(self) -> np.ndarray: ...

    def take(self, row_mask: np.ndarray, node_map: np.ndarray, n_children: np.ndarray) -> "LevelBackend": ...


@dataclass
class CellIndex:
    """How one level re-indexed its rows' nonzeros, for the next level to refine without a sort.

    ``P`` holds the level's rows (labels ``labels``, in level order) with cell indices;
    ``slot`` is each row's child within its node, which the next level turns into a node.
    """

    P: sp.csr_matrix
    labels: np.ndarray
    slot: np.ndarray
    grid_width: int | None

    def rows_of(self, labels: np.ndarray, n_labels: int) -> np.ndarray:
        row_of_label = np.full(n_labels, -1, dtype=np.int64)
        row_of_label[self.labels] = np.arange(len(self.labels))
        rows = row_of_label[labels]
        assert (rows >= 0).all(), "a splitting node's labels were all in a splitting parent"
        return rows


def make_backend(
    X: sp.csr_matrix | np.ndarray,
    labels: np.ndarray,
    node: np.ndarray,
    n_children: np.ndarray,
    branching: int,
    pool: Workers,
    prev: CellIndex | None = None,
) -> LevelBackend:
    """Backend for rows ``X[labels]`` (level order); row ``i`` belongs to node ``node[i]`` (sorted).

    ``prev``: the parent level's cells (sparse features), refined instead of renumbered.
    """
    if sp.issparse(X):
        return SparseLevel.build(X, labels, node, n_children, branching, pool, prev)
    return DenseLevel(X[labels], node, n_children, branching, pool)


def _inv_norms(sq: np.ndarray) -> np.ndarray:
    return np.divide(1.0, np.sqrt(sq), out=np.zeros_like(sq), where=sq > 0)


class SparseLevel:
    """Sparse rows as ``P`` (``n_rows x V``, nonzeros re-indexed to cells); keeps child sums ``S`` (``B`` x ``V``).

    Grid layout (``grid_width`` = ``D``): cell = ``node * D + feature``. Pair layout: cells are the
    (node, feature) pairs that occur, ``cell_node`` naming each one's node.
    """

    def __init__(
        self,
        P: sp.csr_matrix,
        node: np.ndarray,
        n_children: np.ndarray,
        branching: int,
        pool: Workers,
        grid_width: int | None,
        cell_node: np.ndarray | None = None,
    ):
        self.P, self.node = P, node
        self.n_children, self.n_nodes = n_children, len(n_children)
        self.branching, self.pool, self.grid_width = branching, pool, grid_width
        self.max_children = int(n_children.max()) if len(n_children) else 0
        self._cell_node = cell_node
        self.n_rows = P.shape[0]
        self.shards = _row_shards(P)
        self.a: np.ndarray | None = None
        self.S: list[np.ndarray] | None = None  # per child: its sums on every cell
        self._total: np.ndarray | None = None  # per-cell sum of all rows
        self._q_total: np.ndarray | None = None  # P @ total
        self._sq: np.ndarray | None = None  # n_nodes x M squared norms of S, kept up to date
        self._q: np.ndarray | None = None  # n_rows x M dots of rows with S, from the last scores()

    @classmethod
    def build(
        cls,
        X: sp.csr_matrix,
        labels: np.ndarray,
        node: np.ndarray,
        n_children: np.ndarray,
        branching: int,
        pool: Workers,
        prev: CellIndex | None = None,
    ) -> "SparseLevel":
        n_features, n_nodes = X.shape[1], len(n_children)
        nnz = int(np.diff(X.indptr)[labels].sum())
        grid = n_nodes * n_features <= min(max(nnz, _GRID_CELLS_MIN), _GRID_CELLS_MAX)
        if prev is not None and not (grid and prev.grid_width is not None):
            return cls._refine(X.shape[0], labels, node, n_children, branching, pool, prev)
        identity = len(labels) == X.shape[0] and bool((labels == np.arange(len(labels))).all())
        Xl = X if identity else X[labels]  # the root level uses the features as they are
        row_nnz = np.diff(Xl.indptr)
        if grid and n_nodes == 1:
            P = sp.csr_matrix((Xl.data, Xl.indices, Xl.indptr), shape=Xl.shape)
            return cls(P, node, n_children, branching, pool, n_features)
        if grid:
            cells = Xl.indices + np.repeat((node * n_features).astype(Xl.indices.dtype), row_nnz)
            P = sp.csr_matrix((Xl.data, cells, Xl.indptr), shape=(Xl.shape[0], n_nodes * n_features))
            return cls(P, node, n_children, branching, pool, n_features)
        cells, cell_node = number_pairs(np.repeat(node, row_nnz), Xl.indices, n_features)
        P = sp.csr_matrix((Xl.data, cells, Xl.indptr), shape=(Xl.shape[0], len(cell_node)))
        return cls(P, node, n_children, branching, pool, None, cell_node)

    @classmethod
    def _refine(
        cls, n_labels: int, labels: np.ndarray, node: np.ndarray, n_children: np.ndarray, branching: int,
        pool: Workers, prev: CellIndex,
    ) -> "SparseLevel":
        """Pair layout from the parent level's cells: (parent cell, child slot) is (child node,
        feature), so marking the combinations that occur numbers the pairs in one linear pass."""
        rows = prev.rows_of(labels, n_labels)
        sub = prev.P[rows]
        row_nnz = np.diff(sub.indptr)
        key = sub.indices.astype(np.int64) * branching + np.repeat(prev.slot[rows], row_nnz)
        present = np.zeros(prev.P.shape[1] * branching, dtype=bool)
        present[key] = True
        dtype = np.int32 if len(present) < np.iinfo(np.int32).max else np.int64
        ids = np.cumsum(present, dtype=dtype)
        cells = ids[key] - 1
        n_cells = int(ids[-1]) if len(ids) else 0
        cell_node = np.empty(n_cells, dtype=np.int64)
        cell_node[cells] = np.repeat(node, row_nnz)
        empty = sp.csr_matrix((len(labels), n_cells), dtype=sub.dtype)
        P = _with_arrays(empty, sub.data, cells.astype(sub.indices.dtype), sub.indptr)
        return cls(P, node, n_children, branching, pool, None, cell_node)

    def cell_index(self, labels: np.ndarray, slot: np.ndarray) -> CellIndex:
        return CellIndex(self.P, labels, slot, self.grid_width)

    @property
    def cell_node(self) -> np.ndarray:
        if self._cell_node is None:  # grid layout
            self._cell_node = np.repeat(np.arange(self.n_nodes), self.grid_width)
        return self._cell_node

    # ------------------------------------------------------------------ assignment -> sums
    def assign(self, a: np.ndarray) -> None:
        M = self.max_children
        a = np.asarray(a, dtype=np.int64)
        partial = bool((a < 0).any())
        moved = None if self.a is None or partial or (self.a < 0).any() else np.flatnonzero(a != self.a)
        if partial:  # seeding: sums of the few counted rows only
            self.S = [_transpose(self.P[a == b]) @ np.ones(int((a == b).sum()), np.float32) for b in range(M)]
            self._sq = self._q = None
        elif moved is None or len(moved) > _REFRESH_FRACTION * self.n_rows:
            sums = [self._rmatvec((a == b).astype(np.float32)) for b in range(M - 1)]
            last = self.total.copy()  # last child: node total minus the others
            for v in sums:
                last -= v
            self.S = sums + [last]
            self._sq = self._q = None
        elif len(moved):  # move the few rows that changed child
            sub = self.P[moved]
            if self._q is None or sub.nnz * 16 >= self.P.shape[1]:
                self._sq = None  # many cells touched: recomputing the norms is as cheap
            for b in range(M):
                w = (a[moved] == b).astype(np.float32) - (self.a[moved] == b)
                if w.any():
                    if self._sq is not None:
                        # |S + d|^2 = |S|^2 + 2 S.d + |d|^2, with S.d = sum_r w_r (x_r . S) from the last scores
                        dots = np.bincount(self.node[moved], weights=w * self._q[moved, b], minlength=self.n_nodes)
                        self._sq[:, b] = np.maximum(self._sq[:, b] + 2 * dots + self._delta_sq(sub, w), 0)
                    _scatter_add(self.S[b], sub, w)
            self._q = None
        self.a = a

    def _delta_sq(self, sub: sp.csr_matrix, w: np.ndarray) -> np.ndarray:
        """Per-node ``|sub.T @ w|^2`` over the few cells the moved rows touch."""
        cells, inverse = np.unique(sub.indices, return_inverse=True)
        d = np.bincount(inverse, weights=sub.data * np.repeat(w, np.diff(sub.indptr)), minlength=len(cells))
        owner = cells // self.grid_width if self.grid_width is not None else self._cell_node[cells]
        return np.bincount(owner, weights=d * d, minlength=self.n_nodes)

    @property
    def total(self) -> np.ndarray:
        if self._total is None:
            self._total = self._rmatvec(np.ones(self.n_rows, dtype=np.float32))
        return self._total

    # ------------------------------------------------------------------ sums -> scores
    def scores(self) -> np.ndarray:
        """``n_rows x B`` cosines to the node's child centroids, up to a per-row shift (which the
        balanced assignment ignores): exact once every row is assigned, else relative to each
        node's last child. ``M - 1`` mat-vecs either way, ``M`` = most children of any node."""
        assert self.S is not None and self.a is not None, "assign() first"
        M = self.max_children
        out = np.zeros((self.n_rows, self.branching), dtype=np.float32)
        if self._sq is None:
            self._sq = np.stack([self._node_sq(self.S[b]) for b in range(M)], axis=1)
        inv = _inv_norms(self._sq).astype(np.float32)
        if (self.a < 0).any():  # seeding: score c_b - c_last with normalised centroids
            cent = [self._per_cell_scale(self.S[b], inv[:, b]) for b in range(M)]
            last = cent[1] if M == 2 else np.stack(cent)[self._per_cell(self.n_children - 1), np.arange(len(cent[0]))]
            for b in range(M - 1):
                out[:, b] = self._matvec(cent[b] - last)
            return out
        q = [self._matvec(self.S[b]) for b in range(M - 1)]
        if self._q_total is None:
            self._q_total = self._matvec(self.total)
        q.append(self._q_total - np.sum(q, axis=0))  # rows dot the last child's sum: total - the others
        self._q = np.stack(q, axis=1)
        out[:, :M] = self._q * inv[self.node]
        return out

    def _per_cell(self, per_node: np.ndarray) -> np.ndarray:
        if self.grid_width is not None:
            return np.repeat(per_node, self.grid_width)
        return per_node[self.cell_node]

    def _per_cell_scale(self, v: np.ndarray, per_node: np.ndarray) -> np.ndarray:
        if self.grid_width is not None:
            return (v.reshape(self.n_nodes, self.grid_width) * per_node[:, None]).ravel()
        return v * per_node[self.cell_node]

    def _node_sq(self, v: np.ndarray) -> np.ndarray:
        """Per-node sum of squares of a per-cell vector (float64)."""
        if self.grid_width is not None:
            g = v.reshape(self.n_nodes, self.grid_width)
            return np.einsum("ij,ij->i", g, g, dtype=np.float64)
        return np.bincount(self.cell_node, weights=v.astype(np.float64) ** 2, minlength=self.n_nodes)

    # ------------------------------------------------------------------ threaded mat-vecs
    def _matvec(self, v: np.ndarray) -> np.ndarray:
        return np.concatenate(list(self.pool.map(lambda m: m @ v, self.shards)))

    def _rmatvec(self, w: np.ndarray) -> np.ndarray:
        bounds = np.cumsum([0] + [m.shape[0] for m in self.shards])
        parts = self.pool.map(
            lambda i: _transpose(self.shards[i]) @ w[bounds[i] : bounds[i + 1]], range(len(self.shards))
        )
        out = None
        for part in parts:  # fixed order: same float result for any thread count
            out = part if out is None else out + part
        return out

    # ------------------------------------------------------------------ dropping converged nodes
    def take(self, row_mask: np.ndarray, node_map: np.ndarray, n_children: np.ndarray) -> "SparseLevel":
        """Keep rows ``row_mask`` (whole nodes; ``node_map`` renumbers kept nodes, -1: dropped).

        Kept cells are renumbered in place of the kept rows' indices (grid: a shift per row;
        pairs: a remap) and the sums carry over, so this costs one gather of the kept rows.
        """
        rows = np.flatnonzero(row_mask)
        kept = node_map >= 0
        sub = self.P[rows]
        old_node = self.node[rows]
        if self.grid_width is not None:  # kept node blocks slide down: one shift per row
            D = self.grid_width
            shift = ((old_node - node_map[old_node]) * D).astype(sub.indices.dtype)
            sub.indices -= np.repeat(shift, np.diff(sub.indptr))
            n_cells, cell_node = int(kept.sum()) * D, None

            def keep(v: np.ndarray) -> np.ndarray:
                return v.reshape(self.n_nodes, D)[kept].ravel()
        else:
            keep_cell = kept[self._cell_node]
            remap = (np.cumsum(keep_cell, dtype=np.int64) - 1).astype(sub.indices.dtype)
            sub.indices = remap[sub.indices]
            n_cells, cell_node = int(keep_cell.sum()), node_map[self._cell_node[keep_cell]]

            def keep(v: np.ndarray) -> np.ndarray:
                return v[keep_cell]
        P = _with_arrays(sp.csr_matrix((len(rows), n_cells), dtype=sub.dtype), sub.data, sub.indices, sub.indptr)
        out = SparseLevel(P, node_map[old_node], n_children, self.branching, self.pool, self.grid_width, cell_node)
        M = out.max_children  # kept nodes may have fewer children: later sums are all zero there
        out.a = None if self.a is None else self.a[rows]
        out.S = None if self.S is None else [keep(v) for v in self.S[:M]]
        out._total = None if self._total is None else keep(self._total)
        out._q_total = None if self._q_total is None else self._q_total[rows]
        out._sq = None if self._sq is None else self._sq[kept, :M]
        out._q = None if self._q is None else self._q[rows, :M]
        return out


def _scatter_add(target: np.ndarray, sub: sp.csr_matrix, w: np.ndarray) -> None:
    """``target += sub.T @ w``; a scatter when ``sub`` is small next to ``target`` (no full-size temporary)."""
    if sub.nnz * 16 < len(target):
        np.add.at(target, sub.indices, sub.data * np.repeat(w, np.diff(sub.indptr)))
    else:
        target += _transpose(sub) @ w


def _with_arrays(empty: sp.spmatrix, data: np.ndarray, indices: np.ndarray, indptr: np.ndarray) -> sp.spmatrix:
    # Set the arrays directly: scipy's constructor copies views of a much larger array ("prune").
    empty.data, empty.indices, empty.indptr = data, indices, indptr
    return empty


def _transpose(m: sp.csr_matrix) -> sp.csc_matrix:
    """``m.T`` as a csc matrix on the same arrays (no copy, even when they are views)."""
    return _with_arrays(sp.csc_matrix(m.shape[::-1], dtype=m.dtype), m.data, m.indices, m.indptr)


def _row_shards(P: sp.csr_matrix) -> list[sp.csr_matrix]:
    """Row blocks of about ``_SHARD_NNZ`` nonzeros that share ``P``'s arrays."""
    n_shards = max(1, min(P.shape[0], -(-P.nnz // _SHARD_NNZ)))
    if n_shards == 1:
        return [P]
    cuts = np.searchsorted(P.indptr, np.linspace(0, P.nnz, n_shards + 1)[1:-1])
    bounds = np.unique(np.concatenate([[0], cuts, [P.shape[0]]]))
    out = []
    for r0, r1 in zip(bounds[:-1], bounds[1:]):
        i0, i1 = P.indptr[r0], P.indptr[r1]
        empty = sp.csr_matrix((r1 - r0, P.shape[1]), dtype=P.dtype)
        out.append(_with_arrays(empty, P.data[i0:i1], P.indices[i0:i1], P.indptr[r0 : r1 + 1] - i0))
    return out


def number_pairs(node_of_nnz: np.ndarray, cols: np.ndarray, n_cols: int) -> tuple[np.ndarray, np.ndarray]:
    """Number the (node, feature) pairs that occur, node-major; return each nonzero's pair and each pair's node.

    One sort of the ``node * n_cols + feature`` keys (equal keys get equal ids, so the sort need
    not be stable for the result to be deterministic).
    """
    key = node_of_nnz.astype(np.int64) * n_cols + cols
    order = np.argsort(key)
    sorted_key = key[order]
    first = np.empty(len(key), dtype=bool)
    first[:1] = True
    np.not_equal(sorted_key[1:], sorted_key[:-1], out=first[1:])
    dtype = np.int32 if len(key) < np.iinfo(np.int32).max else np.int64
    pair = np.empty(len(key), dtype=dtype)
    pair[order] = np.cumsum(first, dtype=dtype) - 1
    return pair, sorted_key[first] // n_cols


class DenseLevel:
    """Dense rows (``n_rows x H``); centroids as an ``(n_nodes * B) x H`` array, recomputed per assignment."""

    def __init__(self, X: np.ndarray, node: np.ndarray, n_children: np.ndarray, branching: int, pool: Workers):
        self.X, self.node, self.branching, self.pool = X, node, branching, pool
        self.n_children, self.n_nodes = n_children, len(n_children)
        self.n_rows = X.shape[0]
        self.chunks = [(i, min(i + _DENSE_CHUNK_ROWS, self.n_rows)) for i in range(0, self.n_rows, _DENSE_CHUNK_ROWS)]
        self.a: np.ndarray | None = None
        self.cent: np.ndarray | None = None

    def assign(self, a: np.ndarray) -> None:
        B = self.branching
        self.a = a = np.asarray(a, dtype=np.int64)
        keep = np.flatnonzero(a >= 0)
        target = self.node[keep].astype(np.int64) * B + a[keep]
        onehot = sp.csr_matrix(
            (np.ones(len(keep), dtype=np.float32), (target, keep)), shape=(self.n_nodes * B, self.n_rows)
        )
        cent = np.asarray(onehot @ self.X, dtype=np.float32)
        cent *= _inv_norms(np.einsum("ij,ij->i", cent, cent, dtype=np.float64)).astype(np.float32)[:, None]
        self.cent = cent

    def scores(self) -> np.ndarray:
        assert self.cent is not None, "assign() first"
        B, cent = self.branching, self.cent

        def part(chunk: tuple[int, int]) -> np.ndarray:
            r0, r1 = chunk
            x = self.X[r0:r1]
            base = self.node[r0:r1].astype(np.int64) * B
            return np.stack([np.einsum("ij,ij->i", x, cent[base + b]) for b in range(B)], axis=1)

        if self.n_rows == 0:
            return np.zeros((0, B), dtype=np.float32)
        return np.concatenate(list(self.pool.map(part, self.chunks)), axis=0)

    def take(self, row_mask: np.ndarray, node_map: np.ndarray, n_children: np.ndarray) -> "DenseLevel":
        out = DenseLevel(self.X[row_mask], node_map[self.node[row_mask]], n_children, self.branching, self.pool)
        if self.a is not None:
            out.assign(self.a[row_mask])
        return out
