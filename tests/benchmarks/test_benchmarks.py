"""The benchmark harness's own plumbing on tiny problems, with our code only (no peer venvs)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from benchmarks import report
from benchmarks.harness import benchmark
from benchmarks.measure import RunRecord, RunSettings, run_once
from benchmarks.phases import PhaseError, head_words, texts_file, topk_csr, vm_hwm_mb
from benchmarks.run import BenchmarkArgError, main, parse_synthetic, tfidf_settings
from benchmarks.synthetic import SyntheticError, SyntheticSpec, generate
from benchmarks.systems import REGISTRY, SystemSetupError, SystemSpec, get_systems
from benchmarks.workdata import prepare_dataset, prepare_synthetic
from xtransformer.metrics import evaluate

TINY = SyntheticSpec(n_train=400, n_test=120, n_labels=60, n_features=3000, seed=3)


def test_synthetic_is_reproducible_long_tailed_and_normalised() -> None:
    a, b = generate(TINY), generate(TINY)
    for split in ("train", "test"):
        assert (a[split][0] != b[split][0]).nnz == 0 and (a[split][1] != b[split][1]).nnz == 0
    X, Y = a["train"]
    assert X.shape == (400, 3000) and Y.shape == (400, 60)
    assert sp.issparse(X) and X.dtype == np.float32 and Y.dtype == np.float32
    assert np.diff(Y.indptr).min() >= 1 and set(np.unique(Y.data)) == {1.0}
    np.testing.assert_allclose(np.asarray(X.multiply(X).sum(axis=1)).ravel(), 1.0, rtol=1e-5)
    freq = np.sort(Y.getnnz(axis=0))[::-1]
    assert freq[0] > 5 * max(np.median(freq), 1)  # a head and a long tail
    other = generate(SyntheticSpec(**{**TINY.as_dict(), "seed": 4}))
    assert (other["train"][1] != Y).nnz > 0


def test_synthetic_labels_are_learnable_from_their_topic_words() -> None:
    """Docs sharing a label share words: label centroids score their own docs above others."""
    X, Y = generate(TINY)["train"]
    centroids = (Y.T @ X).tocsr()  # L x F label centroids, sparse
    scores = (X @ centroids.T).toarray()  # 400 x 60 is tiny here
    pos = scores[Y.toarray() > 0].mean()
    neg = scores[Y.toarray() == 0].mean()
    assert pos > 3 * neg


@pytest.mark.parametrize("bad", [{"n_labels": 0}, {"labels_per_doc": 0.5}, {"noise_words": -1}])
def test_synthetic_rejects_bad_sizes(bad: dict) -> None:
    with pytest.raises(SyntheticError, match=next(iter(bad))):
        generate(SyntheticSpec(**{**TINY.as_dict(), **bad}))


def test_cli_argument_errors() -> None:
    assert parse_synthetic("20000x5000") == (20000, 5000)
    with pytest.raises(BenchmarkArgError, match="--synthetic"):
        parse_synthetic("20000")
    with pytest.raises(SystemSetupError, match="--systems"):
        get_systems("pecos,nonesuch")
    assert [s.name for s in get_systems("all")] == list(REGISTRY)


def test_prepare_dataset_from_standard_text_layout(tmp_path: Path) -> None:
    folder = tmp_path / "toyxmc"
    folder.mkdir()
    words = ["alpha beta gamma", "beta gamma delta", "gamma delta alpha", "delta alpha beta"]
    for split, n in (("train", 12), ("test", 4)):
        (folder / f"{split}_texts.txt").write_text("\n".join(words[i % 4] + " common words" for i in range(n)) + "\n")
        (folder / f"{split}_labels.txt").write_text("\n".join(f"c{i % 3}" for i in range(n)) + "\n")
    (folder / "label_map.txt").write_text("c0\nc1\nc2\n")
    problem = prepare_dataset(str(folder), tmp_path / "work")
    assert problem.eval_split == "test" and problem.train_split == "train"
    for split in ("train", "dev", "test"):
        X, Y = problem.X(split), problem.Y(split)
        assert X.shape[0] == Y.shape[0] > 0 and Y.shape[1] == 3
    assert problem.info["n_labels"] == 3
    again = prepare_dataset(str(folder), tmp_path / "work")  # reused, not rebuilt
    assert again.data_dir == problem.data_dir
    # --tfidf lead_chars=6: the lead block's columns beside the body's, in a problem folder of its own
    lead = prepare_dataset(str(folder), tmp_path / "work", tfidf=tfidf_settings(["lead_chars=6", "min_df=1"]))
    body = prepare_dataset(str(folder), tmp_path / "work", tfidf={"min_df": 1})
    assert lead.data_dir != body.data_dir != problem.data_dir
    assert lead.X("train").shape[1] > body.X("train").shape[1] and lead.info["source"]["tfidf"]["lead_chars"] == 6
    with pytest.raises(BenchmarkArgError, match="--tfidf"):
        tfidf_settings(["lead_chars"])
    # --holdout 3: three training documents scored instead of test, in a problem of their own
    held = prepare_dataset(str(folder), tmp_path / "work", holdout=3)
    assert held.name == "toyxmc-holdout3" and held.eval_split == "holdout" and held.data_dir != problem.data_dir
    assert held.X("holdout").shape[0] == 3 and held.X("train").shape[0] == problem.X("train").shape[0] - 3
    held.ensure_texts()  # the documents of both splits, reloaded with the same holdout, row for row
    texts = (held.data_dir / texts_file("holdout")).read_text().splitlines()
    assert len(texts) == 3 and all(json.loads(t).endswith("common words") for t in texts)
    with pytest.raises(BenchmarkArgError, match="--holdout"):
        main(["--dataset", str(folder), "--holdout", "3", "--eval-split", "test", "--work", str(tmp_path / "w")])


def test_run_once_scores_popular_baseline_with_our_metrics(tmp_path: Path) -> None:
    problem = prepare_synthetic(TINY, tmp_path / "work")
    rec = run_once(REGISTRY["popular"], problem, tmp_path / "run", 0, RunSettings(topk=5))
    assert rec.ok, rec.error
    assert rec.peak_rss_mb is not None and rec.peak_rss_mb > 10
    assert rec.cpu_s is not None and rec.cpu_s > 0  # the child's own CPU seconds (it imports numpy)
    assert set(rec.timings["seconds"]) >= {"load_data", "train", "save", "load.default", "predict.default"}
    assert rec.timings["predictions"]["default"]["n_docs"] == 120
    assert not (tmp_path / "run" / "model").exists()  # only its size is kept
    # Same numbers as scoring the k most frequent training labels directly.
    freq = np.asarray(problem.Y("train").sum(axis=0)).ravel()
    top = np.argsort(-freq, kind="stable")[:5]
    n = 120
    pred = topk_csr(np.tile(top, n), np.tile(freq[top], n), np.arange(n + 1) * 5, 60)
    expected = evaluate(problem.Y("test"), pred)
    for key in report.METRICS:
        assert rec.metrics["default"][key] == pytest.approx(expected[key])


def test_head_words_keeps_the_first_words_of_each_text() -> None:
    texts = ["one  two\tthree four", "short", "", "a b c"]
    assert head_words(texts, 3) == ["one two three", "short", "", "a b c"]
    assert head_words(texts, 1) == ["one", "short", "", "a"]
    with pytest.raises(PhaseError, match="n_words"):
        head_words(texts, 0)


def test_failing_system_is_recorded_and_others_still_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "broken.py").write_text("import sys\nprint('boom: bad model')\nsys.exit(3)\n")
    broken = SystemSpec("broken", "always fails", "broken")
    missing = SystemSpec("missing", "needs a module", "broken", requires=("xtransformer.nonesuch:thing",))
    lazy = SystemSpec("lazy", "needs a name", "broken", requires=("xtransformer.api:nonesuch",))
    (tmp_path / "killed.py").write_text(
        "import os, signal\nprint('level 1 of 3', flush=True)\nprint('FutureWarning: x', flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    killed = SystemSpec("killed", "killed as by the out-of-memory killer", "killed")
    # the systems' modules (`python -m broken`, run from the repository root) found through PYTHONPATH
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    problem = prepare_synthetic(TINY, tmp_path / "work")
    systems = [broken, missing, lazy, killed, REGISTRY["popular"]]
    result = benchmark(problem, systems, 1, RunSettings(), tmp_path / "work", reference="popular")
    runs = {r["system"]: r for r in result["runs"]}
    assert not runs["broken"]["ok"] and "boom: bad model" in runs["broken"]["error"]
    assert "exit code 3" in runs["broken"]["error"]
    assert "missing" in result["skipped"] and "not importable" in result["skipped"]["missing"]
    assert result["skipped"]["lazy"] == "xtransformer.api has no nonesuch yet"
    assert "popular" in result["summary"] and "broken" not in result["summary"]
    assert "- broken: failed (exit code 3: boom: bad model;" in result["markdown"]
    assert "- missing: skipped" in result["markdown"]
    assert "- killed: failed (exit code -9: killed by SIGKILL (the out-of-memory killer" in result["markdown"]
    assert "when the host ran out of memory): level 1 of 3;" in result["markdown"]  # the last line not a warning


def _record(system: str, repeat: int, train: float, predict: float, rss: float) -> RunRecord:
    timings = {
        "seconds": {"index": 1.0, "train": train, "save": 0.0},
        "predictions": {"default": {"load_s": 0.1, "predict_s": predict, "n_docs": 100}},
        "variants": ["default"],
        "model_bytes": 2**20,
    }
    return RunRecord(system, repeat, True, 1.0, rss, timings=timings, metrics={"default": {"P@1": 50.0}})


def test_summary_takes_ratios_within_each_repeat() -> None:
    # Repeat 1 is a slow machine moment for both: per-repeat ratios stay exactly 2.
    records = [
        _record("ref", 0, 1.0, 1.0, 100.0),
        _record("b", 0, 3.0, 0.5, 150.0),
        _record("ref", 1, 9.0, 4.0, 100.0),
        _record("b", 1, 19.0, 2.0, 150.0),
    ]
    summary = report.summarize(records, reference="ref")
    assert summary["b"]["ratio_fit_s"]["values"] == [2.0, 2.0]
    assert summary["b"]["ratio_docs_per_s"]["median"] == pytest.approx(2.0)
    assert summary["b"]["train_s"] == {"median": 11.0, "min": 3.0, "max": 19.0, "values": [3.0, 19.0]}
    assert summary["b"]["model_mb"]["median"] == pytest.approx(1.0)
    table = report.markdown_table(summary, "ref")
    assert "| b | 1.00 | 11.00 (3.00–19.00) |" in table
    assert table.count("\n") == 3  # header, rule, two rows


def test_cli_end_to_end_on_synthetic(tmp_path: Path) -> None:
    out = tmp_path / "results"
    result = main(
        [
            "--synthetic",
            "300x40",
            "--n-test",
            "80",
            "--n-features",
            "2000",
            "--systems",
            "popular,ours-xrlinear",
            "--repeats",
            "2",
            "--reference",
            "popular",
            "--out",
            str(out),
            "--work",
            str(tmp_path / "work"),
        ]
    )
    name = "synthetic-n300-l40-f2000-seed0"
    saved = json.loads((out / f"{name}.json").read_text())
    assert (out / f"{name}.md").read_text() == saved["markdown"] == result["markdown"]
    row = saved["summary"]["popular"]
    assert row["repeats"] == 2 and len(row["P@1"]["values"]) == 2
    assert 0 < row["P@5"]["median"] <= 100 and row["ratio_fit_s"]["median"] == 1.0
    assert saved["machine"]["cores"] >= 1 and saved["settings"]["repeats"] == 2
    # Ours is either measured or skipped with the reason, never silently absent.
    assert "ours-xrlinear" in saved["summary"] or "ours-xrlinear" in saved["skipped"]


def test_scaling_writes_curves_and_plot(tmp_path: Path) -> None:
    out = tmp_path / "results"
    record = main(
        [
            "--scaling",
            "--systems",
            "popular",
            "--n-test",
            "50",
            "--n-features",
            "1000",
            "--scale-labels",
            "20,40",
            "--scale-docs",
            "100,200",
            "--fixed-docs",
            "200",
            "--fixed-labels",
            "20",
            "--out",
            str(out),
            "--work",
            str(tmp_path / "work"),
        ]
    )
    assert sorted(x for x, _ in record["curves"]["labels"]["popular"]["train_s"]) == [20, 40]
    assert sorted(x for x, _ in record["curves"]["docs"]["popular"]["train_s"]) == [100, 200]
    png = out / "scaling-n200-l20-f1000.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(list((out / "scaling").glob("*.json"))) == 3  # (200,20) is shared by both curves


def test_host_description_names_native_bf16_and_the_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """A table's header names its host as the docs must: CPU, native bf16 or not, GPU model; results
    saved before these keys existed still render."""
    machine = report.machine_info()
    assert machine["native_bf16"] in (True, False, None) and isinstance(machine["gpus"], list)
    host = {"cores": 16, "ram_gib": 125.0, "cpu": "Intel(R) Xeon(R) Processor", "native_bf16": True}
    assert report.describe_host({**host, "gpus": ["NVIDIA H100 80GB HBM3"]}) == (
        "16 cores / 125.0 GiB (Intel(R) Xeon(R) Processor, native bf16), 1 x NVIDIA H100 80GB HBM3"
    )
    no_bf16 = report.describe_host({**host, "native_bf16": False, "gpus": []})
    assert no_bf16 == "16 cores / 125.0 GiB (Intel(R) Xeon(R) Processor, no native bf16)"
    assert report.describe_host({"cores": 2, "ram_gib": 23.5, "cpu": "X"}) == "2 cores / 23.5 GiB (X)"

    def no_driver(*args: object, **kwargs: object) -> None:
        raise FileNotFoundError("nvidia-smi")

    monkeypatch.setattr(report.subprocess, "run", no_driver)
    assert report.visible_gpus() == []


def test_vm_hwm_reads_this_process() -> None:
    hwm = vm_hwm_mb()
    assert hwm is None or hwm > 10


@pytest.mark.slow  # imports Lightning + Hydra twice (~10 s)
def test_pipeline_adapter_refuses_synthetic_problems_clearly(tmp_path: Path) -> None:
    spec = REGISTRY["ours-pipeline"]
    if spec.unavailable_reason():
        pytest.skip(spec.unavailable_reason())
    problem = prepare_synthetic(TINY, tmp_path / "work")
    rec = run_once(spec, problem, tmp_path / "run", 0, RunSettings())
    assert not rec.ok and "needs a text dataset" in rec.error
