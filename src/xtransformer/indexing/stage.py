"""The semantic label indexing stage: label representation -> hierarchical balanced k-means."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from xtransformer.indexing.chain import ClusterChain
from xtransformer.indexing.errors import IndexingError
from xtransformer.indexing.kmeans import hierarchical_kmeans
from xtransformer.indexing.quality import cluster_quality
from xtransformer.indexing.representations import ORPHAN_FALLBACKS, EmbedFn, label_representation, parse_representation


@dataclass
class IndexingConfig:
    """Mirrors ``configs/indexing/{pifa_tfidf,pifa_neural,text_emb,pifa_concat}.yaml`` one-to-one."""

    name: str = "pifa_tfidf"  # pifa_tfidf | pifa_neural | text_emb | pifa_concat | a+b combinations
    n_clusters: int | None = None  # K; null: 2 ** (int(log2(L // 100 + 1)) + 1) (Eurlex-4K: 64)
    max_leaf_size: int | None = None  # alternative to n_clusters: smallest power of two fitting it (PECOS)
    branching: int = 2  # children per split of the k-means tree
    max_iter: int = 20  # assignments per split (PECOS's kmeans_max_iter)
    seed: int = 0
    normalize_y_rows: bool = True  # PIFA weights documents by 1/sqrt(#labels), as PECOS
    orphan_fallback: str = "auto"  # labels without positives: auto | text_neighbour | random_label | none
    threads: int | None = None  # null: all CPUs available to the process

    def __post_init__(self) -> None:
        parse_representation(self.name)
        if self.orphan_fallback not in ORPHAN_FALLBACKS:
            raise IndexingError(
                f"indexing.orphan_fallback must be one of {ORPHAN_FALLBACKS}, got {self.orphan_fallback!r}"
            )
        for key in ("branching", "max_iter"):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < (2 if key == "branching" else 1):
                raise IndexingError(f"indexing.{key} must be an int >= {2 if key == 'branching' else 1}, got {v!r}")
        if self.n_clusters is not None and self.max_leaf_size is not None:
            raise IndexingError("set at most one of indexing.n_clusters and indexing.max_leaf_size")

    @classmethod
    def from_mapping(cls, cfg: Mapping[str, Any]) -> "IndexingConfig":
        """Build from a dict / Hydra node, naming unknown keys in the error."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(cfg) - known)
        if unknown:
            raise IndexingError(f"unknown indexing config key(s) {unknown}; known: {sorted(known)}")
        return cls(**dict(cfg))


def build_index(
    cfg: IndexingConfig | Mapping[str, Any],
    Y_train: sp.spmatrix,
    X_train_tfidf: sp.spmatrix | None = None,
    doc_embeddings: np.ndarray | None = None,
    label_texts: Sequence[str | None] | None = None,
    embed_fn: EmbedFn | None = None,
    *,
    label_ids: Sequence[str] | None = None,
) -> tuple[ClusterChain, dict[str, Any]]:
    """Cluster the labels of ``Y_train`` into a :class:`ClusterChain`; report what was done.

    The report holds the config, the representation report (dimensions, labels without
    positives and what they got, missing label texts), timings, the chain's level sizes and
    cluster-quality figures beside a random balanced clustering.
    """
    cfg = cfg if isinstance(cfg, IndexingConfig) else IndexingConfig.from_mapping(cfg)
    t0 = time.perf_counter()
    features, rep_report = label_representation(
        cfg.name,
        Y_train,
        X_tfidf=X_train_tfidf,
        doc_embeddings=doc_embeddings,
        label_texts=label_texts,
        embed_fn=embed_fn,
        label_ids=label_ids,
        normalize_y_rows=cfg.normalize_y_rows,
        orphan_fallback=cfg.orphan_fallback,
        seed=cfg.seed,
    )
    t1 = time.perf_counter()
    chain = hierarchical_kmeans(
        features,
        n_clusters=cfg.n_clusters,
        max_leaf_size=cfg.max_leaf_size,
        branching=cfg.branching,
        max_iter=cfg.max_iter,
        seed=cfg.seed,
        threads=cfg.threads,
    )
    t2 = time.perf_counter()
    report = {
        "config": dataclasses.asdict(cfg),
        "representation": rep_report,
        "n_clusters": chain.n_clusters,
        "level_sizes": chain.level_sizes,
        "seconds_representation": round(t1 - t0, 3),
        "seconds_kmeans": round(t2 - t1, 3),
        "quality": cluster_quality(chain, features=features, Y=Y_train, seed=cfg.seed),
    }
    return chain, report
