"""LightningModule of the neural matcher: pretrained encoder + ``Linear(H, K)`` head."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
from torch import nn
from torchmetrics import MeanMetric

from xtransformer.encoders import encoder_forward, pool_hidden, resolve_pooling
from xtransformer.matcher.loss import cluster_recall_at_b, squared_hinge_loss
from xtransformer.matcher.metrics import XMCMetrics
from xtransformer.training import FineTunedModule

_NO_DECAY = ("bias", "layernorm", "layer_norm", "norm.weight")


@dataclass(frozen=True)
class TrainOptions:
    """The optimisation of a matcher module (a level of XR-Transformer has its own lr and warmup)."""

    pooling: str = "auto"
    lr: float = 5e-5
    head_lr: float | None = None  # None: lr
    weight_decay: float = 0.01
    adam_eps: float = 1e-8
    warmup_ratio: float = 0.1
    topb: int = 20  # validation cluster recall@b
    dropout: float | None = None  # every dropout of the encoder; None: the model's own rates

    @classmethod
    def of(cls, cfg: Any, **overrides: Any) -> TrainOptions:
        """From a :class:`~xtransformer.matcher.MatcherConfig` (``overrides``: e.g. a level's lr)."""
        names = [f.name for f in fields(cls)]
        return cls(**{**{n: getattr(cfg, n) for n in names}, **overrides})


class MatcherModule(FineTunedModule):
    """Scores the K clusters of a document: ``g = W · pool(encoder(x)) + b``, trained with eq. 3."""

    def __init__(
        self, encoder_path: str, num_clusters: int, options: TrainOptions | None = None, with_token_types: bool = False
    ) -> None:
        super().__init__()
        from xtransformer.encoders import pretrained_encoder, set_dropout

        opt = options or TrainOptions()
        # plain values only: checkpoints stay loadable with weights_only=True
        self.save_hyperparameters(
            {
                "encoder_path": encoder_path,
                "num_clusters": num_clusters,
                "with_token_types": with_token_types,
                **asdict(opt),
            }
        )
        if num_clusters < 1:
            raise ValueError(f"num_clusters must be >= 1, got {num_clusters}")
        self.encoder = pretrained_encoder(encoder_path)
        self.pooling = resolve_pooling(opt.pooling, self.encoder)
        self.head = nn.Linear(self.encoder.config.hidden_size, num_clusters)
        _freeze_unused_parameters(self.encoder, self.pooling, with_token_types)
        if opt.dropout is not None:  # matcher.dropout; None: the rates the model was trained with
            set_dropout(self.encoder, opt.dropout)
        # from_pretrained returns eval mode and Lightning keeps each submodule's mode: fine-tune in
        # train mode, dropout at the model's rates as in the paper, or at matcher.dropout's.
        self.encoder.train()
        self.val_loss = MeanMetric()
        self.val_recall = MeanMetric()
        self.val_precision = XMCMetrics(max_k=min(5, num_clusters))  # cluster P@k / nDCG@k on dev

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(embeddings B x H, logits B x K)``."""
        emb = pool_hidden(encoder_forward(self.encoder, batch), batch["attention_mask"], self.pooling)
        return emb, self.head(emb)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        _, logits = self(batch)
        loss = squared_hinge_loss(logits, batch["targets"])
        bs = batch["input_ids"].shape[0]
        self.log("train/loss", loss, prog_bar=True, batch_size=bs)
        self.log("train/lr", self.trainer.optimizers[0].param_groups[0]["lr"], batch_size=bs)
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        _, logits = self(batch)
        targets = batch["targets"]
        self.val_loss.update(squared_hinge_loss(logits, targets), weight=targets.shape[0])
        recall, has_pos = cluster_recall_at_b(logits, targets, self.hparams.topb)
        if has_pos.any():
            self.val_recall.update(recall[has_pos])
        self.val_precision.update(logits.detach().float(), targets.detach().cpu().numpy() > 0)
        # torchmetrics syncs across ranks at epoch end only (ranks may see unequal batch counts).
        self.log("val/loss", self.val_loss, on_epoch=True, prog_bar=True)
        self.log(f"val/recall@{self.hparams.topb}", self.val_recall, on_epoch=True, prog_bar=True)

    def on_validation_epoch_end(self) -> None:
        if int(self.val_precision.n_docs) == 0 and not self.trainer.world_size > 1:
            return  # no validation batch ran
        scores = self.val_precision.compute()
        self.log_dict({f"val/cluster_{k}": scores[k] for k in ("P@1", f"P@{self.val_precision.max_k}") if k in scores})
        self.val_precision.reset()

    def param_groups(self) -> list[dict[str, Any]]:
        """AdamW groups: no weight decay on biases and LayerNorm; the head may have its own lr."""
        hp = self.hparams
        decay, no_decay = [], []
        for name, p in self.encoder.named_parameters():
            if p.requires_grad:
                (no_decay if any(k in name.lower() for k in _NO_DECAY) else decay).append(p)
        head_lr = hp.head_lr if hp.head_lr is not None else hp.lr
        groups = [
            {"params": decay, "weight_decay": hp.weight_decay, "lr": hp.lr},
            {"params": no_decay, "weight_decay": 0.0, "lr": hp.lr},
            {"params": [self.head.weight], "weight_decay": hp.weight_decay, "lr": head_lr},
            {"params": [self.head.bias], "weight_decay": 0.0, "lr": head_lr},
        ]
        return [g for g in groups if g["params"]]


def _freeze_unused_parameters(encoder: nn.Module, pooling: str, with_token_types: bool = False) -> list[str]:
    """Freeze parameters that never get a gradient (BERT's pooler, XLNet's mask_emb, ...).

    DDP refuses parameters that take no part in the loss; probing once with a two-token batch
    avoids ``find_unused_parameters=True`` and its per-step graph walk. The probe passes
    token_type_ids exactly when the training batches do (XLNet's segment parameters depend on it).
    """
    was_training = encoder.training
    encoder.eval()  # no dropout: the probe must not consume random numbers
    device = next(encoder.parameters()).device
    last = int(encoder.config.vocab_size) - 1  # ordinary tokens, not padding
    batch = {
        "input_ids": torch.tensor([[last, last - 1]], device=device),
        "attention_mask": torch.ones(1, 2, dtype=torch.long, device=device),
    }
    if with_token_types:
        batch["token_type_ids"] = torch.zeros(1, 2, dtype=torch.long, device=device)
    try:
        pool_hidden(encoder_forward(encoder, batch), batch["attention_mask"], pooling).sum().backward()
    finally:
        encoder.train(was_training)
    frozen = []
    for name, p in encoder.named_parameters():
        if p.requires_grad and p.grad is None:
            p.requires_grad_(False)
            frozen.append(name)
        p.grad = None
    return frozen
