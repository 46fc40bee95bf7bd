"""Finishing a Table 5 sweep: the ensembles of rows 7-9 from their member runs, then the table,
by hand or through the Hydra callback that sweeps/table5.yaml installs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from hydra.utils import instantiate
from omegaconf import OmegaConf
from run_helpers import write_run

from xtransformer.ensemble import ensemble_predictions
from xtransformer.metrics import evaluate
from xtransformer.suite.table5 import FinishTable5, build_ensembles
from xtransformer.utils.io import load_csr, save_csr

ROOT = Path(__file__).resolve().parents[2]
N, L = 12, 6
TRUTH = sp.csr_matrix(np.eye(N, L, dtype=np.float32) + np.eye(N, L, k=1, dtype=np.float32))

# sweeps/table5.yaml's members: rows 0-6 and the extra runs x1-x4 (indexing, matcher, ranker)
GRID = {
    "0": ("pifa_tfidf", "bert", "tfidf", "tfn"),
    "1": ("pifa_tfidf", "bert", "tfidf+neural", "tfn"),
    "2": ("pifa_tfidf", "bert", "tfidf+neural", "tfn+man"),
    "3": ("pifa_tfidf", "roberta", "tfidf+neural", "tfn+man"),
    "4": ("pifa_tfidf", "xlnet", "tfidf+neural", "tfn+man"),
    "5": ("pifa_neural", "xlnet", "tfidf+neural", "tfn+man"),
    "6": ("text_emb", "xlnet", "tfidf+neural", "tfn+man"),
    "x1": ("pifa_neural", "bert", "tfidf+neural", "tfn+man"),
    "x2": ("pifa_neural", "roberta", "tfidf+neural", "tfn+man"),
    "x3": ("text_emb", "bert", "tfidf+neural", "tfn+man"),
    "x4": ("text_emb", "roberta", "tfidf+neural", "tfn+man"),
}


def fake_sweep(root: Path, seeds=(0, 1)) -> dict[tuple[str, int], Path]:
    """Finished run folders with random score matrices, as the pipeline writes them."""
    rng = np.random.default_rng(0)
    runs = {}
    for seed in seeds:
        for num, (row, (indexing, matcher, features, negatives)) in enumerate(GRID.items()):
            folder = write_run(
                root / f"{seed}_{num}",
                seed=seed,
                p1=50.0,
                indexing=indexing,
                matcher=f"tiny_{matcher}",
                features=features,
                negatives=negatives,
                dataset="reuters21578",
            )
            doc = json.loads((folder / "metrics.json").read_text())
            doc["config"]["table5_id"] = row
            (folder / "metrics.json").write_text(json.dumps(doc))
            scores = sp.random(N, L, density=0.5, random_state=rng, format="csr", dtype=np.float32)
            save_csr(scores, folder / "predictions" / "test.npz")
            save_csr(TRUTH, folder / "truth" / "test.npz")
            (folder / "label_vocab.txt").write_text("\n".join(f"l{i}" for i in range(L)) + "\n")
            runs[row, seed] = folder
    return runs


def test_ensembles_of_rows_7_to_9_average_their_members(tmp_path: Path) -> None:
    runs = fake_sweep(tmp_path)
    made = build_ensembles(tmp_path)
    assert sorted(p.name for p in made) == [f"row{r}_seed{s}" for r in (7, 8, 9) for s in (0, 1)]
    members = {7: ["4", "5", "6"], 8: ["x1", "x2", "5"], 9: ["2", "3", "4", "5", "6", "x1", "x2", "x3", "x4"]}
    for row, ids in members.items():
        doc = json.loads((tmp_path / "ensembles" / f"row{row}_seed1" / "metrics.json").read_text())
        assert doc["table5_id"] == row and sorted(doc["members"]) == sorted(str(runs[i, 1]) for i in ids)
        want = ensemble_predictions([load_csr(runs[i, 1] / "predictions" / "test.npz") for i in ids])
        got = load_csr(tmp_path / "ensembles" / f"row{row}_seed1" / "predictions" / "test.npz")
        assert got.shape == want.shape and abs(got - want).max() < 1e-6  # the members' average, entry for entry
        expected = evaluate(TRUTH, want)
        assert {k: doc["metrics"][k] for k in expected} == pytest.approx(expected)
        # and not any single member's result: the ensemble really combined them
        assert all(abs(load_csr(runs[i, 1] / "predictions" / "test.npz") - got).max() > 1e-3 for i in ids)


def test_table5_sweep_finishes_itself_through_its_callback(tmp_path: Path) -> None:
    fake_sweep(tmp_path, seeds=(0,))
    sweep_cfg = OmegaConf.load(ROOT / "sweeps" / "table5.yaml")
    callback = instantiate(sweep_cfg.hydra.callbacks.table5)
    assert isinstance(callback, FinishTable5)
    callback.on_multirun_end(config=OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}}))
    table = (tmp_path / "results.md").read_text().splitlines()
    ids = [line.split(" | ")[1] for line in table[2:]]
    assert ids == [str(i) for i in range(14)]  # Table 5 rows 0-9, then the 4 extra members x1-x4
    assert [line.split(" | ")[6] for line in table[9:12]] == ["ensemble"] * 3
    assert (tmp_path / "results.csv").is_file() and (tmp_path / "results_p_at_k.png").is_file()
