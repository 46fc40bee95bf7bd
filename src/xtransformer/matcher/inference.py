"""Matcher inference: embeddings + top-b clusters, and the saved model folder.

Matcher folder layout (written atomically; the same in the stage cache and in model folders)::

    encoder/               HF save_pretrained layout (weights, config, tokenizer, declared pooling)
    head.safetensors       the Linear(H, K) head (no pickle)
    matcher_config.json    MatcherConfig + resolved pooling, K, H, model type, training key
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
from torch import nn

from xtransformer.encoders import (
    declare_pooling,
    encode_batches,
    l2_normalize,
    length_sorted_batches,
    pretrained_encoder,
)
from xtransformer.encoders.tokens import TokenizedTexts, tokenize_texts
from xtransformer.utils.io import atomic_dir, is_complete, load_json, save_json


@dataclass
class MatcherPrediction:
    """Dense ``N x H`` embeddings and the ``N x K`` csr of the top-b cluster scores."""

    embeddings: np.ndarray
    topb: sp.csr_matrix


@dataclass(frozen=True)
class EncodeOptions:
    """How a matcher encodes: batch size, clusters kept, autocast precision, normalisation, the
    tokens read per document (None: the fine-tuning length) and progress."""

    batch_size: int = 128
    topb: int = 20
    precision: str | None = "32"
    normalize: bool = False
    max_length: int | None = None
    progress: bool = True
    desc: str = "matcher inference"


@dataclass
class LoadedMatcher:
    """A fine-tuned matcher in memory: encoder, ``Linear(H, K)`` head, tokenizer and its record
    (``matcher_config.json``: the settings it was trained with, the pooling it resolved, K, H)."""

    encoder: nn.Module
    head: nn.Linear
    tokenizer: Any
    meta: dict[str, Any]

    @property
    def pooling(self) -> str:
        return self.meta["pooling_resolved"]

    def to(self, device: str | torch.device) -> LoadedMatcher:
        self.encoder.to(device)
        self.head.to(device)
        return self

    def encode(
        self, texts: Sequence[str], options: EncodeOptions, token_cache: Path | None = None
    ) -> MatcherPrediction:
        """Embeddings (float32; l2-normalised with ``options.normalize``) and top-b clusters of
        ``texts``; ``token_cache``: a folder that keeps their tokenisation."""
        meta = self.meta
        tokens = tokenize_texts(
            self.tokenizer,
            texts,
            options.max_length or meta["max_length"],
            meta["truncate_chars"],
            cache_dir=token_cache,
            progress=options.progress,
        )
        pred = predict_tokens(self, tokens, options)
        if options.normalize:
            pred.embeddings = l2_normalize(pred.embeddings)
        return pred

    def save(self, path: str | os.PathLike) -> Path:
        """Write the matcher folder (atomic): ``encoder/`` (weights, config, tokenizer; the pooling
        declared so that ``auto`` resolves to it), ``head.safetensors``, ``matcher_config.json``."""
        from safetensors.torch import save_file

        path = Path(path)
        with atomic_dir(path) as tmp:
            self.encoder.save_pretrained(tmp / "encoder")
            self.tokenizer.save_pretrained(tmp / "encoder")
            declare_pooling(tmp / "encoder", self.pooling, self.encoder.config.hidden_size)
            save_file(
                {k: v.detach().cpu().contiguous() for k, v in self.head.state_dict().items()}, tmp / "head.safetensors"
            )
            save_json(self.meta, tmp / "matcher_config.json")
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, device: str | torch.device = "cpu") -> LoadedMatcher:
        """Load a folder written by :meth:`save`."""
        from safetensors.torch import load_file
        from transformers import AutoTokenizer

        path = Path(path)
        if not is_complete(path) or not (path / "matcher_config.json").is_file():
            raise FileNotFoundError(
                f"no finished matcher model in {path} (expected encoder/, head.safetensors, "
                "matcher_config.json and a _COMPLETE marker)"
            )
        meta = load_json(path / "matcher_config.json")
        encoder = pretrained_encoder(path / "encoder").to(device)
        tokenizer = AutoTokenizer.from_pretrained(path / "encoder")
        head = nn.Linear(int(meta["hidden_size"]), int(meta["num_clusters"]))
        head.load_state_dict(load_file(path / "head.safetensors"))
        return cls(encoder=encoder.eval(), head=head.to(device).eval(), tokenizer=tokenizer, meta=meta)


def topb_csr(scores: np.ndarray, clusters: np.ndarray, num_clusters: int) -> sp.csr_matrix:
    """``N x K`` csr from per-row top-b ``scores`` / cluster ids (``N x b`` each); zeros are kept."""
    n, b = scores.shape
    indptr = np.arange(0, n * b + 1, b, dtype=np.int64)
    mat = sp.csr_matrix(
        (scores.ravel().astype(np.float32), clusters.ravel().astype(np.int32), indptr), shape=(n, num_clusters)
    )
    mat.sort_indices()
    return mat


def predict_tokens(matcher: Any, tokens: TokenizedTexts, options: EncodeOptions) -> MatcherPrediction:
    """Embeddings and top-b clusters of already tokenised texts (length-sorted batches). ``matcher``:
    anything with ``encoder``, ``head`` and ``pooling`` (a :class:`LoadedMatcher`, a training module)."""
    head = matcher.head
    n, b = len(tokens), min(int(options.topb), head.out_features)
    emb = np.zeros((n, head.in_features), dtype=np.float32)
    scores = np.zeros((n, b), dtype=np.float32)
    clusters = np.zeros((n, b), dtype=np.int64)
    batches = ((rows, tokens.batch(rows)) for rows in length_sorted_batches(tokens.lengths, options.batch_size))
    for rows, e, logits in encode_batches(
        matcher.encoder,
        batches,
        matcher.pooling,
        options.precision,
        head=head,
        progress=options.progress,
        total=n,
        desc=options.desc,
    ):
        top = logits.topk(b, dim=1)
        emb[rows] = e.numpy()
        scores[rows] = top.values.numpy()
        clusters[rows] = top.indices.numpy()
    return MatcherPrediction(embeddings=emb, topb=topb_csr(scores, clusters, head.out_features))
