"""Every config group option composes into a valid run; the records are the one source of defaults.

A record group's base node (``<group>/_defaults``) is generated from its settings record
(``xtransformer.configuration``); its option files extend it and set only fields of that record.
The list of groups lives in ``configuration.GROUPS``; train.yaml picks each one's default option.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from omegaconf import OmegaConf

from xtransformer import methods as registry
from xtransformer.configuration import GROUPS, RECORD_GROUPS, compose, defaults_node, record_class
from xtransformer.errors import UserError
from xtransformer.pipeline.settings import run_settings
from xtransformer.settings import Settings

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
OPTIONS = [(g, p.stem) for g in GROUPS if g != "hydra" for p in sorted((CONFIGS / g).glob("*.yaml"))]


def _compose(*overrides: str):
    return compose(["paths.output_dir=/tmp/x", *overrides])


@pytest.mark.parametrize("group, option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_group_option_gives_valid_settings(group, option):
    overrides = [f"{group}={option}"]
    if group == "data" and option == "custom":
        overrides.append("data.path=/some/folder")  # the template has no path (a one-line error otherwise)
    if group == "trainer" and option == "gpu":
        pytest.skip("trainer=gpu is checked against the visible GPUs (none here): see test_reliability")
    for method in registry.METHODS:
        cfg = _compose(*overrides, f"method={method}")
        if method == "xrtransformer" and cfg.matcher.architecture != "transformer":
            with pytest.raises(UserError, match=r"^matcher\.architecture='cnn': XR-Transformer fine-tunes"):
                run_settings(cfg)  # a CNN matcher is X-Transformer's only: one line, before any data work
            continue
        s = run_settings(cfg)
        assert s.method == method


def _with_record_values(record: Settings, node: dict[str, Any]) -> dict[str, Any]:
    """``node`` with each field that takes a value of its own in a run (``hydra``) given the record's."""
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        if isinstance(value, Settings):
            _with_record_values(value, node[f.name])
        elif "hydra" in f.metadata:
            assert node[f.name] == f.metadata["hydra"], f.name
            node[f.name] = value
    return node


def test_a_record_groups_base_node_is_its_records_defaults():
    """The generated ``<group>/_defaults`` holds the record's defaults, nested records included,
    and the run's value of each field that declares one (``${seed}``, ...)."""
    for group, target in RECORD_GROUPS.items():
        cls = record_class(group)
        node = _with_record_values(cls(), defaults_node(cls()))
        assert cls.where == group and target.rpartition(".")[2] == cls.__name__
        assert cls.from_mapping(node) == cls(), group


def test_the_seed_reaches_every_record_that_takes_one():
    """The run's seed interpolation is declared on the field, so nested records carry it too."""
    cfg = _compose("seed=7")
    for path in ("indexing", "matcher", "cnn", "calibration", "xrlinear.indexing", "xrtransformer.final.indexing"):
        assert OmegaConf.select(cfg, f"{path}.seed") == 7, path
    assert cfg.matcher.cache_dir == cfg.paths.cache_dir
    assert OmegaConf.is_missing(_compose("data=custom").data, "path")  # data=custom's folder: no default


def _unknown_keys(record: Settings, node: dict[str, Any], where: str) -> list[str]:
    """The keys of ``node`` that are not fields of ``record`` (nested records checked against theirs)."""
    fields = {f.name for f in dataclasses.fields(record)}
    bad = [f"{where}.{k}" for k in node if k not in fields]
    for key, value in node.items():
        nested = getattr(record, key, None)
        if isinstance(nested, Settings) and isinstance(value, dict):
            bad += _unknown_keys(nested, value, f"{where}.{key}")
    return bad


def _record_files() -> list[Path]:
    return sorted(p for g in RECORD_GROUPS for p in (CONFIGS / g).glob("*.yaml"))


@pytest.mark.parametrize("path", _record_files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_option_files_set_only_fields_of_their_record(path):
    raw = yaml.safe_load(path.read_text()) or {}
    raw.pop("defaults", None)
    assert "_target_" not in raw, "the group's generated base node names the record"
    if path.read_text().startswith("# @package _global_"):  # sections of several groups
        sections = raw
    else:
        sections = {path.parent.name: raw}
    for group, node in sections.items():
        assert group in RECORD_GROUPS, (path, group)
        assert not _unknown_keys(record_class(group)(), node, group), path
    assert f"# Settings: {RECORD_GROUPS[path.parent.name]};" in path.read_text(), "a header naming the record"


@pytest.mark.parametrize("row", sorted(p.stem for p in (CONFIGS / "table5").glob("*.yaml")))
def test_a_table5_row_gives_valid_settings(row):
    """The X-Transformer sweeps run Table 5's rows (``+table5=<row>``): each one's settings pass the check,
    its row id a run setting that suite/table5.py reads back."""
    s = run_settings(_compose(f"+table5={row}"))
    assert s.method in ("xtransformer", "kimcnn", "xmlcnn")


@pytest.mark.parametrize("key", ["max_cg_iter", "post_processor", "max_cluster_growth", "normalize_y_rows"])
def test_a_records_default_is_written_once(key):
    """Keys of the ranker and indexing records, copied into several files before the records
    became the base nodes: each is set by at most one config file now."""
    found = subprocess.run(["grep", "-rlw", key, str(CONFIGS)], capture_output=True, text=True).stdout.split()
    assert len(found) <= 1, found


def test_train_yaml_picks_an_option_of_every_group():
    defaults = yaml.safe_load((CONFIGS / "train.yaml").read_text())["defaults"]
    picked = {key for entry in defaults if isinstance(entry, dict) for key in entry}
    assert set(GROUPS) <= picked, set(GROUPS) - picked


def test_a_target_that_is_not_the_groups_record_is_rejected():
    with pytest.raises(UserError, match=r"^ranker\._target_='xtransformer.matcher.MatcherConfig': must be"):
        run_settings(_compose("ranker._target_=xtransformer.matcher.MatcherConfig"))


def test_a_target_that_moved_names_its_new_place():
    with pytest.raises(
        UserError, match=r"no such class \(it moved: write xtransformer\.methods\.xrlinear\.XRLinearConfig\)"
    ):
        run_settings(_compose("xrlinear._target_=xtransformer.pipeline.settings.XRLinearConfig"))


def test_composing_registers_nothing_on_import():
    """Importing the package leaves Hydra's ConfigStore as it was: the entry points register."""
    code = (
        "import xtransformer.configuration, xtransformer.cli, xtransformer.pipeline.settings\n"
        "from hydra.core.config_store import ConfigStore\n"
        "assert 'ranker' not in ConfigStore.instance().repo, ConfigStore.instance().repo.keys()\n"
        "xtransformer.configuration.register()\n"
        "assert '_defaults.yaml' in ConfigStore.instance().repo['ranker']\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_wandb_logger_starts_offline_without_a_retired_setting_warning(tmp_path, capfd, monkeypatch):
    """`logger=wandb` as a run builds it: the run starts offline, with no warning line about the
    `anonymous` setting Lightning passes and wandb retired."""
    from xtransformer.pipeline.loggers import build_loggers

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.chdir(tmp_path)
    (lg,) = build_loggers(_compose("logger=wandb", f"paths.output_dir={tmp_path}"))
    try:
        assert lg.experiment.offline
    finally:
        lg.experiment.finish()
    out = capfd.readouterr()
    assert "anonymous" not in out.out + out.err
