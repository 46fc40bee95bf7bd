"""A forest of hierarchical linear models: one per label tree, their label scores averaged.

Parabel, omikuji and Bonsai train several trees whose balanced k-means started from different
seeds: each tree splits the labels differently, so a label one tree's beam misses another's may
reach, and the average ranks more steadily than any one tree. :class:`LinearForest` holds such
models (``stages.tree_model`` builds the trees, seeds ``seed, seed + 1, ...``) and predicts the
mean of their top-k label scores, an entry a tree did not return counting as 0
(``xtransformer.ensemble.ensemble_predictions``'s ``average``).

It answers the same calls as :class:`HierarchicalLinear` (``predict``, ``config``, ``save``), so
the pipeline and model folders hold either; :func:`load_tree_model` reads whichever a folder has.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp

from xtransformer.ranker.config import HierarchicalLinearConfig
from xtransformer.ranker.errors import RankerError
from xtransformer.ranker.extend import train_added
from xtransformer.ranker.features import as_features
from xtransformer.ranker.hierarchical import HierarchicalLinear
from xtransformer.ranker.linear import load_model_meta
from xtransformer.utils.io import atomic_dir, save_json

if TYPE_CHECKING:  # indexing imports the ranker
    from xtransformer.indexing.placement import Placing


class LinearForest:
    """Hierarchical linear models over different label trees; predictions are their mean."""

    def __init__(self, trees: Sequence[HierarchicalLinear]):
        if len(trees) < 2:
            raise RankerError(f"linear forest: needs at least 2 trees, got {len(trees)}")
        if len({(t.n_labels, t.n_features) for t in trees}) != 1:
            raise RankerError("linear forest: the trees disagree on the label or feature count")
        self.trees = list(trees)

    @property
    def config(self) -> HierarchicalLinearConfig:
        return self.trees[0].config

    @config.setter
    def config(self, value: HierarchicalLinearConfig) -> None:
        # prediction settings are the forest's: every tree searches with the same beam and top-k
        for t in self.trees:
            t.config = value

    def __copy__(self) -> LinearForest:
        # the model folder's predictor gives each call a shallow copy with its own config
        import copy

        return LinearForest([copy.copy(t) for t in self.trees])

    @property
    def n_labels(self) -> int:
        return self.trees[0].n_labels

    @property
    def n_features(self) -> int:
        return self.trees[0].n_features

    @property
    def n_weights(self) -> int:
        return sum(t.n_weights for t in self.trees)

    @property
    def chain(self) -> list[sp.csr_matrix]:
        """The first tree's (the one ``n_trees: 1`` would have built)."""
        return self.trees[0].chain

    @property
    def train_stats(self) -> list[list[dict]]:
        return [t.train_stats for t in self.trees]

    def predict(
        self,
        X: sp.spmatrix | np.ndarray,
        beam_size: int | None = None,
        topk: int | None = None,
        post_processor: str | None = None,
        matcher_weight: float | None = None,
    ) -> sp.csr_matrix:
        """Mean of the trees' top-``topk`` label scores (csr ``N x L``), its top ``topk`` kept."""
        from xtransformer.ensemble import ensemble_predictions

        topk = topk or self.config.topk
        preds = [
            t.predict(X, beam_size=beam_size, topk=topk, post_processor=post_processor, matcher_weight=matcher_weight)
            for t in self.trees
        ]
        return ensemble_predictions(preds, "average", topk)

    def add_labels(
        self,
        X: sp.spmatrix | np.ndarray,
        Y: sp.spmatrix,
        X_index: sp.spmatrix | np.ndarray | None = None,
        placing: Placing | None = None,
    ) -> tuple[LinearForest, dict]:
        """Every tree with the new labels placed in its own leaves (``HierarchicalLinear.add_labels``);
        one-vs-all weights do not depend on the tree: trained once, shared by every tree."""
        from xtransformer.indexing.placement import Placing  # here: indexing imports the ranker

        first, placing = self.trees[0], placing or Placing()
        once = None
        if first.trains_added_on_every_document(placing):
            once = train_added(as_features(X), sp.csr_matrix(Y[:, first.n_labels :]), first.config)
        grown = [t.add_labels(X, Y, X_index, placing, once) for t in self.trees]
        report = dict(grown[0][1])
        report["trees"] = [r["placement"] for _, r in grown]
        return LinearForest([t for t, _ in grown]), report

    def save(self, path: str | Path) -> None:
        with atomic_dir(path) as tmp:
            for i, t in enumerate(self.trees):
                t.save(tmp / f"tree_{i}")
            save_json({"model": "LinearForest", "n_trees": len(self.trees)}, tmp / "model.json")

    @classmethod
    def load(cls, path: str | Path) -> LinearForest:
        path = Path(path)
        meta = load_model_meta(path, "model.json", "LinearForest")
        return cls([HierarchicalLinear.load(path / f"tree_{i}") for i in range(int(meta["n_trees"]))])


def load_tree_model(path: str | Path) -> HierarchicalLinear | LinearForest:
    """The model a folder holds: one tree (``HierarchicalLinear``) or a forest."""
    from xtransformer.utils.io import load_json

    path = Path(path)
    kind = load_json(path / "model.json").get("model") if (path / "model.json").is_file() else None
    return LinearForest.load(path) if kind == "LinearForest" else HierarchicalLinear.load(path)
