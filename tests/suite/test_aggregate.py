"""Tests for xtransformer.suite.aggregate on hand-written sweep folders (no Lightning/Hydra)."""

from __future__ import annotations

import csv
import io
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from run_helpers import write_ensemble, write_run

from xtransformer.suite.aggregate import aggregate, main, mean_std
from xtransformer.suite.paper_rows import table5_row
from xtransformer.suite.report import to_csv, to_markdown, write_report
from xtransformer.suite.runs import AggregateError, AggregateWarning, collect_runs, scan_runs

METRIC_NAMES = [f"{m}@{k}" for m in ("P", "R", "nDCG", "PSP") for k in range(1, 6)]


# --------------------------------------------------------------------------- fake runs


@pytest.fixture()
def sweep(tmp_path: Path) -> Path:
    """2 configs (Table 5 rows 0 and 2) x 3 / 2 seeds, one unfinished job, one broken file, one ensemble."""
    root = tmp_path / "multirun"
    root.mkdir()
    (root / "multirun.yaml").write_text("hydra: {}\n")
    jobs = [
        {"seed": 0, "p1": 80.0, "features": "tfidf", "negatives": "tfn"},
        {"seed": 1, "p1": 82.0, "features": "tfidf", "negatives": "tfn"},
        {"seed": 2, "p1": 84.0, "features": "tfidf", "negatives": "tfn"},
        {"seed": 0, "p1": 70.0, "matcher": "tiny_bert"},
        {"seed": 1, "p1": 71.0, "matcher": "tiny_bert"},
    ]
    for num, job in enumerate(jobs):
        write_run(root / str(num), **job)
    (root / "5").mkdir()  # started, never finished: no metrics.json
    write_run(root / "6", seed=2, p1=99.0, matcher="tiny_bert")
    (root / "6" / "metrics.json").write_text('{"method": "xtransformer", "metrics": {"P@1": ')  # killed mid-write
    write_ensemble(root / "ensembles" / "seed0", [root / "0", root / "3"], p1=90.0, relative=True)
    return root


# --------------------------------------------------------------------------- collecting


def test_collect_runs_rows_and_skips(sweep: Path) -> None:
    with pytest.warns(AggregateWarning, match=r"skipped 2 incomplete run\(s\)"):
        rows = collect_runs([sweep])
    assert len(rows) == 6
    runs = [r for r in rows if r["method"] == "xtransformer"]
    assert sorted((r["matcher"], r["seed"]) for r in runs) == [
        ("bert", 0),
        ("bert", 1),
        ("bert", 2),
        ("tiny_bert", 0),
        ("tiny_bert", 1),
    ]
    first = next(r for r in runs if r["run_dir"] == str((sweep / "0").resolve()))
    assert first["dataset"] == "eurlex57k" and first["eval_split"] == "test"
    assert (first["indexing"], first["ranker_features"], first["negatives"]) == ("pifa_tfidf", "tfidf", "tfn")
    assert first["metrics"]["P@1"] == 80.0 and first["metrics"]["n_docs"] == 300.0
    # seed, paths, dirs, logger, time stamps and leaves that follow from the descriptor
    # (ranker.name, matcher.model_name_or_path) are not configuration keys
    assert set(first) == {
        "dataset",
        "method",
        "eval_split",
        "indexing",
        "matcher",
        "ranker_features",
        "negatives",
        "ensemble_method",
        "seed",
        "run_dir",
        "metrics",
    }
    scan = scan_runs([sweep])
    assert sorted(p.name for p, _ in scan.skipped) == ["5", "6"]
    assert any("unreadable" in why for _, why in scan.skipped)


def test_ensemble_descriptor_from_members(sweep: Path) -> None:
    rows = scan_runs([sweep]).rows
    (ens,) = [r for r in rows if r["method"] == "ensemble"]
    assert ens["matcher"] == "bert,tiny_bert"  # members' distinct values
    assert ens["indexing"] == "pifa_tfidf"
    assert ens["ranker_features"] == "tfidf,tfidf+neural"
    assert ens["dataset"] == "eurlex57k" and ens["ensemble_method"] == "rank_average"
    assert ens["seed"] == 0  # both members ran with seed 0


def test_varying_config_leaves_become_columns(tmp_path: Path) -> None:
    for num, (lr, seed) in enumerate([(1e-5, 0), (1e-5, 1), (4e-5, 0), (4e-5, 1)]):
        write_run(tmp_path / "lr" / str(num), seed=seed, p1=80.0 + num, lr=lr)
    rows = collect_runs([tmp_path / "lr"])
    assert {r["matcher.learning_rate"] for r in rows} == {1e-5, 4e-5}
    assert "ranker.name" not in rows[0] and "stamp" not in rows[0] and "data.data_dir" not in rows[0]
    agg = aggregate(rows)
    assert [(r["matcher.learning_rate"], r["n_seeds"]) for r in agg] == [(1e-5, 2), (4e-5, 2)]
    assert "matcher.learning_rate" in to_markdown(agg).splitlines()[0]
    # a user-ignored leaf merges the groups
    ignore = ("seed", "*.seed", "paths.*", "*_dir", "logger.*", "stamp", "matcher.learning_rate")
    with pytest.warns(AggregateWarning, match=r"seed\(s\) \[0, 1\]"):
        merged = aggregate(collect_runs([tmp_path / "lr"], ignore=ignore))
    assert [r["n_seeds"] for r in merged] == [4]


# --------------------------------------------------------------------------- aggregation


def test_mean_std_on_known_numbers(sweep: Path) -> None:
    agg = aggregate(scan_runs([sweep]).rows)
    assert [r["config_id"] for r in agg] == [0, 2, 10]  # rows 0 and 2 of Table 5, then the ensemble
    row0, row2, ens = agg
    assert row0["n_seeds"] == 3 and row0["seeds"] == [0, 1, 2]
    assert row0["mean"]["P@1"] == pytest.approx(82.0)
    assert row0["std"]["P@1"] == pytest.approx(2.0)  # sample std of 80, 82, 84
    assert row0["mean"]["R@3"] == pytest.approx(82.0 - 2 - 50)
    assert row2["mean"]["P@5"] == pytest.approx(70.5 - 4)
    assert row2["std"]["P@1"] == pytest.approx(math.sqrt(0.5))  # 70, 71
    assert ens["n_seeds"] == 1 and ens["std"]["P@1"] is None and ens["paper_row"] is None
    assert set(row0["mean"]) == {"P@1", "P@3", "P@5", "R@1", "R@3", "R@5"}


def test_mean_std_helper() -> None:
    assert mean_std([1.0]) == (1.0, None)
    assert mean_std([None, float("nan")]) == (None, None)
    mean, std = mean_std([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5 and std == pytest.approx(1.2909944487)


def test_group_by_and_bad_arguments(sweep: Path) -> None:
    rows = scan_runs([sweep]).rows
    by_method = aggregate(rows, metrics=("P@1",), group_by=["method"])
    assert sorted((r["method"], r["n_seeds"]) for r in by_method) == [("ensemble", 1), ("xtransformer", 5)]
    assert "| P@1 | seeds |" in to_markdown(by_method).splitlines()[0]  # renders what was aggregated
    with pytest.raises(AggregateError, match="not aggregated"):
        to_csv(by_method, ["P@3"])
    with pytest.raises(AggregateError, match="P@7"):
        aggregate(rows, metrics=("P@7",))
    with pytest.raises(AggregateError, match="group_by"):
        aggregate(rows, group_by=["nonsense"])
    with pytest.raises(AggregateError, match="rows is empty"):
        aggregate([])


def test_repeated_seed_warns(tmp_path: Path) -> None:
    write_run(tmp_path / "a" / "0", seed=0, p1=80.0)
    write_run(tmp_path / "b" / "0", seed=0, p1=82.0)
    with pytest.warns(AggregateWarning, match="seed"):
        (row,) = aggregate(collect_runs([tmp_path / "a", tmp_path / "b"]))
    assert row["n_seeds"] == 2 and row["mean"]["P@1"] == 81.0


# --------------------------------------------------------------------------- Table 5 numbering


def table5_grid(root: Path, seeds: tuple[int, ...] = (0, 1)) -> list[Path]:
    """All of Table 5 with our model-name variants, jobs in shuffled order; returns the folders to scan."""
    singles = {  # paper row -> run settings
        4: {"matcher": "xlnet_base_cased"},
        0: {"matcher": "tiny_bert", "features": "tfidf", "negatives": "tfn"},
        6: {"indexing": "text_emb", "matcher": "tiny_xlnet"},
        2: {"matcher": "bert_base"},
        5: {"indexing": "pifa-neural", "matcher": "xlnet"},
        1: {"matcher": "bert", "features": "tfidf_neural", "negatives": "tfn"},
        3: {"matcher": "roberta_large"},
    }
    job = 0
    for seed in seeds:
        runs: dict[Any, Path] = {}
        for paper_id, settings in singles.items():
            runs[paper_id] = write_run(root / "sweep" / str(job), seed=seed, p1=60.0 + paper_id + seed, **settings)
            job += 1
        for fam in ("bert", "roberta"):  # members of row 8, not collected themselves
            runs[fam] = write_run(
                root / "members" / f"{fam}-{seed}", seed=seed, p1=61.0, indexing="pifa_neural", matcher=fam
            )
        ensembles = {9: [2, 3, 4, 5, 6], 7: [4, 5, 6], 8: ["bert", "roberta", 5]}
        for paper_id, members in ensembles.items():
            write_ensemble(root / "ens" / f"{paper_id}-{seed}", [runs[m] for m in members], p1=70.0 + paper_id)
    return [root / "sweep", root / "ens"]


def test_table5_grid_gets_paper_ids(tmp_path: Path) -> None:
    agg = aggregate(scan_runs(table5_grid(tmp_path)).rows)
    assert [r["config_id"] for r in agg] == list(range(10))
    assert [r["paper_row"] for r in agg] == list(range(10))
    assert all(r["n_seeds"] == 2 for r in agg)
    assert agg[0]["matcher"] == "tiny_bert" and agg[5]["indexing"] == "pifa-neural"
    assert agg[7]["matcher"] == "tiny_xlnet,xlnet,xlnet_base_cased"
    assert agg[8]["indexing"] == "pifa-neural,pifa_neural" and agg[8]["matcher"] == "bert,roberta,xlnet"
    assert agg[4]["mean"]["P@1"] == pytest.approx(64.5) and agg[4]["std"]["P@1"] == pytest.approx(math.sqrt(0.5))
    lines = to_markdown(agg).splitlines()
    assert lines[0].startswith("| Dataset | Config. ID | indexing | matching | ranker input | negative-sampling |")
    assert "| P@1 | P@3 | P@5 | R@1 | R@3 | R@5 | seeds |" in lines[0]
    assert lines[2].split(" | ")[1:6] == ["0", "pifa_tfidf", "tiny_bert", "tfidf", "TFN"]
    assert "60.50 ± 0.71" in lines[2]


def test_table5_row_matching_is_tolerant() -> None:
    base = {
        "method": "xtransformer",
        "indexing": "pifa_tfidf",
        "ranker_features": "tfidf+neural",
        "negatives": "tfn+man",
    }
    assert table5_row({**base, "matcher": "BERT-base-cased"}) == 2
    assert table5_row({**base, "matcher": "minilm"}) == 2
    assert table5_row({**base, "matcher": "tiny_roberta"}) == 3
    assert table5_row({**base, "matcher": "xlnet", "negatives": "TFN + MAN"}) == 4
    assert table5_row({**base, "matcher": "mpnet"}) is None
    assert table5_row({**base, "matcher": "bert", "method": "xrlinear"}) is None
    assert (
        table5_row({**base, "matcher": "bert,roberta,xlnet", "indexing": "pifa_tfidf,text_emb", "method": "ensemble"})
        == 9
    )
    assert table5_row({**base, "matcher": None}) is None


def test_colliding_configs_are_numbered_sequentially(tmp_path: Path) -> None:
    # minilm and tiny_bert both look like BERT for row 2: no paper ids, Table 5 order kept
    write_run(tmp_path / "0", seed=0, p1=80.0, matcher="tiny_bert")
    write_run(tmp_path / "1", seed=0, p1=81.0, matcher="minilm")
    write_run(tmp_path / "2", seed=0, p1=82.0, matcher="tiny_bert", features="tfidf", negatives="tfn")
    write_run(tmp_path / "3", seed=0, p1=83.0, matcher="mpnet", dataset="aaa")
    agg = aggregate(collect_runs([tmp_path]))
    assert [(r["dataset"], r["config_id"], r["paper_row"]) for r in agg] == [
        ("aaa", 0, None),
        ("eurlex57k", 0, 0),
        ("eurlex57k", 1, 2),
        ("eurlex57k", 2, 2),
    ]
    assert [r["matcher"] for r in agg[2:]] == ["minilm", "tiny_bert"]


# --------------------------------------------------------------------------- rendering and CLI


def test_write_report_files(sweep: Path, tmp_path: Path) -> None:
    agg = aggregate(scan_runs([sweep]).rows)
    out = tmp_path / "report"
    paths = write_report(agg, out)
    assert {p.name for p in out.iterdir()} == {"results.md", "results.csv", "results_p_at_k.png"}
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and paths["png"].stat().st_size > 5000
    md = paths["md"].read_text()
    assert "82.00 ± 2.00" in md and "90.00 |" in md  # single-seed ensemble: no ± part
    assert "method" in md.splitlines()[0]  # xtransformer and ensemble rows differ in method
    table = list(csv.DictReader(io.StringIO(paths["csv"].read_text())))
    assert [r["config_id"] for r in table] == ["0", "2", "10"]
    assert float(table[0]["P@1_mean"]) == pytest.approx(82.0) and float(table[0]["P@1_std"]) == pytest.approx(2.0)
    assert table[2]["P@1_std"] == "" and table[0]["seeds"] == "0 1 2"
    assert table[2]["matcher"] == "bert,tiny_bert"  # comma-joined value survives CSV quoting
    assert to_csv(agg) == paths["csv"].read_text()


def test_cli_writes_report_into_first_sweep_dir(sweep: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(sweep), "--metrics", "P@1,nDCG@5"]) == 0
    captured = capsys.readouterr()
    assert "| P@1 | nDCG@5 | seeds |" in captured.out.splitlines()[0]
    assert "82.00 ± 2.00" in captured.out
    assert "skipped incomplete run" in captured.err
    for name in ("results.md", "results.csv", "results_p_at_k.png"):
        assert (sweep / name).is_file()
    assert "nDCG@5_mean" in (sweep / "results.csv").read_text().splitlines()[0]
    # running again over the same folder ignores the report it wrote
    assert main([str(sweep), "--out", str(sweep / "again")]) == 0


def test_cli_errors(tmp_path: Path, sweep: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty"
    (empty / "0" / ".hydra").mkdir(parents=True)
    assert main([str(empty)]) == 2
    err = capsys.readouterr().err
    assert "no run found under" in err and "1 incomplete run(s) skipped" in err
    assert main([str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main([str(sweep), "--metrics", "P@9"]) == 2
    assert "P@9" in capsys.readouterr().err
    with pytest.raises(AggregateError, match="no run found"), pytest.warns(AggregateWarning, match="incomplete"):
        collect_runs([tmp_path / "empty" / "0"])


def test_module_entry_point(sweep: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-W",
            "error::RuntimeWarning",
            "-m",
            "xtransformer.suite.aggregate",
            str(sweep),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("| Dataset | Config. ID |")
    assert (out / "results_p_at_k.png").is_file()


def test_cnn_baselines_are_rows_of_their_own_after_the_grid(tmp_path: Path) -> None:
    import json

    folders = table5_grid(tmp_path)
    for seed in (0, 1):
        for method, p1 in (("kimcnn", 50.0), ("xmlcnn", 52.0)):
            run = write_run(tmp_path / "sweep" / f"{method}-{seed}", seed=seed, p1=p1 + seed, method=method)
            doc = json.loads((run / "metrics.json").read_text())
            doc["config"]["cnn"] = {"name": method, "filter_widths": [8]}
            (run / "metrics.json").write_text(json.dumps(doc))
    agg = aggregate(scan_runs(folders).rows)
    cnn = [r for r in agg if r["method"] in ("kimcnn", "xmlcnn")]
    assert [r["method"] for r in agg[-2:]] == ["kimcnn", "xmlcnn"]  # after the paper's rows
    assert [(r["matcher"], r["n_seeds"], r["paper_row"]) for r in cnn] == [("kimcnn", 2, None), ("xmlcnn", 2, None)]
    assert cnn[0]["mean"]["P@1"] == pytest.approx(50.5) and cnn[1]["mean"]["P@1"] == pytest.approx(52.5)
