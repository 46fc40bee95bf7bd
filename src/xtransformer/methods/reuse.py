"""The rows a training run computed for its documents, found again by each text's digest.

Adding labels reads documents the model was mostly trained on: EURLEX57K's 44,000 training acts,
which took XR-Transformer's encoder 460 s to embed on 2 CPU cores. Every fit records the digest of
each training text in the stage ``documents`` (keyed by the data's content key), and the model
records the keys of its stages (``train_settings["stages"]``). Given the run's cache
(``add_labels(..., cache=...)``), it takes a known text's TF-IDF row and embedding from there
and computes only the rows of texts the run never read. Where the cache lacks a stage
(another machine, a cleared cache, a model trained before stages were recorded) every row is
computed, as without it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from xtransformer.cache import StageCache
from xtransformer.data.tfidf import TRAIN_ROWS
from xtransformer.utils.io import load_csr, load_json, save_npy, text_digests

log = logging.getLogger(__name__)

DOCS_STAGE = "documents"


def documents_stage(cache: StageCache, digests: np.ndarray, data_key: str) -> None:
    """Record the digest of every training text (``utils.io.text_digests``), in their order."""
    cache.run(DOCS_STAGE, data_key, lambda tmp: save_npy(digests, tmp / "digests.npy"))


def stage_record(data_key: str, keys: Mapping[str, Any]) -> dict[str, str]:
    """What a model's ``train_settings["stages"]`` keeps: the documents' key and its stages' keys (a
    stage of one key per run; the level loop's keys are left out). Keys only: a folder keeps no
    machine-local path, so the cache is named when labels are added (``add_labels(..., cache=...)``)."""
    return {DOCS_STAGE: data_key} | {name: key for name, key in keys.items() if isinstance(key, str)}


def as_cache(cache: StageCache | str | Path | None) -> StageCache | None:
    """``cache`` as a :class:`StageCache` (a folder's), None as None."""
    return None if cache is None or isinstance(cache, StageCache) else StageCache(Path(cache))


@dataclass
class RunRows:
    """Where each given text sits among the run's documents (``source``: its row there, -1: a text
    the run never read) and the run's finished stage folders by stage name."""

    source: np.ndarray
    folders: dict[str, Path]

    @classmethod
    def find(
        cls, cache: StageCache | None, stages: Mapping[str, str] | None, texts: Sequence[str], wanted: Sequence[str]
    ) -> RunRows | None:
        """The given ``texts`` matched to the documents of the run that wrote ``stages`` into
        ``cache``, with the folders of its ``wanted`` stages found there; None (and a log line
        saying why) where nothing can be reused."""
        if cache is None:
            return None
        if not stages or DOCS_STAGE not in stages:
            log.info("add_labels: the model records no training stages (written before they were kept); "
                     "every document's rows are computed")  # fmt: skip
            return None
        names = [DOCS_STAGE, *(name for name in wanted if name in stages)]
        folders = {name: cache.path(name, stages[name]) for name in names if cache.trusted(name, stages[name])}
        if DOCS_STAGE not in folders:
            log.info("add_labels: %s holds no record of this model's training documents; every document's "
                     "rows are computed", cache.root)  # fmt: skip
            return None
        known = np.load(folders.pop(DOCS_STAGE) / "digests.npy")
        row_of = dict(zip(known.tolist(), range(len(known))))
        source = np.array([row_of.get(d, -1) for d in text_digests(texts).tolist()], dtype=np.int64)
        found = ", ".join(sorted(folders)) or "no stage"
        log.info("add_labels: %d of %d documents found among the %d the model was trained on; rows from %s",
                 int((source >= 0).sum()), len(texts), len(known), found)  # fmt: skip
        return cls(source, folders)

    def rows(self, stage: str, load: Callable[[Path], Any], compute: Callable[[np.ndarray], Any]) -> Any | None:
        """The given texts' rows: the run's (``load(stage folder)``, indexed by ``source``) where it
        read the text, ``compute(positions)`` for the others; None where the stage is not cached."""
        if stage not in self.folders:
            return None
        hit = np.flatnonzero(self.source >= 0)
        miss = np.flatnonzero(self.source < 0)
        stored = load(self.folders[stage])[self.source[hit]]
        if not len(miss):
            return stored
        parts = [stored, compute(miss)]
        order = np.argsort(np.concatenate([hit, miss]), kind="stable")  # back to the given order
        return (sp.vstack(parts, format="csr") if sp.issparse(stored) else np.concatenate(parts))[order]

    def settings(self, stage: str) -> dict[str, Any]:
        """The settings the run built ``stage`` with (its ``stage.json``)."""
        return load_json(self.folders[stage] / "stage.json").get("settings") or {}


def tfidf_rows(rows: RunRows | None, tfidf: Any, texts: Sequence[str]) -> sp.csr_matrix:
    """The texts' TF-IDF rows: the run's where it read the text, ``tfidf``'s vectoriser's for the rest."""

    def vectorise(at: np.ndarray) -> sp.csr_matrix:
        return tfidf.from_texts([texts[i] for i in at])

    got = None if rows is None else rows.rows("tfidf", lambda folder: load_csr(folder / TRAIN_ROWS), vectorise)
    return vectorise(np.arange(len(texts))) if got is None else got
