"""Where a label added to a trained tree goes: the leaf cluster(s) whose centroid is nearest it.

Labels and leaves are compared in the representation the tree was indexed with: a label's PIFA
row (the unit sum of its documents' features, ``representations.pifa``) and a leaf's centroid
(the unit sum of the PIFA rows of the old labels in it), both computed from the documents given.
Given the training documents, these are the very rows the k-means clustered. A leaf none of whose
labels occurs in the documents has no centroid; a new label nothing can be compared with (no old
label in the documents, or no feature shared) goes where the model routes its documents.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from xtransformer.indexing.errors import IndexingError
from xtransformer.indexing.representations import _weighted_Y, pifa
from xtransformer.utils.rows import dense_f32, unit_rows


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
) -> Placement:
    """Leaves of the labels in ``Y``'s columns after the ``C_old.shape[0]`` old ones.

    ``Y`` (``N x L_all``): the documents' labels, old first; ``X_index`` (``N x D``): the documents
    in the tree's representation; ``C_old`` (``L_old x K``): the tree's leaf level; ``n_leaves``:
    leaves per new label (λ of a disentangled tree, else 1); ``routes`` (``N x K``): the leaves
    the model reaches for each document, the fallback."""
    n_old, K = C_old.shape
    n_new = Y.shape[1] - n_old
    if n_new < 1:
        raise IndexingError("placing labels: no new label columns in Y")
    if not 1 <= n_leaves <= K:
        raise IndexingError(f"placing labels: n_leaves must lie in [1, {K}], got {n_leaves}")
    reps = pifa(_weighted_Y(sp.csr_matrix(Y, dtype=np.float32), normalize_y_rows), X_index)
    centroids = unit_rows(_as_csr(C_old).T.tocsr() @ reps[:n_old])
    sims = dense_f32(reps[n_old:] @ centroids.T)
    blind = ~np.any(sims > 0, axis=1)  # nothing to compare with: no old label present or no shared feature
    if blind.any() and routes is not None:
        sims[blind] = dense_f32(sp.csr_matrix(Y[:, n_old:]).T.tocsr()[blind] @ routes)
    return _choose(sims, n_leaves, blind if routes is not None else np.zeros(n_new, bool))


def _choose(sims: np.ndarray, n_leaves: int, by_routes: np.ndarray) -> Placement:
    """The ``n_leaves`` best leaves of each row (ties to the smaller leaf)."""
    order = np.argsort(-sims, axis=1, kind="stable")[:, :n_leaves]
    n_new = sims.shape[0]
    rows = np.repeat(np.arange(n_new), n_leaves)
    leaves = sp.csr_matrix((np.ones(rows.size, np.float32), (rows, order.ravel())), shape=sims.shape)
    best = sims[np.arange(n_new), order[:, 0]]
    how = ["routes" if r else "centroid" for r in by_routes]
    return Placement(leaves, np.where(by_routes, 0.0, best).astype(np.float32), how)


def _as_csr(C: sp.spmatrix) -> sp.csr_matrix:
    out = sp.csr_matrix(C, dtype=np.float32, copy=True)
    out.data[:] = 1.0
    return out


def grow_chain(chain: Any, leaves: sp.csr_matrix) -> Any:
    """``chain`` (a ``ClusterChain``) with rows ``leaves`` (``n_new x K``) appended to its leaf level."""
    from xtransformer.indexing.chain import ClusterChain

    return ClusterChain([*chain[:-1], sp.vstack([chain.leaf_assignment, _as_csr(leaves)], format="csr")])


def leaves_per_label(C: sp.csr_matrix) -> int:
    """The most leaves a label of ``C`` sits in (λ of a disentangled tree, else 1)."""
    return max(int(np.diff(sp.csr_matrix(C).indptr).max(initial=1)), 1)
