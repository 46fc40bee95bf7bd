"""``XMCModel``: load a model folder, predict labels for texts (or TF-IDF rows).

    from xtransformer import XMCModel
    model = XMCModel.load("outputs/train/runs/<date>/model")       # the run's main method
    model = XMCModel.load("outputs/train/runs/<date>/model/xrlinear")
    model.predict(["oil prices rose ..."], k=5)   # [{"labels": [...], "names": [...], "scores": [...]}]
    model.predict(texts, k=5, beam_size=20)       # prediction settings can be overridden per call

Importing this and predicting with a linear model needs numpy, scipy and scikit-learn only
(no torch, Lightning, Hydra or W&B): every heavier import sits inside the kind that needs it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import scipy.sparse as sp

from xtransformer.model.folder import LABELS, PREDICT_SETTINGS, TRAIN_SETTINGS, ModelError, load_record, read_manifest
from xtransformer.model.methods import EnsemblePredictor, check_kind, empty_rows_csr

INDEX = "models.json"  # in a run's model/ folder: the methods it holds and the main one


class XMCModel:
    def __init__(self, folder: Path, manifest: dict[str, Any], predictor: Any):
        self.folder = folder
        self.manifest = manifest
        self.method: str = manifest["method"]
        self.predictor = predictor
        self.predict_settings: dict[str, Any] = load_record(folder, PREDICT_SETTINGS)
        self.train_settings: dict[str, Any] = load_record(folder, TRAIN_SETTINGS)
        labels = load_record(folder, LABELS)
        self.label_ids: list[str] = labels["ids"]
        self.label_names: list[str] = labels["names"]

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(cls, path: str | os.PathLike, method: str | None = None, verify: bool = True) -> "XMCModel":
        """Load a method folder, or the ``method`` (default: the main one) of a run's ``model/`` folder
        (or of the run folder itself). ``verify`` checks every file's sha256 against the manifest."""
        folder = _resolve(Path(path), method)
        manifest = read_manifest(folder, verify=verify)
        kind = manifest["components"]["kind"]
        if kind == "ensemble":
            members = [cls.load((folder / rel).resolve(), verify=verify) for rel in manifest["components"]["members"]]
            predictor: Any = EnsemblePredictor(members)
        else:
            predictor = check_kind(kind, folder)(folder, manifest["components"])
        return cls(folder, manifest, predictor)

    # ------------------------------------------------------------------ prediction
    @property
    def n_labels(self) -> int:
        return len(self.label_ids)

    @property
    def takes_features(self) -> bool:
        """True when the model can predict from TF-IDF rows alone (no text needed)."""
        return not self.predictor.needs_text

    def settings(self, overrides: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(overrides) - set(self.predict_settings))
        if unknown:
            raise ModelError(f"unknown prediction setting(s) {unknown} for a {self.method} model; "
                             f"it takes {sorted(self.predict_settings)}")
        return {**self.predict_settings, **{k: v for k, v in overrides.items() if v is not None}}

    def predict_csr(self, texts: Sequence[str], **overrides: Any) -> sp.csr_matrix:
        """csr ``N x L`` of the top-``topk`` label scores of every text (the run's prediction format).

        Empty or blank texts get an empty row: there is nothing to classify.
        """
        if isinstance(texts, str):
            raise ModelError("predict takes a list of texts, not one string")
        texts = list(texts)
        settings = self.settings(overrides)
        keep = np.fromiter((bool(t and not t.isspace()) for t in texts), bool, len(texts))
        if not keep.any():
            return sp.csr_matrix((len(texts), self.n_labels), dtype=np.float32)
        some = [t for t, k in zip(texts, keep) if k] if not keep.all() else texts
        pred = self.predictor.predict(some, settings)
        return pred if keep.all() else empty_rows_csr(pred, keep)

    def predict_features_csr(self, X: sp.spmatrix, **overrides: Any) -> sp.csr_matrix:
        """Same as :meth:`predict_csr` from TF-IDF rows (``N x F``, as the run computed them) or,
        for a model trained on given features (XC format), from those raw feature rows."""
        if self.predictor.needs_text:
            raise ModelError(f"a {self.method} model needs texts (its encoder reads them); use predict(texts)")
        settings = self.settings(overrides)
        if isinstance(self.predictor, EnsemblePredictor):
            return self.predictor.predict_features(X, settings)  # each member prepares its own input
        return self.predictor.predict_features(self.predictor.tfidf.from_features(X), settings)

    def predict(self, texts: Sequence[str], k: int = 5, **overrides: Any) -> list[dict[str, Any]]:
        """For each text, its ``k`` best labels: ``{"labels": ids, "names": names, "scores": floats}``."""
        return self.top_labels(self.predict_csr(texts, **self.overrides_for_k(k, overrides)), k)

    def predict_features(self, X: sp.spmatrix, k: int = 5, **overrides: Any) -> list[dict[str, Any]]:
        return self.top_labels(self.predict_features_csr(X, **self.overrides_for_k(k, overrides)), k)

    def overrides_for_k(self, k: int, overrides: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
            raise ModelError(f"k must be an int >= 1, got {k!r}")
        topk = overrides.get("topk") or self.predict_settings["topk"]
        return {**overrides, "topk": max(int(k), int(topk))}

    def top_labels(self, pred: sp.csr_matrix, k: int) -> list[dict[str, Any]]:
        """Rows of a score matrix as sorted (best first; ties by label index) label lists."""
        from xtransformer.topk import Candidates, topk

        c = topk(Candidates.from_csr(pred), int(k))
        bounds = np.searchsorted(c.doc, np.arange(pred.shape[0] + 1))
        ids, names = self.label_ids, self.label_names
        out = []
        for a, b in zip(bounds[:-1], bounds[1:]):
            items = c.item[a:b].tolist()
            out.append({"labels": [ids[i] for i in items], "names": [names[i] for i in items],
                        "scores": [float(s) for s in c.score[a:b]]})
        return out

    def __repr__(self) -> str:
        return f"XMCModel({self.method}, {self.n_labels} labels, {self.folder})"


def _resolve(path: Path, method: str | None) -> Path:
    """A method folder from a method folder, a run's model/ folder or a run folder."""
    if (path / "model" / INDEX).is_file() and not (path / INDEX).is_file():
        path = path / "model"
    if (path / INDEX).is_file():
        index = load_record(path, INDEX)
        name = method or index["main"]
        if name not in index["methods"]:
            raise ModelError(f"{path}: no {name!r} model; it holds {index['methods']}")
        return path / name
    if method is not None and (path / method).is_dir():
        return path / method
    return path
