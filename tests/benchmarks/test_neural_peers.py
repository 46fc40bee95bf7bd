"""The neural systems of the benchmark (PECOS XR-Transformer, ours through the public API) and
LibMultiLabel's linear models, each on a tiny problem through the harness. A peer's virtual
environment is built on demand (a minute from PyPI the first time, reused after); where it cannot
be built (no index reachable) its test is skipped with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest
import scipy.sparse as sp

from benchmarks import report
from benchmarks.harness import benchmark
from benchmarks.measure import RunRecord, RunSettings, run_once
from benchmarks.run import BenchmarkArgError, build_parser, neural_setup, run_setup
from benchmarks.synthetic import SyntheticSpec
from benchmarks.systems import REGISTRY, SystemSetupError, get_systems
from benchmarks.workdata import Problem, prepare_dataset, prepare_synthetic

TINY = SyntheticSpec(n_train=400, n_test=120, n_labels=60, n_features=3000, seed=3)


def write_text_dataset(folder: Path, texts: dict[str, list[str]], Y: dict[str, sp.csr_matrix]) -> Path:
    """A dataset in the standard text layout (``<split>_texts.txt``, ``<split>_labels.txt``)."""
    folder.mkdir(parents=True)
    n_labels = Y["train"].shape[1]
    for split in ("train", "test"):
        (folder / f"{split}_texts.txt").write_text("\n".join(texts[split]) + "\n")
        rows = (" ".join(f"l{j}" for j in Y[split][i].indices) for i in range(Y[split].shape[0]))
        (folder / f"{split}_labels.txt").write_text("\n".join(rows) + "\n")
    (folder / "label_map.txt").write_text("\n".join(f"l{j}" for j in range(n_labels)) + "\n")
    return folder


@pytest.fixture(scope="module")
def text_problem(tmp_path_factory: pytest.TempPathFactory) -> Problem:
    """The toy task (keywords per label) as a text dataset: 180 train / 60 test documents, 24 labels."""
    from tiny_models import toy_xmc

    texts, Y, _ = toy_xmc(n_train=200, n_dev=8, n_test=60, n_labels=24, n_clusters=6, seed=1)
    root = tmp_path_factory.mktemp("textxmc")
    folder = write_text_dataset(root / "toytext", texts, Y)
    return prepare_dataset(str(folder), root / "work")


def python_of(name: str) -> None:
    """Build the system's environment now, or skip the test saying why it cannot be built."""
    try:
        REGISTRY[name].python()
    except SystemSetupError as exc:
        pytest.skip(f"{name}: its virtual environment cannot be built here ({str(exc).splitlines()[-1]})")


def scores(rec: RunRecord, variant: str = "default") -> dict[str, float]:
    assert rec.ok, rec.error
    return rec.metrics[variant]


def popular_p1(problem: Problem, tmp_path: Path) -> float:
    return scores(run_once(REGISTRY["popular"], problem, tmp_path / "popular", 0, RunSettings()))["P@1"]


@pytest.mark.slow  # builds the pecos-xrt environment on first use, then ~30 s
def test_pecos_xrt_adapter_on_tiny_text_problem(text_problem: Problem, tiny_bert: Path, tmp_path: Path) -> None:
    python_of("pecos-xrt")
    extra = ["--encoder", str(tiny_bert), "--max-length", "32", "--steps-scale", "0.01", "--batch-workers", "0"]
    settings = RunSettings(threads=1, extra_args={"pecos-xrt": extra})
    rec = run_once(REGISTRY["pecos-xrt"], text_problem, tmp_path / "run", 0, settings)
    assert scores(rec)["P@1"] > popular_p1(text_problem, tmp_path)
    info, seconds = rec.timings["info"], rec.timings["seconds"]
    assert info["library"] == "libpecos" and info["version"] == "1.2.8" and info["steps_scale"] == 0.01
    assert info["batch_workers"] == 0  # batches made in-process: no forked workers
    steps = [m["max_steps"] for m in info["train_params"]["matcher_params_chain"]]
    assert len(steps) == len(info["preliminary_tree"]) and steps[-1] == 12  # 1,200 x 0.01
    assert 0 < seconds["finetune"] < seconds["train"] and seconds["train_embed"] > 0
    assert rec.timings["predictions"]["default"]["n_docs"] == 60


@pytest.mark.slow  # builds the libmultilabel environment on first use, then seconds
def test_libmultilabel_adapters_on_tiny_problem(tmp_path: Path) -> None:
    python_of("lml-linear")
    problem = prepare_synthetic(TINY, tmp_path / "work")
    floor = popular_p1(problem, tmp_path)
    for name in ("lml-linear", "lml-tree"):
        rec = run_once(REGISTRY[name], problem, tmp_path / name, 0, RunSettings())
        assert scores(rec)["P@1"] > floor + 20, name
        assert rec.timings["info"]["library"] == "libmultilabel" and rec.timings["model_bytes"] > 0


@pytest.mark.slow  # Lightning + two fine-tuned levels of a tiny BERT (~30 s)
def test_ours_xrtransformer_adapter_trains_the_runs_three_models(text_problem: Problem, tmp_path: Path) -> None:
    overrides = ["method=xrtransformer", "matcher=tiny_bert", "matcher.max_steps=6", "indexing.n_clusters=6"]
    settings = RunSettings(extra_args={"ours-xrtransformer": [f"--override={o}" for o in overrides]})
    rec = run_once(REGISTRY["ours-xrtransformer"], text_problem, tmp_path / "run", 0, settings)
    assert rec.timings["variants"] == ["default", "xrlinear", "combined"]
    floor = popular_p1(text_problem, tmp_path)
    assert all(scores(rec, v)["P@1"] > floor for v in rec.timings["variants"])
    assert rec.timings["info"]["tfidf_same_as_benchmark"] is True
    rows = report._rows_of(rec)
    xrt, xrl, both = (rows[report.row_label("ours-xrtransformer", v)] for v in rec.timings["variants"])
    assert xrt["finetune_s"] > 0 and xrl["finetune_s"] is None and both["finetune_s"] == xrt["finetune_s"]
    # each part is timed and rounded on its own: sums agree to the millisecond
    assert both["train_s"] == pytest.approx(xrt["train_s"] + xrl["train_s"], abs=1e-3)
    assert both["run_s"] == pytest.approx(both["train_s"] + both["predict_s"], abs=1e-3)


def test_text_systems_are_skipped_on_problems_without_documents(tmp_path: Path) -> None:
    problem = prepare_synthetic(TINY, tmp_path / "work")
    systems = [REGISTRY["ours-xrtransformer"], REGISTRY["pecos-xrt"], REGISTRY["popular"]]
    result = benchmark(problem, systems, 1, RunSettings(), tmp_path / "work", reference="popular")
    for name in ("ours-xrtransformer", "pecos-xrt"):
        assert "reads documents" in result["skipped"][name]
        assert f"- {name}: skipped ({name} reads documents" in result["markdown"]
    assert "popular" in result["summary"]


def test_neural_setup_shares_ours_settings_with_pecos() -> None:
    args = build_parser().parse_args(["--dataset", "eurlex57k", "--steps-scale", "0.25"])
    extra, tfidf = neural_setup(args)
    assert extra["ours-xrtransformer"] == ["--override=experiment=eurlex57k_xr_ensemble"]
    pecos = extra["pecos-xrt"]
    assert pecos[pecos.index("--max-length") + 1] == "128" and pecos[-2:] == ["--steps-scale", "0.25"]
    assert (Path(pecos[pecos.index("--encoder") + 1]) / "config.json").is_file()
    assert tfidf == {"lead_chars": 600}  # the experiment's TF-IDF, every system's features
    workers = build_parser().parse_args(["--dataset", "eurlex57k", "--pecos-batch-workers", "0"])
    assert neural_setup(workers)[0]["pecos-xrt"][-2:] == ["--batch-workers", "0"]
    with pytest.raises(BenchmarkArgError, match="--pecos-batch-workers"):
        neural_setup(build_parser().parse_args(["--dataset", "eurlex57k", "--pecos-batch-workers", "-1"]))
    with pytest.raises(BenchmarkArgError, match="--steps-scale"):
        neural_setup(build_parser().parse_args(["--dataset", "eurlex57k", "--steps-scale", "0"]))
    with pytest.raises(BenchmarkArgError, match="method=xrlinear"):
        neural_setup(build_parser().parse_args(["--dataset", "x", "--xr-override", "method=xrlinear"]))


def test_linear_peers_run_apart_get_the_neural_runs_features_and_neural_runs_one_repeat() -> None:
    def setup(*argv: str) -> tuple[dict, dict, int]:
        args = build_parser().parse_args(["--dataset", "eurlex57k", *argv])
        return run_setup(args, get_systems(args.systems))

    assert setup("--systems", "pecos,omikuji") == ({}, {}, 3)
    extra, tfidf, repeats = setup("--systems", "pecos", "--xr-override", "experiment=eurlex57k_xr_ensemble")
    assert tfidf == {"lead_chars": 600} and repeats == 3
    extra, tfidf, repeats = setup("--systems", "pecos-xrt,ours-xrtransformer")
    assert tfidf == {"lead_chars": 600} and repeats == 1 and "pecos-xrt" in extra
    assert setup("--systems", "pecos-xrt", "--repeats", "2")[2] == 2


def test_rerender_merges_results_of_one_problem_with_their_sources_and_load(tmp_path: Path) -> None:
    from benchmarks.run import main
    from xtransformer.utils.io import load_json, save_json

    argv = ["--synthetic", "300x40", "--n-test", "60", "--n-features", "2000", "--systems", "popular"]
    main([*argv, "--repeats", "1", "--out", str(tmp_path / "a"), "--work", str(tmp_path / "work")])
    first = tmp_path / "a" / "synthetic-n300-l40-f2000-seed0.json"
    later = load_json(first) | {"commit": "abc1234"}
    later["runs"] = [run | {"system": "later-peer"} for run in later["runs"]]
    save_json(later, tmp_path / "later.json")
    merged = main(["--rerender", str(first), str(tmp_path / "later.json"), "--tag", "all", "--out", str(tmp_path)])
    assert set(merged["summary"]) == {"popular", "later-peer"}
    table = (tmp_path / "synthetic-n300-l40-f2000-seed0-all.md").read_text()
    assert "commit abc1234: later-peer" in table and "host load (1-min average" in table
    assert "CPU s / wall s of each run" in table and "later-peer" in table.split("CPU s / wall s")[1]
    with pytest.raises(BenchmarkArgError, match="--tag"):
        main(["--rerender", str(first), str(tmp_path / "later.json")])
    with pytest.raises(BenchmarkArgError, match="popular ran seed 0 in more than one"):
        main(["--rerender", str(first), str(first), "--tag", "twice", "--out", str(tmp_path)])


def test_rerender_keeps_one_system_at_two_steps_scales_as_two_rows(tmp_path: Path) -> None:
    from benchmarks.harness import merge_results

    def result(scale: float, p1: float) -> dict:
        run = {"system": "pecos-xrt", "repeat": 0, "ok": True, "timings": {"info": {"steps_scale": scale}}}
        return {"settings": {"problem": "p", "date": "d"}, "commit": "c", "skipped": {}, "runs": [run | {"p1": p1}]}

    merged = merge_results([result(0.1, 1.0), result(1.0, 2.0)])
    names = [(r["system"], r["p1"]) for r in merged["runs"]]
    assert names == [("pecos-xrt (steps x0.1)", 1.0), ("pecos-xrt (steps x1)", 2.0)]


def test_later_seeds_of_a_system_merge_into_its_row(tmp_path: Path) -> None:
    from benchmarks.run import main
    from xtransformer.utils.io import load_json

    argv = ["--synthetic", "300x40", "--n-test", "60", "--n-features", "2000", "--work", str(tmp_path / "work")]
    main([*argv, "--systems", "popular,ours-xrlinear", "--repeats", "1", "--out", str(tmp_path / "a")])
    main([*argv, "--systems", "popular", "--repeats", "2", "--first-repeat", "1", "--out", str(tmp_path / "b")])
    stem = "synthetic-n300-l40-f2000-seed0"
    later = load_json(tmp_path / "b" / f"{stem}.json")
    assert [r["repeat"] for r in later["runs"]] == [1, 2] and later["settings"]["first_repeat"] == 1
    assert (tmp_path / "work" / stem / "runs" / "popular" / "r2").is_dir()
    paths = [str(tmp_path / d / f"{stem}.json") for d in ("a", "b")]
    merged = main(["--rerender", *paths, "--tag", "seeds", "--out", str(tmp_path)])
    assert merged["summary"]["popular"]["repeats"] == 3 and merged["summary"]["ours-xrlinear"]["repeats"] == 1
    assert "seeds (repeats) of each system: popular 0, 1, 2; ours-xrlinear 0" in merged["markdown"]
    with pytest.raises(BenchmarkArgError, match="popular ran seed 1 in more than one"):
        main(["--rerender", *paths, paths[1], "--tag", "again", "--out", str(tmp_path)])
    with pytest.raises(BenchmarkArgError, match="--first-repeat must be >= 0"):
        main([*argv, "--first-repeat", "-1"])


def test_ours_xrtransformer_gives_every_linear_stage_the_harness_threads() -> None:
    """--threads reaches ours' linear stages (trees, final model, XR-Linear), as it reaches the peers'
    C++ threads: on a many-core GPU host they would otherwise run with the configs' own count."""
    import argparse
    from dataclasses import fields, is_dataclass

    import torch

    from benchmarks import ours

    def threads_of(node: object, path: str = "") -> list[tuple[str, int]]:
        if not is_dataclass(node):
            return []
        found = [(f"{path}.threads", node.threads)] if hasattr(node, "threads") else []
        return found + [p for f in fields(node) for p in threads_of(getattr(node, f.name), f"{path}.{f.name}")]

    before = torch.get_num_threads()
    try:
        args = argparse.Namespace(override=["experiment=eurlex57k_xr_ensemble"], threads=3, seed=0)
        system = ours.ADAPTERS["xrtransformer"](args)
    finally:
        torch.set_num_threads(before)
    found = [p for name, settings in system.s.methods.items() for p in threads_of(settings, name)]
    assert len(found) >= 5 and {n for _, n in found} == {3}, found
