"""LightningModule of the neural matcher: pretrained encoder + ``Linear(H, K)`` head."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, fields
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from torch import nn
from torchmetrics import MeanMetric

from xtransformer.encoders import encoder_forward, pool_hidden, resolve_pooling
from xtransformer.matcher.loss import cluster_recall_at_b, squared_hinge_loss
from xtransformer.matcher.metrics import XMCMetrics

_NO_DECAY = ("bias", "layernorm", "layer_norm", "norm.weight")


class LinearWarmupDecay:
    """LR multiplier: linear warmup over ``warmup`` steps, then linear decay to 0 at ``total``."""

    def __init__(self, warmup: int, total: int) -> None:
        self.warmup, self.total = max(0, int(warmup)), max(1, int(total))

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / (self.warmup + 1)
        return max(0.0, (self.total - step) / max(1, self.total - self.warmup))


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


class MatcherModule(pl.LightningModule):
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
        # Part of the state dict, so it survives the trip back from ddp_spawn workers.
        self.register_buffer("trained_steps", torch.zeros((), dtype=torch.long))
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

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.trained_steps.fill_(self.trainer.global_step)

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

    def configure_optimizers(self) -> Any:
        hp = self.hparams
        groups = self.param_groups()
        optimizer = torch.optim.AdamW(groups, lr=hp.lr, eps=hp.adam_eps, fused=self._fused(groups))
        total = int(self.trainer.estimated_stepping_batches)
        schedule = LinearWarmupDecay(round(hp.warmup_ratio * total), total)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def _fused(self, groups: list[dict[str, Any]]) -> bool | None:
        """AdamW in one kernel for every tensor: the default per-tensor loop takes ~90 ms of a MiniLM
        step on 2 CPU cores, fused 10 ms. Not with fp16 loss scaling (Lightning must unscale before
        it clips) nor on devices without a fused AdamW."""
        trainer = self._trainer
        if trainer is not None and getattr(trainer.precision_plugin, "scaler", None) is not None:
            return None
        return all(p.device.type in ("cpu", "cuda") for g in groups for p in g["params"]) or None

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        # Lightning's mixed-precision plugin refuses to clip for a fused optimizer (it would unscale
        # fp16 gradients itself); without a loss scaler (bf16, fp32) the gradients are true: clip here
        if not optimizer.defaults.get("fused") or not gradient_clip_val:
            return super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)
        params = [p for g in optimizer.param_groups for p in g["params"]]
        if gradient_clip_algorithm == "value":
            torch.nn.utils.clip_grad_value_(params, gradient_clip_val)
        else:
            torch.nn.utils.clip_grad_norm_(params, gradient_clip_val)

    # Random states travel with the checkpoint so a resumed run draws the same dropout masks.
    # Only tensors and plain Python values: checkpoints stay loadable with weights_only=True.
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        name, keys, pos, has_gauss, cached = np.random.get_state()
        checkpoint["rng_states"] = {
            "torch": torch.get_rng_state(),
            "numpy": [name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
            "python": random.getstate(),
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        states = checkpoint.get("rng_states")
        if states:
            torch.set_rng_state(states["torch"])
            name, keys, pos, has_gauss, cached = states["numpy"]
            np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
            random.setstate(states["python"])


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
