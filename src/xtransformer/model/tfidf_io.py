"""The TF-IDF vectoriser as plain data: vocabulary (JSON list, column order), idf (``.npz``) and
the analyser settings, never a pickle of the sklearn object (pickles run code when loaded and
break across sklearn versions). Rebuilding sklearn's ``TfidfVectorizer`` from them with a fixed
vocabulary reproduces the run's features bit for bit.

Datasets that came with features (XC / npz formats) have no vectoriser: the record then says
``input: features`` and prediction l2-normalises the given rows, as the pipeline did.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import scipy.sparse as sp

from xtransformer.model.folder import ModelError, load_record
from xtransformer.utils.io import atomic_path, save_json

SETTINGS = "tfidf.json"
VOCABULARY = "vocabulary.json"
IDF = "idf.npz"
LEAD_DIR = "lead"
# get_params() entries that are not analyser settings, or that cannot be stored as data
_SKIP = {"vocabulary", "dtype", "input", "tokenizer", "preprocessor", "analyzer", "stop_words"}


def save_tfidf(vectorizer: Any | None, folder: Path, n_features: int) -> None:
    """Write the fitted ``vectorizer`` (or, when None, the features-input record) into ``folder``;
    a lead block's vectoriser (``LeadTfidf``) goes in ``folder/lead/``."""
    folder.mkdir(parents=True, exist_ok=True)
    if vectorizer is None:
        save_json({"input": "features", "n_features": int(n_features), "normalize": "l2"}, folder / SETTINGS)
        return
    from xtransformer.data.tfidf import LeadTfidf

    with_lead = isinstance(vectorizer, LeadTfidf)
    record = {"input": "text", "n_features": int(n_features),
              **_save_vectorizer(vectorizer.body if with_lead else vectorizer, folder)}
    if with_lead:
        record["lead"] = {"chars": vectorizer.chars, "weight": vectorizer.weight, "dir": LEAD_DIR,
                          **_save_vectorizer(vectorizer.lead, folder / LEAD_DIR)}
    save_json(record, folder / SETTINGS)


def _save_vectorizer(vectorizer: Any, folder: Path) -> dict[str, Any]:
    """Vocabulary and idf files in ``folder``; returns the analyser record."""
    params = vectorizer.get_params()
    for key in ("tokenizer", "preprocessor", "stop_words"):
        if params.get(key) is not None:
            raise ModelError(f"TF-IDF vectoriser with a custom {key} cannot be stored as data")
    if params.get("analyzer") != "word":
        raise ModelError(f"TF-IDF vectoriser with analyzer={params.get('analyzer')!r} cannot be stored as data")
    terms = [""] * len(vectorizer.vocabulary_)
    for term, col in vectorizer.vocabulary_.items():
        terms[col] = term
    settings = {k: v for k, v in params.items() if k not in _SKIP}
    settings["ngram_range"] = list(settings["ngram_range"])
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_path(folder / VOCABULARY) as tmp:
        tmp.write_text(json.dumps(terms, ensure_ascii=False), encoding="utf-8")
    with atomic_path(folder / IDF) as tmp:
        with open(tmp, "wb") as fh:
            np.savez(fh, idf=np.asarray(vectorizer.idf_))
    return {"n_terms": len(terms), "dtype": np.dtype(params["dtype"]).name, "vectorizer": settings}


class TfidfFeatures:
    """Texts (or given feature rows) -> the ranker's TF-IDF input, exactly as the run computed it."""

    def __init__(self, folder: Path):
        self.record = load_record(folder, SETTINGS)
        self.n_features = int(self.record["n_features"])
        self.vectorizer = _load_vectorizer(folder, self.record) if self.record["input"] == "text" else None

    @property
    def takes_text(self) -> bool:
        return self.vectorizer is not None

    def from_texts(self, texts: Sequence[str]) -> sp.csr_matrix:
        if self.vectorizer is None:
            raise ModelError("this model was trained on given features, not text: predict from a feature matrix")
        from xtransformer.data.tfidf import _transform  # the pipeline's own chunked transform

        X = _transform(self.vectorizer, list(texts), n_jobs=1).tocsr()
        X.sort_indices()  # as the pipeline stores them
        return X

    def from_features(self, X: sp.spmatrix) -> sp.csr_matrix:
        if not sp.issparse(X) or X.ndim != 2 or X.shape[1] != self.n_features:
            raise ModelError(f"features must be a sparse N x {self.n_features} matrix, got "
                             f"{getattr(X, 'shape', type(X).__name__)}")
        if self.vectorizer is not None:
            return sp.csr_matrix(X, dtype=np.float32)  # already this model's TF-IDF rows
        from sklearn.preprocessing import normalize

        return normalize(X.astype(np.float32), norm="l2", copy=True).tocsr()


def _load_vectorizer(folder: Path, record: dict[str, Any]) -> Any:
    body = _load_one(folder, record)
    lead = record.get("lead")
    if lead is None:
        return body
    from xtransformer.data.tfidf import LeadTfidf

    vec = LeadTfidf(body, _load_one(folder / lead["dir"], lead), lead["chars"], lead["weight"])
    if vec.n_features != int(record["n_features"]):
        raise ModelError(f"{folder}: body and lead vocabularies hold {vec.n_features} terms, the record "
                         f"says {record['n_features']}")
    return vec


def _load_one(folder: Path, record: dict[str, Any]) -> Any:
    from sklearn.feature_extraction.text import TfidfVectorizer

    terms = load_record(folder, VOCABULARY)
    try:
        with np.load(folder / IDF, allow_pickle=False) as z:
            idf = z["idf"]
    except (OSError, ValueError, KeyError) as e:
        raise ModelError(f"{folder / IDF}: unreadable ({e})") from None
    n_terms = int(record["n_terms"] if "n_terms" in record else record["n_features"])  # older folders: n_features
    if len(terms) != len(idf) or len(terms) != n_terms:
        raise ModelError(f"{folder}: vocabulary ({len(terms)}) and idf ({len(idf)}) sizes differ")
    settings = dict(record["vectorizer"])
    settings["ngram_range"] = tuple(settings["ngram_range"])
    vec = TfidfVectorizer(vocabulary={t: i for i, t in enumerate(terms)}, dtype=np.dtype(record["dtype"]), **settings)
    vec.idf_ = idf  # with a fixed vocabulary this is all a fitted vectoriser holds
    return vec
