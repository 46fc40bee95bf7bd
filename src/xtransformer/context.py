"""What every method's ``fit`` shares besides its own settings: the training context.

A :class:`TrainContext` holds the stage cache, the resolved Lightning ``Trainer`` settings, the
experiment loggers and the process's rank, so no function carries them through its parameters.
``TrainContext()`` is a complete default: a scratch cache that keeps nothing, one CPU process at
32-bit precision, no loggers. The Hydra run builds one from its config groups.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xtransformer.cache import StageCache
from xtransformer.settings import Settings
from xtransformer.utils.dist import is_rank_zero
from xtransformer.utils.hardware import device_type, resolve_precision

ACCELERATORS = ("cpu", "gpu", "cuda", "mps", "tpu", "auto")
PRECISIONS = ("auto", "32", "32-true", "16", "16-mixed", "bf16", "bf16-mixed", "bf16-true", "16-true", "64", "64-true")


@dataclass
class TrainerConfig(Settings):
    """The Lightning ``Trainer`` settings this suite reads (``configs/trainer/*.yaml``); the rest of
    the group goes to the Trainer untouched (:attr:`TrainContext.lightning`). Placement and
    precision shape the fine-tuned weights (part of the neural stages' keys)."""

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

    @classmethod
    def from_group(cls, group: Mapping[str, Any]) -> tuple[TrainerConfig, dict[str, Any]]:
        """The record of a whole ``trainer`` config group, and the group's other Lightning kwargs."""
        names = {f.name for f in dataclasses.fields(cls)}
        record = cls.from_mapping({k: v for k, v in group.items() if k in names})
        return record, {k: v for k, v in group.items() if k not in names}

    def resolved(self) -> TrainerConfig:
        """This record with ``precision: auto`` made concrete (what runs, and what keys see)."""
        return dataclasses.replace(self, precision=resolve_precision(self.precision, self.accelerator))

    def placement(self) -> dict[str, str]:
        """What the fine-tuned weights depend on (cache keys): where and at which precision."""
        return {k: str(getattr(self, k)) for k in ("accelerator", "devices", "num_nodes", "strategy", "precision")}

    @property
    def device(self) -> str:
        """The torch device type the trained encoder embeds on ("cuda" or "cpu")."""
        return "cuda" if device_type(self.accelerator) == "cuda" else "cpu"


@dataclass
class TrainContext:
    """The cache, trainer, loggers and rank a ``fit`` runs with.

    ``cache``: the stage cache (None: a scratch cache, removed by :meth:`close`); ``trainer``: the
    Lightning placement and precision (``auto`` resolved here); ``lightning``: further ``Trainer``
    kwargs (log cadence, progress bar, ...); ``loggers``: Lightning loggers that receive the
    training curves; ``callbacks``: Lightning callbacks added to every fine-tuning.
    """

    cache: StageCache | None = None
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    # configs/trainer/cpu.yaml's: no sanity validation, no model summary, a log line every 10 steps
    lightning: dict[str, Any] = field(
        default_factory=lambda: {"num_sanity_val_steps": 0, "enable_model_summary": False, "log_every_n_steps": 10}
    )
    loggers: list[Any] = field(default_factory=list)
    callbacks: list[Any] = field(default_factory=list)  # further Lightning callbacks of every fit

    def __post_init__(self) -> None:
        self._own_cache = self.cache is None
        if self.cache is None:
            self.cache = StageCache(Path(tempfile.gettempdir()) / "xmc-scratch", enabled=False)
        self.trainer = self.trainer.resolved()

    @property
    def trainer_kwargs(self) -> dict[str, Any]:
        """Every Lightning ``Trainer`` kwarg of the run (the matcher config adds its own)."""
        return {**self.lightning, **dataclasses.asdict(self.trainer)}

    @property
    def is_rank_zero(self) -> bool:
        """False in the helper processes of a DDP run (they only share the fine-tuning work)."""
        return is_rank_zero()

    @property
    def work_root(self) -> Path:
        """Where model lookups and token caches live: the cache, or this context's scratch folder."""
        return self.cache.base

    def matcher_settings(self, cfg: Any) -> Any:
        """``cfg`` (a ``MatcherConfig``) with its model / token cache in this context's folder unless set."""
        return cfg if cfg.cache_dir is not None else dataclasses.replace(cfg, cache_dir=str(self.work_root))

    def close(self) -> None:
        """Remove the scratch folder of a context without cache."""
        if self._own_cache:
            self.cache.close()

    def __enter__(self) -> TrainContext:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
