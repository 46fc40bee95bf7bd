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


@pytest.mark.parametrize("command, words", [("predict", "--labels"), ("serve", "--max-texts"),
                                            ("ensemble", "--method"), ("train", "Configuration groups")])
def test_every_command_has_a_real_help(command, words):
    res = _run("-m", "xtransformer", command, "--help")
    assert res.returncode == 0, res.stderr
    assert words in res.stdout


def test_configs_found_from_the_package_or_checkout():
    assert (Path(config_dir()) / "train.yaml").is_file()
