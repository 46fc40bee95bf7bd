"""The command line: one dispatcher, real --help for every command, configs found by package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from xtransformer.cli import config_dir


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
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import xtransformer  # noqa: F401  (resolvers)

    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose(config_name="train")
    settings = [k for k, v in cfg.items() if not OmegaConf.is_config(v)]
    res = _run(str(Path(__file__).resolve().parents[2] / "train.py"), "seed=7", "--help")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    for group in ("data", "indexing", "matcher", "method", "ranker", "trainer", "logger", "calibration"):
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
