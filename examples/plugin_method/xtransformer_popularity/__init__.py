"""The popularity baseline of XMC papers as an xtransformer method: each label scores its share of
the training documents, the same for every document. A method from another package: registered by
the entry point ``xtransformer.methods`` in this package's ``pyproject.toml``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from xtransformer.api import ModelRecords, ReadsFeatureRows, Settings, XMCModel, predict_field, settings_key


@dataclass
class PopularityConfig(Settings):
    """The config group ``popularity``."""

    where = "popularity"

    smoothing: float = 0.0  # added to every label's count (a training setting: part of the stage key)
    topk: int = predict_field(20)  # labels kept per document

    def check(self) -> None:
        if not self.smoothing >= 0:
            raise self.bad("smoothing", "must be >= 0")
        if self.topk < 1:
            raise self.bad("topk", "must be an int >= 1")


@dataclass
class PopularitySettings(Settings):
    """Everything ``Popularity.fit`` reads: one field per config group."""

    popularity: PopularityConfig = field(default_factory=PopularityConfig)


class Popularity(ReadsFeatureRows, XMCModel):
    """Label scores from the training documents' label counts."""

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
            np.save(tmp / "scores.npy", (counts / max(counts.sum(), 1e-12)).astype(np.float32))

        folder = ctx.cache.run("popularity", keys["popularity"], build, settings=s.popularity.training_settings())
        records = ModelRecords.of(data, s.popularity.prediction_settings(), s.training_settings())
        model = cls(records, np.load(folder / "scores.npy"))
        model.training_run.report = {"stage_keys": keys}
        return model

    def _scores(self, n: int, settings: dict[str, Any]) -> sp.csr_matrix:
        top = np.argsort(-self.scores, kind="stable")[: int(settings["topk"])]
        rows = np.repeat(np.arange(n), len(top))
        return sp.csr_matrix((np.tile(self.scores[top], n), (rows, np.tile(top, n))), shape=(n, len(self.scores)))

    def _predict_texts(self, texts: list[str], settings: dict[str, Any], report: Any) -> sp.csr_matrix:
        return self._scores(len(texts), settings)

    def _predict_features(self, X: sp.spmatrix, settings: dict[str, Any]) -> sp.csr_matrix:
        return self._scores(X.shape[0], settings)

    def _feature_rows(self, X: sp.spmatrix) -> sp.spmatrix:
        return X

    def _save_components(self, tmp: Path, folder: Path) -> dict[str, Any]:
        np.save(tmp / "scores.npy", self.scores)
        return {"kind": self.kind, "scores": "scores.npy"}

    @classmethod
    def _load(cls, folder: Path, components: dict[str, Any], records: ModelRecords, verify: bool) -> Popularity:
        return cls(records, np.load(folder / components["scores"]))
