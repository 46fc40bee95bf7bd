"""The command line: one dispatcher, real --help for every command, configs found by package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from xtransformer.configuration import GROUPS, compose, config_dir


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("entry", [["-m", "xtransformer"], ["-m", "xtransformer.cli"]])
def test_dispatcher_lists_commands(entry):
    res = _run(*entry, "--help")
    assert res.returncode == 0 and all(c in res.stdout for c in ("train", "predict", "serve", "ensemble"))
    res = _run(*entry)  # no command: usage on stderr, non-zero
    assert res.returncode == 2 and "usage" in res.stderr


@pytest.mark.parametrize(
    "command, words",
    [("predict", "--labels"), ("serve", "--max-texts"), ("ensemble", "--method"), ("train", "Configuration groups")],
)
def test_every_command_has_a_real_help(command, words):
    res = _run("-m", "xtransformer", command, "--help")
    assert res.returncode == 0, res.stderr
    assert words in res.stdout


def test_configs_found_from_the_package_or_checkout():
    assert (Path(config_dir()) / "train.yaml").is_file()


def test_train_help_lists_groups_and_every_top_level_setting():
    """``--help`` (configs/hydra/help/xmc.yaml) has one line per top-level setting: a setting added
    to train.yaml without a help line fails here."""
    from omegaconf import OmegaConf

    settings = [k for k, v in compose().items() if not OmegaConf.is_config(v)]
    res = _run(str(Path(__file__).resolve().parents[2] / "train.py"), "seed=7", "--help")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    for group in [*(g for g in GROUPS if g != "hydra"), "method", "experiment"]:
        assert any(line.startswith(f"{group}: ") for line in lines), group
    assert "matcher: " in res.stdout and "tiny_bert" in res.stdout
    for key in settings:
        assert sum(line.split(" ")[0] == key for line in lines) == 1, f"no help line for top-level setting {key!r}"
    assert any(line.startswith("seed ") and line.endswith("[7]") for line in lines)


@pytest.mark.parametrize(
    "raw",
    [b"\xef\xbb\xbfoil up\ngrain down\n", b"oil up\r\ngrain down\r\n", b"oil up\rgrain down\r", b"oil up\ngrain down"],
)
def test_predict_input_line_ends_and_bom(tmp_path, raw):
    """xmc-predict reads its texts as training reads them: any line end, no BOM."""
    from xtransformer.cli import read_lines

    path = tmp_path / "texts.txt"
    path.write_bytes(raw)
    assert list(read_lines(path)) == [(1, "oil up"), (2, "grain down")]


@pytest.mark.parametrize(
    "args, message",
    [
        (["ranker.no_such_key=1"], "ranker.no_such_key: no such setting (`python train.py --help` lists them)"),
        (["xrtransformer.final.indexing.nope=1"], "xrtransformer.final.indexing.nope: no such setting"),
        (["indexing.n_clusters.x=1"], "indexing.n_clusters.x: no such setting"),
        (["cnn=nope"], "cnn=nope: no such option of config group 'cnn'; available: kimcnn, xmlcnn"),
        (["+seed=3"], "Could not append to config. An item is already at 'seed'. Either remove + prefix: 'seed=3'"),
        (["ranker.negatives"], "Error parsing override 'ranker.negatives' missing EQUAL at '<EOF>' See https://"),
        (["table5=c0"], "Could not override 'table5'. No match in the defaults list."),
        (["seed=0,1"], "Ambiguous value for argument 'seed=0,1' 1. To use it as a list"),
        (["experiment=null"], "Config group override must be a string or a list. Got NoneType"),
    ],
)
def test_composition_errors_are_one_line_naming_the_key_or_option(args, message):
    from xtransformer.configuration import composition_error

    assert composition_error(args).startswith(message)


@pytest.mark.parametrize(
    "args",
    [
        ["data=custom", "matcher=kimcnn", "cnn.lr=1", "+table5=c0"],  # group choices, then their keys
        ["+ranker.extra=1", "ranker.extra=2"],  # a key added earlier on the line is there for the next
        ["hydra/launcher=joblib", "hydra.run.dir=/tmp/x"],  # Hydra's own settings: left to Hydra
        ["~indexing.n_clusters", "seed=abc"],  # types and values: the records' checks, later
        ["-m", "no_such_key=1"],  # multirun: left to Hydra
    ],
)
def test_overrides_that_compose_pass(args):
    from xtransformer.configuration import composition_error

    assert composition_error(args) is None
