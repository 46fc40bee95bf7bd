"""Hierarchical balanced spherical k-means over label representations (PECOS / Parabel style).

The tree shape is fixed before any clustering, from ``L``, ``K`` and ``B`` alone:

* leaf ``j`` (of ``K``) holds labels ``[floor(j L / K), floor((j+1) L / K))`` of the final order, so
  leaf sizes differ by at most one;
* a node covering ``k`` leaves has ``min(B, k)`` children covering ``k // m`` or ``k // m + 1``
  leaves (larger first); a node with one leaf passes straight through to the next level.

When ``K`` is a power of ``B`` this is the usual complete tree and every split is balanced to
within one label. Otherwise the tree is still ``ceil(log_B K)`` levels deep with exactly ``K``
leaves, some splits are uneven (child sizes proportional to their leaf counts, e.g. ``K = 3``,
``B = 2``: the root splits 2/3 : 1/3) and some nodes have a single child.

Each split is balanced spherical k-means on the node's labels with the child sizes as hard
capacities: centroids are the l2-normalised sums of their labels; labels are assigned by ranking
them on ``score_b - max_{b' > b} score_{b'}`` and giving child ``b`` its quota of best-ranked
labels (``B = 2``: sort on ``<x, c_0 - c_1>`` and cut at the size of child 0, as PECOS does). A
node stops when its assignment no longer changes, or after ``max_iter`` assignments (the seeded
one included); the first centroids are distinct random labels of the node. Ties keep the previous
order, so a seed gives the same tree for any thread count. All nodes of a level are split by one
compiled kernel (see :mod:`kmeans_level`); an iteration costs about one pass over a node's nonzeros
for ``B = 2`` and ``B`` passes otherwise, so a 16-way tree is slower to build than a binary one:
for PECOS-style 16-ary chains, cluster with ``B = 2`` and call :meth:`ClusterChain.subsample`.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from xtransformer.indexing.chain import ClusterChain, codes_to_csr
from xtransformer.indexing.errors import IndexingError
from xtransformer.indexing.kmeans_level import children_order, node_seeds, split_level
from xtransformer.utils.hardware import available_cpus
from xtransformer.utils.rows import row_sq_norms

log = logging.getLogger(__name__)

# Rows whose l2 norm is off by more than this are renormalised (on a copy).
_NORM_TOL = 1e-3


def default_n_clusters(n_labels: int) -> int:
    """The paper's / Parabel's rule: ``2 ** (int(log2(L // 100 + 1)) + 1)`` (Eurlex-4K: 64, Wiki-500K: 8192)."""
    return 2 ** (int(math.log2(n_labels // 100 + 1)) + 1)


def resolve_n_clusters(n_labels: int, n_clusters: int | None, max_leaf_size: int | None) -> int:
    """``K`` from exactly one of ``n_clusters`` / ``max_leaf_size``, else :func:`default_n_clusters`.

    ``max_leaf_size`` follows PECOS: the smallest power of two whose leaves hold at most that many
    labels, whatever ``branching`` (4,271 labels, 100 -> 64; a 16-way tree then has 16 x 4 leaves),
    and a single leaf (no clustering: one flat level of labels) when all labels fit in one.
    """
    if n_clusters is not None and max_leaf_size is not None:
        raise IndexingError("set at most one of `n_clusters` and `max_leaf_size`")
    if max_leaf_size is not None:
        if not _is_int(max_leaf_size) or max_leaf_size < 1:
            raise IndexingError(f"`max_leaf_size` must be an int >= 1, got {max_leaf_size!r}")
        if max_leaf_size >= n_labels:
            return 1
        k = 2
        while k * max_leaf_size < n_labels:
            k *= 2
        if k > n_labels:
            raise IndexingError(
                f"`max_leaf_size`={max_leaf_size} needs {k} clusters but there are only {n_labels} labels"
            )
        return k
    k = default_n_clusters(n_labels) if n_clusters is None else n_clusters
    if not _is_int(k) or k < 2:
        raise IndexingError(f"`n_clusters` must be an int >= 2, got {k!r}")
    if k > n_labels >= 2:
        # A setting tuned for one data set (the default run's 16) meets a smaller one: one label a
        # cluster is what that K asks for at most, so the run goes on instead of failing.
        _warn_clamped(int(k), n_labels)
        return n_labels
    if k > n_labels:
        raise IndexingError(f"`n_clusters`={k} exceeds the number of labels ({n_labels})")
    return int(k)


@functools.cache
def _warn_clamped(k: int, n_labels: int) -> None:
    """Once per process: the run checks K up front and again in each stage that builds a tree."""
    log.warning(
        "n_clusters=%d is more than the %d labels: using %d clusters of one label each "
        "(set indexing.n_clusters, or xrlinear.indexing.n_clusters, to at most %d to silence this)",
        k,
        n_labels,
        n_labels,
        n_labels,
    )


@dataclass(frozen=True)
class TreeLevel:
    """Nodes of one tree level: leaf range ``[leaf_lo, leaf_hi)`` and parent index per node."""

    leaf_lo: np.ndarray
    leaf_hi: np.ndarray
    parent: np.ndarray  # index into the previous level (all zeros for the root's children)

    @property
    def n_nodes(self) -> int:
        return len(self.leaf_lo)


def tree_levels(n_labels: int, n_clusters: int, branching: int) -> list[TreeLevel]:
    """Levels ``0`` (root) .. ``D`` (the ``K`` leaves) of the tree shape described in the module doc."""
    levels = [TreeLevel(np.array([0]), np.array([n_clusters]), np.array([0]))]
    while levels[-1].n_nodes < n_clusters:
        lo, hi = levels[-1].leaf_lo, levels[-1].leaf_hi
        k = hi - lo
        m = np.minimum(branching, k)
        parent = np.repeat(np.arange(len(k)), m)
        j = np.arange(len(parent)) - np.repeat(np.cumsum(m) - m, m)  # child index within its parent
        count = k[parent] // m[parent] + (j < k[parent] % m[parent])
        child_hi = np.cumsum(count)
        levels.append(TreeLevel(child_hi - count, child_hi, parent))
    return levels


def label_bound(leaf: np.ndarray, n_labels: int, n_clusters: int) -> np.ndarray:
    """First label position of leaf ``leaf`` (``leaf == K`` gives ``L``)."""
    return np.asarray(leaf, dtype=np.int64) * n_labels // n_clusters


def hierarchical_kmeans(
    features: sp.csr_matrix | np.ndarray,
    n_clusters: int | None = None,
    max_leaf_size: int | None = None,
    branching: int = 2,
    max_iter: int = 20,
    seed: int = 0,
    threads: int | None = None,
) -> ClusterChain:
    """Cluster ``L`` labels (rows of ``features``, ``L x D``) into a balanced ``B``-ary tree with ``K`` leaves.

    Args:
        features: csr or dense ``L x D``; rows should be l2-normalised (others are normalised on a
            copy). All-zero rows are allowed: they have no preference and fill whatever room is
            left, so they tend to share a few leaves (as in PECOS); ``label_representation``
            gives labels without positives a donor row by default to avoid that.
        n_clusters / max_leaf_size: ``K`` directly, or through a leaf size (see
            :func:`resolve_n_clusters`); neither gives :func:`default_n_clusters`.
        branching: children per split ``B`` (>= 2).
        max_iter: assignments per split, the seeded one included (PECOS's ``kmeans_max_iter``).
        seed: seeds the choice of initial centroids; the result depends on nothing else.
        threads: worker threads (default: the CPUs available to this process).

    Returns:
        A :class:`ClusterChain` with one matrix per level (``[K_1 x 1, ..., L x K]``).
    """
    X = _check_features(features)
    n_labels = X.shape[0]
    if not _is_int(branching) or branching < 2:
        raise IndexingError(f"`branching` must be an int >= 2, got {branching!r}")
    if not _is_int(max_iter) or max_iter < 1:
        raise IndexingError(f"`max_iter` must be an int >= 1, got {max_iter!r}")
    n_threads = resolve_threads(threads)
    k = resolve_n_clusters(n_labels, n_clusters, max_leaf_size)
    if k == 1:  # every label fits one leaf: the flat chain [L x 1] (PECOS's rule)
        return ClusterChain([sp.csr_matrix(np.ones((n_labels, 1), dtype=np.float32))])
    levels = tree_levels(n_labels, k, branching)
    rng = np.random.default_rng(seed)
    perm = np.arange(n_labels)
    X = X if sp.issparse(X) else sp.csr_matrix(X)  # dense rows (embeddings) take the same kernel
    run = _Splitting(X, k, branching, rng, max_iter, n_threads)
    for parent_level, child_level in zip(levels[:-1], levels[1:]):
        perm = _split_level(run, perm, parent_level, child_level)
    codes = np.empty(n_labels, dtype=np.int64)
    codes[perm] = np.repeat(np.arange(k), np.diff(label_bound(np.arange(k + 1), n_labels, k)))
    mats = [codes_to_csr(lvl.parent, prev.n_nodes) for prev, lvl in zip(levels[:-1], levels[1:])]
    return ClusterChain(mats + [codes_to_csr(codes, k)])


@dataclass
class _Splitting:
    """What every level's split shares: the label rows, the tree's shape, the random stream."""

    X: sp.csr_matrix
    n_clusters: int
    branching: int
    rng: np.random.Generator
    max_iter: int
    threads: int


def _split_level(run: _Splitting, perm: np.ndarray, parents: TreeLevel, children: TreeLevel) -> np.ndarray:
    """Split every node of ``parents`` into its children; return the new label order."""
    X, n_clusters, branching, rng = run.X, run.n_clusters, run.branching, run.rng
    n_labels = len(perm)
    n_child = np.bincount(children.parent, minlength=parents.n_nodes)
    splitting = np.flatnonzero(n_child >= 2)
    if splitting.size == 0:
        return perm
    start = label_bound(parents.leaf_lo[splitting], n_labels, n_clusters)
    size = label_bound(parents.leaf_hi[splitting], n_labels, n_clusters) - start
    node = np.repeat(np.arange(len(splitting)), size)
    pos = np.repeat(start - np.cumsum(size) + size, size) + np.arange(len(node))
    # Child quotas: caps[node, j] = labels of child j (0 beyond the node's own children).
    compact = np.full(parents.n_nodes, -1)
    compact[splitting] = np.arange(len(splitting))
    child_node = compact[children.parent]
    child_size = np.diff(label_bound(np.stack([children.leaf_lo, children.leaf_hi]), n_labels, n_clusters), axis=0)[0]
    first_child = np.cumsum(n_child) - n_child
    j = np.arange(children.n_nodes) - first_child[children.parent]
    caps = np.zeros((len(splitting), branching), dtype=np.int64)
    sel = child_node >= 0
    caps[child_node[sel], j[sel]] = child_size[sel]

    # Seeds: the rows of the n_children highest random keys within each node, one per child.
    node_start = np.searchsorted(node, np.arange(len(splitting) + 1))
    seeds = node_seeds(rng.random(len(node)), node_start, branching)
    labels = perm[pos]
    t0 = time.perf_counter()
    assign, n_iter = split_level(X, labels, node_start, caps, seeds, run.max_iter, run.threads)
    log.debug(
        "level with %d splitting nodes, %d labels: at most %d iterations, %.2fs",
        len(splitting),
        len(labels),
        int(n_iter.max()),
        time.perf_counter() - t0,
    )
    new_perm = perm.copy()
    new_perm[pos] = labels[children_order(node_start, assign, branching)]
    return new_perm


def _check_features(features: sp.spmatrix | np.ndarray) -> sp.csr_matrix | np.ndarray:
    """Validate ``features`` and return float32 csr/ndarray with unit (or zero) rows."""
    if sp.issparse(features):
        # Canonical order is not needed (and sorting costs seconds on big PIFA); scipy never
        # produces duplicate entries, so stored values are taken as they are.
        X = sp.csr_matrix(features, dtype=np.float32)
        data = X.data
        sq = row_sq_norms(X)
    elif isinstance(features, np.ndarray):
        if features.ndim != 2:
            raise IndexingError(f"`features` must be 2-D (labels x dims), got shape {features.shape}")
        X = np.ascontiguousarray(features, dtype=np.float32)
        data = X.reshape(-1)
        sq = np.einsum("ij,ij->i", X, X, dtype=np.float64)
    else:
        raise IndexingError(f"`features` must be a scipy sparse matrix or numpy array, got {type(features).__name__}")
    if X.shape[0] < 2:
        raise IndexingError(f"`features` needs at least 2 labels (rows), got {X.shape[0]}")
    if not np.all(np.isfinite(data)):
        raise IndexingError("`features` has NaN or infinite values")
    nonzero = sq > 0
    if not nonzero.any():
        raise IndexingError("`features` is empty: every label representation is all-zero")
    norms = np.sqrt(sq[nonzero])
    if np.abs(norms - 1.0).max() > _NORM_TOL:
        log.info("hierarchical_kmeans: l2-normalising %d label rows", int(nonzero.sum()))
        scale = np.ones(X.shape[0])
        scale[nonzero] = 1.0 / norms
        scale = scale.astype(np.float32)
        X = (sp.diags(scale) @ X).tocsr() if sp.issparse(X) else X * scale[:, None]
    return X


def resolve_threads(threads: int | None) -> int:
    """``threads`` as a count (``None``: the CPUs available to this process)."""
    if threads is None:
        return available_cpus()
    if not _is_int(threads) or threads < 1:
        raise IndexingError(f"`threads` must be an int >= 1 or None, got {threads!r}")
    return int(threads)


def _is_int(v: object) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)
