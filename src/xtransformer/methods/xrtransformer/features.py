"""The features XR-Transformer's final linear model reads: TF-IDF ⊕ fine-tuned embeddings."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from xtransformer.encoders import l2_normalize
from xtransformer.ranker.features import as_features, concat_features
from xtransformer.ranker.postprocess import get_post_processor


def final_features(features: str, X_tfidf: sp.spmatrix, emb: np.ndarray, neural_weight: float = 1.0) -> sp.csr_matrix:
    """``tfidf+neural``: ``[X | w · emb]`` (each block, then the row, l2-normalised, as the ranker's);
    ``neural``: the l2-normalised embeddings alone (the ablation without TF-IDF)."""
    if features == "tfidf+neural":
        return concat_features(X_tfidf, emb, weight=neural_weight)
    if features == "neural":
        return as_features(l2_normalize(np.asarray(emb, dtype=np.float32)))
    raise ValueError(f"final features must be 'tfidf+neural' or 'neural', got {features!r}")


def combine_with_head(
    pred: sp.csr_matrix, head_topb: sp.csr_matrix, post_processor: str, method: str, topk: int
) -> sp.csr_matrix:
    """The linear model's label scores combined with the label-level head's top-b scores
    (``final.combine_head``); the head's raw scores go through the linear model's post-processor
    first, so both live on one scale."""
    from xtransformer.ensemble import ensemble_predictions

    if head_topb.shape != pred.shape:
        raise ValueError(
            f"final.combine_head={method!r}: the last fine-tuned level has {head_topb.shape[1]} "
            f"nodes, not the {pred.shape[1]} labels (raise xrtransformer.max_match_clusters)"
        )
    head = sp.csr_matrix(head_topb, dtype=np.float32, copy=True)
    head.data = get_post_processor(post_processor).transform(head.data)
    return ensemble_predictions([pred, head], method=method, topk=topk)
