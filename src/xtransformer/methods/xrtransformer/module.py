"""One level of XR-Transformer fine-tuning: the matcher module with a shortlisted, weighted loss.

The encoder, pooling, optimiser groups, schedule and resumable random state are the matcher's
(``MatcherModule``); what changes per level is the loss. It is the weighted squared hinge of the
paper's eq. 9 over each document's shortlist (eq. 8): the children of its true parents (given by
the data module as ``batch["tfn"]``) and of the parents the previous level's head ranks in its
top ``only_topk`` (matcher-aware). The previous head is scored on the embedding the step computes
anyway, so mining those negatives costs one ``B x K_{t-1}`` product instead of a pass over the
training set between levels. Only shortlisted (document, cluster) pairs are scored: a gather of
head rows, never ``B x K_t`` logits (the top level, whose shortlist is the whole level, is dense).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from xtransformer.encoders import encoder_forward, pool_hidden
from xtransformer.matcher.loss import hinge_weights, weighted_squared_hinge
from xtransformer.matcher.module import MatcherModule


class XRLevelModule(MatcherModule):
    """``MatcherModule`` whose training step is XR-Transformer's level-``t`` objective."""

    def setup_level(
        self,
        level: int,
        children: np.ndarray | None = None,
        prev_head: tuple[np.ndarray, np.ndarray] | None = None,
        init_head: tuple[np.ndarray, np.ndarray] | None = None,
        loss: Any = None,
    ) -> XRLevelModule:
        """Level facts kept out of ``__init__`` so Lightning's hyper-parameters stay small.

        ``children``: the previous level's children table (``K_{t-1} x c``, -1 padded; None: no
        shortlist, the dense loss); with ``prev_head`` (its ``W``, ``b``) it turns the predicted
        parents into shortlisted clusters. ``init_head``: the bootstrapped ``(W, b)`` of this level;
        None keeps the random init. ``loss``: the record with ``shortlist``, ``negatives``,
        ``only_topk``, ``importance`` and ``neg_weight`` (``XRTransformerConfig``; None: its defaults).
        """
        if loss is None:
            from xtransformer.methods.xrtransformer.config import XRTransformerConfig

            loss = XRTransformerConfig()
        shortlist, negatives = loss.shortlist, loss.negatives
        only_topk, importance, neg_weight = loss.only_topk, loss.importance, loss.neg_weight
        self.level = int(level)
        self.use_shortlist = bool(shortlist) and children is not None
        self.use_tfn = "tfn" in negatives
        self.use_man = "man" in negatives and prev_head is not None
        self.only_topk, self.importance, self.neg_weight = int(only_topk), importance, float(neg_weight)
        # buffers: part of the checkpoint (a resumed level sees the same shortlists), moved with the module
        self.register_buffer(
            "child_table",
            torch.as_tensor(children if children is not None else np.zeros((0, 1)), dtype=torch.long),
            persistent=True,
        )
        W, b = prev_head if prev_head is not None else (np.zeros((0, self.head.in_features)), np.zeros(0))
        self.register_buffer("prev_W", torch.as_tensor(W, dtype=torch.float32), persistent=True)
        self.register_buffer("prev_b", torch.as_tensor(b, dtype=torch.float32), persistent=True)
        if init_head is not None:
            W0, b0 = init_head
            with torch.no_grad():
                self.head.weight.copy_(torch.as_tensor(W0, dtype=torch.float32))
                self.head.bias.copy_(torch.as_tensor(b0, dtype=torch.float32).reshape(-1))
        return self

    # ------------------------------------------------------------------ shortlist
    def shortlist_mask(
        self, emb: torch.Tensor, targets: torch.Tensor, tfn: torch.Tensor | None, predicted: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``B x K_t`` boolean: positives, children of true parents, children of predicted parents
        (``predicted``: :meth:`predicted_children`, when the caller has it already)."""
        mask = targets > 0  # teacher forcing always keeps every positive cluster
        if self.use_tfn and tfn is not None:
            mask = mask | tfn
        if self.use_man:
            mask = mask | (predicted if predicted is not None else self.predicted_children(emb))
        return mask

    @torch.no_grad()
    def predicted_children(self, emb: torch.Tensor) -> torch.Tensor:
        """``B x K_t`` boolean: the children of the previous head's top-``only_topk`` parents."""
        scores = emb.detach().float() @ self.prev_W.T + self.prev_b
        top = scores.topk(min(self.only_topk, scores.shape[1]), dim=1).indices
        kids = self.child_table[top].flatten(1)  # B x (k * max_children), -1 padded
        rows = torch.arange(kids.shape[0], device=kids.device).unsqueeze(1).expand_as(kids)
        ok = kids >= 0
        mask = torch.zeros(emb.shape[0], self.head.out_features, dtype=torch.bool, device=emb.device)
        mask[rows[ok], kids[ok]] = True
        return mask

    def shortlist_logits(self, emb: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """Scores of the (document, cluster) pairs only: gathered head rows, no ``B x K`` product."""
        # index_select, not W[cols]: the latter's backward (index_put_ accumulating repeated rows) is
        # not deterministic on a multi-threaded CPU, so same-seed runs drifted apart
        W, b = self.head.weight.index_select(0, cols), self.head.bias.index_select(0, cols)
        return (W * emb.index_select(0, rows).float()).sum(-1) + b

    def level_loss(
        self, emb: torch.Tensor, targets: torch.Tensor, tfn: torch.Tensor | None
    ) -> tuple[torch.Tensor, dict]:
        weights = hinge_weights(targets, self.importance, self.neg_weight)
        if not self.use_shortlist:
            loss = weighted_squared_hinge(self.head(emb), targets, weights)
            return loss, {"shortlist": float(targets.shape[1])}
        predicted = self.predicted_children(emb) if self.use_man else None
        mask = self.shortlist_mask(emb, targets, tfn, predicted)
        rows, cols = mask.nonzero(as_tuple=True)
        logits = self.shortlist_logits(emb, rows, cols)
        loss = weighted_squared_hinge(logits, targets[rows, cols], weights[rows, cols], rows, emb.shape[0])
        stats = {"shortlist": rows.numel() / emb.shape[0]}
        if predicted is not None:  # how many true clusters the matcher-aware half alone would have offered
            pos = targets > 0
            stats["man_recall"] = float((predicted & pos).sum() / pos.sum().clamp(min=1))
        return loss, stats

    # ------------------------------------------------------------------ Lightning
    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        emb = pool_hidden(encoder_forward(self.encoder, batch), batch["attention_mask"], self.pooling)
        loss, stats = self.level_loss(emb, batch["targets"], batch.get("tfn"))
        bs = batch["input_ids"].shape[0]
        prefix = f"level{self.level}/"
        self.log(f"{prefix}loss", loss, prog_bar=True, batch_size=bs)
        self.log("train/loss", loss, batch_size=bs, logger=False)  # the progress log reads this name
        self.log(f"{prefix}lr", self.trainer.optimizers[0].param_groups[0]["lr"], batch_size=bs)
        for name, value in stats.items():
            self.log(f"{prefix}{name}", value, batch_size=bs)
        return loss

    def head_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return (
            self.head.weight.detach().cpu().float().numpy().copy(),
            self.head.bias.detach().cpu().float().numpy().copy(),
        )

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> Any:
        return None  # each level is evaluated once, after training (see xrtransformer.train)
