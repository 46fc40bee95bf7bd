"""benchmarks/paired.py: per-document differences between systems over their seeds."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from benchmarks.paired import PairedError, main, paired_bootstrap


def test_paired_bootstrap_brackets_the_mean_and_is_exact_for_a_constant_gap() -> None:
    flat = paired_bootstrap(np.full(500, 0.5), resamples=200, seed=0)
    assert flat == {"diff": 0.5, "lo": 0.5, "hi": 0.5, "above_0": 1.0}
    noisy = paired_bootstrap(np.random.default_rng(1).normal(0.0, 1.0, 2000), resamples=1000, seed=0)
    assert noisy["lo"] < noisy["diff"] < noisy["hi"] and 0.0 < noisy["above_0"] < 1.0


def test_paired_compares_every_seed_of_each_system_with_the_reference(tmp_path: Path) -> None:
    from benchmarks.run import main as run

    work = tmp_path / "work"
    synthetic = ["--synthetic", "300x40", "--n-test", "60", "--n-features", "2000", "--work", str(work)]
    bench = run([*synthetic, "--systems", "popular,ours-xrlinear", "--repeats", "2", "--out", str(tmp_path)])
    p1 = {(r["system"], r["repeat"]): r["metrics"]["default"]["P@1"] for r in bench["runs"]}
    problem = "synthetic-n300-l40-f2000-seed0"
    argv = ["--problem", problem, "--work", str(work), "--out", str(tmp_path), "--resamples", "500"]
    result = main([*argv, "popular", "ours-xrlinear"])
    ours = result["systems"]["ours-xrlinear"]
    assert ours["seeds"] == [0, 1] and ours["per_seed"][1]["P@1"] == pytest.approx(p1[("ours-xrlinear", 1)])
    gap = np.mean([p1[("ours-xrlinear", s)] - p1[("popular", s)] for s in (0, 1)])
    d = result["diffs"]["ours-xrlinear"]["P@1"]
    assert d["diff"] == pytest.approx(gap) and d["lo"] <= d["diff"] <= d["hi"]
    assert "| − popular |" in (tmp_path / f"{problem}-paired.md").read_text()
    assert main([*argv, "ours-xrlinear", "popular:default"])["against"] == "ours-xrlinear"
    with pytest.raises(PairedError, match="no predictions preds.combined.npz"):
        main([*argv, "popular", "ours-xrlinear:combined"])
    # every seed read was kept as a record: with the work folder gone, the comparison stands as it was
    records = tmp_path / "per-document" / problem
    assert sorted(p.name for p in (records / "ours-xrlinear").iterdir()) == ["r0.npz", "r1.npz"]
    shutil.rmtree(work)
    again = main([*argv, "popular", "ours-xrlinear"])
    assert again["diffs"] == result["diffs"] and again["systems"] == result["systems"]
    with np.load(records / "popular" / "r0.npz") as z:
        fields = dict(z)
    # a seed 7 of other documents (other counts of true labels) than seeds 0 and 1
    np.savez_compressed(records / "popular" / "r7.npz", **{**fields, "n_true": fields["n_true"][::-1] + 1})
    with pytest.raises(PairedError, match="popular seed 7: scored other documents"):
        main([*argv, "popular", "ours-xrlinear"])
    (records / "popular" / "r7.npz").unlink()
    with pytest.raises(PairedError, match="no records under"):
        main([*argv, "popular", "ours-xrlinear:combined"])
    with pytest.raises(PairedError, match="at least two systems"):
        main([*argv, "popular"])
    with pytest.raises(PairedError, match="no prepared problem .* and no records"):
        main(["--problem", "nothing", "--work", str(work), "--out", str(tmp_path), "popular", "ours-xrlinear"])
