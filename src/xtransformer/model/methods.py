"""One predictor per method, each a small composition of stored components.

Component layout of a method folder (``manifest.json`` ``components`` names the kind)::

    kind                 components
    xrlinear             tfidf/ + ranker/ (HierarchicalLinear on tfidf, or a LinearForest of them:
                         tree_0/, tree_1/, ...)
    xtransformer         tfidf/ + matcher/ (encoder + cluster head) + ranker/ (LinearRanker on the
                         matcher's shortlist, tfidf or tfidf+neural) + label_tree/
    xrtransformer        tfidf/ + matcher/ (encoder; pooling, truncate_chars) + features (kind,
                         embedding length, normalisation) +
                         ranker/ (HierarchicalLinear or LinearForest on concat_features(tfidf, embeddings))
    ensemble             members (relative paths of sibling method folders) + a score combination

Every predictor maps texts (or, for text-free kinds, TF-IDF rows) to a csr ``N x L`` of top-k
label scores with the same functions the pipeline used, so a saved model reproduces the run's
predictions exactly. Prediction settings (``predict_settings.json``) are kept apart from the
component records: they may be overridden per call, the components may not.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import scipy.sparse as sp

from xtransformer.model.folder import ModelError
from xtransformer.model.tfidf_io import TfidfFeatures

TFIDF_DIR, RANKER_DIR, MATCHER_DIR, TREE_DIR = "tfidf", "ranker", "matcher", "label_tree"


def _with_settings(model: Any, base: Any, settings: dict[str, Any]) -> Any:
    """A shallow copy of the ranker (weights shared) whose config carries this call's prediction
    settings: concurrent calls with different overrides never see each other's."""
    names = {f.name for f in dataclasses.fields(base)}
    out = copy.copy(model)
    out.config = dataclasses.replace(base, **{k: v for k, v in settings.items() if k in names})
    return out


class XRLinearPredictor:
    """TF-IDF -> HierarchicalLinear beam search."""

    needs_text = False

    def __init__(self, folder: Path, components: dict[str, Any]):
        from xtransformer.ranker.forest import load_tree_model

        self.tfidf = TfidfFeatures(folder / TFIDF_DIR)
        self.model = load_tree_model(folder / RANKER_DIR)
        self.base_config = self.model.config

    def predict_features(self, X: sp.csr_matrix, settings: dict[str, Any]) -> sp.csr_matrix:
        return _with_settings(self.model, self.base_config, settings).predict(X)

    def predict(self, texts: Sequence[str], settings: dict[str, Any]) -> sp.csr_matrix:
        return self.predict_features(self.tfidf.from_texts(texts), settings)


class _NeuralPredictor:
    """TF-IDF + a fine-tuned matcher folder + the linear model ``load_ranker`` reads; the encoder runs
    through ``predict_matcher``, exactly as the run embedded its eval split."""

    needs_text = True

    @staticmethod
    def load_ranker(path: Path) -> Any:  # imported on use: loading a linear-only model must not import torch
        raise NotImplementedError

    def __init__(self, folder: Path, components: dict[str, Any]):
        from xtransformer.matcher.inference import load_matcher_model

        self.tfidf = TfidfFeatures(folder / TFIDF_DIR)
        self.model = self.load_ranker(folder / RANKER_DIR)
        self.base_config = self.model.config
        self.features = components["features"]
        self.matcher = load_matcher_model(folder / MATCHER_DIR, device="cpu")

    def encode(self, texts: Sequence[str], settings: dict[str, Any]) -> tuple[sp.csr_matrix, np.ndarray, sp.csr_matrix]:
        """(TF-IDF, embeddings in the dtype the run stored them, the matcher head's top-b)."""
        from xtransformer.matcher.inference import predict_matcher

        pred = predict_matcher(None, texts, batch_size=settings["eval_batch_size"], topb=settings["topb"],
                               precision=settings["inference_precision"], normalize=self.features["normalize_embeddings"],
                               device="cpu", progress=False, model=self.matcher,
                               max_length=self.features.get("max_length"))  # older folders: the fine-tuning length
        return self.tfidf.from_texts(texts), pred.embeddings.astype(self.features["embeddings_dtype"]), pred.topb


class XTransformerPredictor(_NeuralPredictor):
    """TF-IDF + fine-tuned matcher (top-b clusters, embeddings) -> LinearRanker over the shortlist."""

    @staticmethod
    def load_ranker(path: Path) -> Any:
        from xtransformer.ranker.linear import LinearRanker

        return LinearRanker.load(path)

    def predict(self, texts: Sequence[str], settings: dict[str, Any]) -> sp.csr_matrix:
        from xtransformer.ranker.features import concat_features

        X, emb, topb = self.encode(texts, settings)
        feats = X if self.features["kind"] == "tfidf" else concat_features(X, emb, weight=self.features["neural_weight"])
        return _with_settings(self.model, self.base_config, settings).predict(feats, topb)


class XRTransformerPredictor(_NeuralPredictor):
    """TF-IDF + the fine-tuned encoder's embeddings -> the final HierarchicalLinear (beam search);
    optionally combined with the label-level head (``combine_head``), as the run predicted."""

    @staticmethod
    def load_ranker(path: Path) -> Any:
        from xtransformer.ranker.forest import load_tree_model

        return load_tree_model(path)

    def predict(self, texts: Sequence[str], settings: dict[str, Any]) -> sp.csr_matrix:
        from xtransformer.xrtransformer.model import combine_with_head, final_features

        X, emb, head = self.encode(texts, settings)
        model = _with_settings(self.model, self.base_config, settings)
        scores = model.predict(final_features(self.features["kind"], X, emb, self.features["neural_weight"]))
        if settings.get("combine_head"):
            scores = combine_with_head(scores, head, model.config.post_processor, settings["combine_head"],
                                       model.config.topk)
        return scores


class EnsemblePredictor:
    """Sibling method folders combined by ``xtransformer.ensemble.ensemble_predictions``."""

    def __init__(self, members: list[Any]):
        self.members = members  # XMCModel instances
        self.needs_text = any(m.predictor.needs_text for m in members)

    def _combine(self, preds: list[sp.csr_matrix], settings: dict[str, Any]) -> sp.csr_matrix:
        from xtransformer.ensemble import ensemble_predictions

        return ensemble_predictions(preds, method=settings["method"], topk=int(settings["topk"]),
                                    weights=settings.get("weights"))  # older folders: none, equal

    def predict(self, texts: Sequence[str], settings: dict[str, Any]) -> sp.csr_matrix:
        topk = int(settings["topk"])
        return self._combine([m.predict_csr(texts, topk=max(topk, m.predict_settings["topk"])) for m in self.members],
                             settings)

    def predict_features(self, X: sp.csr_matrix, settings: dict[str, Any]) -> sp.csr_matrix:
        topk = int(settings["topk"])
        return self._combine([m.predict_features_csr(X, topk=max(topk, m.predict_settings["topk"]))
                              for m in self.members], settings)


KINDS = {
    "xrlinear": XRLinearPredictor,
    "xtransformer": XTransformerPredictor,
    "xrtransformer": XRTransformerPredictor,
}


def empty_rows_csr(pred: sp.csr_matrix, keep: np.ndarray) -> sp.csr_matrix:
    """``pred`` (rows of the ``keep`` documents) spread to ``len(keep)`` rows, the others empty."""
    rows = np.flatnonzero(keep)
    counts = np.zeros(len(keep), dtype=np.int64)
    counts[rows] = np.diff(pred.indptr)
    indptr = np.r_[0, np.cumsum(counts)]
    return sp.csr_matrix((pred.data, pred.indices, indptr), shape=(len(keep), pred.shape[1]))


def check_kind(kind: str, where: Path) -> type:
    if kind not in KINDS:
        raise ModelError(f"{where}: unknown model kind {kind!r}; this xtransformer knows {sorted(KINDS)}")
    return KINDS[kind]
