"""A toy method added the way docs/ARCHITECTURE.md says ("How to add a method"): it predicts each
label's share of the training documents, the popularity baseline of XMC papers. Registered by
``test_registry.py`` with one line in ``xtransformer.methods.METHODS`` and one config file."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from xtransformer.methods.abilities import ReadsFeatureRows
from xtransformer.methods.base import ModelRecords, XMCModel
from xtransformer.settings import Settings, predict_field
from xtransformer.utils.io import settings_key


@dataclass
class PopularityConfig(Settings):
    where = "popularity"

    smoothing: float = 0.0  # added to every label's count (a training setting: part of the key)
    topk: int = predict_field(20)


@dataclass
class PopularitySettings(Settings):
    popularity: PopularityConfig = field(default_factory=PopularityConfig)


class Popularity(ReadsFeatureRows, XMCModel):
    kind = "popularity"
    settings_class = PopularitySettings

    def __init__(self, records: ModelRecords, scores: np.ndarray):
        super().__init__(records)
        self.scores = scores

    @classmethod
    def stage_keys(cls, s: PopularitySettings, data_key: str, n_labels: int, trainer: Any) -> dict[str, str]:
        return {"popularity": settings_key("popularity", data_key, s.popularity.training_settings())}

    @classmethod
    def _fit(cls, data: Any, s: PopularitySettings, ctx: Any, validation: Any, keys: dict[str, str]) -> Popularity:
        def build(tmp: Path) -> None:
            counts = np.asarray(data.Y.sum(axis=0)).ravel() + s.popularity.smoothing
            np.save(tmp / "scores.npy", (counts / counts.sum()).astype(np.float32))

        folder = ctx.cache.run("popularity", keys["popularity"], build, settings=s.popularity.training_settings())
        model = cls(
            ModelRecords.of(data, s.popularity.prediction_settings(), s.training_settings()),
            np.load(folder / "scores.npy"),
        )
        model.training_run.report = {"stage_keys": keys}
        return model

    def _scores(self, n: int, settings: dict[str, Any]) -> sp.csr_matrix:
        top = np.argsort(-self.scores, kind="stable")[: int(settings["topk"])]
        rows = np.repeat(np.arange(n), len(top))
        data = np.tile(self.scores[top], n)
        return sp.csr_matrix((data, (rows, np.tile(top, n))), shape=(n, len(self.scores)))

    def _predict_texts(self, texts: list[str], settings: dict[str, Any], report: Any) -> sp.csr_matrix:
        return self._scores(len(texts), settings)

    def _predict_features(self, X: sp.spmatrix, settings: dict[str, Any]) -> sp.csr_matrix:
        return self._scores(X.shape[0], settings)

    def _save_components(self, tmp: Path, folder: Path) -> dict[str, Any]:
        np.save(tmp / "scores.npy", self.scores)
        return {"kind": self.kind, "scores": "scores.npy"}

    @classmethod
    def _load(cls, folder: Path, components: dict[str, Any], records: ModelRecords, verify: bool) -> Popularity:
        return cls(records, np.load(folder / components["scores"]))
