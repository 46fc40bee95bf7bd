"""Data layer: XMC dataset formats, label vocabulary, TF-IDF features.

Names load on first use, so that a module needing only the label vocabulary (the label tree, the
linear model) does not import scikit-learn with the TF-IDF stage.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "DataConfig": "dataset",
    "Split": "dataset",
    "XMCDataset": "dataset",
    "load_dataset": "dataset",
    "resolve_dataset_dir": "dataset",
    "warn_unseen_labels": "dataset",
    "DataError": "errors",
    "read_xc_sparse": "readers",
    "write_xc_sparse": "readers",
    "TfidfConfig": "tfidf",
    "load_vectorizer": "tfidf",
    "tfidf_features": "tfidf",
    "LabelVocab": "vocab",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
