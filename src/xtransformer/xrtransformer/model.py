"""The features XR-Transformer's final linear model reads: TF-IDF ⊕ fine-tuned embeddings."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from xtransformer.encoders import l2_normalize
from xtransformer.ranker.features import as_features, concat_features


def final_features(features: str, X_tfidf: sp.spmatrix, emb: np.ndarray, neural_weight: float = 1.0) -> sp.csr_matrix:
    """``tfidf+neural``: ``[X | w · emb]`` (each block, then the row, l2-normalised, as the ranker's);
    ``neural``: the l2-normalised embeddings alone (the ablation without TF-IDF)."""
    if features == "tfidf+neural":
        return concat_features(X_tfidf, emb, weight=neural_weight)
    if features == "neural":
        return as_features(l2_normalize(np.asarray(emb, dtype=np.float32)))
    raise ValueError(f"final features must be 'tfidf+neural' or 'neural', got {features!r}")
