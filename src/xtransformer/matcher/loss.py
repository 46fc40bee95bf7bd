"""Matching objective and cluster recall (X-Transformer, eq. 3)."""

from __future__ import annotations

import torch


def squared_hinge_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean over the batch and the K clusters of ``max(0, 1 - M̃ g)²`` with ``M̃ = 2M - 1``.

    ``logits`` ``B x K`` are the head scores ``g``; ``targets`` ``B x K`` hold M in {0, 1}.
    Computed in float32 whatever the autocast dtype (the squared margins lose bits in bf16).
    """
    if logits.shape != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)} differ in shape")
    signs = 2.0 * targets.float() - 1.0
    return torch.clamp(1.0 - signs * logits.float(), min=0.0).pow(2).mean()


def cluster_recall_at_b(logits: torch.Tensor, targets: torch.Tensor, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-document recall of the true clusters inside the top-``b`` scores.

    Returns ``(recall, has_positive)``: recall ``B`` float32, and a mask of the documents with at
    least one true cluster (the others have no defined recall and should be skipped).
    """
    b = min(int(b), logits.shape[1])
    top = logits.topk(b, dim=1).indices
    hits = targets.gather(1, top).float().sum(1)
    positives = targets.float().sum(1)
    has_positive = positives > 0
    return hits / positives.clamp(min=1.0), has_positive
