"""XR-Transformer's settings: the ``xrtransformer`` config group's record (its defaults are the group's base node).

The encoder, batch shape and per-level schedule (steps, learning rate, warmup) come from the
matcher config (``MatcherConfig.level_schedule``); this record holds what is particular to
multi-resolution fine-tuning and to the final linear model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from xtransformer.data.tfidf import TfidfConfig
from xtransformer.errors import UserError
from xtransformer.indexing import IndexingConfig
from xtransformer.matcher.config import MatcherConfig
from xtransformer.methods.xrlinear.config import XRLinearConfig
from xtransformer.ranker.config import HierarchicalLinearConfig
from xtransformer.settings import Settings, predict_field, run_field

LEVELS = ("all", "last")
BOOTSTRAPS = ("inherit", "weighted-linear", "fresh")
IMPORTANCE = ("counts", "normalized", "none")
SHORTLIST_NEGATIVES = ("tfn", "man", "tfn+man")
FINAL_FEATURES = ("tfidf+neural", "neural")
FINAL_TREES = ("recluster", "same")
HEAD_COMBINATIONS = ("average", "rank-average", "softmax-average")  # xtransformer.ensemble.METHODS


class XRTransformerConfigError(UserError):
    """A bad ``xrtransformer.*`` setting (the message names the key)."""


def _final_model() -> HierarchicalLinearConfig:
    """PECOS's final model, each choice measured on EURLEX57K: matcher-aware negatives from the model's
    own beam (dev P@1 92.88 with tfn -> 93.50), light pruning (threshold 0.1: 92.42 P@1, 0.01: 92.92 and
    329 MB, 0.001: 92.82 and 1.2 GB); at prediction the label rankers outweigh the path above them
    (matcher_weight 0.2: dev P@1/3/5 +0.38/+0.56/+0.91 over 1.0, chosen on 5,000 held-out training
    documents: experiments/matcher_weight); labels added to the trained model get 5 dual CD passes, the
    fewest within 0.3 of retraining on held-out documents (2 and 3 fell 0.4 below on P@1:
    experiments/label_growth)."""
    return HierarchicalLinearConfig(
        features="tfidf+neural", negatives="tfn+man", threshold=0.01, matcher_weight=0.2, added_max_iter=5
    )


@dataclass
class FinalModelConfig(Settings):
    """The linear tree model XR-Transformer predicts with: TF-IDF ⊕ fine-tuned embeddings."""

    where = "xrtransformer.final"
    error = XRTransformerConfigError

    features: str = "tfidf+neural"  # tfidf+neural | neural (ablation: embeddings alone)
    tree: str = "recluster"  # recluster: PIFA on the final features; same: the fine-tuning tree
    nr_splits: int = 16  # branching of the re-clustered tree as the linear model sees it
    # > 1: as many re-clustered trees (k-means seeded indexing.seed + i), one model each, averaged
    n_trees: int = 1
    # the re-clustered tree: PIFA over the features handed to it (TF-IDF ⊕ embeddings); its n_copies is λ
    # on the final tree (counts from a final model on the partition)
    indexing: IndexingConfig = field(default_factory=lambda: IndexingConfig(max_leaf_size=100))
    model: HierarchicalLinearConfig = field(default_factory=_final_model)
    # prediction only: also rank with the fine-tuned label-level head, combined with the linear
    # model's scores by this ensemble method (null: the linear model alone, as the paper); needs the
    # label level among the fine-tuned levels
    combine_head: str | None = predict_field(None)

    def check(self) -> None:
        _choice(self, "features", FINAL_FEATURES)
        _choice(self, "tree", FINAL_TREES)
        if self.combine_head is not None:
            _choice(self, "combine_head", HEAD_COMBINATIONS)
        if self.nr_splits < 2:
            raise self.bad("nr_splits", "must be an int >= 2")
        if self.n_trees < 1:
            raise self.bad("n_trees", "must be an int >= 1")
        if self.n_trees > 1 and self.tree != "recluster":
            raise self.bad("n_trees", "needs tree: recluster (every tree of `same` is the fine-tuning tree)")
        if self.model.features != "tfidf+neural" and self.features == "tfidf+neural":
            raise self.bad(
                "model.features",
                f"is {self.model.features!r}, but the final model reads TF-IDF ⊕ embeddings: set it to 'tfidf+neural'",
            )

    def as_xrlinear(self) -> XRLinearConfig:
        """With ``tree: recluster`` the final model is XR-Linear on its feature rows: these settings."""
        if self.tree != "recluster":
            raise self.bad("tree", "is 'same': the final model trains on the fine-tuning tree, not an XR-Linear tree")
        return XRLinearConfig(indexing=self.indexing, nr_splits=self.nr_splits, n_trees=self.n_trees, model=self.model)


@dataclass
class XRTransformerConfig(Settings):
    """Multi-resolution fine-tuning over the label tree (Zhang et al., NeurIPS 2021)."""

    where = "xrtransformer"
    error = XRTransformerConfigError

    # the label tree: the indexing chain seen with this branching (ClusterChain.subsample)
    nr_splits: int = 16
    # fine-tune every level with at most this many clusters (the label level too when L fits)
    max_match_clusters: int = 32768
    # all: every matched level, coarse to fine; last: only the finest one, from the pretrained
    # encoder with a dense loss (the ablation "one level" of multi-resolution fine-tuning)
    levels: str = "all"
    # each level's head starts from: inherit (W_t = C_t W_{t-1}), weighted-linear (a linear model
    # solved on the previous level's embeddings), or fresh (random; the ablation)
    bootstrap: str = "inherit"
    bootstrap_docs: int = 20000  # training documents embedded for weighted-linear (0: all)
    # positive weights of the squared hinge: counts (R = Y C_t, PECOS), normalized (R / |R|_1,
    # the paper's eq. 9), none (plain squared hinge)
    importance: str = "counts"
    neg_weight: float = 1.0  # alpha: the weight of a shortlisted negative
    # loss on a shortlist of clusters per document (true: eq. 8) or on all K_t (false: ablation)
    shortlist: bool = True
    negatives: str = "tfn+man"  # shortlist: children of the true parents, of the predicted ones, or both
    only_topk: int = 5  # predicted parents whose children enter the shortlist (matcher-aware)
    eval_docs: int | None = run_field(2000)  # eval-split documents for each level's cluster recall; null: all
    final: FinalModelConfig = field(default_factory=FinalModelConfig)

    def check(self) -> None:
        _choice(self, "levels", LEVELS)
        _choice(self, "bootstrap", BOOTSTRAPS)
        _choice(self, "importance", IMPORTANCE)
        _choice(self, "negatives", SHORTLIST_NEGATIVES)
        for key, low in (("nr_splits", 2), ("max_match_clusters", 1), ("only_topk", 1), ("bootstrap_docs", 0)):
            if getattr(self, key) < low:
                raise self.bad(key, f"must be an int >= {low}")
        if self.eval_docs is not None and self.eval_docs < 1:
            raise self.bad("eval_docs", "must be an int >= 1 or null")
        if not self.neg_weight > 0:
            raise self.bad("neg_weight", "must be a number > 0")

    def fine_tune_settings(self) -> dict[str, Any]:
        """What determines the fine-tuned encoder (the per-level cache keys); the final model's
        settings key only the final stage."""
        return {k: v for k, v in self.training_settings().items() if k != "final"}


def _choice(cfg: Settings, key: str, choices: tuple[str, ...]) -> None:
    if getattr(cfg, key) not in choices:
        raise cfg.bad(key, f"expected one of {list(choices)}")


@dataclass
class XRTransformerSettings(Settings):
    """Everything ``XRTransformer.fit`` reads (the per-level schedule is ``matcher.level_*``).
    ``xrlinear``: the linear model whose beam counts a disentangled leaf level."""

    tfidf: TfidfConfig = field(default_factory=TfidfConfig)
    indexing: IndexingConfig = field(default_factory=IndexingConfig)
    matcher: MatcherConfig = field(default_factory=MatcherConfig)
    xrtransformer: XRTransformerConfig = field(default_factory=XRTransformerConfig)
    xrlinear: XRLinearConfig = field(default_factory=XRLinearConfig)

    def check(self) -> None:
        if self.matcher.architecture != "transformer":  # the level-by-level loop fine-tunes an encoder's layers
            raise self.matcher.bad(
                "architecture",
                "XR-Transformer fine-tunes a transformer level by level; a CNN matcher runs with method=xtransformer",
            )
