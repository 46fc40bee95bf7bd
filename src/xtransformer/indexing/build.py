"""The semantic label indexing stage: label representation -> hierarchical balanced k-means -> tree."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from xtransformer.indexing.chain import ClusterChain
from xtransformer.indexing.config import IndexingConfig
from xtransformer.indexing.kmeans import hierarchical_kmeans
from xtransformer.indexing.quality import cluster_quality
from xtransformer.indexing.representations import EmbedFn, LabelSources, RepresentationOptions, label_representation


def build_index(
    cfg: IndexingConfig | Mapping[str, Any],
    Y_train: sp.spmatrix,
    X_train_tfidf: sp.spmatrix | None = None,
    doc_embeddings: np.ndarray | None = None,
    label_texts: Sequence[str | None] | None = None,
    embed_fn: EmbedFn | None = None,
    *,
    label_ids: Sequence[str] | None = None,
    quality: bool = True,
) -> tuple[ClusterChain, dict[str, Any]]:
    """Cluster the labels of ``Y_train`` into a :class:`ClusterChain`; report what was done.

    The report holds the config, the representation report (dimensions, labels without
    positives and what they got, missing label texts), timings, the chain's level sizes and
    (``quality``) cluster-quality figures beside a random balanced clustering; ``quality=False``
    leaves those out, so that the call costs the tree alone (a benchmark times it).
    """
    cfg = cfg if isinstance(cfg, IndexingConfig) else IndexingConfig.from_mapping(cfg)
    t0 = time.perf_counter()
    sources = LabelSources(X_train_tfidf, doc_embeddings, label_texts, embed_fn, label_ids)
    options = RepresentationOptions(cfg.normalize_y_rows, cfg.orphan_fallback, cfg.seed, cfg.threads)
    features, rep_report = label_representation(cfg.name, Y_train, sources, options)
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
    }
    if quality:
        report["quality"] = cluster_quality(chain, features=features, Y=Y_train, seed=cfg.seed)
    return chain, report
