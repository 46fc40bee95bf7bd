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


def hinge_weights(targets: torch.Tensor, importance: str = "counts", neg_weight: float = 1.0) -> torch.Tensor:
    """Per-entry weights of XR-Transformer's loss (eq. 9) from count targets ``R`` (>= 0).

    Positives (``R > 0``) weigh ``R`` (``counts``, PECOS), ``R / |R_i|_1`` (``normalized``, the
    paper's R-hat) or 1 (``none``); negatives weigh ``neg_weight`` (the paper's alpha).
    """
    R = targets.float()
    positive = R > 0
    if importance == "counts":
        pos_w = R
    elif importance == "normalized":
        pos_w = R / R.sum(dim=-1, keepdim=True).clamp(min=1e-12)
    elif importance == "none":
        pos_w = positive.float()
    else:
        raise ValueError(f"importance must be counts | normalized | none, got {importance!r}")
    return torch.where(positive, pos_w, torch.full_like(R, float(neg_weight)))


def weighted_squared_hinge(
    logits: torch.Tensor,
    targets: torch.Tensor,
    weights: torch.Tensor,
    rows: torch.Tensor | None = None,
    n_rows: int | None = None,
) -> torch.Tensor:
    """``mean_i mean_{l in S_i} w_il · max(0, 1 - s_il g_il)²`` with ``s = ±1`` from ``targets > 0``.

    Dense form: ``logits``/``targets``/``weights`` are ``B x K`` and ``S_i`` is every cluster.
    Shortlist form: all three are flat over the shortlisted (document, cluster) entries and
    ``rows`` names each entry's document (``n_rows`` documents): the same value as the dense form
    restricted to the shortlist, without ever scoring a cluster outside it.
    """
    signs = torch.where(targets > 0, 1.0, -1.0)
    loss = torch.clamp(1.0 - signs * logits.float(), min=0.0).pow(2) * weights.float()
    if rows is None:
        return loss.mean()
    n_rows = int(n_rows if n_rows is not None else int(rows.max()) + 1)
    per_row = torch.zeros(n_rows, dtype=loss.dtype, device=loss.device).index_add_(0, rows, loss)
    sizes = torch.zeros(n_rows, dtype=loss.dtype, device=loss.device).index_add_(0, rows, torch.ones_like(loss))
    has = sizes > 0
    return (per_row[has] / sizes[has]).mean()
