"""The Hydra configuration: where its files live, which config group holds which settings record,
and each record group's base node, generated from the record's defaults.

The typed records are the one source of every default. :func:`register` stores each record's
defaults in Hydra's ConfigStore as ``<group>/_defaults`` (the interpolations its fields take in a
run, ``${seed}`` and the like, included: ``settings.hydra_value``); an option file
``configs/<group>/<option>.yaml`` extends that node and holds only what differs from it. Nothing
here runs on import: the entry points call :func:`register` (``train_main``, :func:`compose`,
:func:`composition_error`); Hydra's joblib / submitit launchers carry the ConfigStore to their
workers. Hydra is imported where it is used: ``xmc-predict`` imports this module's
:func:`config_dir` through the CLI and must stay light.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtransformer.settings import Settings, hydra_value

if TYPE_CHECKING:
    from hydra.core.config_loader import ConfigLoader
    from hydra.core.override_parser.types import Override
    from omegaconf import DictConfig

# config group -> the settings record its options build (the `_target_` of the group's node)
RECORD_GROUPS: dict[str, str] = {
    "data": "xtransformer.data.DataConfig",
    "tfidf": "xtransformer.data.TfidfConfig",
    "indexing": "xtransformer.indexing.IndexingConfig",
    "matcher": "xtransformer.matcher.MatcherConfig",
    "ranker": "xtransformer.ranker.RankerConfig",
    "xrlinear": "xtransformer.methods.xrlinear.XRLinearConfig",
    "xrtransformer": "xtransformer.methods.xrtransformer.XRTransformerConfig",
    "cnn": "xtransformer.methods.cnn.CNNConfig",
    "calibration": "xtransformer.calibration.CalibrationConfig",
}
# options made in code, by a function that returns the option's record (its docstring says what it is)
RECIPES: dict[str, str] = {"cnn/xmlcnn": "xtransformer.methods.cnn.config.xmlcnn_recipe"}
# the groups without a record: Lightning's Trainer kwargs, the loggers, the paths, Hydra's own
PLAIN_GROUPS = ("trainer", "logger", "paths", "hydra")
# every config group that is a section of the composed config (train.yaml picks each one's option)
GROUPS = (*RECORD_GROUPS, *PLAIN_GROUPS)
BASE = "_defaults"  # the generated option a record group's option files extend
NO_SUCH_SETTING = "no such setting (`python train.py --help` lists them)"


def config_dir() -> str:
    """The Hydra configs: shipped inside the installed package (copied there at build time, see
    setup.py), else the checkout's top-level ``configs/`` (source tree / editable install)."""
    shipped = resources.files("xtransformer") / "configs"
    if shipped.is_dir() and (shipped / "train.yaml").is_file():
        return str(shipped)
    return str(Path(__file__).resolve().parents[2] / "configs")


def record_class(group: str) -> type[Settings]:
    """The settings record of a config group of :data:`RECORD_GROUPS`."""
    module, _, name = RECORD_GROUPS[group].rpartition(".")
    return getattr(importlib.import_module(module), name)


def defaults_node(record: Settings) -> dict[str, Any]:
    """``record`` as a plain config node: a nested record as a nested node, a field as the value it
    takes in a Hydra run (its ``hydra`` interpolation, else its value in ``record``)."""
    node: dict[str, Any] = {}
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        node[f.name] = defaults_node(value) if isinstance(value, Settings) else hydra_value(f, value)
    return node


def register() -> None:
    """Store every record group's base node, ``<group>/_defaults``, in Hydra's ConfigStore: the
    record's defaults, with ``_target_`` naming the record (a plain node, not the dataclass: the
    records' own checks give the one-line errors, not OmegaConf's type checks); an option
    ``method=<name>`` for every method of another package; the configs' OmegaConf resolvers."""
    from hydra.core.config_store import ConfigStore

    from xtransformer import resolvers

    resolvers.register()
    store = ConfigStore.instance()
    for group, target in RECORD_GROUPS.items():
        node = {"_target_": target, **defaults_node(record_class(group)())}
        store.store(name=BASE, node=node, group=group, provider="xtransformer")
    for option, recipe in RECIPES.items():
        group, _, name = option.partition("/")
        module, _, function = recipe.rpartition(".")
        record = getattr(importlib.import_module(module), function)()
        node = {"_target_": RECORD_GROUPS[group], **defaults_node(record)}
        store.store(name=name, node=node, group=group, provider="xtransformer")
    for name, node in plugin_method_nodes().items():
        store.store(name=name, node=node, group="method", package="_global_", provider="xtransformer")


def plugin_method_nodes() -> dict[str, dict[str, Any]]:
    """``method=<name>`` of each method another package registers (``methods.plugin_methods``): the
    method's name, and the defaults of every settings group of its own (the suite's groups come
    from ``train.yaml``), so its settings record is its whole config."""
    from xtransformer.methods import method_class, plugin_methods

    nodes = {}
    for name in plugin_methods():
        record = method_class(name).settings_class()
        own = {}
        for f in dataclasses.fields(record):
            value = getattr(record, f.name)
            if f.name not in GROUPS and isinstance(value, Settings):
                own[f.name] = {
                    "_target_": f"{type(value).__module__}.{type(value).__qualname__}",
                    **defaults_node(value),
                }
        nodes[name] = {"method": name, **own}
    return nodes


def compose(
    overrides: Sequence[str] = (),
    config_name: str = "train",
    config_dir: str | None = None,
    return_hydra_config: bool = False,
) -> DictConfig:
    """The config ``python train.py OVERRIDES`` runs with (``config_dir``: the shipped configs)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register()
    with initialize_config_dir(config_dir=config_dir or _config_dir(), version_base="1.3"):
        return hydra_compose(config_name, list(overrides), return_hydra_config=return_hydra_config)


_config_dir = config_dir  # for the functions whose parameter of that name shadows it


# ------------------------------------------------------------------------ command-line checks
def composition_error(args: Sequence[str]) -> str | None:
    """What is wrong with the command line's overrides, as one line naming the key or the option, or
    None when they compose. Checked structurally: the override grammar (Hydra's parser), each
    ``group=option`` against the group's options, each ``key=value`` against the config the group
    choices alone compose to. Hydra's own report spans several lines and ends with a hint about
    HYDRA_FULL_ERROR. Multirun sweeps and Hydra's own flags and settings are left to Hydra."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException, OverrideParseException
    from omegaconf.errors import OmegaConfBaseException

    if any(a.startswith("-") for a in args):  # --multirun, --help, --config-name, ...
        return None
    try:
        parsed = [o for o in OverridesParser.create().parse_overrides(list(args)) if not o.is_hydra_override()]
    except OverrideParseException as err:
        return _one_line(err)
    register()
    with initialize_config_dir(config_dir=_config_dir(), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        is_setting = [_is_setting(o, loader) for o in parsed]
        settings = [o for o, setting in zip(parsed, is_setting) if setting]
        choices = [o for o, setting in zip(parsed, is_setting) if not setting]
        problem = next(filter(None, (_option_error(o, loader) for o in choices)), None)
        if problem is not None:
            return problem
        try:
            cfg = hydra_compose("train", [o.input_line for o in choices])
        except (HydraException, OmegaConfBaseException, ValueError) as err:  # Hydra's own one, in one line
            return _one_line(err)
    return next(filter(None, (_setting_error(o, cfg) for o in settings)), None)


def _one_line(err: BaseException) -> str:
    return " ".join(line.strip() for line in str(err).strip().splitlines() if line.strip())


def _is_setting(o: Override, loader: ConfigLoader) -> bool:
    """A ``key=value`` setting (``+`` / ``++`` / ``~`` too), as Hydra tells them apart: not a sweep,
    not a config group's choice (a mapping given to a group is a setting)."""
    if o.is_sweep_override() or o.package is not None:
        return False
    parent, _, name = o.key_or_group.rpartition("/")
    return bool(name) and (isinstance(o.value(), dict) or name not in loader.list_groups(parent))


def _option_error(o: Override, loader: ConfigLoader) -> str | None:
    """``group=option`` naming an option the group does not have: the options it has."""
    value = o.value() if not o.is_sweep_override() else None
    if o.is_delete() or not isinstance(value, str):
        return None
    group = o.key_or_group
    options = loader.get_group_options(group)
    if value in options:
        return None
    shown = sorted(x for x in options if not x.startswith("_"))
    available = f"; available: {', '.join(shown)}" if shown else ""
    return f"{group}={value}: no such option of config group '{group}'{available}"


def _setting_error(o: Override, cfg: DictConfig) -> str | None:
    """A setting applied to ``cfg`` as Hydra applies it (so later ones see it), or what is wrong with
    it: a key the config does not have, ``+`` on a key it has, ``~`` on one it lacks."""
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

    key, value = o.key_or_group, o.value()
    held = OmegaConf.select(cfg, key, throw_on_missing=False, throw_on_resolution_failure=False)
    if o.is_delete():
        return None if held is not None else f"Could not delete from config. '{key}' does not exist."
    if o.is_add() and held is not None and not isinstance(value, (dict, list)):
        return (
            f"Could not append to config. An item is already at '{key}'. Either remove + prefix: "
            f"'{o.input_line[1:]}' Or add a second + to add or override '{key}': '+{o.input_line}'"
        )
    try:
        OmegaConf.update(cfg, key, value, merge=True, force_add=o.is_add() or o.is_force_add())
    except (ConfigAttributeError, ConfigKeyError):
        return f"{key}: {NO_SUCH_SETTING}"
    except OmegaConfBaseException as err:
        return f"{o.input_line}: {_one_line(err)}"
    return None
