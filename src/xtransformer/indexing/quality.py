"""How good is a label clustering? Figures against a random balanced clustering, and plots.

* ``centroid_cosine``: mean cosine of each label to its leaf centroid. For unit rows the cosines
  in cluster ``k`` sum to ``||sum_{l in k} x_l||``, so this needs only the cluster sums.
* ``group_purity``: share of labels in their cluster's majority group (given a label grouping).
* ``cooccurrence_purity``: share of a document's label pairs that fall in one cluster (micro
  average over training documents) -- what the matcher and TFN negatives care about.

Each figure is reported beside the same figure for a random assignment with the same cluster
sizes. The plots redraw the paper's Figure 1: the long tail of label frequencies and the
distribution of training instances per cluster.

With overlap (a label in several leaf clusters, ``disentangle.py``) the figures are taken over
the (label, cluster) pairs, each pair a row standing for its label, and the report adds how many
labels sit in several clusters and the mean number of clusters a label.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from xtransformer.indexing.chain import ClusterChain, codes_to_csr
from xtransformer.indexing.errors import IndexingError
from xtransformer.utils.io import atomic_path

# Figure 1's threshold: a label / cluster with more than this many training instances is "head".
HEAD_THRESHOLD = 100
# Cluster sums go to a dense K x D grid up to this many cells, else to (cluster, feature) pairs.
_GRID_CELLS = 1 << 25
_BLOCK_NNZ = 1 << 21  # label nonzeros summed into cluster sums at once (cluster_sum_sq)


def random_balanced_codes(cluster_sizes: np.ndarray, seed: int = 0) -> np.ndarray:
    """A random assignment of ``sum(cluster_sizes)`` labels with exactly these cluster sizes."""
    sizes = np.asarray(cluster_sizes, dtype=np.int64)
    codes = np.repeat(np.arange(len(sizes)), sizes)
    return np.random.default_rng(seed).permutation(codes)


def centroid_cosine(features: sp.spmatrix | np.ndarray, codes: np.ndarray) -> float:
    """Mean cosine of each (non-zero) label representation to its cluster centroid."""
    codes = _check_codes(codes, features.shape[0], "features")
    scale, n_nonzero = _unit_scale(features)
    return float(np.sqrt(cluster_sum_sq(features, codes, scale)).sum() / max(n_nonzero, 1))


def cluster_sum_sq(X: sp.spmatrix | np.ndarray, codes: np.ndarray, scale: np.ndarray | None = None) -> np.ndarray:
    """``||sum_{l in k} s_l x_l||^2`` for every cluster ``k`` (``scale`` s: one factor a row, None: 1),
    in O(nnz) (no ``K x D`` product), about :data:`_BLOCK_NNZ` label nonzeros at a time: the pass
    holds some 30 bytes a nonzero of one block, not of every label (EURLEX57K's PIFA rows, scaled to
    unit length: 0.6 GiB at once). Every sum adds its terms in the labels' order, whatever the
    blocks, so the figures do not depend on them."""
    k = int(codes.max()) + 1
    if not sp.issparse(X):
        sums = codes_to_csr(codes, k).T @ (X if scale is None else X * scale[:, None])
        return np.einsum("ij,ij->i", sums, sums, dtype=np.float64)
    X = sp.csr_matrix(X)
    if k * X.shape[1] <= _GRID_CELLS:  # sum into a dense K x D grid
        sums = np.zeros(k * X.shape[1])
        for lo, hi in _row_blocks(np.diff(X.indptr)):
            part = X[lo:hi]
            cells = np.repeat(codes[lo:hi], np.diff(part.indptr)) * X.shape[1] + part.indices
            np.add.at(sums, cells, _scaled(part, scale, lo))  # in order, as one bincount would add
        return np.einsum("ij,ij->i", sums.reshape(k, -1), sums.reshape(k, -1))
    out = np.zeros(k)  # else only the (cluster, feature) pairs that occur, a block of clusters at a time
    for lo, hi in _cluster_blocks(codes, np.diff(X.indptr), k):
        rows = np.flatnonzero((codes >= lo) & (codes < hi))
        part = X[rows]
        weights = _scaled(part, None if scale is None else scale[rows], 0)
        out[lo:hi] = _pair_sum_sq(part, weights, codes[rows] - lo, hi - lo)
    return out


def _scaled(part: sp.csr_matrix, scale: np.ndarray | None, first: int) -> np.ndarray:
    """``part``'s values in float64, each times its row's factor (``scale[first + row]``)."""
    data = part.data.astype(np.float64)
    if scale is not None:
        data *= np.repeat(scale[first : first + part.shape[0]], np.diff(part.indptr))
    return data


def _row_blocks(row_nnz: np.ndarray) -> list[tuple[int, int]]:
    """Consecutive row ranges ``[lo, hi)`` of about :data:`_BLOCK_NNZ` nonzeros each."""
    block = ((np.cumsum(row_nnz) - row_nnz) // _BLOCK_NNZ).astype(np.int64)  # by the nonzeros before it
    bounds = np.r_[0, np.flatnonzero(np.diff(block)) + 1, len(row_nnz)]
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def _cluster_blocks(codes: np.ndarray, row_nnz: np.ndarray, k: int) -> list[tuple[int, int]]:
    """Consecutive cluster ranges ``[lo, hi)`` of about :data:`_BLOCK_NNZ` nonzeros each."""
    return _row_blocks(np.bincount(codes, weights=row_nnz, minlength=k).astype(np.int64))


def _pair_sum_sq(X: sp.csr_matrix, weights: np.ndarray, codes: np.ndarray, k: int) -> np.ndarray:
    """:func:`cluster_sum_sq` of ``k`` clusters whose labels are the rows of ``X`` (``codes``: 0..k-1;
    ``weights``: its values, scaled)."""
    pair, pair_code = number_pairs(np.repeat(codes, np.diff(X.indptr)), X.indices, X.shape[1])
    sums = np.bincount(pair, weights=weights, minlength=len(pair_code))
    return np.bincount(pair_code, weights=sums**2, minlength=k)


def group_purity(codes: np.ndarray, groups: np.ndarray) -> float:
    """Share of labels that belong to the most common group of their cluster."""
    groups = np.asarray(groups)
    codes = _check_codes(codes, len(groups), "groups")
    _, g = np.unique(groups, return_inverse=True)
    table = sp.csr_matrix((np.ones(len(codes)), (codes, g)))
    return float(table.max(axis=1).toarray().sum() / len(codes))


def cooccurrence_purity(Y: sp.spmatrix, codes: np.ndarray) -> float:
    """Share of (document, label pair) co-occurrences whose two labels share a cluster."""
    Y = sp.csr_matrix(Y)
    codes = _check_codes(codes, Y.shape[1], "Y")
    Y.data[:] = 1.0
    M = (Y @ codes_to_csr(codes, int(codes.max()) + 1)).tocsr()
    shared = float((M.data * (M.data - 1) / 2).sum())
    n = np.diff(Y.indptr).astype(np.float64)
    total = float((n * (n - 1) / 2).sum())
    return shared / total if total > 0 else float("nan")


def cluster_quality(
    chain: ClusterChain,
    features: sp.spmatrix | np.ndarray | None = None,
    Y: sp.spmatrix | None = None,
    groups: np.ndarray | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Every figure that the given inputs allow, each with its random-balanced baseline."""
    codes = chain.leaf_codes
    rand = random_balanced_codes(chain.cluster_sizes, seed)
    sizes = chain.cluster_sizes
    out: dict[str, Any] = {
        "n_clusters": chain.n_clusters,
        "cluster_size_min": int(sizes.min()),
        "cluster_size_max": int(sizes.max()),
        **overlap_summary(chain.leaf_assignment),
    }
    Y_pairs = Y
    if not chain.is_hard:  # one row per (label, cluster) pair, standing for its label
        pair_label = chain.leaf_labels
        features = features[pair_label] if features is not None else None
        groups = np.asarray(groups)[pair_label] if groups is not None else None
        Y_pairs = sp.csc_matrix(Y)[:, pair_label] if Y is not None else None
    figures = {
        "centroid_cosine": (lambda c: centroid_cosine(features, c)) if features is not None else None,
        "group_purity": (lambda c: group_purity(c, groups)) if groups is not None else None,
        "cooccurrence_purity": (lambda c: cooccurrence_purity(Y_pairs, c)) if Y is not None else None,
    }
    for name, fn in figures.items():
        if fn is not None:
            out[name] = fn(codes)
            out[f"{name}_random"] = fn(rand)
    if Y is not None:
        inst = instances_per_cluster(Y, chain)
        out["clusters_with_gt100_instances"] = float((inst > HEAD_THRESHOLD).mean())
        out["clusters_without_instances"] = int((inst == 0).sum())
        out["labels_with_gt100_instances"] = float((label_frequencies(Y) > HEAD_THRESHOLD).mean())
    return out


def overlap_summary(C: sp.spmatrix) -> dict[str, Any]:
    """Labels in several leaf clusters of ``C`` (``L x K``), and the mean number of clusters a label."""
    per_label = np.diff(sp.csr_matrix(C).indptr)
    return {
        "labels_in_multiple_clusters": int((per_label > 1).sum()),
        "mean_clusters_per_label": round(float(per_label.mean()), 4),
    }


def label_frequencies(Y: sp.spmatrix) -> np.ndarray:
    """Training documents per label."""
    return np.diff(sp.csc_matrix(Y).indptr)


def instances_per_cluster(Y: sp.spmatrix, chain: ClusterChain) -> np.ndarray:
    """Training documents with at least one label in each leaf cluster (nonzeros of ``M = YC``)."""
    M = (sp.csr_matrix(Y) @ chain.leaf_assignment).tocsc()
    M.eliminate_zeros()
    return np.diff(M.indptr)


def save_quality_plots(out_dir: str | os.PathLike, Y: sp.spmatrix, chain: ClusterChain, title: str = "") -> list[Path]:
    """Write ``label_long_tail.png`` and ``cluster_distribution.png`` (the paper's Figure 1) to ``out_dir``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    paths = []
    freq = np.sort(label_frequencies(Y))[::-1]
    inst = np.sort(instances_per_cluster(Y, chain))[::-1]
    for name, counts, what in (
        ("label_long_tail.png", freq, "labels"),
        ("cluster_distribution.png", inst, "clusters"),
    ):
        fig, ax = plt.subplots(figsize=(6, 4))
        rank = np.arange(1, len(counts) + 1)
        head = counts > HEAD_THRESHOLD
        top = np.maximum(counts, 0.5)  # log axis: draw zero counts at the floor
        ax.fill_between(rank, top, 0.5, where=head, color="tab:cyan", step="mid", label=f"> {HEAD_THRESHOLD} instances")
        ax.fill_between(
            rank, top, 0.5, where=~head, color="tab:gray", step="mid", label=f"<= {HEAD_THRESHOLD} instances"
        )
        ax.set_yscale("log")
        ax.set_xlabel(f"{what} sorted by training instances")
        ax.set_ylabel("training instances")
        ax.set_title(f"{title} {len(counts)} {what}: {100 * head.mean():.1f}% with > {HEAD_THRESHOLD}".strip())
        ax.legend()
        fig.tight_layout()
        path = out_dir / name
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


def _check_codes(codes: np.ndarray, n: int, against: str) -> np.ndarray:
    codes = np.asarray(codes)
    if codes.ndim != 1 or len(codes) != n:
        raise IndexingError(f"`codes` must have one cluster per label ({n}, from `{against}`), got shape {codes.shape}")
    if not np.issubdtype(codes.dtype, np.integer) or (len(codes) and codes.min() < 0):
        raise IndexingError("`codes` must be non-negative integers")
    return codes.astype(np.int64)


def _row_sq(X: sp.spmatrix | np.ndarray) -> np.ndarray:
    if sp.issparse(X):
        X = sp.csr_matrix(X)
        sq = np.zeros(X.shape[0])
        rows = np.flatnonzero(np.diff(X.indptr))
        if rows.size:
            sq[rows] = np.add.reduceat(X.data * X.data, X.indptr[rows], dtype=np.float64)
        return sq
    return np.einsum("ij,ij->i", X, X, dtype=np.float64)


def _unit_scale(X: sp.spmatrix | np.ndarray) -> tuple[np.ndarray | None, int]:
    """The factor that gives each row of ``X`` unit length (None when they already have it; 0 for an
    empty row) and the number of non-zero rows."""
    sq = _row_sq(X)
    nonzero = sq > 0
    if not nonzero.any() or np.abs(np.sqrt(sq[nonzero]) - 1).max() < 1e-3:
        return None, int(nonzero.sum())
    return np.divide(1.0, np.sqrt(sq), out=np.zeros_like(sq), where=nonzero), int(nonzero.sum())


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
