"""TF-IDF features from text, a stage of the stage cache (key: the data's content + settings).

Word unigrams + bigrams, sublinear tf, l2-normalised rows, a configurable vocabulary cap: the
features the XMC literature and PECOS's benchmarks use. The vectoriser is fit on train only;
dev/test are transformed with it. With ``lead_chars`` > 0 a second TF-IDF block holds the words
of each document's opening (a legal act's title and header; a paper's title), so the linear
models weigh them apart from the body: ``[body | lead_weight * lead]``, rows l2-normalised.
Datasets that come with features (XC / npz formats) pass them through unchanged.
"""

from __future__ import annotations

import logging
import pickle
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.preprocessing import normalize

from xtransformer.cache import StageCache
from xtransformer.data.dataset import XMCDataset
from xtransformer.data.errors import DataError
from xtransformer.data.paths import default_cache_dir
from xtransformer.settings import Settings, run_field
from xtransformer.utils.io import load_csr, save_csr, save_json, settings_key

log = logging.getLogger(__name__)

VECTORIZER = "vectorizer.pkl"


@dataclass
class TfidfConfig(Settings):
    """Mirrors ``configs/tfidf/default.yaml``."""

    where = "tfidf"
    error = DataError

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


def tfidf_key(source_key: str, cfg: TfidfConfig, splits: list[str]) -> str:
    """The TF-IDF stage's cache key: the data's content key, the training settings, the splits."""
    return settings_key("tfidf", source_key, cfg.training_settings(), sorted(splits))


def tfidf_features(
    ds: XMCDataset,
    cfg: TfidfConfig | dict | None = None,
    cache_dir: str | Path | None = None,
    use_cache: bool = True,
    cache: StageCache | None = None,
    key: str | None = None,
) -> dict[str, sp.csr_matrix]:
    """TF-IDF matrices (float32 CSR, l2-normalised rows) for every split of ``ds``, through the
    stage cache (``cache``, else one at ``cache_dir``; ``key`` defaults to :func:`tfidf_key`)."""
    cfg = TfidfConfig.from_mapping(cfg) if isinstance(cfg, dict) else (cfg or TfidfConfig())
    if not ds.has_texts:
        if any(s.X is None for s in ds.splits.values()):
            raise DataError(f"dataset {ds.name!r} has neither texts nor features for every split")
        return {name: normalize(s.X.astype(np.float32), norm="l2", copy=True).tocsr() for name, s in ds.splits.items()}
    own = cache is None
    cache = cache if cache is not None else StageCache(Path(cache_dir or default_cache_dir()), enabled=use_cache)
    key = key or tfidf_key(ds.source_key, cfg, list(ds.splits))

    def build(tmp: Path) -> None:
        vec, out = fit_tfidf(ds, cfg)
        for s, X in out.items():
            save_csr(X, tmp / f"X.{s}.npz")
        with open(tmp / VECTORIZER, "wb") as fh:
            pickle.dump(vec, fh)  # a workspace artifact; model folders store vocabulary + idf (model/tfidf_io.py)
        save_json({"settings": cfg.training_settings(), "source_key": ds.source_key,
                   "n_features": out["train"].shape[1]}, tmp / "meta.json")

    folder = cache.run("tfidf", key, build, settings=cfg.training_settings())
    out = {s: load_csr(folder / f"X.{s}.npz") for s in ds.splits}
    if own:
        cache.close()
    return out


def fit_tfidf(ds: XMCDataset, cfg: TfidfConfig) -> tuple[TfidfVectorizer, dict[str, sp.csr_matrix]]:
    """Fit on train, transform every split (rows sorted, l2-normalised)."""
    t0 = time.perf_counter()
    vec = _vectorizer(cfg)
    if cfg.lead_chars:
        vec = LeadTfidf(vec, _vectorizer(cfg), cfg.lead_chars, cfg.lead_weight)
    out = {"train": vec.fit_transform(ds.splits["train"].texts).tocsr()}
    for name, split in ds.splits.items():
        if name != "train":
            out[name] = _transform(vec, split.texts, cfg.n_jobs)
    for X in out.values():
        X.sort_indices()
    log.info("TF-IDF: %d features, fit+transform %.1fs (%s)", out["train"].shape[1], time.perf_counter() - t0,
             ", ".join(f"{s} {X.shape[0]}x{X.shape[1]}" for s, X in out.items()))
    return vec, out


def load_vectorizer(folder: str | Path) -> TfidfVectorizer | LeadTfidf:
    """The fitted vectoriser of a TF-IDF stage folder (to featurise new text at prediction time)."""
    path = Path(folder) / VECTORIZER
    if not path.is_file():
        raise DataError("no TF-IDF vectoriser here; run tfidf_features first", path)
    with open(path, "rb") as fh:
        return pickle.load(fh)
