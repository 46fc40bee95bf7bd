"""Small saved models for the model-folder, API and server tests (no pipeline, no Hydra)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.sparse as sp

from tiny_models import toy_xmc
from xtransformer.data.tfidf import TfidfConfig, _vectorizer
from xtransformer.model.export import write_xrlinear
from xtransformer.ranker import HierarchicalLinear, HierarchicalLinearConfig


def toy_tree(C: sp.csr_matrix) -> list[sp.csr_matrix]:
    """Root -> K clusters -> L labels."""
    return [sp.csr_matrix(np.ones((C.shape[1], 1), np.float32)), C]


def labels_record(n: int) -> dict[str, list[str]]:
    return {"ids": [f"L{i}" for i in range(n)], "names": [f"label number {i}" for i in range(n)]}


def save_toy_xrlinear(folder: Path) -> tuple[Path, dict]:
    """An XR-Linear model folder on the toy task; returns it and the task's texts."""
    texts, Y, C = toy_xmc()
    vec = _vectorizer(TfidfConfig(min_df=1))
    X = vec.fit_transform(texts["train"]).tocsr()
    model = HierarchicalLinear.train(X, Y["train"], toy_tree(C), HierarchicalLinearConfig(threads=1))
    write_xrlinear(folder, "xrlinear", vec, X.shape[1], model, {"dataset": "toy"}, labels_record(C.shape[0]))
    return folder, texts
