"""Property test of the stage keys (``pipeline/keys.py``) against the settings records.

For every field of every config group the run reads, change it to another valid value and
recompute all stage keys from the settings alone:
- a training setting of a stage changes that stage's key and every key downstream of it;
- a run setting (names, threads, progress, paths) and a prediction setting of a final model
  (beam, top-k, post-processor, head combination) change no key at all;
- a prediction setting of the matcher (top-b, embedding dtype, ...) changes no key of the matcher's
  weights, only its outputs and the stages trained on them (matcher-aware negatives, neural features).
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path
from typing import Any, Iterator

import pytest
from hydra import compose, initialize_config_dir

from xtransformer.errors import UserError
from xtransformer.pipeline.keys import stage_keys
from xtransformer.pipeline.settings import RunSettings, run_settings
from xtransformer.pipeline.stages import xr_plan
from xtransformer.settings import PREDICT, RUN, TRAIN, Settings, role

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
N_LABELS = 90  # Reuters: the level plan of XR-Transformer needs the label count only

# keys each stage's training settings must change (its own and everything downstream)
DOWNSTREAM = {
    "tfidf": {"tfidf", "xrlinear", "indexing", "matcher", "matcher_outputs", "ranker", "xr_levels", "xr_outputs",
              "xrfinal"},
    "xrlinear": {"xrlinear"},
    "indexing": {"indexing", "matcher", "matcher_outputs", "ranker", "xr_levels", "xr_outputs", "xrfinal"},
    "matcher": {"matcher", "matcher_outputs", "ranker", "xr_levels", "xr_outputs", "xrfinal"},
    "trainer": {"matcher", "matcher_outputs", "ranker", "xr_levels", "xr_outputs", "xrfinal"},
    "ranker": {"ranker"},
    "xrtransformer": {"xr_levels", "xr_outputs", "xrfinal"},
    "xrtransformer.final": {"xrfinal"},
}
# values tried, in order, for fields whose next valid value is not found by the generic rules
CANDIDATES: dict[str, list[Any]] = {
    "accelerator": ["auto"], "devices": [2], "strategy": ["ddp"], "precision": ["bf16-mixed"],
    "model_name_or_path": ["tiny:bert"], "level_steps": [[7, 9]], "level_lr": [[1e-3, 1e-4]], "level_warmup_ratio": [[0.2, 0.1]],
    "n_clusters": [8, 4], "max_leaf_size": [None, 50], "inference_precision": ["16-mixed"],
    "token_pattern": [r"(?u)\b\w+\b"], "combine_head": ["average"], "truncate_chars": [500],
    "name": ["text_emb"], "strip_accents": [None], "max_features": [1000],
}


def _settings(method: str, *overrides: str) -> RunSettings:
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[f"method={method}", "paths.output_dir=/tmp/x", *overrides])
    return run_settings(cfg)


def _keys(s: RunSettings) -> dict[str, Any]:
    levels = xr_plan(N_LABELS, s.indexing, s.xrtransformer, s.matcher) if s.method == "xrtransformer" else None
    return stage_keys(s, "source", ["train", "test"], levels).as_dict()


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


def _replace_path(s: RunSettings, path: str, new_leaf: Settings) -> RunSettings:
    """``s`` with the record at ``path`` (minus its last component) replaced by ``new_leaf``."""
    parts = path.split(".")[:-1]

    def rebuild(obj: Any, rest: list[str]) -> Any:
        if not rest:
            return new_leaf
        return dataclasses.replace(obj, **{rest[0]: rebuild(getattr(obj, rest[0]), rest[1:])})

    return rebuild(s, parts)


def _stage_of(path: str) -> str:
    top = path.split(".")[0]
    if top == "xrtransformer" and path.startswith("xrtransformer.final."):
        return "xrtransformer.final"
    return top


def _in_record(s: RunSettings, path: str) -> str:
    """TRAIN / PREDICT / RUN as the stage's key sees it (records may depend on other fields: the
    disentanglement fields are training settings only at n_copies > 1, the beam of XR-Linear only
    with matcher-aware negatives, the level schedule only for XR-Transformer)."""
    parts = path.split(".")
    record: Any = s
    for p in parts[:-1]:
        record = getattr(record, p)
    name = parts[-1]
    f = next(f for f in dataclasses.fields(record) if f.name == name)
    train = (record.training_settings(levels=s.method == "xrtransformer") if parts[0] == "matcher"
             else record.training_settings())
    if name in train:
        return TRAIN
    return role(f) if role(f) != TRAIN else RUN  # a training field this configuration does not use


CASES = [("xtransformer", ()), ("xtransformer", ("ranker=tfidf_tfn",)), ("xrtransformer", ()),
         ("xrlinear", ("xrlinear.model.negatives=tfn+man", "xrlinear.indexing.n_copies=2"))]


@pytest.mark.parametrize("method, overrides", CASES, ids=[f"{m}{'+' if o else ''}{'+'.join(o)}" for m, o in CASES])
def test_every_training_setting_changes_its_keys_and_no_other_setting_does(method, overrides):
    s = _settings(method, *overrides)
    base = _keys(s)
    sections = ["tfidf", "xrlinear", "trainer"] + [n for n in ("indexing", "matcher", "ranker", "xrtransformer")
                                                    if getattr(s, n) is not None]
    checked = {TRAIN: 0, PREDICT: 0, RUN: 0}
    for name in sections:
        for path, record, field_name, _ in _fields(getattr(s, name), name):
            which = _in_record(s, path)
            new_record = _mutate(record, field_name)
            try:
                mutated = _replace_path(s, path, new_record)
            except UserError:  # pinned by a cross-field rule of the enclosing record
                continue
            keys = _keys(mutated)
            changed = {k for k in base if base[k] != keys[k]}
            stage = _stage_of(path)
            if which == TRAIN:
                must = {k for k in DOWNSTREAM[stage] if base[k] not in (None, ())}
                if stage in ("matcher", "trainer") and method == "xtransformer" and not _ranker_reads_matcher(s):
                    must -= {"ranker"}
                assert must <= changed, f"{path} (training setting) left {sorted(must - changed)} unchanged"
                assert "xrlinear" not in changed or stage in ("tfidf", "xrlinear"), f"{path} changed xrlinear"
            elif which == PREDICT and stage == "matcher":
                assert not changed & {"tfidf", "xrlinear", "indexing", "matcher", "xr_levels"}, (path, changed)
                assert changed, f"{path}: the matcher's outputs must depend on it"
            else:
                assert not changed, f"{path} ({which} setting) changed keys {sorted(changed)}"
            checked[which] += 1
    assert checked[TRAIN] >= 20 and checked[RUN] >= 3, checked


def _ranker_reads_matcher(s: RunSettings) -> bool:
    return s.ranker.features != "tfidf" or "man" in s.ranker.negatives


def test_data_key_is_content_not_path_or_time(tmp_path):
    """A copied (and touched) data folder keeps its key, so a copied cache is still a cache; an
    edited file gets a new one."""
    import os
    import shutil

    from test_data import write_text_dataset
    from xtransformer.data import load_dataset

    splits = {"train": (["a b c", "c d e", "e f g", "g h i"], ["x", "y", "x y", "y"]),
              "dev": (["a b", "g i"], ["x", "y"]), "test": (["a c", "e g"], ["x", "y"])}
    first = write_text_dataset(tmp_path / "d1", splits)
    key = load_dataset(str(first), cache_dir=tmp_path / "c").source_key
    copy = tmp_path / "elsewhere" / "d1"  # the same data set (its name is its folder's) in another place
    shutil.copytree(first, copy)
    for f in copy.iterdir():
        os.utime(f, (1, 1))
    assert load_dataset(str(copy), cache_dir=tmp_path / "c").source_key == key
    (copy / "train_labels.txt").write_text("x\ny\nx\ny\n")
    assert load_dataset(str(copy), cache_dir=tmp_path / "c").source_key != key


def test_old_names_of_the_xrlinear_switches_still_work(caplog):
    s = _settings("xtransformer", "baseline=false", "combine_with_baseline=null")
    assert s.train_xrlinear is False and s.combine_with_xrlinear is None
    assert "now `train_xrlinear`" in caplog.text and "now `combine_with_xrlinear`" in caplog.text
    with pytest.raises(UserError, match=r"^combine_with_baseline='median': expected one of"):
        _settings("xtransformer", "combine_with_baseline=median")
    assert _settings("xtransformer").combine_with_xrlinear == "average"
