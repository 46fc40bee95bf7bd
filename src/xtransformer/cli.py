"""Command-line entry points."""

from __future__ import annotations

import os
from pathlib import Path

import hydra
from omegaconf import DictConfig

# Offline-safe defaults for this workplace; users override them in their environment.
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "configs")


@hydra.main(config_path=CONFIG_DIR, config_name="train", version_base="1.3")
def _train(cfg: DictConfig) -> float | None:
    from xtransformer.pipeline.run import run

    metrics = run(cfg)
    # the returned value is what Hydra sweepers optimise
    return metrics.get("metrics", {}).get("P@1") if metrics else None


def train_main() -> None:
    _train()
