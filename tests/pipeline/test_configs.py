"""Every config group option composes into a valid run, and every settings file mirrors its record.

Each group file names its settings record with ``_target_`` (Hydra's convention); the file's keys
are that record's fields, one to one, so the configs and the code cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir

from xtransformer.errors import UserError
from xtransformer.pipeline.settings import run_settings
from xtransformer.settings import Settings

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
GROUPS = (
    "data",
    "tfidf",
    "indexing",
    "matcher",
    "ranker",
    "xrlinear",
    "xrtransformer",
    "cnn",
    "method",
    "trainer",
    "calibration",
)
OPTIONS = [(g, p.stem) for g in GROUPS for p in sorted((CONFIGS / g).glob("*.yaml")) if not p.stem.startswith("_")]


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose(config_name="train", overrides=["paths.output_dir=/tmp/x", *overrides])


@pytest.mark.parametrize("group, option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_group_option_gives_valid_settings(group, option):
    overrides = [f"{group}={option}"]
    if group == "data" and option == "custom":
        overrides.append("data.path=/some/folder")  # the template has no path (a one-line error otherwise)
    if group == "trainer" and option == "gpu":
        pytest.skip("trainer=gpu is checked against the visible GPUs (none here): see test_reliability")
    for method in ("xtransformer", "xrtransformer", "xrlinear", "kimcnn", "xmlcnn"):
        cfg = _compose(*overrides, f"method={method}")
        if method == "xrtransformer" and cfg.matcher.architecture != "transformer":
            with pytest.raises(UserError, match=r"^matcher\.architecture='cnn': XR-Transformer fine-tunes"):
                run_settings(cfg)  # a CNN matcher is X-Transformer's only: one line, before any data work
            continue
        s = run_settings(cfg)
        assert s.method == method


def _target_files() -> list[Path]:
    return sorted(p for g in GROUPS for p in (CONFIGS / g).glob("*.yaml") if "_target_" in p.read_text())


@pytest.mark.parametrize("path", _target_files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_settings_files_mirror_their_record(path):
    raw = yaml.safe_load(path.read_text())
    module, _, name = raw["_target_"].rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, Settings)
    assert set(raw) - {"_target_", "defaults"} == {f.name for f in dataclasses.fields(cls)}, path


def test_a_target_that_is_not_the_groups_record_is_rejected():
    with pytest.raises(UserError, match=r"^ranker\._target_='xtransformer.matcher.MatcherConfig': must be"):
        run_settings(_compose("ranker._target_=xtransformer.matcher.MatcherConfig"))


def test_a_target_that_moved_names_its_new_place():
    with pytest.raises(
        UserError, match=r"no such class \(it moved: write xtransformer\.methods\.xrlinear\.XRLinearConfig\)"
    ):
        run_settings(_compose("xrlinear._target_=xtransformer.pipeline.settings.XRLinearConfig"))


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
