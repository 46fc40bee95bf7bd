"""The benchmark tests' shared setup: ``benchmarks`` importable (it lives beside ``src``, not in
the package) and every test offline, with its TF-IDF cache out of the repository."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


@pytest.fixture(autouse=True)
def _quiet_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("XMC_CACHE_DIR", str(tmp_path / "cache"))
