"""TF-IDF features from text, cached on disk under a key of data + settings.

Word unigrams + bigrams, sublinear tf, l2-normalised rows, a configurable vocabulary cap: the
features the XMC literature and PECOS's benchmarks use. The vectoriser is fit on train only;
dev/test are transformed with it. Datasets that come with features (XC / npz formats) pass
them through unchanged.
"""

from __future__ import annotations

import dataclasses
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

from xtransformer.data.dataset import XMCDataset
from xtransformer.data.errors import DataError
from xtransformer.data.paths import default_cache_dir
from xtransformer.utils.io import atomic_dir, is_complete, load_csr, save_csr, save_json, settings_key

log = logging.getLogger(__name__)


@dataclass
class TfidfConfig:
    """Mirrors ``configs/tfidf/default.yaml``."""

    ngram_max: int = 2
    max_features: int | None = 200_000
    min_df: int = 2
    max_df: float = 1.0
    sublinear_tf: bool = True
    lowercase: bool = True
    strip_accents: str | None = "unicode"
    token_pattern: str = r"(?u)\b\w\w+\b"
    dtype: str = "float32"
    n_jobs: int = 2  # threads transforming chunks of documents after the fit


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


def _transform(vec: TfidfVectorizer, texts: list[str], n_jobs: int) -> sp.csr_matrix:
    if n_jobs <= 1 or len(texts) < 2000:
        return vec.transform(texts).tocsr()
    chunks = np.array_split(np.arange(len(texts)), n_jobs * 4)
    with ThreadPoolExecutor(n_jobs) as pool:
        parts = list(pool.map(lambda idx: vec.transform([texts[i] for i in idx]), chunks))
    return sp.vstack(parts, format="csr")


def _settings(cfg: TfidfConfig) -> dict:
    return dataclasses.asdict(cfg) | {"n_jobs": None}  # threads do not change the features


def _cache_folder(ds: XMCDataset, cfg: TfidfConfig, cache_dir: str | Path | None) -> Path:
    key = settings_key(ds.source_key, _settings(cfg), sorted(ds.splits))
    return Path(cache_dir or default_cache_dir()) / "tfidf" / f"{ds.name}-{key}"


def tfidf_features(
    ds: XMCDataset,
    cfg: TfidfConfig | dict | None = None,
    cache_dir: str | Path | None = None,
    use_cache: bool = True,
) -> dict[str, sp.csr_matrix]:
    """TF-IDF matrices (float32 CSR, l2-normalised rows) for every split of ``ds``."""
    cfg = TfidfConfig(**cfg) if isinstance(cfg, dict) else (cfg or TfidfConfig())
    if not ds.has_texts:
        if any(s.X is None for s in ds.splits.values()):
            raise DataError(f"dataset {ds.name!r} has neither texts nor features for every split")
        return {name: normalize(s.X.astype(np.float32), norm="l2", copy=True).tocsr() for name, s in ds.splits.items()}
    settings = _settings(cfg)
    folder = _cache_folder(ds, cfg, cache_dir)
    if use_cache and is_complete(folder):
        log.info("TF-IDF: cache hit %s", folder)
        return {s: load_csr(folder / f"X.{s}.npz") for s in ds.splits}
    t0 = time.perf_counter()
    vec = _vectorizer(cfg)
    out = {"train": vec.fit_transform(ds.splits["train"].texts).tocsr()}
    for name, split in ds.splits.items():
        if name != "train":
            out[name] = _transform(vec, split.texts, cfg.n_jobs)
    for X in out.values():
        X.sort_indices()
    log.info(
        "TF-IDF: %d features, fit+transform %.1fs (%s)",
        out["train"].shape[1],
        time.perf_counter() - t0,
        ", ".join(f"{s} {X.shape[0]}x{X.shape[1]}" for s, X in out.items()),
    )
    if use_cache:
        with atomic_dir(folder) as tmp:
            for s, X in out.items():
                save_csr(X, tmp / f"X.{s}.npz")
            with open(tmp / "vectorizer.pkl", "wb") as fh:
                pickle.dump(vec, fh)
            save_json({"settings": settings, "source_key": ds.source_key, "n_features": out["train"].shape[1]}, tmp / "meta.json")
    return out


def load_vectorizer(ds: XMCDataset, cfg: TfidfConfig | None = None, cache_dir: str | Path | None = None) -> TfidfVectorizer:
    """The fitted vectoriser of a cached TF-IDF (to featurise new text at prediction time)."""
    path = _cache_folder(ds, cfg or TfidfConfig(), cache_dir) / "vectorizer.pkl"
    if not path.is_file():
        raise DataError("no cached TF-IDF vectoriser; run tfidf_features first", path)
    with open(path, "rb") as fh:
        return pickle.load(fh)
