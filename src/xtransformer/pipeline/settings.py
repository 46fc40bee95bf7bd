"""The run's settings, read from the Hydra config and checked in one place before any data work.

:func:`run_settings` turns the composed config into typed records: the run's own switches, the
data, the trainer, and for every method the run trains the record its ``fit`` takes (built from
the config groups its fields name). Every bad type, value, choice or cross-field rule fails here
with one line naming the key, the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from xtransformer import methods as registry
from xtransformer.calibration import CalibrationConfig
from xtransformer.configuration import GROUPS
from xtransformer.context import TrainerConfig
from xtransformer.data import DataConfig
from xtransformer.ensemble import METHODS as ENSEMBLE_METHODS
from xtransformer.methods import method_class
from xtransformer.settings import Settings, SettingsError, run_field
from xtransformer.suite.published import PublishedError, select

log = logging.getLogger(__name__)


@dataclass
class RunSettings:
    """Every setting of one run, typed and checked: the run's own switches, the data, the trainer
    (``auto`` precision resolved) and one settings record per method it trains."""

    method: str
    seed: int
    cache: bool
    train_xrlinear: bool
    combine_with_xrlinear: str | None
    combine_weight: float
    data: DataConfig
    trainer: TrainerConfig
    lightning: dict[str, Any]  # the trainer group's other Lightning kwargs
    methods: dict[str, Settings]  # name -> its fit's settings record, in training order (XR-Linear first)
    calibration: CalibrationConfig = dataclasses.field(default_factory=CalibrationConfig)
    cache_dir: str = ""
    output_dir: str = ""
    published: list[str] = dataclasses.field(default_factory=list)  # the published rows set beside this run

    @property
    def main(self) -> Settings:
        return self.methods[self.method]

    @property
    def combined(self) -> bool:
        """Whether the run reports the main method combined with XR-Linear."""
        return bool(self.combine_with_xrlinear) and self.method != "xrlinear" and "xrlinear" in self.methods

    @property
    def given_tfidf(self) -> bool:
        """Whether a method reads the dataset's own TF-IDF rows (``tfidf=given``): the data must bring them."""
        return any(getattr(getattr(r, "tfidf", None), "source", None) == "given" for r in self.methods.values())

    def combine_weights(self) -> list[float]:
        """The weights of [main method, XR-Linear] in ``{method}+xrlinear`` (``combine_weight``)."""
        return [self.combine_weight, 1.0 - self.combine_weight]

    def stage_keys(self, data_key: str, n_labels: int) -> dict[str, dict[str, Any]]:
        """Every stage key of every method this run trains, from the settings alone."""
        return {
            name: method_class(name).stage_keys(record, data_key, n_labels, self.trainer)
            for name, record in self.methods.items()
        }

    def records(self) -> dict[str, Any]:
        """``{"train": {group: record}, "predict": {group: record}}`` of every group this run reads."""
        groups: dict[str, Settings] = {"trainer": self.trainer, "calibration": self.calibration}
        for record in self.methods.values():
            groups |= {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
        return {
            "train": {k: v.training_settings() for k, v in groups.items()},
            "predict": {k: v.prediction_settings() for k, v in groups.items() if v.prediction_settings()},
        }


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
    # the seed papers' rows this run stands beside (<paper>/<set>/<row>, suite/published.yaml): written
    # into metrics.json and logged next to the run's results; the sweep aggregate prints them too
    published: list[str] | None = run_field(None)
    table5_id: int | str | None = run_field(None)  # the Table 5 row of a +table5=<row> run (suite/table5.py reads it)

    def check(self) -> None:
        if self.baseline is not None:
            log.warning("`baseline` is now `train_xrlinear` (a later version removes the old name)")
            self.train_xrlinear = self.baseline
        if self.combine_with_baseline != "unset":
            log.warning("`combine_with_baseline` is now `combine_with_xrlinear` (a later version removes the old name)")
            self.combine_with_xrlinear = self.combine_with_baseline
        if self.method not in registry.trainable():
            raise self.bad("method", f"expected one of {list(registry.trainable())} (the config group method=...)")
        key = "combine_with_baseline" if self.combine_with_baseline != "unset" else "combine_with_xrlinear"
        if self.combine_with_xrlinear not in (None, *ENSEMBLE_METHODS):
            raise self.bad(key, f"expected one of {[*ENSEMBLE_METHODS, None]}")
        if not (
            isinstance(self.combine_weight, (int, float))
            and not isinstance(self.combine_weight, bool)
            and 0.0 < self.combine_weight < 1.0
        ):
            raise self.bad(
                "combine_weight", "must be a number in (0, 1): the main method's share, XR-Linear gets the rest"
            )
        if self.model_scale not in ("full", "small"):
            raise self.bad("model_scale", "expected 'full' or 'small'")
        try:
            select(self.published or [])
        except PublishedError as err:
            raise self.bad("published", str(err)) from None


def groups(plain: Mapping[str, Any]) -> set[str]:
    """The config's groups: the suite's own, and the sections of the main method's settings record
    (a method added to the registry may bring a group of its own)."""
    method = plain.get("method")
    if not (isinstance(method, str) and method in registry.trainable()):
        return set(GROUPS)  # _TopLevel's check names the bad `method`
    return set(GROUPS) | {f.name for f in dataclasses.fields(method_class(method).settings_class)}


def plain_config(cfg: DictConfig) -> dict[str, Any]:
    """The config resolved to plain values; a missing (``???``) or unresolvable value fails naming its key."""

    def walk(node: Any, where: str) -> Any:
        if isinstance(node, DictConfig):
            out = {}
            for key in node:
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
    top = _TopLevel.from_mapping({k: v for k, v in plain.items() if k not in groups(plain)})
    trainer, lightning = TrainerConfig.from_group(plain.get("trainer") or {})
    names = (["xrlinear"] if top.train_xrlinear and top.method != "xrlinear" else []) + [top.method]
    paths = plain.get("paths") or {}
    return RunSettings(
        method=top.method,
        seed=top.seed,
        cache=top.cache,
        train_xrlinear=top.train_xrlinear,
        combine_with_xrlinear=top.combine_with_xrlinear,
        combine_weight=float(top.combine_weight),
        data=DataConfig.from_mapping(plain.get("data") or {}),
        # `auto` made concrete here, so the records, cache keys and Lightning all see what runs
        trainer=trainer.resolved(),
        lightning=lightning,
        methods={name: method_settings(name, plain) for name in names},
        calibration=CalibrationConfig.from_mapping(plain.get("calibration") or {}),
        cache_dir=str(paths.get("cache_dir", "")),
        output_dir=str(paths.get("output_dir", "")),
        published=list(top.published or []),
    )


def compose_config(*overrides: str) -> DictConfig:
    """The Hydra config ``python train.py OVERRIDES`` composes from the package's configs, unresolved:
    what ``xtransformer.pipeline.run.run`` takes. Outside a Hydra run ``paths.output_dir`` (Hydra's run
    folder by default) must be among the overrides before anything reads it."""
    from xtransformer.configuration import compose

    return compose(overrides)


def compose_settings(*overrides: str) -> RunSettings:
    """The settings ``python train.py OVERRIDES`` would run with, for the Python API::

    s = compose_settings("method=xrtransformer", "data=eurlex57k")
    XRTransformer.fit(texts, labels, s.main, context=TrainContext(trainer=s.trainer, lightning=s.lightning))
    """
    return run_settings(compose_config("paths.output_dir=.", *overrides))


def method_settings(name: str, plain: Mapping[str, Any]) -> Settings:
    """The settings record of method ``name``'s fit, from the config groups its fields name."""
    record = method_class(name).settings_class
    return record.from_mapping({f.name: plain.get(f.name) or {} for f in dataclasses.fields(record)})
