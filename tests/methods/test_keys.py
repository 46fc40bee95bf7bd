"""Property test of the stage keys (each method's ``stage_keys``) against the settings records.

For every field of every settings record a run's methods read, change it to another valid value
and recompute that method's stage keys from the settings alone:
- a training setting of a stage changes that stage's key and every key downstream of it;
- a run setting (names, threads, progress, paths) and a prediction setting of a final model
  (beam, top-k, post-processor, head combination) change no key at all;
- a prediction setting of the matcher (top-b, embedding dtype, ...) changes no key of the matcher's
  weights, only its outputs and the stages trained on them (matcher-aware negatives, neural features);
- the linear model a disentangled leaf level is counted from keys the neural tree only at λ > 1;
- a group the method reads only in some configurations (X-Transformer's ``cnn``: a CNN matcher's)
  keys nothing when unused, and a CNN matcher keys none of the transformer's fine-tuning settings.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from xtransformer.errors import UserError
from xtransformer.methods import method_class
from xtransformer.pipeline.settings import RunSettings, compose_settings
from xtransformer.settings import PREDICT, RUN, TRAIN, Settings, role

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
N_LABELS = 90  # Reuters: the level plan of XR-Transformer needs the label count only

ALL = {"tfidf", "xrlinear", "indexing", "matcher", "matcher_outputs", "ranker", "xrlevel", "xrembed", "xrfinal", "cnn"}
NEURAL_TREE = {"indexing", "matcher", "matcher_outputs", "ranker", "xrlevel", "xrembed", "xrfinal"}
# keys each group's training settings must change (its own stage and everything downstream)
DOWNSTREAM = {
    "tfidf": ALL,
    "xrlinear": {"xrlinear"} | NEURAL_TREE,  # in a neural record: the tree's overlap source (λ > 1)
    "indexing": NEURAL_TREE,
    "matcher": {"matcher", "matcher_outputs", "ranker", "xrlevel", "xrembed", "xrfinal"},
    "trainer": {"matcher", "matcher_outputs", "ranker", "xrlevel", "xrembed", "xrfinal", "cnn"},
    "cnn": {"cnn", "matcher", "matcher_outputs", "ranker"},  # as a method, or as X-Transformer's matcher
    "ranker": {"ranker"},
    "xrtransformer": {"xrlevel", "xrembed", "xrfinal"},
    "xrtransformer.final": {"xrfinal"},
}
# the linear model's fields a disentangled neural tree is counted with (XRLinearConfig.overlap_source)
OVERLAP_SOURCE = ("xrlinear.nr_splits", "xrlinear.model.")
# values tried, in order, for fields whose next valid value is not found by the generic rules
CANDIDATES: dict[str, list[Any]] = {
    "accelerator": ["auto"],
    "devices": [2],
    "strategy": ["ddp"],
    "precision": ["bf16-mixed"],
    "model_name_or_path": ["tiny:bert"],
    "level_steps": [[7, 9]],
    "level_lr": [[1e-3, 1e-4]],
    "level_warmup_ratio": [[0.2, 0.1]],
    "n_clusters": [8, 4],
    "max_leaf_size": [None, 50],
    "inference_precision": ["16-mixed"],
    "token_pattern": [r"(?u)\b\w+\b"],
    "combine_head": ["average"],
    "truncate_chars": [500],
    "name": ["text_emb"],
    "strip_accents": [None],
    "max_features": [1000],
    "embeddings": ["random"],
    "encoder": ["tiny:bert"],
    "filter_widths": [[3, 5]],
}


def _settings(method: str, *overrides: str) -> RunSettings:
    return compose_settings(f"method={method}", *overrides)


def _keys(name: str, record: Settings, trainer: Settings) -> dict[str, Any]:
    return method_class(name).stage_keys(record, "source", N_LABELS, trainer)


def _alternatives(value: Any, name: str) -> Iterator[Any]:
    yield from CANDIDATES.get(name, [])
    if isinstance(value, bool):
        yield not value
    elif isinstance(value, int):
        yield from (value + 1, value * 2, max(value - 1, 0), 3)
    elif isinstance(value, float):
        yield from (value / 2, value * 2 if value else 0.5, min(value + 0.05, 0.95), 0.5)
    elif value is None:
        yield from (3, 0.5, 100, "average")


def _mutate(section: Settings, name: str) -> Settings:
    value = getattr(section, name)
    tried = []
    for alt in _alternatives(value, name):
        if alt == value and type(alt) is type(value):
            continue
        # n_clusters and max_leaf_size: at most one of the two is set
        other = {"n_clusters": "max_leaf_size", "max_leaf_size": "n_clusters"}.get(name)
        paired = {other: None} if other and alt is not None else {}
        try:
            return dataclasses.replace(section, **{name: alt, **paired})
        except UserError as err:
            tried.append((alt, str(err)))
            choices = re.search(r"expected one of (\[.*\])", str(err))
            if choices:  # a choice field: take another listed option
                for option in ast.literal_eval(choices.group(1)):
                    if option != value:
                        try:
                            return dataclasses.replace(section, **{name: option})
                        except UserError:
                            continue
    if isinstance(value, str):
        try:
            return dataclasses.replace(section, **{name: value + "x"})
        except UserError as err:
            choices = re.search(r"expected one of (\[.*\])", str(err))
            for option in ast.literal_eval(choices.group(1)) if choices else []:
                if option != value:
                    return dataclasses.replace(section, **{name: option})
    raise AssertionError(f"no other valid value found for {name}={value!r}: {tried}")


def _fields(section: Settings, path: str) -> Iterator[tuple[str, Settings, str, str]]:
    """(dotted path, owning record, field name, role) of every leaf field under ``section``."""
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if isinstance(value, Settings):
            yield from _fields(value, f"{path}.{f.name}")
        else:
            yield f"{path}.{f.name}", section, f.name, role(f)


def _replace_path(record: Settings, path: str, new_leaf: Settings) -> Settings:
    """``record`` with the record at ``path`` (minus its last component) replaced by ``new_leaf``."""
    parts = path.split(".")[:-1]

    def rebuild(obj: Any, rest: list[str]) -> Any:
        if not rest:
            return new_leaf
        return dataclasses.replace(obj, **{rest[0]: rebuild(getattr(obj, rest[0]), rest[1:])})

    return rebuild(record, parts)


def _stage_of(path: str) -> str:
    top = path.split(".")[0]
    if top == "xrtransformer" and path.startswith("xrtransformer.final."):
        return "xrtransformer.final"
    return top


def _in_record(name: str, record: Settings, path: str) -> str:
    """TRAIN / PREDICT / RUN as the method's keys see it (records may depend on other fields: the
    disentanglement fields are training settings only at n_copies > 1, the beam of XR-Linear only
    with matcher-aware negatives, the level schedule only for XR-Transformer, the linear model of a
    neural record only as the overlap source of a disentangled tree)."""
    parts = path.split(".")
    if getattr(record, parts[0]).training_settings() and parts[0] not in record.training_settings():
        return RUN  # a group this configuration of the method does not read (X-Transformer's cnn)
    if name != "xrlinear" and parts[0] == "xrlinear":
        counted = record.indexing.n_copies > 1 and path.startswith(OVERLAP_SOURCE)
        if not counted:
            return RUN
        if parts[-1] in ("beam_size", "post_processor"):  # its beam counts the overlap
            return TRAIN
    section: Any = record
    for p in parts[:-1]:
        section = getattr(section, p)
    leaf = parts[-1]
    f = next(f for f in dataclasses.fields(section) if f.name == leaf)
    train = (
        section.training_settings(levels=name == "xrtransformer")
        if parts[0] == "matcher"
        else section.training_settings()
    )
    if leaf in train:
        return TRAIN
    return role(f) if role(f) != TRAIN else RUN  # a training field this configuration does not use


CASES = [
    ("xtransformer", ()),
    ("xtransformer", ("ranker=tfidf_tfn",)),
    ("xrtransformer", ()),
    ("xtransformer", ("indexing.n_copies=2",)),
    ("xtransformer", ("matcher=xmlcnn",)),
    ("xtransformer", ("matcher=kimcnn", "ranker=tfidf_tfn")),
    ("xrlinear", ("xrlinear.model.negatives=tfn+man", "xrlinear.indexing.n_copies=2")),
    ("kimcnn", ()),
    ("xmlcnn", ()),
]


def _check_change(name: str, path: str, which: str, base: dict, keys: dict, reads_matcher: bool) -> None:
    changed = {k for k in base if base[k] != keys[k]}
    stage = "trainer" if path.startswith("trainer.") else _stage_of(path)
    if which == TRAIN:
        must = DOWNSTREAM[stage] & set(base)
        if stage in ("matcher", "trainer", "cnn") and name == "xtransformer" and not reads_matcher:
            must -= {"ranker", "matcher_outputs"} if stage == "trainer" else {"ranker"}
        assert must <= changed, f"{name}: {path} (training setting) left {sorted(must - changed)} unchanged"
    elif which == PREDICT and stage == "matcher":
        assert not changed & {"tfidf", "indexing", "matcher", "xrlevel"}, (path, changed)
        assert changed, f"{path}: the matcher's outputs must depend on it"
    else:
        assert not changed, f"{name}: {path} ({which} setting) changed keys {sorted(changed)}"


@pytest.mark.parametrize("method, overrides", CASES, ids=[f"{m}{'+' if o else ''}{'+'.join(o)}" for m, o in CASES])
def test_every_training_setting_changes_its_keys_and_no_other_setting_does(method, overrides):
    s = _settings(method, *overrides)
    checked = {TRAIN: 0, PREDICT: 0, RUN: 0}
    for name, record in s.methods.items():
        base = _keys(name, record, s.trainer)
        reads = name == "xtransformer" and (record.ranker.features != "tfidf" or "man" in record.ranker.negatives)
        for group in [f.name for f in dataclasses.fields(record)]:
            for path, section, field_name, _ in _fields(getattr(record, group), group):
                which = _in_record(name, record, path)
                try:
                    mutated = _replace_path(record, path, _mutate(section, field_name))
                except UserError:  # pinned by a cross-field rule of the enclosing record
                    continue
                _check_change(name, path, which, base, _keys(name, mutated, s.trainer), reads)
                checked[which] += 1
        for path, section, field_name, _ in _fields(s.trainer, "trainer"):  # placement and precision
            keys = _keys(name, record, _mutate(section, field_name))
            _check_change(name, path, TRAIN if name != "xrlinear" else RUN, base, keys, reads)
    assert checked[TRAIN] >= 20 and checked[RUN] >= 3, checked


def test_data_key_is_content_not_path_or_time(tmp_path):
    """A copied (and touched) data folder keeps its key, so a copied cache is still a cache; an
    edited file gets a new one."""
    import os
    import shutil

    from run_helpers import write_text_dataset

    from xtransformer.data import load_dataset
    from xtransformer.data.inputs import LabeledData

    def key(folder: Path) -> str:
        return LabeledData.from_split(load_dataset(str(folder), cache_dir=tmp_path / "c"), "train").key

    splits = {
        "train": (["a b c", "c d e", "e f g", "g h i"], ["x", "y", "x y", "y"]),
        "dev": (["a b", "g i"], ["x", "y"]),
        "test": (["a c", "e g"], ["x", "y"]),
    }
    first = write_text_dataset(tmp_path / "d1", splits)
    copy = tmp_path / "elsewhere" / "d1"  # the same data set (its name is its folder's) in another place
    shutil.copytree(first, copy)
    for f in copy.iterdir():
        os.utime(f, (1, 1))
    assert key(copy) == key(first)
    (copy / "train_labels.txt").write_text("x\ny\nx\ny\n")
    assert key(copy) != key(first)


def test_old_names_of_the_xrlinear_switches_still_work(caplog):
    s = _settings("xtransformer", "baseline=false", "combine_with_baseline=null")
    assert s.train_xrlinear is False and s.combine_with_xrlinear is None
    assert "now `train_xrlinear`" in caplog.text and "now `combine_with_xrlinear`" in caplog.text
    with pytest.raises(UserError, match=r"^combine_with_baseline='median': expected one of"):
        _settings("xtransformer", "combine_with_baseline=median")
    assert _settings("xtransformer").combine_with_xrlinear == "average"
