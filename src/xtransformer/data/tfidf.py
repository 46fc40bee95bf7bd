"""TF-IDF features from text: the settings, the fitted vectoriser as data, and the TF-IDF stage.

Word unigrams + bigrams, sublinear tf, l2-normalised rows, a configurable vocabulary cap: the
features the XMC literature and PECOS's benchmarks use. The vectoriser is fit on the training
documents only; other documents are transformed with it. With ``lead_chars`` > 0 a second TF-IDF
block holds the words of each document's opening (a legal act's title and header; a paper's
title), so the linear models weigh them apart from the body: ``[body | lead_weight * lead]``, rows
l2-normalised. Data that come with features (XC / npz formats) pass them through, l2-normalised,
and so do a text dataset's own TF-IDF rows with ``tfidf.source: given`` (``tfidf=given``: the
xmc-base layout's ``tfidf-attnxml/``, the features the papers' linear models read).

:class:`TfidfFeatures` is the component every method holds: documents in, the model's TF-IDF rows
out, saved as plain data (vocabulary JSON list in column order, idf ``.npz``, the analyser
settings), never a pickle (pickles run code when loaded and break across sklearn versions).
Rebuilding sklearn's ``TfidfVectorizer`` from them with a fixed vocabulary reproduces the
features bit for bit.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import scipy.sparse as sp

from xtransformer.data.errors import DataError
from xtransformer.model.folder import ModelError, load_record
from xtransformer.settings import Settings, run_field
from xtransformer.utils.io import atomic_path, load_csr, save_csr, save_json, settings_key

if TYPE_CHECKING:  # scikit-learn loads when a vectoriser is made or read: the settings record alone needs none
    from sklearn.feature_extraction.text import TfidfVectorizer

log = logging.getLogger(__name__)

SETTINGS = "tfidf.json"
VOCABULARY = "vocabulary.json"
IDF = "idf.npz"
LEAD_DIR = "lead"
SOURCES = ("text", "given")  # where the TF-IDF rows come from: fit on the texts, or shipped with the dataset
UNIT_TOLERANCE = 1e-5  # a given row counts as l2-normalised when its squared norm is this close to 1
# get_params() entries that are not analyser settings, or that cannot be stored as data
_SKIP = {"vocabulary", "dtype", "input", "tokenizer", "preprocessor", "analyzer", "stop_words"}


@dataclass
class TfidfConfig(Settings):
    """The ``tfidf`` config group's record: word uni+bigram TF-IDF, sublinear tf, l2-normalised rows."""

    where = "tfidf"
    error = DataError

    source: str = "text"  # text: fit on the training texts | given: the dataset's own TF-IDF rows
    ngram_max: int = 2
    max_features: int | None = 200_000
    min_df: int = 2
    max_df: float = 1.0
    sublinear_tf: bool = True
    lowercase: bool = True
    strip_accents: str | None = "unicode"
    token_pattern: str = r"(?u)\b\w\w+\b"
    dtype: str = "float32"
    lead_chars: int = 0  # > 0: also a block of each document's first lead_chars characters
    lead_weight: float = 1.0  # that block's weight before the row is l2-normalised
    n_jobs: int = run_field(2)  # threads transforming chunks of documents after the fit

    def check(self) -> None:
        if self.source not in SOURCES:
            raise self.bad("source", f"expected one of {list(SOURCES)}")
        for key in ("ngram_max", "min_df", "n_jobs"):
            if getattr(self, key) < 1:
                raise self.bad(key, "must be an int >= 1")
        if self.lead_chars < 0:
            raise self.bad("lead_chars", "must be an int >= 0 (0: no lead block)")
        if not self.lead_weight > 0:
            raise self.bad("lead_weight", "must be > 0")
        if self.max_features is not None and self.max_features < 1:
            raise self.bad("max_features", "must be an int >= 1, or null for the whole vocabulary")
        if not 0 < self.max_df <= 1:
            raise self.bad("max_df", "must be a fraction of documents in (0, 1]")
        if self.dtype not in ("float32", "float64"):
            raise self.bad("dtype", "expected one of ['float32', 'float64']")
        if self.strip_accents not in (None, "unicode", "ascii"):
            raise self.bad("strip_accents", "expected one of ['unicode', 'ascii', None]")


def _vectorizer(cfg: TfidfConfig) -> TfidfVectorizer:
    from sklearn.feature_extraction.text import TfidfVectorizer

    return TfidfVectorizer(
        ngram_range=(1, cfg.ngram_max),
        max_features=cfg.max_features,
        min_df=cfg.min_df,
        max_df=cfg.max_df,
        sublinear_tf=cfg.sublinear_tf,
        lowercase=cfg.lowercase,
        strip_accents=cfg.strip_accents,
        token_pattern=cfg.token_pattern,
        dtype=np.dtype(cfg.dtype),
        norm="l2",
    )


class LeadTfidf:
    """``[body | weight * lead]`` TF-IDF, rows l2-normalised: ``body`` reads whole documents,
    ``lead`` their first ``chars`` characters. Fit and transform as a sklearn vectoriser."""

    def __init__(self, body: TfidfVectorizer, lead: TfidfVectorizer, chars: int, weight: float):
        self.body, self.lead, self.chars, self.weight = body, lead, int(chars), float(weight)

    @property
    def n_features(self) -> int:
        return len(self.body.vocabulary_) + len(self.lead.vocabulary_)

    def fit_transform(self, texts: list[str]) -> sp.csr_matrix:
        return self.stack(self.body.fit_transform(texts), self.lead.fit_transform(self.leads(texts)))

    def transform(self, texts: list[str]) -> sp.csr_matrix:
        return self.stack(self.body.transform(texts), self.lead.transform(self.leads(texts)))

    def leads(self, texts: list[str]) -> list[str]:
        return [t[: self.chars] for t in texts]

    def stack(self, body: sp.spmatrix, lead: sp.spmatrix) -> sp.csr_matrix:
        both = sp.hstack([body, lead * self.weight], format="csr", dtype=body.dtype)
        from sklearn.preprocessing import normalize

        return normalize(both, norm="l2", copy=False).tocsr()


def n_features(vec: TfidfVectorizer | LeadTfidf) -> int:
    """Columns a fitted vectoriser produces."""
    return vec.n_features if isinstance(vec, LeadTfidf) else len(vec.vocabulary_)


def _transform(vec: TfidfVectorizer | LeadTfidf, texts: list[str], n_jobs: int) -> sp.csr_matrix:
    if n_jobs <= 1 or len(texts) < 2000:
        return vec.transform(texts).tocsr()
    chunks = np.array_split(np.arange(len(texts)), n_jobs * 4)
    with ThreadPoolExecutor(n_jobs) as pool:
        parts = list(pool.map(lambda idx: vec.transform([texts[i] for i in idx]), chunks))
    return sp.vstack(parts, format="csr")


class TfidfFeatures:
    """Documents -> the model's TF-IDF input, exactly as training computed it.

    ``vectorizer``: a fitted ``TfidfVectorizer`` or :class:`LeadTfidf`; None for a model trained
    on given feature rows (``n_features`` columns), which predicts from such rows l2-normalised.
    """

    def __init__(self, vectorizer: TfidfVectorizer | LeadTfidf | None, n_features: int):
        self.vectorizer = vectorizer
        self.n_features = int(n_features)

    @classmethod
    def fit(cls, texts: Sequence[str], cfg: TfidfConfig) -> tuple[TfidfFeatures, sp.csr_matrix]:
        """Fit on ``texts``; returns the features and the texts' rows (sorted, l2-normalised)."""
        t0 = time.perf_counter()
        vec = _vectorizer(cfg)
        if cfg.lead_chars:
            vec = LeadTfidf(vec, _vectorizer(cfg), cfg.lead_chars, cfg.lead_weight)
        X = vec.fit_transform(list(texts)).tocsr()
        X.sort_indices()
        log.info("TF-IDF: %d features, fit on %d documents in %.1fs", X.shape[1], X.shape[0], time.perf_counter() - t0)
        return cls(vec, n_features(vec)), X

    @property
    def takes_text(self) -> bool:
        return self.vectorizer is not None

    def from_texts(self, texts: Sequence[str], n_jobs: int = 1) -> sp.csr_matrix:
        if self.vectorizer is None:
            raise DataError("this model was trained on given features, not text: predict from a feature matrix")
        X = _transform(self.vectorizer, list(texts), n_jobs=n_jobs).tocsr()
        X.sort_indices()
        return X

    def from_features(self, X: sp.spmatrix) -> sp.csr_matrix:
        if not sp.issparse(X) or X.ndim != 2 or X.shape[1] != self.n_features:
            raise ModelError(
                f"features must be a sparse N x {self.n_features} matrix, got {getattr(X, 'shape', type(X).__name__)}"
            )
        if self.vectorizer is not None:
            return sp.csr_matrix(X, dtype=np.float32)  # already this model's TF-IDF rows
        if _unit_float32_rows(X):  # TF-IDF rows as most feature files hold them: no copy of a large matrix
            return sp.csr_matrix(X)
        from sklearn.preprocessing import normalize

        return normalize(X.astype(np.float32), norm="l2", copy=False).tocsr()  # astype copied: normalise that copy

    # ------------------------------------------------------------------ as data
    def save(self, folder: Path) -> None:
        """Write the vectoriser (or the features-input record) into ``folder``; a lead block's
        vectoriser goes in ``folder/lead/``."""
        folder.mkdir(parents=True, exist_ok=True)
        vec = self.vectorizer
        if vec is None:
            save_json({"input": "features", "n_features": self.n_features, "normalize": "l2"}, folder / SETTINGS)
            return
        with_lead = isinstance(vec, LeadTfidf)
        record = {
            "input": "text",
            "n_features": self.n_features,
            **_save_vectorizer(vec.body if with_lead else vec, folder),
        }
        if with_lead:
            record["lead"] = {
                "chars": vec.chars,
                "weight": vec.weight,
                "dir": LEAD_DIR,
                **_save_vectorizer(vec.lead, folder / LEAD_DIR),
            }
        save_json(record, folder / SETTINGS)

    @classmethod
    def load(cls, folder: Path) -> TfidfFeatures:
        record = load_record(folder, SETTINGS)
        vec = _load_vectorizer(folder, record) if record["input"] == "text" else None
        return cls(vec, int(record["n_features"]))


def _unit_float32_rows(X: sp.spmatrix) -> bool:
    """Whether ``X`` is float32 csr whose rows have unit l2 norm already (or none: an empty row)."""
    from xtransformer.utils.rows import row_sq_norms

    if not (isinstance(X, sp.csr_matrix) and X.dtype == np.float32):
        return False
    sq = row_sq_norms(X)
    return bool(np.all((sq == 0) | (np.abs(sq - 1.0) <= UNIT_TOLERANCE)))


def given_features(X: sp.spmatrix) -> tuple[TfidfFeatures, sp.csr_matrix]:
    """Data that came with feature rows: their l2-normalised rows, and the features component."""
    features = TfidfFeatures(None, X.shape[1])
    return features, features.from_features(X)


# ---------------------------------------------------------------------------------------- the stage
TRAIN_ROWS = "X.train.npz"  # the stage's rows of the training documents, in their order


def tfidf_key(data_key: str, cfg: TfidfConfig) -> str:
    """The TF-IDF stage's cache key: the training documents' content key and the training settings
    (``source`` only when it is ``given``: the keys of text TF-IDF stay those made before it existed)."""
    settings = cfg.training_settings()
    if settings.get("source") == "text":
        del settings["source"]
    return settings_key("tfidf", data_key, settings)


def check_source(data: Any, cfg: TfidfConfig, who: str) -> None:
    """One line before any work when ``tfidf.source=given`` finds no TF-IDF rows in ``data``."""
    if cfg.source == "given" and data.features is None:
        raise DataError(
            f"tfidf.source=given: {who} got no TF-IDF rows with the documents (data in the xmc-base layout "
            "ships them in tfidf-attnxml/; XRLinear.fit takes them as a LabeledData with texts and features)",
            data.source,
        )


def tfidf_stage(cache: Any, data: Any, cfg: TfidfConfig, key: str) -> tuple[TfidfFeatures, sp.csr_matrix]:
    """The features component and the training documents' rows of ``data``
    (:class:`~xtransformer.data.inputs.LabeledData`), through the stage cache under ``key``: fit on
    its texts, or its own rows (feature-only data, or ``tfidf.source=given``)."""
    if data.texts is None or cfg.source == "given":
        check_source(data, cfg, "the TF-IDF stage")
        return given_features(data.features)

    def build(tmp: Path) -> None:
        features, X = TfidfFeatures.fit(data.texts, cfg)
        save_csr(X, tmp / TRAIN_ROWS)
        features.save(tmp / "tfidf")

    folder = cache.run("tfidf", key, build, settings=cfg.training_settings())
    return TfidfFeatures.load(folder / "tfidf"), load_csr(folder / TRAIN_ROWS)


def tfidf_features(
    ds: Any, cfg: TfidfConfig | dict | None = None, cache_dir: str | Path | None = None, use_cache: bool = True
) -> dict[str, sp.csr_matrix]:
    """TF-IDF matrices (float32 csr, l2-normalised rows) of every split of a dataset: the vectoriser
    fit on train through the stage cache at ``cache_dir``, the other splits transformed with it."""
    from xtransformer.cache import StageCache
    from xtransformer.data.inputs import LabeledData
    from xtransformer.data.paths import default_cache_dir

    cfg = TfidfConfig.from_mapping(cfg) if isinstance(cfg, dict) else (cfg or TfidfConfig())
    train = LabeledData.from_split(ds, "train")
    cache = StageCache(Path(cache_dir or default_cache_dir()), enabled=use_cache)
    try:
        features, X = tfidf_stage(cache, train, cfg, tfidf_key(train.key, cfg))
    finally:
        cache.close()
    out = {"train": X}
    for name, split in ds.splits.items():
        if name != "train":
            out[name] = (
                features.from_texts(split.texts, cfg.n_jobs)
                if split.texts is not None and features.takes_text
                else features.from_features(split.X)
            )
    return out


# ---------------------------------------------------------------------------------------- as data
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
    with atomic_path(folder / IDF) as tmp, open(tmp, "wb") as fh:
        np.savez(fh, idf=np.asarray(vectorizer.idf_))
    return {"n_terms": len(terms), "dtype": np.dtype(params["dtype"]).name, "vectorizer": settings}


def _load_vectorizer(folder: Path, record: dict[str, Any]) -> Any:
    body = _load_one(folder, record)
    lead = record.get("lead")
    if lead is None:
        return body
    vec = LeadTfidf(body, _load_one(folder / lead["dir"], lead), lead["chars"], lead["weight"])
    if vec.n_features != int(record["n_features"]):
        raise ModelError(
            f"{folder}: body and lead vocabularies hold {vec.n_features} terms, the record says {record['n_features']}"
        )
    return vec


def _load_one(folder: Path, record: dict[str, Any]) -> Any:
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
    from sklearn.feature_extraction.text import TfidfVectorizer

    vec = TfidfVectorizer(vocabulary={t: i for i, t in enumerate(terms)}, dtype=np.dtype(record["dtype"]), **settings)
    vec.idf_ = idf  # with a fixed vocabulary this is all a fitted vectoriser holds
    return vec
