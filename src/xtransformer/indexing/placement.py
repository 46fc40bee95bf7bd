"""Where a label added to a trained tree goes: the leaf clusters nearest it, or those its documents reach.

Two rules (``Placing.by``). ``centroid``: the leaves whose centroids are nearest the
label in the representation the tree was indexed with: a label's PIFA row (the unit sum of its
documents' features, ``representations.pifa``) and a leaf's centroid (the unit sum of the PIFA rows
of the old labels in it), both computed from the documents given. A leaf none of whose labels
occurs in the documents has no centroid; a new label nothing can be compared with (no old label in
the documents, or no feature shared) goes where the model routes its documents. ``routes``: the
leaves the trained model's beam reaches most often from the new label's documents (the upper levels
stay frozen: a leaf the beam does not reach from a document can never rank the label for it); ties
go to the nearer centroid.

A new label sits in ``Placing.leaves`` leaves (default: two, or the tree's λ where it is larger),
each with its own weights, merged as a disentangled label's copies are. Without a rule a method
uses its own (``XMCModel.default_placement``). On EURLEX57K, held-out training documents chose, as
the fewest leaves within 0.3 of a model trained with the labels from the start on P@1, P@5 and
nDCG@5, then routes (``experiments/label_growth``): one leaf by routes for XR-Linear and for
XR-Transformer's final model (``XMCModel.default_leaves``), their new labels trained against every
document and scored without the path above their leaf (the tree models' ``added_negatives`` and
``added_reach``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from xtransformer.indexing.errors import IndexingError
from xtransformer.indexing.representations import _weighted_Y, pifa
from xtransformer.indexing.sparse_sums import leaf_centroids
from xtransformer.ranker.config import ADDED_NEGATIVES
from xtransformer.ranker.negatives import binarize
from xtransformer.utils.rows import dense_f32

PLACEMENTS = ("centroid", "routes")
DEFAULT_LEAVES = 2
_DENSE_BYTES = 64 << 20  # a block of centroids taken dense to compare the new labels with


@dataclass(frozen=True)
class Placing:
    """How new labels are placed and trained: ``by`` one of ``PLACEMENTS`` (None: the method's own,
    see :meth:`resolved`); ``leaves`` per new label (None: the method's ``usual_leaves``, else
    ``DEFAULT_LEAVES``, or the tree's λ where it is larger, at most the tree's leaves); ``negatives``
    what a tree model's new labels train against (``leaf`` | ``all``, None: its ``added_negatives``).
    Checked when made (one line)."""

    by: str | None = None
    leaves: int | None = None
    usual_leaves: int | None = None  # the method's default: unlike ``leaves``, cut to a smaller tree
    negatives: str | None = None

    def __post_init__(self) -> None:
        if self.by is not None and self.by not in PLACEMENTS:
            raise IndexingError(f"placement must be one of {', '.join(PLACEMENTS)}, got {self.by!r}")
        if self.negatives is not None and self.negatives not in ADDED_NEGATIVES:
            raise IndexingError(f"negatives must be one of {', '.join(ADDED_NEGATIVES)}, got {self.negatives!r}")
        if self.leaves is not None and (isinstance(self.leaves, bool) or not isinstance(self.leaves, int)):
            raise IndexingError(f"leaves must be a whole number >= 1, got {self.leaves!r}")
        if self.leaves is not None and self.leaves < 1:
            raise IndexingError(f"leaves must be >= 1, got {self.leaves}")

    def resolved(self, default: str, leaves: int | None = None) -> Placing:
        """This placing with ``default`` as its rule where it names none, and ``leaves`` as the
        method's usual leaves."""
        usual = leaves if leaves is not None else self.usual_leaves
        return Placing(self.by if self.by is not None else default, self.leaves, usual, self.negatives)

    def n_leaves(self, C: sp.spmatrix) -> int:
        """Leaves per new label in the tree whose leaf level is ``C`` (``L x K``)."""
        K = C.shape[1]
        if self.leaves is not None and self.leaves > K:
            raise IndexingError(f"leaves is {self.leaves} but the tree has only {K} leaf clusters")
        return self.leaves or min(max(self.usual_leaves or DEFAULT_LEAVES, leaves_per_label(C)), K)


@dataclass
class Placement:
    """The new labels' leaves (csr ``n_new x K``), each placed label's similarity to its first leaf
    and how it was placed (``centroid`` | ``routes``)."""

    leaves: sp.csr_matrix
    similarity: np.ndarray
    how: list[str]

    def summary(self) -> dict[str, Any]:
        return {
            "by_centroid": self.how.count("centroid"),
            "by_routes": self.how.count("routes"),
            "mean_similarity": round(float(self.similarity.mean()) if len(self.similarity) else 0.0, 4),
        }


def place_labels(
    Y: sp.csr_matrix,
    X_index: sp.spmatrix | np.ndarray,
    C_old: sp.csr_matrix,
    n_leaves: int = 1,
    routes: sp.csr_matrix | None = None,
    normalize_y_rows: bool = True,
    by: str = "centroid",
    threads: int = 1,
) -> Placement:
    """Leaves of the labels in ``Y``'s columns after the ``C_old.shape[0]`` old ones.

    ``Y`` (``N x L_all``): the documents' labels, old first; ``X_index`` (``N x D``): the documents
    in the tree's representation; ``C_old`` (``L_old x K``): the tree's leaf level; ``n_leaves``:
    leaves per new label; ``routes`` (``N x K``): the leaves the model reaches for each document
    (``by="routes"``: what decides; ``by="centroid"``: the fallback); ``threads``: for the label sums."""
    n_old, K = C_old.shape
    n_new = Y.shape[1] - n_old
    if n_new < 1:
        raise IndexingError("placing labels: no new label columns in Y")
    if not 1 <= n_leaves <= K:
        raise IndexingError(f"placing labels: n_leaves must lie in [1, {K}], got {n_leaves}")
    Yw = _weighted_Y(sp.csr_matrix(Y, dtype=np.float32), normalize_y_rows)
    sims = _cosines(pifa(Yw[:, n_old:], X_index, threads), _centroids(Yw[:, :n_old], X_index, C_old, threads))
    if by == "routes":
        if routes is None:
            raise IndexingError("placing labels by routes needs the leaves the model reaches for each document")
        counts = dense_f32(binarize(Y[:, n_old:]).T.tocsr() @ binarize(routes))
        reached = counts.max(axis=1) > 0  # a label whose documents reach no leaf falls back to its centroid
        # the documents decide; the centroid (similarity in [0, 1]) only breaks ties between counts
        return _choose(np.where(reached[:, None], counts + 0.5 * sims, sims), n_leaves, reached, sims)
    blind = ~np.any(sims > 0, axis=1)  # nothing to compare with: no old label present or no shared feature
    if blind.any() and routes is not None:
        sims[blind] = dense_f32(sp.csr_matrix(Y[:, n_old:]).T.tocsr()[blind] @ routes)
    by_routes = blind if routes is not None else np.zeros(n_new, bool)
    return _choose(sims, n_leaves, by_routes, np.where(by_routes[:, None], 0.0, sims))


@dataclass
class Centroids:
    """``K`` centroids of ``D`` features, given a block at a time: ``block(a, b)`` is leaves
    ``a .. b`` as a dense feature-major ``D x (b - a)`` float32 array."""

    K: int
    D: int
    block: Callable[[int, int], np.ndarray]


def _centroids(Yw_old: sp.csr_matrix, X: sp.spmatrix | np.ndarray, C_old: sp.csr_matrix, threads: int) -> Centroids:
    """The leaves' centroids (a leaf's: the unit sum of its labels' PIFA rows), a block of leaves
    at a time, dense and feature-major. From sparse rows, summed label by label without the
    ``L x D`` PIFA matrix (``sparse_sums.leaf_centroids``: the same numbers, EURLEX57K's 64 leaves
    in 0.70-0.74 s against 1.17-1.25 s through it); from dense rows, through it."""
    D, leaves = X.shape[1], binarize(C_old).T.tocsr()
    if sp.issparse(X):
        Yt, Xc = Yw_old.T.tocsr(), sp.csr_matrix(X)
        return Centroids(leaves.shape[0], D, lambda a, b: leaf_centroids(Yt, Xc, leaves, a, b, threads))
    unit = pifa(binarize(C_old), pifa(Yw_old, X, threads), threads)
    return Centroids(leaves.shape[0], D, lambda a, b: np.ascontiguousarray(dense_f32(unit[a:b]).T))


def _cosines(rows: sp.csr_matrix | np.ndarray, centroids: Centroids) -> np.ndarray:
    """``rows @ centroids.T`` (unit rows: cosines) as a dense array, the centroids taken a block at
    a time (about ``_DENSE_BYTES`` each): one sparse-times-dense product per block, several times
    faster than the sparse product, the same sums, memory bounded on any tree."""
    K, D = centroids.K, centroids.D
    out = np.empty((rows.shape[0], K), np.float32)
    step = max(1, _DENSE_BYTES // (4 * max(D, 1)))
    for k in range(0, K, step):
        out[:, k : k + step] = dense_f32(rows @ centroids.block(k, min(k + step, K)))
    return out


def _choose(scores: np.ndarray, n_leaves: int, by_routes: np.ndarray, sims: np.ndarray) -> Placement:
    """The ``n_leaves`` best-scored leaves of each row (ties to the smaller leaf); ``sims``: each
    leaf's centroid similarity, reported for the first leaf."""
    order = np.argsort(-scores, axis=1, kind="stable")[:, :n_leaves]
    n_new = scores.shape[0]
    rows = np.repeat(np.arange(n_new), n_leaves)
    leaves = sp.csr_matrix((np.ones(rows.size, np.float32), (rows, order.ravel())), shape=scores.shape)
    how = ["routes" if r else "centroid" for r in by_routes]
    return Placement(leaves, sims[np.arange(n_new), order[:, 0]].astype(np.float32), how)


def grow_chain(chain: Any, leaves: sp.csr_matrix) -> Any:
    """``chain`` (a ``ClusterChain``) with rows ``leaves`` (``n_new x K``) appended to its leaf level."""
    from xtransformer.indexing.chain import ClusterChain

    return ClusterChain([*chain[:-1], sp.vstack([chain.leaf_assignment, binarize(leaves)], format="csr")])


def leaves_per_label(C: sp.csr_matrix) -> int:
    """The most leaves a label of ``C`` sits in (λ of a disentangled tree, else 1)."""
    return max(int(np.diff(sp.csr_matrix(C).indptr).max(initial=1)), 1)
