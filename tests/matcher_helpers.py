"""The matcher stage on the toy task, as the matcher tests (and their DDP script) run it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import scipy.sparse as sp
from tiny_models import tiny_model_dir, toy_xmc

from xtransformer.cache import StageCache
from xtransformer.context import TrainContext
from xtransformer.data.inputs import LabeledData
from xtransformer.matcher import MatcherConfig, fine_tune_matcher

# the Trainer kwargs beside placement and precision (TrainContext.lightning)
TRAINER = {
    "enable_progress_bar": False,
    "enable_model_summary": False,
    "num_sanity_val_steps": 0,
    "log_every_n_steps": 1,
}


class LossRecorder(pl.Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        self.losses.append(float(trainer.callback_metrics["train/loss"]))


def matcher_cfg(tmp_path: Path, **overrides: Any) -> MatcherConfig:
    # Mean pooling: a random tiny model's first token needs far more steps to learn to summarise.
    values = {
        "model_name_or_path": str(tiny_model_dir("bert")),
        "pooling": "mean",
        "max_length": 32,
        "batch_size": 16,
        "lr": 3e-3,
        "head_lr": 3e-2,
        "warmup_ratio": 0.2,
        "max_steps": 36,
        "topb": 3,
        "checkpoint_every_n_steps": 10,
        "val_every_n_steps": 12,
        "cache_dir": str(tmp_path / "cache"),
        "progress": False,
    }
    values.update(overrides)
    return MatcherConfig(**values)


def toy_data() -> tuple[dict[str, LabeledData], sp.csr_matrix]:
    """The toy task's splits as fit reads them, and its label-to-cluster matrix."""
    texts, Y, C = toy_xmc()
    ids = [f"L{j}" for j in range(C.shape[0])]
    return {s: LabeledData.build(texts[s], Y[s], ids) for s in texts}, C


def fine_tune(cfg: MatcherConfig, cache: Path, callbacks: list[Any] = (), key: str = "toy", **lightning: Any) -> Path:
    data, C = toy_data()
    ctx = TrainContext(cache=StageCache(cache), lightning={**TRAINER, **lightning}, callbacks=list(callbacks))
    return fine_tune_matcher(ctx, key, data["train"], C, cfg, data["dev"])


class Crash(pl.Callback):
    """Simulates a killed run: raises once training reaches ``step`` optimizer steps."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step >= self.step:
            raise RuntimeError("simulated crash")
