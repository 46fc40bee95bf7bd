"""The benchmark tests' shared setup: every test offline, with its TF-IDF cache out of the
repository (``benchmarks`` imports from the repository root: pyproject.toml's ``pythonpath``)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _quiet_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("XMC_CACHE_DIR", str(tmp_path / "cache"))
