"""What the two transformer methods share: the semantic label tree, the fine-tuned encoder as a
component (texts -> TF-IDF, embeddings, top-b clusters), its keys and its folder part.

X-Transformer and XR-Transformer differ in how they fine-tune and what ranks after the encoder;
both index labels the same way (``indexing``, optionally from the pretrained encoder's
embeddings, optionally disentangled with XR-Linear's counts), and both predict by encoding texts
with a fine-tuned :class:`~xtransformer.matcher.inference.LoadedMatcher` (X-Transformer: or a
:class:`~xtransformer.methods.cnn.matcher.CNNMatcher`) exactly as they encoded the training
documents, so a saved folder reproduces the run's predictions.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from xtransformer.data.errors import DataError
from xtransformer.data.inputs import LabeledData
from xtransformer.data.tfidf import TfidfFeatures, tfidf_stage
from xtransformer.indexing import ClusterChain, build_index, cluster_quality, learn_overlap
from xtransformer.matcher.inference import EncodeOptions, LoadedMatcher
from xtransformer.matcher.train import inference_precision, tiny_corpus
from xtransformer.methods.abilities import AddsLabels, ScoresZeroShot
from xtransformer.methods.base import ModelRecords, XMCModel
from xtransformer.utils.hardware import predict_device
from xtransformer.utils.io import load_csr, load_json, save_csr, save_json, save_npy, settings_key
from xtransformer.utils.rows import unit_rows

log = logging.getLogger(__name__)

TFIDF_DIR, MATCHER_DIR, RANKER_DIR, TREE_DIR = "tfidf", "matcher", "ranker", "label_tree"
EMBEDDINGS = "embeddings.npy"  # an embedding stage's rows of the training documents, in their order
EmbedFn = Callable[[list[str]], np.ndarray]
Matcher = Any  # a LoadedMatcher or a CNNMatcher: encode / to / save / load alike


@dataclass
class TreeInputs:
    """The matcher settings resolved for the context, the TF-IDF component and rows, the label tree."""

    mcfg: Any
    tfidf: TfidfFeatures
    X: sp.csr_matrix
    chain: ClusterChain


class NeuralModel(AddsLabels, ScoresZeroShot, XMCModel):
    """A model that reads texts through TF-IDF and a fine-tuned encoder (``matcher``)."""

    collective = True  # fine-tuning is shared by the processes of a DDP run

    def __init__(self, records: ModelRecords, tfidf: TfidfFeatures, matcher: Matcher, features: dict[str, Any]):
        super().__init__(records)
        self.tfidf = tfidf
        self.matcher = matcher
        self.features = features  # how the embeddings the rankers read were made: part of the model

    @classmethod
    def _check(cls, data: LabeledData, s: Any) -> None:
        from xtransformer.indexing import check_copies_fit
        from xtransformer.matcher.train import check_model

        data.require_texts(f"method={cls.kind}")
        if s.tfidf.source == "given":  # its folder reads documents as texts alone, the rankers' TF-IDF included
            raise DataError(
                f"tfidf=given: method={cls.kind} computes its rankers' TF-IDF from the texts it predicts for; "
                "use tfidf=default, or method=xrlinear with tfidf=given"
            )
        check_model(s.matcher)
        check_copies_fit(s.indexing, data.n_labels, "indexing")

    @staticmethod
    def _tree_inputs(ctx: Any, data: LabeledData, s: Any, keys: dict[str, Any]) -> TreeInputs:
        """What both transformer methods build before fine-tuning: TF-IDF and the label tree."""
        tfidf, X = tfidf_stage(ctx.cache, data, s.tfidf, keys["tfidf"])
        chain, _ = index_stage(ctx, data, X, s, keys["indexing"])
        return TreeInputs(ctx.matcher_settings(s.matcher), tfidf, X, chain)

    def to(self, device: str) -> NeuralModel:
        """Encode on ``device`` (``cpu``, ``cuda``, ``cuda:N``, ``auto``); the rankers stay on the CPU."""
        self.device = predict_device(device)
        self.matcher.to(self.device)
        return self

    def embed(
        self, texts: list[str], settings: dict[str, Any], token_cache: Path | None = None, progress: bool = False
    ) -> tuple[np.ndarray, sp.csr_matrix]:
        """(embeddings in the dtype training stored them, the head's top-b clusters) of ``texts``."""
        options = EncodeOptions(
            batch_size=settings["eval_batch_size"],
            topb=settings["topb"],
            precision=settings["inference_precision"],
            normalize=self.features["normalize_embeddings"],
            max_length=self.features.get("max_length"),  # older folders: the fine-tuning length
            progress=progress,
        )
        pred = self.matcher.encode(texts, options, token_cache)
        return pred.embeddings.astype(self.features["embeddings_dtype"]), pred.topb

    def embed_stage(
        self, ctx: Any, stage: str, key: str, data: LabeledData, progress: bool
    ) -> tuple[np.ndarray, sp.csr_matrix]:
        """The training documents embedded once by the fine-tuned encoder (stage ``stage``), with
        this model's own :meth:`embed`: the rankers train on what prediction computes."""

        def build(tmp: Path) -> None:
            import time

            start = time.perf_counter()
            emb, topb = self.embed(data.texts, self.predict_settings, ctx.work_root, progress)
            save_npy(emb, tmp / EMBEDDINGS)
            save_csr(topb, tmp / "topb.npz")
            save_json(
                {"docs_per_s": round(len(data) / max(time.perf_counter() - start, 1e-9), 2), "device": self.device},
                tmp / "facts.json",
            )

        folder = ctx.cache.run(stage, key, build, settings=self.predict_settings)
        self.training_run.report.setdefault("encode", load_json(folder / "facts.json"))
        return np.load(folder / EMBEDDINGS), load_csr(folder / "topb.npz")

    def embed_rows(self, rows: Any, stage: str, texts: list[str], progress: bool = False) -> np.ndarray:
        """The texts' embeddings: the training run's (stage ``stage`` of ``rows``, a
        :class:`~xtransformer.methods.reuse.RunRows`) where it embedded the text at this model's
        inference precision, this model's :meth:`embed` for the rest."""

        def encode(at: np.ndarray) -> np.ndarray:
            return self.embed([texts[i] for i in at], self.predict_settings, progress=progress)[0]

        key = "inference_precision"  # the one embedding setting a call may change after training
        same = rows is not None and stage in rows.folders
        same = same and rows.settings(stage).get(key) == self.predict_settings.get(key)
        got = rows.rows(stage, lambda folder: np.load(folder / EMBEDDINGS), encode) if same else None
        return encode(np.arange(len(texts))) if got is None else got

    def _label_rows(self, names: list[str]) -> np.ndarray:
        """The fine-tuned encoder's unit embeddings of the label texts (name and alternative names)."""
        return unit_rows(self.embed(names, self.predict_settings)[0].astype(np.float32))

    # ------------------------------------------------------------------ folders
    def _save_neural(self, tmp: Path) -> dict[str, Any]:
        self.tfidf.save(tmp / TFIDF_DIR)
        self.matcher.save(tmp / MATCHER_DIR)
        return {
            "kind": self.kind,
            "tfidf": TFIDF_DIR,
            "matcher": MATCHER_DIR,
            "ranker": RANKER_DIR,
            "features": self.features,
        }

    @staticmethod
    def _load_neural(folder: Path) -> tuple[TfidfFeatures, Matcher]:
        return TfidfFeatures.load(folder / TFIDF_DIR), load_matcher(folder / MATCHER_DIR)


def load_matcher(path: Path, device: str = "cpu") -> Matcher:
    """The matcher a folder holds: a text CNN (``cnn.json``) or a fine-tuned transformer."""
    from xtransformer.methods.cnn.matcher import CNNMatcher, is_cnn_matcher

    return (CNNMatcher if is_cnn_matcher(path) else LoadedMatcher).load(path, device)


def embedding_record(features: str, neural_weight: float, mcfg: Any, embed_length: int | None = None) -> dict[str, Any]:
    """How the embeddings the rankers were trained on were made: part of the model (the rankers'
    weights fit them), never a prediction setting a call may override. ``embed_length``: tokens
    read per document (None: the matcher group's ``embed_length``)."""
    return {
        "kind": features,
        "neural_weight": neural_weight,
        "normalize_embeddings": mcfg.normalize_embeddings,
        "embeddings_dtype": mcfg.save_embeddings_dtype,
        "max_length": embed_length or mcfg.embed_length,
    }


def encoder_predict_settings(mcfg: Any, trainer_precision: Any) -> dict[str, Any]:
    """The encoder's prediction settings (a call may override them)."""
    return {
        "topb": mcfg.topb,
        "eval_batch_size": mcfg.eval_batch_size,
        "inference_precision": inference_precision(mcfg, trainer_precision),
    }


# ---------------------------------------------------------------------------------------- keys
def index_key(s: Any, tfidf_key: str, precision: Any) -> str:
    """The label tree's key: its settings, the pretrained encoder it may embed with, and (λ > 1)
    the linear model its overlap is counted from."""
    m = s.matcher
    encoder = {
        "model_name_or_path": m.model_name_or_path,
        "max_length": m.max_length,
        "truncate_chars": m.truncate_chars,
        "precision": str(precision),
    }
    return settings_key(
        "index", tfidf_key, s.indexing.training_settings(), encoder, *s.xrlinear.overlap_source(s.indexing.n_copies)
    )


def outputs_key(stage: str, encoder_key: str, mcfg: Any, precision: Any) -> str:
    """The key of the training documents' embeddings: the encoder's, its prediction settings."""
    predict = mcfg.prediction_settings() | {"inference_precision": inference_precision(mcfg, precision)}
    return settings_key(stage, encoder_key, predict)


# ---------------------------------------------------------------------------------------- indexing
def index_stage(ctx: Any, data: LabeledData, X: sp.csr_matrix, s: Any, key: str) -> tuple[ClusterChain, dict]:
    """The label tree of ``s.indexing`` (stage ``indexing``) and its report."""
    icfg = s.indexing

    def build(tmp: Path) -> None:
        embed_fn = pretrained_embedder(ctx, s.matcher, data.texts)
        doc_emb = embed_fn(data.texts) if "pifa_neural" in icfg.name else None
        chain, report = build_index(
            icfg,
            data.Y,
            X_train_tfidf=X,
            doc_embeddings=doc_emb,
            label_texts=data.label_names,
            embed_fn=embed_fn,
            label_ids=data.label_ids,
        )
        if icfg.n_copies > 1:  # the matcher and the rankers then train on the overlapping leaf level
            chain, report["disentangle"] = learn_overlap(chain, X, data.Y, icfg, s.xrlinear.model, s.xrlinear.nr_splits)
            report["quality"] = cluster_quality(chain, Y=data.Y, seed=icfg.seed)
        chain.save(tmp / "chain", data.label_ids, report["config"])
        save_json(report, tmp / "report.json")

    folder = ctx.cache.run("indexing", key, build, settings=icfg.training_settings())
    report = load_json(folder / "report.json")
    log.info(
        "indexing %s: K=%d, levels %s, quality %s",
        icfg.name,
        report["n_clusters"],
        report["level_sizes"],
        report.get("quality"),
    )
    return ClusterChain.load(folder / "chain", data.label_ids), report


def pretrained_embedder(ctx: Any, mcfg: Any, train_texts: list[str]) -> EmbedFn:
    """Mean-pooled embeddings from the (not yet fine-tuned) encoder, for text_emb / pifa_neural;
    the encoder loads on first use (pifa_tfidf without orphan labels never needs it)."""
    state: dict[str, Any] = {}

    def embed(texts: list[str]) -> np.ndarray:
        from xtransformer.encoders import EmbedOptions, embed_texts, load_encoder

        if "model" not in state:  # a tiny:* model must be the one the matcher fine-tunes
            state["model"], state["tok"] = load_encoder(
                mcfg.model_name_or_path, mcfg.cache_dir, corpus=tiny_corpus(mcfg, train_texts)
            )
            state["model"].eval()
        # the trainer's precision (a training setting, in the index key), not the matcher's inference one
        options = EmbedOptions(
            max_length=mcfg.max_length,
            batch_size=mcfg.eval_batch_size,
            pooling="mean",
            precision=str(ctx.trainer.precision),
            truncate_chars=mcfg.truncate_chars,
        )
        return embed_texts(state["model"], state["tok"], texts, options)

    return embed
