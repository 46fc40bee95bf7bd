"""The LightningModule of the CNN baselines: a :class:`TextCNN` trained with binary cross-entropy
over every label (LibMultiLabel's and XML-CNN's recipe), validated by label P@k on dev."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torchmetrics import MeanMetric

from xtransformer.matcher.metrics import XMCMetrics
from xtransformer.methods.cnn.network import NETWORK_KEYS, TextCNN
from xtransformer.training import FineTunedModule


class CNNModule(FineTunedModule):
    """``TextCNN`` + BCE; ``embedding``: the initial table (``V x E``) or its shape (random rows)."""

    def __init__(self, embedding: torch.Tensor | tuple[int, int], n_labels: int, cfg: Any) -> None:
        super().__init__()
        shape = tuple(embedding.shape) if isinstance(embedding, torch.Tensor) else tuple(embedding)
        # plain values only: checkpoints stay loadable with weights_only=True
        optim = ("lr", "weight_decay", "adam_eps", "warmup_ratio")
        self.save_hyperparameters(
            {"n_labels": n_labels, "vocab": shape, **{k: getattr(cfg, k) for k in (*NETWORK_KEYS, *optim)}}
        )
        self.network = TextCNN(embedding, n_labels, cfg)
        self.val_loss = MeanMetric()
        self.val_precision = XMCMetrics(max_k=min(5, n_labels))

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.network(batch["input_ids"], batch["attention_mask"])

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = F.binary_cross_entropy_with_logits(self(batch).float(), batch["targets"])
        bs = batch["input_ids"].shape[0]
        self.log("train/loss", loss, prog_bar=True, batch_size=bs)
        self.log("train/lr", self.trainer.optimizers[0].param_groups[0]["lr"], batch_size=bs)
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        logits, targets = self(batch).float(), batch["targets"]
        self.val_loss.update(F.binary_cross_entropy_with_logits(logits, targets), weight=targets.shape[0])
        self.val_precision.update(logits.detach(), targets.detach().cpu().numpy() > 0)
        self.log("val/loss", self.val_loss, on_epoch=True, prog_bar=True)

    def on_validation_epoch_end(self) -> None:
        if int(self.val_precision.n_docs) == 0 and not self.trainer.world_size > 1:
            return  # no validation batch ran
        scores = self.val_precision.compute()
        k = self.val_precision.max_k
        self.log_dict({f"val/{m}": scores[m] for m in ("P@1", f"P@{k}") if m in scores}, prog_bar=True)
        self.val_precision.reset()

    def param_groups(self) -> list[dict[str, Any]]:
        """AdamW groups: no weight decay on biases nor on the word embeddings."""
        hp = self.hparams
        decay, no_decay = [], []
        for name, p in self.network.named_parameters():
            (no_decay if name.endswith("bias") or name.startswith("embedding") else decay).append(p)
        groups = [{"params": decay, "weight_decay": hp.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        return [g | {"lr": hp.lr} for g in groups if g["params"]]
