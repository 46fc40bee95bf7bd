"""The neural path's ranker: one level of one-vs-all rankers over an external shortlist.

``LinearRanker`` trains a weight vector per label of ``C`` (one per copy when labels sit in
several clusters) and, at prediction, scores the labels of the matcher's top-b clusters.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.sparse as sp

from xtransformer.ranker.config import RankerConfig
from xtransformer.ranker.copies import COPIES_DIR, LabelCopies
from xtransformer.ranker.errors import RankerError
from xtransformer.ranker.extend import extend_level
from xtransformer.ranker.features import as_features
from xtransformer.ranker.fit import LevelSpec, solver_params, train_level
from xtransformer.ranker.level import LinearLevel, load_level, save_level
from xtransformer.ranker.negatives import binarize
from xtransformer.ranker.postprocess import get_post_processor
from xtransformer.topk import Candidates
from xtransformer.utils.io import atomic_dir, is_complete, load_json, save_json


class LinearRanker:
    """Single-level OVA rankers over an external shortlist (the neural matcher's top-b clusters)."""

    def __init__(
        self,
        level: LinearLevel,
        config: RankerConfig,
        train_stats: dict | None = None,
        copies: LabelCopies | None = None,
    ):
        self.level = level
        self.config = config
        self.train_stats = train_stats or {}
        self.copies = copies  # None: ``C`` is a partition (one column per label)

    @classmethod
    def train(
        cls,
        X: sp.spmatrix | np.ndarray,
        Y: sp.spmatrix,
        C: sp.spmatrix,
        negatives: sp.spmatrix,
        cfg: RankerConfig,
        merge: str = "max",
    ) -> LinearRanker:
        """Train a weight vector per label of ``C`` (``L x K``) on the rows of ``negatives`` (``N x K`` mask).

        A label in several clusters of ``C`` trains one copy per cluster, on that cluster's rows;
        ``merge`` (``max`` | ``mean``) combines the copies' scores at prediction.
        """
        X, Y, C, mask = check_training_inputs(X, Y, C, negatives)
        copies, C = LabelCopies.of(C, merge)
        spec = LevelSpec(Y if copies is None else copies.expand(Y), C, mask)
        level, info = train_level(X, spec, solver_params(cfg), cfg.bias, cfg.threshold, cfg.batch_nnz, cfg.n_threads)
        return cls(level, cfg, info, copies)

    @property
    def n_labels(self) -> int:
        return self.copies.n_labels if self.copies is not None else self.level.n_labels

    @property
    def W(self) -> sp.csr_matrix:
        """Weights ``(F + 1) x L`` (csr; one column per copy when labels have copies); the last row
        holds the bias weights when ``bias > 0``."""
        return self.level.W.tocsr()

    @property
    def n_weights(self) -> int:
        return self.level.n_weights

    def predict(
        self,
        X: sp.spmatrix | np.ndarray,
        shortlist: sp.spmatrix,
        topk: int | None = None,
        post_processor: str | None = None,
        shortlist_transformed: bool = False,
    ) -> sp.csr_matrix:
        """Top-``topk`` label scores (csr ``N x L``) for the labels of each document's shortlisted clusters.

        ``shortlist`` (csr ``N x K``) holds the matcher's raw scores for its top-b clusters (set
        ``shortlist_transformed`` when they are already post-processed probabilities).
        """
        X = as_features(X)
        if not sp.issparse(shortlist) or shortlist.shape != (X.shape[0], self.level.n_clusters):
            raise RankerError(
                f"ranker: `shortlist` must be a sparse {(X.shape[0], self.level.n_clusters)} matrix, got "
                f"{getattr(shortlist, 'shape', type(shortlist).__name__)}"
            )
        post = get_post_processor(post_processor or self.config.post_processor)
        parents = Candidates.from_csr(shortlist)
        if not shortlist_transformed and post.rule != "child":
            parents.score = post.transform(parents.score)
        parents.score = post.weight_parent(parents.score, self.config.matcher_weight)
        k = topk or self.config.topk
        if self.copies is None:
            return self.level.score(X, parents, post, k, self.config.n_threads).to_csr(self.n_labels)
        out = self.level.score(X, parents, post, self.copies.search_width(k), self.config.n_threads)
        return self.copies.merge_topk(out, k).to_csr(self.n_labels)

    def add_labels(
        self, X: sp.spmatrix | np.ndarray, Y: sp.spmatrix, leaves: sp.spmatrix, routes: sp.spmatrix | None
    ) -> tuple[LinearRanker, dict]:
        """These rankers with the labels of ``Y``'s columns after their own (``Y``: ``N x L_all``)
        in clusters ``leaves`` (``n_new x K``), trained on ``X`` with this ranker's negatives
        (``routes``: the matcher's top-b clusters of each document); old weights unchanged."""
        ext = extend_level(
            self.level, self.copies, self.config, as_features(X), sp.csr_matrix(Y), sp.csr_matrix(leaves), routes
        )
        return LinearRanker(ext.level, self.config, self.train_stats, ext.copies), {"training": ext.info}

    def save(self, path: str | Path) -> None:
        with atomic_dir(path) as tmp:
            save_level(self.level, tmp)
            if self.copies is not None:
                self.copies.save(tmp / COPIES_DIR)
            save_json(
                {"model": "LinearRanker", "config": self.config.to_dict(), "train_stats": self.train_stats},
                tmp / "ranker.json",
            )

    @classmethod
    def load(cls, path: str | Path) -> LinearRanker:
        path = Path(path)
        meta = load_model_meta(path, "ranker.json", "LinearRanker")
        return cls(
            load_level(path),
            RankerConfig(**meta["config"]),
            meta.get("train_stats"),
            LabelCopies.load(path / COPIES_DIR),
        )


def check_training_inputs(
    X: sp.spmatrix | np.ndarray, Y: sp.spmatrix, C: sp.spmatrix, mask: sp.spmatrix
) -> tuple[sp.csr_matrix, sp.csr_matrix, sp.csr_matrix, sp.csr_matrix]:
    X = as_features(X)
    for name, M in (("Y", Y), ("C", C), ("negatives", mask)):
        if not sp.issparse(M) or M.ndim != 2:
            raise RankerError(f"ranker: `{name}` must be a 2-D scipy sparse matrix, got {type(M).__name__}")
    if Y.shape[0] != X.shape[0]:
        raise RankerError(f"ranker: `Y` has {Y.shape[0]} rows but `X` has {X.shape[0]}")
    if C.shape[0] != Y.shape[1]:
        raise RankerError(f"ranker: `C` has {C.shape[0]} rows but `Y` has {Y.shape[1]} labels")
    if mask.shape != (X.shape[0], C.shape[1]):
        raise RankerError(f"ranker: `negatives` must be {(X.shape[0], C.shape[1])} (N x K), got {mask.shape}")
    return X, binarize(Y), binarize(C), binarize(mask)


def load_model_meta(path: Path, name: str, model: str) -> dict:
    if not is_complete(path):
        raise RankerError(f"{path}: not a complete saved {model} folder (missing or half-written)")
    meta = load_json(path / name)
    if meta.get("model") != model:
        raise RankerError(f"{path}/{name}: holds a {meta.get('model')!r}, expected {model!r}")
    return meta
