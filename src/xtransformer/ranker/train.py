"""The neural path's ranker in one call: features and negatives chosen by ``RankerConfig``."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from xtransformer.ranker.config import RankerConfig
from xtransformer.ranker.errors import RankerError
from xtransformer.ranker.features import concat_features
from xtransformer.ranker.linear import LinearRanker
from xtransformer.ranker.negatives import negative_mask


def ranker_features(X_tfidf: sp.spmatrix, emb: np.ndarray | None, cfg: RankerConfig) -> sp.csr_matrix:
    """The ranker's input for ``cfg.features``: TF-IDF, or TF-IDF + neural embedding (``concat_features``)."""
    if cfg.features == "tfidf":
        return concat_features(X_tfidf)
    if emb is None:
        raise RankerError("ranker config `features: tfidf+neural` needs the matcher's embeddings (`emb`)")
    return concat_features(X_tfidf, emb, cfg.neural_weight)


def train_ranker(
    X_tfidf: sp.spmatrix,
    Y: sp.spmatrix,
    C: sp.spmatrix,
    cfg: RankerConfig,
    emb: np.ndarray | None = None,
    matcher_pred: sp.spmatrix | None = None,
    merge: str = "max",
) -> LinearRanker:
    """Train one level of OVA rankers over clusters ``C`` (``L x K``) as ``cfg`` says.

    ``emb`` (``N x H``) is needed for ``features: tfidf+neural``; ``matcher_pred`` (csr ``N x K``, the
    matcher's top-b clusters of the training instances) for ``negatives: man`` / ``tfn+man``;
    ``merge`` joins the scores of a label that sits in several clusters (``max`` | ``mean``).
    Predict with ``ranker.predict(ranker_features(X, emb, cfg), shortlist)``.
    """
    X = ranker_features(X_tfidf, emb, cfg)
    mask = negative_mask(cfg.negatives, Y, C, matcher_pred)
    return LinearRanker.train(X, Y, C, mask, cfg, merge=merge)
