"""XR-Linear's settings: the ``xrlinear`` config group's record (its defaults are the group's base node)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from xtransformer.data.tfidf import TfidfConfig
from xtransformer.indexing import IndexingConfig
from xtransformer.ranker import HierarchicalLinearConfig
from xtransformer.settings import Settings


@dataclass
class XRLinearConfig(Settings):
    """XR-Linear's own tree and its linear model: PECOS XLinearModel's recipe, PIFA-TF-IDF, binary
    balanced k-means to leaves of <= 100 labels, then every 4th level kept (``nr_splits`` 16)."""

    where = "xrlinear"

    # orphan labels (no positive document) keep zero PIFA rows, as in PECOS: there is no matcher
    # to feed, and copies of other labels' rows only slow the k-means (53k of 64k labels on the
    # synthetic benchmark: 9.1M -> 1.6M nonzeros) without a better tree
    indexing: IndexingConfig = field(default_factory=lambda: IndexingConfig(max_leaf_size=100, orphan_fallback="none"))
    nr_splits: int = 16  # branching of the tree as the model sees it (ClusterChain.subsample)
    # > 1: as many trees (k-means seeded indexing.seed + i), one model each, scores averaged (LinearForest)
    n_trees: int = 1
    # a level of OVA rankers per tree level + beam search. Labels added to the trained model get 2 dual
    # CD passes: chosen on held-out EURLEX57K documents (experiments/label_growth)
    model: HierarchicalLinearConfig = field(default_factory=lambda: HierarchicalLinearConfig(added_max_iter=2))

    def check(self) -> None:
        if self.nr_splits < 2:
            raise self.bad("nr_splits", "must be an int >= 2")
        if self.n_trees < 1:
            raise self.bad("n_trees", "must be an int >= 1")

    def overlap_source(self, n_copies: int) -> list[dict[str, Any]]:
        """What a leaf level disentangled to ``n_copies`` clusters a label is counted from (this
        model's training settings, tree arity and beam; its key part); nothing at ``n_copies`` 1."""
        if n_copies == 1:
            return []
        m = self.model
        return [
            {
                "counts_from": "xrlinear",
                "model": m.training_settings(),
                "beam_size": m.beam_size,
                "post_processor": m.post_processor,
                "nr_splits": self.nr_splits,
            }
        ]


@dataclass
class XRLinearSettings(Settings):
    """Everything ``XRLinear.fit`` reads: the TF-IDF and the tree model."""

    tfidf: TfidfConfig = field(default_factory=TfidfConfig)
    xrlinear: XRLinearConfig = field(default_factory=XRLinearConfig)
