"""Label indexing settings (``IndexingConfig``, the ``indexing`` config group's record) and their checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from xtransformer.indexing.errors import IndexingError
from xtransformer.indexing.kmeans import resolve_n_clusters
from xtransformer.indexing.representations import ORPHAN_FALLBACKS, parse_representation
from xtransformer.ranker.copies import MERGES
from xtransformer.settings import Settings, run_field, train_field


@dataclass
class IndexingConfig(Settings):
    """The label tree: a representation (``name``: ``configs/indexing/<name>.yaml`` picks one), then
    balanced k-means; its defaults are the ``indexing`` group's base node."""

    where = "indexing"
    error = IndexingError

    name: str = "pifa_tfidf"  # pifa_tfidf | pifa_neural | text_emb | pifa_concat | a+b combinations
    n_clusters: int | None = None  # K; null: 2 ** (int(log2(L // 100 + 1)) + 1) (Eurlex-4K: 64)
    max_leaf_size: int | None = None  # alternative to n_clusters: smallest power of two fitting it (PECOS)
    branching: int = 2  # children per split of the k-means tree
    max_iter: int = 20  # assignments per split (PECOS's kmeans_max_iter)
    seed: int = train_field(0, hydra="${seed}")  # the run's seed
    normalize_y_rows: bool = True  # PIFA weights documents by 1/sqrt(#labels), as PECOS
    orphan_fallback: str = "auto"  # labels without positives: auto | text_neighbour | random_label | none
    threads: int | None = run_field(None)  # null: all CPUs available to the process
    # label disentanglement (indexing/disentangle.py): each label in up to n_copies (λ) leaf clusters,
    # learned from where an XR-Linear model trained on the partition sends its positive documents
    n_copies: int = 1  # λ; 1: the partition as built (no reassignment, today's tree bit for bit)
    merge: str = "max"  # max | mean: one score for a label reached through several clusters
    # a leaf cluster takes at most this x its size in labels (extra copies refused beyond): bounds the
    # leaf level's prediction cost to about this factor; null: uncapped, as the paper (cost grows ~λ-fold)
    max_cluster_growth: float | None = 1.2
    min_count: int = 1  # (label, cluster) pairs reached by fewer positive documents are ignored

    def check(self) -> None:
        try:
            parse_representation(self.name)
        except IndexingError as err:
            raise self.bad("name", str(err)) from None
        check_disentangle_settings(self)
        if self.orphan_fallback not in ORPHAN_FALLBACKS:
            raise self.bad("orphan_fallback", f"expected one of {list(ORPHAN_FALLBACKS)}")
        if self.branching < 2:
            raise self.bad("branching", "must be an int >= 2")
        if self.max_iter < 1:
            raise self.bad("max_iter", "must be an int >= 1")
        if self.n_clusters is not None and self.n_clusters < 2:  # one cluster: nothing for a matcher to learn
            raise self.bad("n_clusters", "must be an int >= 2, or null for the paper's rule")
        if self.max_leaf_size is not None and self.max_leaf_size < 1:
            raise self.bad("max_leaf_size", "must be an int >= 1 or null")
        if self.n_clusters is not None and self.max_leaf_size is not None:
            raise self.bad(
                "n_clusters", f"set at most one of {self._where()}.n_clusters and {self._where()}.max_leaf_size"
            )

    def training_settings(self) -> dict[str, Any]:
        """The settings that shape the tree, without the disentanglement fields other than
        ``n_copies`` while it is 1 (they change nothing then)."""
        out = super().training_settings()
        if self.n_copies == 1:
            for key in DISENTANGLE_KEYS[1:]:
                out.pop(key)
        return out


DISENTANGLE_KEYS = ("n_copies", "merge", "max_cluster_growth", "min_count")


def check_disentangle_settings(cfg: IndexingConfig) -> None:
    """Fail on bad disentanglement settings before any data work, naming the key."""
    if cfg.n_copies < 1:
        raise cfg.bad("n_copies", "must be an int >= 1 (λ, clusters per label)")
    if cfg.n_clusters is not None and cfg.n_copies > cfg.n_clusters:
        raise cfg.bad("n_copies", f"is above the number of leaf clusters ({cfg._where()}.n_clusters={cfg.n_clusters})")
    if cfg.merge not in MERGES:
        raise cfg.bad("merge", f"expected one of {list(MERGES)}")
    if cfg.min_count < 1:
        raise cfg.bad("min_count", "must be an int >= 1")
    if cfg.max_cluster_growth is not None and not cfg.max_cluster_growth >= 1:
        raise cfg.bad("max_cluster_growth", "must be null or a number >= 1")


def check_copies_fit(cfg: IndexingConfig, n_labels: int, where: str = "indexing") -> None:
    """``n_copies`` against the number of leaf clusters, once the label count fixes it (``n_clusters: null``)."""
    k = resolve_n_clusters(n_labels, cfg.n_clusters, cfg.max_leaf_size)
    if cfg.n_copies > k:
        raise IndexingError(
            f"{where}.n_copies={cfg.n_copies} is above the number of leaf clusters ({k} for {n_labels} labels)"
        )
