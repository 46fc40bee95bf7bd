"""Data layer: XMC dataset formats, label vocabulary, TF-IDF features.

Names load on first use, so that a module needing only the label vocabulary (the label tree, the
linear model) does not import scikit-learn with the TF-IDF stage.
"""

from __future__ import annotations

from xtransformer.utils.lazy import lazy_exports

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
__getattr__ = lazy_exports(__name__, _EXPORTS)
