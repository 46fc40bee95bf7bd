"""Matcher inference: embeddings + top-b clusters, and the saved model folder.

Model folder layout (written atomically)::

    encoder/               HF save_pretrained layout (weights, config, tokenizer)
    head.pt                state dict of the Linear(H, K) head
    matcher_config.json    MatcherConfig + resolved pooling, K, H, model type, training key
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

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
from xtransformer.matcher.datamodule import TokenizedTexts, tokenize_texts
from xtransformer.utils.io import atomic_dir, is_complete, load_json, save_json


@dataclass
class MatcherPrediction:
    """Dense ``N x H`` embeddings and the ``N x K`` csr of the top-b cluster scores."""

    embeddings: np.ndarray
    topb: sp.csr_matrix


@dataclass
class LoadedMatcher:
    encoder: nn.Module
    head: nn.Linear
    tokenizer: Any
    meta: dict[str, Any]


def topb_csr(scores: np.ndarray, clusters: np.ndarray, num_clusters: int) -> sp.csr_matrix:
    """``N x K`` csr from per-row top-b ``scores`` / cluster ids (``N x b`` each); zeros are kept."""
    n, b = scores.shape
    indptr = np.arange(0, n * b + 1, b, dtype=np.int64)
    mat = sp.csr_matrix((scores.ravel().astype(np.float32), clusters.ravel().astype(np.int32), indptr),
                        shape=(n, num_clusters))
    mat.sort_indices()
    return mat


def predict_tokens(
    encoder: nn.Module,
    head: nn.Linear,
    pooling: str,
    tokens: TokenizedTexts,
    batch_size: int = 128,
    topb: int = 20,
    precision: str | None = "32",
    progress: bool = True,
    desc: str = "matcher inference",
) -> MatcherPrediction:
    """Embeddings and top-b clusters of already tokenised texts (length-sorted batches)."""
    n, b = len(tokens), min(int(topb), head.out_features)
    emb = np.zeros((n, head.in_features), dtype=np.float32)
    scores = np.zeros((n, b), dtype=np.float32)
    clusters = np.zeros((n, b), dtype=np.int64)
    batches = ((rows, tokens.batch(rows)) for rows in length_sorted_batches(tokens.lengths, batch_size))
    for rows, e, logits in encode_batches(encoder, batches, pooling, precision, head=head, progress=progress,
                                          total=n, desc=desc):
        top = logits.topk(b, dim=1)
        emb[rows] = e.numpy()
        scores[rows] = top.values.numpy()
        clusters[rows] = top.indices.numpy()
    return MatcherPrediction(embeddings=emb, topb=topb_csr(scores, clusters, head.out_features))


def save_matcher_model(encoder: nn.Module, head: nn.Linear, tokenizer: Any, meta: dict[str, Any],
                       path: str | os.PathLike) -> Path:
    """Write the fine-tuned matcher to ``path`` (atomic folder)."""
    path = Path(path)
    with atomic_dir(path) as tmp:
        encoder.save_pretrained(tmp / "encoder")
        tokenizer.save_pretrained(tmp / "encoder")
        if meta.get("pooling_resolved"):  # `auto` on this encoder folder then pools as it was trained
            declare_pooling(tmp / "encoder", meta["pooling_resolved"], encoder.config.hidden_size)
        torch.save({k: v.detach().cpu() for k, v in head.state_dict().items()}, tmp / "head.pt")
        save_json(meta, tmp / "matcher_config.json")
    return path


def load_matcher_model(path: str | os.PathLike, device: str | torch.device = "cpu") -> LoadedMatcher:
    """Load a folder written by :func:`save_matcher_model`."""
    from transformers import AutoTokenizer

    path = Path(path)
    if (path / "model").is_dir() and not (path / "matcher_config.json").is_file():
        path = path / "model"  # accept the training output folder too
    if not is_complete(path) or not (path / "matcher_config.json").is_file():
        raise FileNotFoundError(f"no finished matcher model in {path} (expected encoder/, head.pt or head.safetensors, "
                                "matcher_config.json and a _COMPLETE marker)")
    meta = load_json(path / "matcher_config.json")
    encoder = pretrained_encoder(path / "encoder").to(device)
    tokenizer = AutoTokenizer.from_pretrained(path / "encoder")
    head = nn.Linear(int(meta["hidden_size"]), int(meta["num_clusters"]))
    if (path / "head.safetensors").is_file():  # portable model folders hold no pickles
        from safetensors.torch import load_file

        head.load_state_dict(load_file(path / "head.safetensors"))
    else:
        head.load_state_dict(torch.load(path / "head.pt", map_location="cpu"))
    return LoadedMatcher(encoder=encoder.eval(), head=head.to(device).eval(), tokenizer=tokenizer, meta=meta)


def predict_matcher(
    model_dir: str | os.PathLike,
    texts: Sequence[str],
    batch_size: int | None = None,
    topb: int | None = None,
    precision: str | None = None,
    normalize: bool | None = None,
    device: str | torch.device | None = None,
    progress: bool = True,
    model: LoadedMatcher | None = None,
    max_length: int | None = None,
) -> MatcherPrediction:
    """Embeddings (float32) and top-b clusters of new ``texts`` with a saved matcher.

    Settings default to those the model was trained with (``matcher_config.json``; ``max_length``:
    the fine-tuning length, a run's ``matcher.embed_max_length`` may have embedded with more); pass
    an already loaded ``model`` to avoid reloading it for each call.
    """
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    loaded = model or load_matcher_model(model_dir, device)
    meta = loaded.meta
    tokens = tokenize_texts(loaded.tokenizer, texts, max_length or meta["max_length"], meta["truncate_chars"],
                            cache_dir=None, progress=progress)
    pred = predict_tokens(loaded.encoder, loaded.head, meta["pooling_resolved"], tokens,
                          batch_size=batch_size or meta["eval_batch_size"], topb=topb or meta["topb"],
                          precision=precision if precision is not None else meta["inference_precision_resolved"],
                          progress=progress)
    if normalize if normalize is not None else meta["normalize_embeddings"]:
        pred.embeddings = l2_normalize(pred.embeddings)
    return pred
