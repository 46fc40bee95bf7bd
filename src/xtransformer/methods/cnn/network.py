"""The text CNN: word embeddings, convolutions of several widths, (dynamic) max pooling, an
optional bottleneck, one output over all labels."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

# the settings that shape the network (a model folder's record of it)
NETWORK_KEYS = ("filter_widths", "feature_maps", "pooling_chunks", "bottleneck", "embed_dropout", "dropout")


def dynamic_max_pool(h: torch.Tensor, chunks: int) -> torch.Tensor:
    """``B x M x T`` feature maps -> ``B x (M * chunks)``: the maximum of each of ``chunks``
    consecutive stretches of the sequence (XML-CNN's dynamic max pooling; 1 chunk: max pooling)."""
    return F.adaptive_max_pool1d(h, chunks).flatten(1)


class TextCNN(nn.Module):
    """``tokens -> embedding -> [conv_w -> ReLU -> pool]_w -> (bottleneck -> ReLU) -> logits``."""

    def __init__(self, embedding: torch.Tensor | tuple[int, int], n_labels: int, cfg: object) -> None:
        """``embedding``: the initial ``V x E`` table, or its shape for N(0, 1) rows; ``cfg``: anything
        with the attributes :data:`NETWORK_KEYS` names (a ``CNNConfig``, a folder's record)."""
        super().__init__()
        self.embedding = (
            nn.Embedding.from_pretrained(embedding, freeze=False)
            if isinstance(embedding, torch.Tensor)
            else nn.Embedding(*embedding)
        )
        dim = self.embedding.embedding_dim
        self.convs = nn.ModuleList(nn.Conv1d(dim, cfg.feature_maps, w) for w in cfg.filter_widths)
        self.chunks, self.widest = int(cfg.pooling_chunks), max(cfg.filter_widths)
        pooled = cfg.feature_maps * len(cfg.filter_widths) * self.chunks
        self.bottleneck = nn.Linear(pooled, cfg.bottleneck) if cfg.bottleneck else None
        self.embed_dropout, self.dropout = nn.Dropout(cfg.embed_dropout), nn.Dropout(cfg.dropout)
        self.output = nn.Linear(cfg.bottleneck or pooled, n_labels)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Logits ``B x L``."""
        return self.output(self.features(input_ids, attention_mask))

    def features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The output layer's input ``B x D`` (the bottleneck's, else the pooled maps): a CNN
        matcher's embeddings. Padded positions embed as zeros, short texts are padded to the widest filter."""
        x = self.embed_dropout(self.embedding(input_ids)) * attention_mask.unsqueeze(-1).to(self.embedding.weight.dtype)
        x = x.transpose(1, 2)  # B x E x T: the convolutions run along the sequence
        need = self.widest + self.chunks - 1  # every chunk of every map gets at least one position
        if x.shape[-1] < need:
            x = F.pad(x, (0, need - x.shape[-1]))
        pooled = torch.cat([dynamic_max_pool(F.relu(conv(x)), self.chunks) for conv in self.convs], dim=1)
        h = self.dropout(pooled)
        if self.bottleneck is not None:
            h = self.dropout(F.relu(self.bottleneck(h)))
        return h


def run_batches(
    network: TextCNN, tokens: Any, batch_size: int, precision: str, width: int, progress: bool = False
) -> Iterator[tuple[np.ndarray, torch.Tensor, torch.Tensor]]:
    """``(rows, features, logits)`` of tokenised texts, float32 on the CPU: length-sorted batches,
    each padded to ``width`` tokens (the training length), under ``torch.inference_mode`` and the
    autocast of ``precision``. Windows over padding reach the pooling, so a fixed width keeps a
    document's scores independent of the batch it comes in (a served text scores as in a file)."""
    from tqdm.auto import tqdm

    from xtransformer.encoders import autocast_context, length_sorted_batches

    device = next(network.parameters()).device
    network.eval()
    with tqdm(total=len(tokens), desc="CNN", unit="doc", disable=not progress, leave=False) as bar:
        for rows in length_sorted_batches(tokens.lengths, batch_size):
            batch = {key: v.to(device) for key, v in tokens.batch(rows).items() if v is not None}
            pad = (0, max(0, width - batch["input_ids"].shape[1]))
            ids, mask = F.pad(batch["input_ids"], pad), F.pad(batch["attention_mask"], pad)
            with torch.inference_mode(), autocast_context(precision, device):
                h = network.features(ids, mask)
                logits = network.output(h)
            yield rows, h.float().cpu(), logits.float().cpu()
            bar.update(len(rows))
