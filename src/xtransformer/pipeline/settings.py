"""The run's settings, read from the Hydra config and checked in one place before any data work.

:func:`run_settings` turns the composed config into typed records (one per config group, see
``xtransformer.settings``): every bad type, value, choice or cross-field rule fails here with one
line naming the key, the value and what is allowed. The stages receive these records, never the
raw config; cache keys (``keys.py``) and model folders read their training / prediction records.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any, Mapping

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from xtransformer.data import DataConfig, TfidfConfig
from xtransformer.ensemble import METHODS as ENSEMBLE_METHODS
from xtransformer.indexing import IndexingConfig
from xtransformer.matcher import MatcherConfig
from xtransformer.ranker import HierarchicalLinearConfig, RankerConfig
from xtransformer.settings import Settings, SettingsError, run_field
from xtransformer.utils.hardware import resolve_precision
from xtransformer.xrtransformer import XRTransformerConfig

log = logging.getLogger(__name__)

METHODS = ("xtransformer", "xrtransformer", "xrlinear")
ACCELERATORS = ("cpu", "gpu", "cuda", "mps", "tpu", "auto")
PRECISIONS = ("auto", "32", "32-true", "16", "16-mixed", "bf16", "bf16-mixed", "bf16-true", "16-true", "64", "64-true")


@dataclass
class XRLinearConfig(Settings):
    """Mirrors ``configs/xrlinear/default.yaml``: XR-Linear's own tree and its linear model."""

    where = "xrlinear"

    # orphan labels (no positive document) keep zero PIFA rows, as in PECOS: there is no matcher
    # to feed, and copies of other labels' rows only slow the k-means (53k of 64k labels on the
    # synthetic benchmark: 9.1M -> 1.6M nonzeros) without a better tree
    indexing: IndexingConfig = field(default_factory=lambda: IndexingConfig(max_leaf_size=100, orphan_fallback="none"))
    nr_splits: int = 16  # branching of the tree as the model sees it (ClusterChain.subsample)
    # > 1: as many trees (k-means seeded indexing.seed + i), one model each, scores averaged (LinearForest)
    n_trees: int = 1
    model: HierarchicalLinearConfig = field(default_factory=HierarchicalLinearConfig)

    def check(self) -> None:
        if self.nr_splits < 2:
            raise self.bad("nr_splits", "must be an int >= 2")
        if self.n_trees < 1:
            raise self.bad("n_trees", "must be an int >= 1")


@dataclass
class TrainerConfig(Settings):
    """The Lightning ``Trainer`` settings this suite reads (``configs/trainer/*.yaml``); the rest
    of the group goes to the Trainer untouched. Placement and precision shape the fine-tuned weights
    (part of the matcher's key); the others only log and display."""

    where = "trainer"

    accelerator: str = "cpu"
    devices: int | str | list[int] = 1
    strategy: str = "auto"
    precision: str | int = "32-true"
    num_nodes: int = 1

    def check(self) -> None:
        if self.accelerator not in ACCELERATORS:
            raise self.bad("accelerator", f"expected one of {list(ACCELERATORS)}")
        if str(self.precision) not in PRECISIONS:
            raise self.bad("precision", f"expected one of {list(PRECISIONS)}")
        if isinstance(self.devices, int) and self.devices < 1 and self.devices != -1:
            raise self.bad("devices", "must be >= 1, -1 (all), 'auto' or a list of device ids")
        if isinstance(self.devices, str) and self.devices != "auto":
            raise self.bad("devices", "must be >= 1, -1 (all), 'auto' or a list of device ids")
        if self.num_nodes < 1:
            raise self.bad("num_nodes", "must be an int >= 1")
        if self.accelerator in ("gpu", "cuda"):
            import torch

            if not torch.cuda.is_available():
                raise self.bad("accelerator", "no CUDA GPU is visible on this machine; use trainer=cpu")
            if isinstance(self.devices, int) and self.devices > torch.cuda.device_count():
                raise self.bad("devices", f"only {torch.cuda.device_count()} GPU(s) visible")

    def placement(self) -> dict[str, str]:
        """What the fine-tuned weights depend on (cache keys): where and at which precision."""
        return {k: str(getattr(self, k)) for k in ("accelerator", "devices", "num_nodes", "strategy", "precision")}


@dataclass
class RunSettings:
    """Every stage's settings for one run, typed and checked."""

    method: str
    seed: int
    cache: bool
    train_xrlinear: bool
    combine_with_xrlinear: str | None
    combine_weight: float
    data: DataConfig
    tfidf: TfidfConfig
    xrlinear: XRLinearConfig
    trainer: TrainerConfig
    trainer_kwargs: dict[str, Any]  # the whole trainer group, for Lightning
    indexing: IndexingConfig | None = None  # the neural methods' tree
    matcher: MatcherConfig | None = None
    ranker: RankerConfig | None = None  # method=xtransformer
    xrtransformer: XRTransformerConfig | None = None
    cache_dir: str = ""
    output_dir: str = ""

    @property
    def neural(self) -> bool:
        return self.method != "xrlinear"

    def records(self) -> dict[str, Any]:
        """``{"train": {stage: record}, "predict": {stage: record}}`` of every stage this run has."""
        stages = {name: getattr(self, name) for name in ("tfidf", "xrlinear", "trainer", "indexing", "matcher",
                                                         "ranker", "xrtransformer") if getattr(self, name) is not None}
        return {"train": {k: v.training_settings() for k, v in stages.items()},
                "predict": {k: v.prediction_settings() for k, v in stages.items() if v.prediction_settings()}}


@dataclass
class _TopLevel(Settings):
    """The top-level keys of ``configs/train.yaml``."""

    task_name: str = run_field("train")
    seed: int = 0
    model_scale: str = "full"
    train_xrlinear: bool = True
    combine_with_xrlinear: str | None = "average"
    combine_weight: float = 0.5  # the main method's share in that combination (XR-Linear: 1 - it)
    cache: bool = True
    method: str = "xtransformer"
    baseline: bool | None = run_field(None)  # old name of train_xrlinear
    combine_with_baseline: str | None = run_field("unset")  # old name of combine_with_xrlinear

    def check(self) -> None:
        if self.baseline is not None:
            log.warning("`baseline` is now `train_xrlinear` (the old name goes in a later release)")
            self.train_xrlinear = self.baseline
        if self.combine_with_baseline != "unset":
            log.warning("`combine_with_baseline` is now `combine_with_xrlinear` (the old name goes in a later release)")
            self.combine_with_xrlinear = self.combine_with_baseline
        if self.method not in METHODS:
            raise self.bad("method", f"expected one of {list(METHODS)} (the config group method=...)")
        key = "combine_with_baseline" if self.combine_with_baseline != "unset" else "combine_with_xrlinear"
        if self.combine_with_xrlinear not in (None, *ENSEMBLE_METHODS):
            raise self.bad(key, f"expected one of {[*ENSEMBLE_METHODS, None]}")
        if not (isinstance(self.combine_weight, (int, float)) and not isinstance(self.combine_weight, bool)
                and 0.0 < self.combine_weight < 1.0):
            raise self.bad("combine_weight", "must be a number in (0, 1): the main method's share, XR-Linear gets the rest")
        if self.model_scale not in ("full", "small"):
            raise self.bad("model_scale", "expected 'full' or 'small'")


GROUPS = ("data", "tfidf", "indexing", "matcher", "ranker", "xrlinear", "xrtransformer", "trainer", "logger",
          "paths", "hydra")


def plain_config(cfg: DictConfig) -> dict[str, Any]:
    """The config resolved to plain values; a missing (``???``) or unresolvable value fails naming its key."""
    def walk(node: Any, where: str) -> Any:
        if isinstance(node, DictConfig):
            out = {}
            for key in node.keys():
                path = f"{where}.{key}" if where else str(key)
                try:
                    if OmegaConf.is_missing(node, key):
                        raise SettingsError(f"{path}: no value given (set it on the command line: {path}=...)")
                    value = node[key]
                except OmegaConfBaseException as err:
                    msg = str(err).split("\n")[0]
                    raise SettingsError(f"{path}: {msg}") from None
                out[key] = walk(value, path)
            return out
        if OmegaConf.is_list(node):
            return [walk(v, f"{where}[{i}]") for i, v in enumerate(node)]
        return node

    return walk(cfg, "")


def run_settings(cfg: DictConfig | Mapping[str, Any]) -> RunSettings:
    """Check the whole config and return the typed records (raises a one-line ``UserError``)."""
    plain = plain_config(cfg) if isinstance(cfg, DictConfig) else dict(cfg)
    top = _TopLevel.from_mapping({k: v for k, v in plain.items() if k not in GROUPS})
    method = top.method
    trainer_kwargs = dict(plain.get("trainer") or {})
    trainer = TrainerConfig.from_mapping({k: trainer_kwargs[k] for k in
                                          (f.name for f in dataclasses.fields(TrainerConfig)) if k in trainer_kwargs})
    # `auto` made concrete here, so the records, cache keys and Lightning all see what runs
    trainer.precision = trainer_kwargs["precision"] = resolve_precision(trainer.precision, trainer.accelerator)
    settings = RunSettings(
        method=method, seed=top.seed, cache=top.cache, train_xrlinear=top.train_xrlinear,
        combine_with_xrlinear=top.combine_with_xrlinear, combine_weight=float(top.combine_weight),
        data=DataConfig.from_mapping(plain.get("data") or {}),
        tfidf=TfidfConfig.from_mapping(plain.get("tfidf") or {}),
        xrlinear=XRLinearConfig.from_mapping(plain.get("xrlinear") or {}),
        trainer=trainer, trainer_kwargs=trainer_kwargs,
        cache_dir=str((plain.get("paths") or {}).get("cache_dir", "")),
        output_dir=str((plain.get("paths") or {}).get("output_dir", "")),
    )
    if method != "xrlinear":
        settings.indexing = IndexingConfig.from_mapping(plain.get("indexing") or {})
        settings.matcher = MatcherConfig.from_mapping(plain.get("matcher") or {})
    if method == "xtransformer":
        settings.ranker = RankerConfig.from_mapping(plain.get("ranker") or {})
    if method == "xrtransformer":
        settings.xrtransformer = XRTransformerConfig.from_mapping(plain.get("xrtransformer") or {})
    return settings
