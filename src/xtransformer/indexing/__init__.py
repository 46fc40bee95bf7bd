"""Semantic label indexing: label representations, hierarchical balanced k-means, ``ClusterChain``."""

from xtransformer.indexing.build import build_index
from xtransformer.indexing.chain import ClusterChain, codes_to_csr
from xtransformer.indexing.config import IndexingConfig, check_copies_fit
from xtransformer.indexing.disentangle import cluster_counts, learn_overlap, reassign
from xtransformer.indexing.errors import IndexingError
from xtransformer.indexing.kmeans import default_n_clusters, hierarchical_kmeans, resolve_n_clusters
from xtransformer.indexing.quality import (
    centroid_cosine,
    cluster_quality,
    cooccurrence_purity,
    group_purity,
    overlap_summary,
    random_balanced_codes,
    save_quality_plots,
)
from xtransformer.indexing.representations import EmbedFn, label_representation, parse_representation

__all__ = [
    "ClusterChain",
    "EmbedFn",
    "IndexingConfig",
    "IndexingError",
    "build_index",
    "centroid_cosine",
    "check_copies_fit",
    "cluster_counts",
    "cluster_quality",
    "codes_to_csr",
    "cooccurrence_purity",
    "default_n_clusters",
    "group_purity",
    "hierarchical_kmeans",
    "label_representation",
    "learn_overlap",
    "overlap_summary",
    "parse_representation",
    "random_balanced_codes",
    "reassign",
    "resolve_n_clusters",
    "save_quality_plots",
]
