"""Experiment loggers from the ``logger`` config group (wandb, csv, tensorboard, none).

Each entry of ``cfg.logger`` is a Lightning logger with a ``_target_``; they receive the matcher's
training curves from Lightning, and ``log_final`` adds the resolved config, final metrics and
plots. W&B defaults to offline mode (no network here); multirun members are grouped by sweep.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)


def build_loggers(cfg: DictConfig) -> list[Any]:
    if not cfg.get("logger"):
        return []
    os.environ.setdefault("WANDB_MODE", "offline")
    out = []
    for name, lcfg in cfg.logger.items():
        if lcfg is None or "_target_" not in lcfg:
            continue
        out.append(hydra.utils.instantiate(lcfg))
        log.info("logger %s: %s", name, type(out[-1]).__name__)
    config = OmegaConf.to_container(cfg, resolve=True)
    for lg in out:
        lg.log_hyperparams(_flatten(config))
    return out


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            flat.update(_flatten(v, key + "/"))
        else:
            flat[key] = v if isinstance(v, (int, float, str, bool)) or v is None else str(v)
    return flat


def log_final(loggers: list[Any], metrics: dict[str, Any], out_dir: Path) -> None:
    """Final metrics (per method), timings and the run's plots to every logger."""
    flat: dict[str, float] = {}
    for method, res in metrics["results"].items():
        if isinstance(res, dict):
            flat.update({f"final/{method}/{k}": float(v) for k, v in res.items() if isinstance(v, (int, float))})
        elif isinstance(res, (int, float)):
            flat[f"final/{method}"] = float(res)
    flat.update({f"time/{k}": float(v) for k, v in metrics["timings_s"].items()})
    flat["peak_rss_gib"] = float(metrics["peak_rss_gib"])
    plots = sorted((out_dir / "plots").glob("*.png")) if (out_dir / "plots").is_dir() else []
    for lg in loggers:
        lg.log_metrics(flat)
        if type(lg).__name__ == "WandbLogger" and plots:
            lg.log_image(key="plots", images=[str(p) for p in plots], caption=[p.stem for p in plots])
        lg.save()
        if hasattr(lg, "finalize"):
            lg.finalize("success")
