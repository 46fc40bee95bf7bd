"""Command-line entry points."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from xtransformer.errors import UserError

# Offline-safe defaults for this workplace; users override them in their environment.
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "configs")


class _DropAdverts(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "litlogger" not in record.getMessage()


def _quiet_lightning_logging() -> None:
    """Lightning gives its loggers their own console handler; Hydra's root handler already prints and
    files every record, so without this each Lightning line appears twice."""
    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.addFilter(_DropAdverts())
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_DropAdverts())


@hydra.main(config_path=CONFIG_DIR, config_name="train", version_base="1.3")
def _train(cfg: DictConfig) -> float | None:
    import lightning.pytorch  # noqa: F401  (import first: it installs the handlers removed next)

    from xtransformer.pipeline.run import run

    _quiet_lightning_logging()

    try:
        metrics = run(cfg)
    except UserError as err:  # a bad setting or input: its message says what to fix, no traceback
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        logging.getLogger("xtransformer").error("%s", err)
        sys.exit(f"error: {err}")
    # the returned value is what Hydra sweepers optimise
    return metrics.get("metrics", {}).get("P@1") if metrics else None


def train_main() -> None:
    _train()
