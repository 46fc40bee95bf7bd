"""The notebook-style example trains, saves, loads and predicts from Python (tiny encoder, a slice of Reuters)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_from_python.py"


@pytest.mark.slow
def test_train_from_python_example_runs_end_to_end(tmp_path):
    spec = importlib.util.spec_from_file_location("train_from_python", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    scores = example.main(["--encoder", "tiny:bert", "--max-docs", "400", "--steps", "4", "8", "--out", str(tmp_path)])
    assert set(scores) == {"xrlinear", "xrtransformer", "xrtransformer+xrlinear"}
    assert all(40 < p1 <= 100 for p1 in scores.values()), scores  # popularity on this slice: about 30
    members = json.loads((tmp_path / "xrtransformer+xrlinear" / "manifest.json").read_text())["components"]["members"]
    assert members == ["../xrtransformer", "../xrlinear"]  # the combination refers to its siblings
    for name in scores:
        assert (tmp_path / name / "manifest.json").is_file()
