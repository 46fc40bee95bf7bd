"""The seed papers' published rows: the shipped table (ids, figures as printed, checks), how a sweep's
table shows them, and the ensemble sweeps' callback that sets them beside the ensemble."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from hydra.utils import instantiate
from omegaconf import OmegaConf
from run_helpers import write_run

from xtransformer.suite.aggregate import aggregate, main
from xtransformer.suite.ensembles import FinishEnsemble, build_ensemble
from xtransformer.suite.published import (
    PublishedError,
    PublishedRow,
    published_lines,
    published_rows,
    published_section,
    rows_from_document,
    select,
)
from xtransformer.suite.report import to_csv, to_markdown
from xtransformer.suite.runs import AggregateError, scan_runs
from xtransformer.utils.io import save_csr

SETS = ("eurlex-4k", "wiki10-31k", "amazoncat-13k", "wiki-500k")


# --------------------------------------------------------------------------- the shipped table


def test_the_table_holds_every_set_and_row_as_printed():
    rows = published_rows()
    for dataset in SETS:  # Table 3: 13 rows a set, but MLC2seq and XML-CNN on Wiki-500K (not scalable)
        table3 = [r for r in rows.values() if r.dataset == dataset and "Table 3" in r.source]
        assert len(table3) == (11 if dataset == "wiki-500k" else 13), dataset
        assert all(set(r.printed) == {"P@1", "P@3", "P@5"} for r in table3)
    parabel = rows["x-transformer/eurlex-4k/parabel"]
    assert parabel.printed == {"P@1": "82.12", "P@3": "68.91", "P@5": "57.89"} and parabel.method == "Parabel"
    assert rows["x-transformer/eurlex-4k/x-transformer"].printed["P@5"] == "62.90"  # the trailing zero kept
    assert rows["x-transformer/eurlex-4k/x-transformer"].metrics["P@5"] == 62.9
    assert "Table 3, 'Parabel [20]'" in parabel.source and parabel.url.startswith("https://")
    # Table 5: configs 0-9 with recall, on the two sets it covers
    for dataset in ("eurlex-4k", "wiki-500k"):
        table5 = [rows[f"x-transformer/{dataset}/table5-{i}"] for i in range(10)]
        assert all(set(r.printed) == {"P@1", "P@3", "P@5", "R@1", "R@3", "R@5"} for r in table5)
        assert table5[2].config == {
            "indexing": "pifa-tfidf",
            "matching": "BERT",
            "ranker input": "tfidf ⊕ neural",
            "negatives": "TFN + MAN",
        }
        # the paper's own cross-check: Table 3's X-Transformer is Table 5's config 9
        ours = rows[f"x-transformer/{dataset}/x-transformer"].printed
        assert {k: table5[9].printed[k] for k in ours} == ours
    amazon = rows["xr-transformer/amazon-3m/xr-transformer"]
    assert amazon.printed == {"P@1": "54"} and amazon.training["time"] == "29 hours"
    assert amazon.training["source"] == "Amazon Science blog (2021)"


def test_an_unknown_row_fails_in_one_line_naming_the_rows_of_its_set():
    with pytest.raises(
        PublishedError, match=r"no published row 'x-transformer/wiki10-31k/nope'.*: annexml, attentionx"
    ):
        select(["x-transformer/wiki10-31k/nope"])
    with pytest.raises(PublishedError, match=r"sets: amazon-3m, amazoncat-13k, eurlex-4k"):
        select(["nope"])


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"row": "r", "method": "m", "where": "w", "metrics": {"P@1": "8x"}}, r"P@1='8x' is not a number"),
        ({"row": "r", "method": "m", "metrics": {"P@1": "8"}}, r"missing \['where'\]"),
        ({"row": "r", "method": "m", "where": "w", "metrics": {}, "pages": 3}, r"unknown keys \['pages'\]"),
    ],
)
def test_a_malformed_entry_is_named(entry, message):
    doc = {"papers": {"p": {"short": "P"}}, "sets": {"s": {"p": [entry]}}}
    with pytest.raises(PublishedError, match=r"published\.yaml: row p/s/r: " + message):
        rows_from_document(doc)
    with pytest.raises(PublishedError, match=r"sets\.s\.q: no such paper"):
        rows_from_document({"papers": {}, "sets": {"s": {"q": []}}})


def test_a_record_round_trips_and_logs_beside_the_runs_figures():
    section = published_section(["x-transformer/wiki-500k/table5-2"])
    rec = json.loads(json.dumps(section))["x-transformer/wiki-500k/table5-2"]  # as metrics.json stores it
    row = PublishedRow.from_record("x-transformer/wiki-500k/table5-2", rec)
    assert row == published_rows()["x-transformer/wiki-500k/table5-2"]
    (line,) = published_lines(section, {"P@1": 70.0, "P@3": 50.125, "n_docs": 9})
    assert line.startswith("published x-transformer/wiki-500k/table5-2 (X-Transformer; X-Transformer (KDD 2020)")
    assert line.endswith("P@1 74.68 P@3 53.64 P@5 41.50 R@1 24.56 R@3 44.26 R@5 52.50 | this run: P@1 70.00 P@3 50.12")


# --------------------------------------------------------------------------- the sweep's table


def test_published_rows_follow_their_sets_block_in_the_table(tmp_path: Path):
    write_run(tmp_path / "a" / "0", seed=0, p1=80.0, dataset="eurlex-4k")
    write_run(tmp_path / "b" / "0", seed=0, p1=70.0, dataset="wiki-500k")
    scan = scan_runs([tmp_path])
    published = published_section(
        [
            "xr-transformer/amazon-3m/x-transformer",
            "x-transformer/wiki-500k/parabel",
            "x-transformer/eurlex-4k/table5-2",
        ]
    )
    agg = aggregate(scan.rows, metrics=("P@1", "R@1"))
    lines = to_markdown(agg, published=published).splitlines()[2:]
    ids = [line.split(" | ")[1] for line in lines]
    assert ids == [
        "2",  # our eurlex-4k run (Table 5's config 2), then the set's published rows
        "published: x-transformer/eurlex-4k/table5-2",
        "2",
        "published: x-transformer/wiki-500k/parabel",
        "published: xr-transformer/amazon-3m/x-transformer",  # a set no run has: last
    ]
    table5 = lines[1].split(" | ")
    assert table5[2:6] == ["pifa-tfidf", "BERT", "tfidf ⊕ neural", "TFN + MAN"] and table5[-3:] == [
        "85.51",
        "17.32",
        "— |",
    ]
    assert lines[3].split(" | ")[2:4] == ["—", "Parabel"] and lines[4].split(" | ")[-2] == "—"  # no R@1 printed
    rows = to_csv(agg, published=published).splitlines()
    assert rows[-1].startswith("amazon-3m,published: xr-transformer/amazon-3m/x-transformer,") and ",51," in rows[-1]


def test_the_aggregate_prints_the_rows_its_runs_name(tmp_path: Path, capsys):
    run = write_run(tmp_path / "0", seed=0, p1=80.0, dataset="eurlex-4k")
    doc = json.loads((run / "metrics.json").read_text())
    doc["published"] = published_section(["x-transformer/eurlex-4k/parabel"])
    doc["config"]["published"] = ["x-transformer/eurlex-4k/parabel"]
    (run / "metrics.json").write_text(json.dumps(doc))
    write_run(tmp_path / "1", seed=1, p1=82.0, dataset="eurlex-4k")  # no published rows: fine beside it
    assert main([str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith(
        "| eurlex-4k | published: x-transformer/eurlex-4k/parabel | — | Parabel | — | — | 82.12 |"
    )
    assert out[-2].split(" | ")[-1] == "2 |"  # the two seeds are one configuration: `published` is no setting
    assert "published: x-transformer/eurlex-4k/parabel" in (tmp_path / "results.md").read_text()


# --------------------------------------------------------------------------- ensemble sweeps

N, L = 10, 6


def fake_members(root: Path, names: list[str]) -> list[Path]:
    rng = np.random.default_rng(0)
    truth = sp.csr_matrix(np.eye(N, L, dtype=np.float32))
    out = []
    for seed, name in enumerate(names):
        folder = write_run(
            root / str(seed), seed=seed, p1=50.0, matcher=name, method="xrtransformer", dataset="amazon-3m"
        )
        save_csr(
            sp.random(N, L, density=0.5, random_state=rng, format="csr", dtype=np.float32),
            folder / "predictions" / "test.npz",
        )
        save_csr(truth, folder / "truth" / "test.npz")
        (folder / "label_vocab.txt").write_text("".join(f"l{i}\n" for i in range(L)))
        out.append(folder)
    return out


def test_an_ensemble_sweep_finishes_itself_with_the_published_rows(tmp_path: Path):
    members = fake_members(tmp_path, ["bert1", "bert2", "bert3"])
    node = {  # as an ensemble sweep installs it (sweeps/xrt_amazon-3m.yaml)
        "_target_": "xtransformer.suite.ensembles.FinishEnsemble",
        "method": "rank-average",
        "published": ["xr-transformer/amazon-3m/xr-transformer", "xr-transformer/amazon-3m/x-transformer"],
    }
    callback = instantiate(OmegaConf.create(node))
    assert isinstance(callback, FinishEnsemble) and callback.method == "rank-average"
    callback.on_multirun_end(config=OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}}))
    doc = json.loads((tmp_path / "ensembles" / "all" / "metrics.json").read_text())
    assert doc["members"] == [str(m) for m in members] and doc["ensemble_method"] == "rank-average"
    assert sorted(doc["published"]) == [
        "xr-transformer/amazon-3m/x-transformer",
        "xr-transformer/amazon-3m/xr-transformer",
    ]
    table = [line.split(" | ") for line in (tmp_path / "results.md").read_text().splitlines()[2:]]
    assert sorted(row[6] for row in table[:4]) == ["ensemble", *["xrtransformer"] * 3]  # the members, their ensemble
    assert [(row[1], row[3], row[8]) for row in table[4:]] == [
        ("published: xr-transformer/amazon-3m/x-transformer", "X-Transformer", "51"),
        ("published: xr-transformer/amazon-3m/xr-transformer", "XR-Transformer", "54"),
    ]
    # a second finish rebuilds the ensemble from the members alone (its own folder is no member)
    assert build_ensemble(tmp_path, "average") == tmp_path / "ensembles" / "all"
    assert json.loads((tmp_path / "ensembles" / "all" / "metrics.json").read_text())["members"] == doc["members"]


def test_an_ensemble_sweep_checks_its_settings_before_any_run(tmp_path: Path):
    with pytest.raises(AggregateError, match=r"method must be one of \['average', 'rank-average', 'softmax-average'\]"):
        FinishEnsemble(method="sigmoid-average")
    with pytest.raises(PublishedError, match=r"no published row 'xr-transformer/amazon-3m/bert1'"):
        FinishEnsemble(published=["xr-transformer/amazon-3m/bert1"])
    fake_members(tmp_path, ["bert1"])
    with pytest.raises(AggregateError, match=r"1 finished run\(s\); an ensemble needs at least 2"):
        build_ensemble(tmp_path)
