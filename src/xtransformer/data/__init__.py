"""Data layer: XMC dataset formats, label vocabulary, TF-IDF features."""

from xtransformer.data.dataset import (
    DataConfig,
    Split,
    XMCDataset,
    load_dataset,
    resolve_dataset_dir,
    warn_unseen_labels,
)
from xtransformer.data.errors import DataError
from xtransformer.data.readers import read_xc_sparse, write_xc_sparse
from xtransformer.data.tfidf import TfidfConfig, load_vectorizer, tfidf_features
from xtransformer.data.vocab import LabelVocab

__all__ = [
    "DataConfig",
    "DataError",
    "LabelVocab",
    "Split",
    "TfidfConfig",
    "XMCDataset",
    "load_dataset",
    "load_vectorizer",
    "read_xc_sparse",
    "resolve_dataset_dir",
    "tfidf_features",
    "warn_unseen_labels",
    "write_xc_sparse",
]
