"""A text CNN as X-Transformer's matcher (``matcher.architecture: cnn``): the ``cnn`` group's network
with one output per leaf cluster of the label tree, ranked by the same linear rankers.

It trains through the CNN baselines' own module and loop: binary cross-entropy on the
instance-to-cluster targets, the published CNN recipe (its learning rates and dropouts were tuned
with it), so the matcher slot swaps the network and nothing else of the CNN's recipe; the rankers
read only the order of its top-b clusters and its features. Its folder (``cnn.json``,
``weights.safetensors``, the tokenizer) loads to :class:`CNNMatcher`, which encodes as
:class:`~xtransformer.matcher.inference.LoadedMatcher` does: embeddings (the output layer's input)
and the top-b clusters by raw logit.
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

from xtransformer.matcher.inference import EncodeOptions, MatcherPrediction, topb_csr
from xtransformer.methods.cnn.config import CNNConfig
from xtransformer.methods.cnn.network import TextCNN, run_batches
from xtransformer.methods.cnn.weights import NETWORK_DIR, load_network, save_network

RECORD = "cnn.json"  # what marks a CNN matcher's folder


def is_cnn_matcher(path: str | os.PathLike) -> bool:
    """Whether the matcher folder ``path`` holds a CNN (else a fine-tuned transformer)."""
    return (Path(path) / RECORD).is_file()


def train_cnn_matcher(ctx: Any, key: str, data: Any, C: sp.spmatrix, cfg: CNNConfig, validation: Any = None) -> Path:
    """The matcher folder of stage (``matcher``, ``key``): a CNN trained on ``binarize(data.Y · C)``."""
    from xtransformer.methods.cnn.train import train_cnn

    return train_cnn(ctx, key, data, ctx.matcher_settings(cfg), validation, C=C, stage="matcher") / NETWORK_DIR


@dataclass
class CNNMatcher:
    """A trained CNN matcher in memory: the network (``K`` outputs), its tokenizer and its record."""

    network: TextCNN
    tokenizer: Any
    meta: dict[str, Any]

    def to(self, device: str | torch.device) -> CNNMatcher:
        self.network.to(device)
        return self

    def encode(
        self, texts: Sequence[str], options: EncodeOptions, token_cache: Path | None = None
    ) -> MatcherPrediction:
        """Embeddings (float32; l2-normalised with ``options.normalize``) and top-b clusters of ``texts``."""
        from xtransformer.encoders import l2_normalize
        from xtransformer.encoders.tokens import tokenize_texts

        meta = self.meta
        length = options.max_length or meta["max_length"]
        tokens = tokenize_texts(
            self.tokenizer, texts, length, meta["truncate_chars"], cache_dir=token_cache, progress=options.progress
        )
        n_clusters, width = self.network.output.out_features, self.network.output.in_features
        b = min(int(options.topb), n_clusters)
        emb = np.zeros((len(tokens), width), dtype=np.float32)
        scores, clusters = np.zeros((len(tokens), b), dtype=np.float32), np.zeros((len(tokens), b), dtype=np.int64)
        batches = run_batches(self.network, tokens, options.batch_size, options.precision, length, options.progress)
        for rows, h, logits in batches:
            top = logits.topk(b, dim=1)
            emb[rows], scores[rows], clusters[rows] = h.numpy(), top.values.numpy(), top.indices.numpy()
        emb = l2_normalize(emb) if options.normalize else emb
        return MatcherPrediction(embeddings=emb, topb=topb_csr(scores, clusters, n_clusters))

    def save(self, path: str | os.PathLike) -> Path:
        """Write the matcher folder (atomic): ``weights.safetensors``, ``cnn.json``, the tokenizer."""
        return save_network(Path(path), self.network, self.tokenizer, self.meta)

    @classmethod
    def load(cls, path: str | os.PathLike, device: str | torch.device = "cpu") -> CNNMatcher:
        """Load a folder written by :meth:`save`."""
        return cls(*load_network(Path(path))).to(device)
