"""Experiment loggers from the ``logger`` config group (wandb, csv, tensorboard, none).

Each entry of ``cfg.logger`` is a Lightning logger with a ``_target_``; they receive the matcher's
training curves from Lightning, and ``log_final`` adds the resolved config, final metrics and
plots. W&B runs offline unless ``logger.wandb.offline=false`` (or ``WANDB_OFFLINE=false``); multirun
members are grouped by sweep.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from xtransformer.suite.runs import flatten_config

log = logging.getLogger(__name__)


def build_loggers(cfg: DictConfig, records: dict[str, Any] | None = None) -> list[Any]:
    """The ``logger`` group's loggers, given the resolved config and (``records``) every stage's
    training / prediction records as hyperparameters (``train/<stage>/...``, ``predict/<stage>/...``),
    so dashboards compare runs on what shaped them rather than on the raw config tree."""
    if not cfg.get("logger"):
        return []
    out = []
    for name, lcfg in cfg.logger.items():
        if lcfg is None or "_target_" not in lcfg:
            continue
        extra = {"group": sweep_group(cfg)} if "group" in lcfg and lcfg.group is None else {}
        out.append(without_retired_wandb_settings(hydra.utils.instantiate(lcfg, **extra)))
        log.info("logger %s: %s", name, type(out[-1]).__name__)
    config = OmegaConf.to_container(cfg, resolve=True)
    params = flatten_config(config) | (flatten_config(records) if records else {})
    for lg in out:
        lg.log_hyperparams(params)
    return out


def without_retired_wandb_settings(logger: Any) -> Any:
    """Lightning's WandbLogger always hands ``wandb.init`` an ``anonymous`` setting (None), which
    wandb retired: one warning line on every run. Left out when unset."""
    init = getattr(logger, "_wandb_init", None)
    if isinstance(init, dict) and init.get("anonymous") is None:
        init.pop("anonymous", None)
    return logger


def sweep_group(cfg: DictConfig) -> str:
    """Members of one multirun share a W&B group (the sweep folder), so the dashboard compares them."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized() and HydraConfig.get().mode.name == "MULTIRUN":
        return f"{cfg.task_name}-{Path(HydraConfig.get().sweep.dir).name}"
    return str(cfg.task_name)


def log_final(loggers: list[Any], metrics: dict[str, Any], out_dir: Path) -> None:
    """Final metrics (per method), timings and the run's plots to every logger."""
    flat: dict[str, float] = {}
    for method, res in metrics["results"].items():
        if isinstance(res, dict):
            flat.update({f"final/{method}/{k}": float(v) for k, v in res.items() if isinstance(v, (int, float))})
        elif isinstance(res, (int, float)):
            flat[f"final/{method}"] = float(res)
    for method, groups in metrics.get("label_groups", {}).items():  # frequent / few / zero-shot labels
        for group, res in groups.items():
            flat.update({f"final/{method}/{group}/{k}": float(v) for k, v in res.items()})
    for row_id, rec in metrics.get("published", {}).items():  # the papers' figures, beside the run's own
        flat.update({f"published/{row_id}/{k}": float(v) for k, v in rec["metrics"].items()})
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
