"""What every network the suite fine-tunes shares (the matcher, XR-Transformer's levels, the CNNs).

AdamW (fused into one kernel where it can be) with linear warm-up and linear decay, gradient
clipping that works with the fused optimiser, the count of optimiser steps taken, and the random
state travelling with every checkpoint so that a resumed run draws the same dropout masks. A
subclass gives ``param_groups()`` and hyper-parameters ``lr``, ``adam_eps`` and ``warmup_ratio``.
"""

from __future__ import annotations

import atexit
import functools
import random
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch


class LinearWarmupDecay:
    """LR multiplier: linear warmup over ``warmup`` steps, then linear decay to 0 at ``total``."""

    def __init__(self, warmup: int, total: int) -> None:
        self.warmup, self.total = max(0, int(warmup)), max(1, int(total))

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / (self.warmup + 1)
        return max(0.0, (self.total - step) / max(1, self.total - self.warmup))


@functools.cache
def _release_process_group_at_exit() -> None:
    """Destroy the process group before the interpreter's own teardown: a worker exiting with a live
    gloo group can abort in its threads' destructors ("terminate called without an active exception")."""

    def release() -> None:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()

    atexit.register(release)


class FineTunedModule(pl.LightningModule):
    """A LightningModule trained by ``matcher.train.fit_resumable``."""

    def __init__(self) -> None:
        super().__init__()
        # Part of the state dict, so it survives the trip back from ddp_spawn workers.
        self.register_buffer("trained_steps", torch.zeros((), dtype=torch.long))

    def param_groups(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def setup(self, stage: str) -> None:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            _release_process_group_at_exit()

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.trained_steps.fill_(self.trainer.global_step)

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
