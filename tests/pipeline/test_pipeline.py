"""End-to-end: the Hydra config composes, the whole pipeline runs on a slice of Reuters with a
tiny random encoder, stages are cached and reused, and a sweep aggregates into a table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from omegaconf import OmegaConf
from run_helpers import CONFIGS, ROOT, TINY, compose_run

from xtransformer.configuration import compose


# A slice of Reuters and a tiny random BERT: the whole method in seconds.
def _groups() -> dict[str, list[str]]:
    skip = {"hydra", "table5"}
    return {
        d.name: sorted(p.stem for p in d.glob("*.yaml"))
        for d in sorted(CONFIGS.iterdir())
        if d.is_dir() and d.name not in skip
    }


def test_every_config_option_composes(tmp_path):
    for group, options in _groups().items():
        for option in options:
            cfg = compose_run([f"{group}={option}"], tmp_path)
            OmegaConf.to_container(cfg, resolve=True)  # every interpolation resolves


def test_table5_rowscompose_run(tmp_path):
    for row in sorted(p.stem for p in (CONFIGS / "table5").glob("*.yaml")):
        cfg = compose_run([f"+table5={row}"], tmp_path)
        assert cfg.indexing.name in ("pifa_tfidf", "pifa_neural", "text_emb")


@pytest.mark.parametrize("launcher", ["basic", "joblib", "slurm", "submitit_local"])
def test_launcherscompose_run(tmp_path, launcher):
    """The sweep launchers: basic (default), joblib (local parallel), SLURM via submitit."""
    cfg = compose([f"hydra/launcher={launcher}", "trainer=ddp"], return_hydra_config=True)
    node = OmegaConf.to_container(cfg.hydra.launcher, resolve=False)
    assert launcher.split("_")[0].lower() in node["_target_"].lower()
    if launcher == "slurm":
        # one SLURM task per Lightning device, so DDP runs without re-launching the script
        cfg.hydra.launcher.submitit_folder = str(tmp_path)  # its default interpolates hydra.sweep.dir
        assert cfg.hydra.launcher.tasks_per_node == cfg.trainer.devices == 2
        assert cfg.hydra.launcher.nodes == cfg.trainer.num_nodes
        assert cfg.hydra.launcher.max_num_timeout > 0


def test_bad_combine_with_xrlinear_fails_before_work(tmp_path):
    from xtransformer.pipeline.run import run

    with pytest.raises(ValueError, match="combine_with_xrlinear"):
        run(compose_run([*TINY, "combine_with_xrlinear=median"], tmp_path))
    assert not (tmp_path / "cache").exists()


def test_bad_key_fails_at_composition(tmp_path):
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException):
        compose_run(["matcher=no_such_matcher"], tmp_path)
    with pytest.raises(ConfigCompositionException):
        compose_run(["ranker.no_such_key=1"], tmp_path)


@pytest.mark.slow
def test_pipeline_end_to_end_and_stage_cache(tmp_path):
    from xtransformer.pipeline.run import run

    cfg = compose_run(TINY, tmp_path)
    metrics = run(cfg)
    run_dir = tmp_path / "run"
    saved = json.loads((run_dir / "metrics.json").read_text())
    from xtransformer.metrics import evaluate
    from xtransformer.utils.io import load_csr

    truth = load_csr(run_dir / "truth" / "test.npz")
    popular = np.asarray(truth.sum(axis=0)).ravel().argmax()  # a floor: the most frequent test label
    floor = 100 * truth[:, popular].mean()
    for method in ("xtransformer", "xrlinear"):
        res = saved["results"][method]
        pred = load_csr(run_dir / "predictions" / method / "test.npz")
        # the saved numbers are the saved predictions' (top-5 of each row, every test document)
        assert res["n_docs"] == 400 and pred.shape == truth.shape
        assert res["P@1"] == pytest.approx(evaluate(truth, pred)["P@1"])
        assert res["P@1"] > floor  # both methods learned something on 400 documents
    assert saved["metrics"] == saved["results"]["xtransformer"]
    groups = saved["label_groups"]["xtransformer+xrlinear"]  # Chalkidis et al.'s groups, every method
    assert set(groups) == {"frequent", "few", "zero"} and groups["frequent"]["n_docs"] > 0
    assert 0 <= groups["frequent"]["RP@5"] <= 100 and "nDCG@5" in groups["frequent"]
    assert saved["seed"] == 0 and saved["config"]["matcher"]["model_name_or_path"] == "tiny:bert"
    assert {"indexing", "matcher", "ranker", "xrlinear"} <= set(metrics["stages"]["ran"])
    assert (run_dir / "predictions" / "test.npz").is_file() and (run_dir / "label_vocab.txt").is_file()
    # the in-run ensemble is the average of the two methods' saved score matrices
    from xtransformer.ensemble import ensemble_predictions

    preds = {m: load_csr(run_dir / "predictions" / m / "test.npz") for m in ("xtransformer", "xrlinear")}
    combined = ensemble_predictions([preds["xtransformer"], preds["xrlinear"]], method="average")
    truth = load_csr(run_dir / "truth" / "test.npz")
    assert saved["results"]["xtransformer+xrlinear"]["P@1"] == pytest.approx(evaluate(truth, combined)["P@1"])
    assert (load_csr(run_dir / "predictions" / "test.npz") != preds["xtransformer"]).nnz == 0
    assert any((run_dir / "plots").glob("*.png"))
    assert "ECE" not in saved["results"]["xtransformer+xrlinear"] and "calibration" not in saved  # off by default

    # the same command again: every stage is reused, nothing retrained, same numbers
    again = run(compose_run(TINY, tmp_path))
    assert again["stages"]["ran"] == []
    assert set(again["stages"]["reused"]) >= {"indexing", "matcher", "ranker", "xrlinear"}
    assert again["results"]["xtransformer"] == metrics["results"]["xtransformer"]

    # a ranker-only change retrains only the ranker
    changed = run(compose_run([*TINY, "ranker.Cp=2.0"], tmp_path))
    assert changed["stages"]["ran"] == ["ranker"]


def test_calibrated_run_holds_documents_out_and_calibrates_every_model(tmp_path):
    """calibration=platt: the held-out documents train no model (the stage keys are those of the
    training split without them), every model and the combination are calibrated on them, and
    metrics.json, the plots and the folders say so."""
    from xtransformer.data import load_dataset
    from xtransformer.data.inputs import LabeledData
    from xtransformer.methods.xrlinear import XRLinear
    from xtransformer.model import XMCModel
    from xtransformer.pipeline.run import run
    from xtransformer.pipeline.settings import run_settings

    cfg = compose_run([*TINY, "calibration=platt", "calibration.holdout=100", "calibration.min_positives=3"], tmp_path)
    metrics = run(cfg)
    s = run_settings(cfg)
    train, held = s.calibration.hold_out(LabeledData.from_split(load_dataset(s.data), "train"))
    assert len(held) == 100 and metrics["calibration"]["holdout"] == 100
    keys = XRLinear.stage_keys(s.methods["xrlinear"], train.key, train.n_labels, s.trainer)
    assert metrics["stages"]["keys"]["xrlinear"] == keys  # trained on the training split without them
    methods = ["xrlinear", "xtransformer", "xtransformer+xrlinear"]
    assert sorted(metrics["calibration"]["models"]) == sorted(methods)
    for method in methods:
        res, record = metrics["results"][method], metrics["calibration"]["models"][method]
        assert {"ECE", "ECE@1", "micro-F1", "macro-F1", "example-F1", "micro-F1 per-label", "RP@5"} <= set(res)
        assert record["fitted_on"]["documents"] == 100 and record["fitted_on"]["key"] == held.key
        model = XMCModel.load(tmp_path / "run" / "model", method)
        assert model.decides and model.predict_settings["threshold"] == res["threshold"]
        assert model.predict(["crude oil prices"], decision="per_label")[0]["probabilities"]
    assert (tmp_path / "run" / "plots" / "reliability.png").is_file()


def test_a_named_dataset_read_from_another_folder_trains_on_its_texts_or_its_given_rows(tmp_path):
    """data=<name> data.path=<an xmc-base folder>: its sizes are not the entry's (not checked);
    tfidf=given trains XR-Linear on the folder's own TF-IDF rows, and the records say which."""
    from run_helpers import write_xmc_base_toy

    from xtransformer.model import XMCModel
    from xtransformer.pipeline.run import run

    folder = write_xmc_base_toy(tmp_path / "toy")
    base = ["data=eurlex-4k", f"data.path={folder}", "method=xrlinear", "logger=none"]
    text = run(compose_run(base, tmp_path / "text"))
    given = run(compose_run([*base, "tfidf=given"], tmp_path / "given"))
    assert text["dataset"] == "eurlex-4k" and text["dataset_summary"]["splits"]["test"]["docs"] == 32
    assert [r["settings"]["train"]["tfidf"]["source"] for r in (text, given)] == ["text", "given"]
    assert given["stages"]["keys"]["xrlinear"]["tfidf"] != text["stages"]["keys"]["xrlinear"]["tfidf"]
    assert text["metrics"]["P@1"] > 80 and given["metrics"]["P@1"] > 80
    model = XMCModel.load(tmp_path / "given" / "run" / "model", "xrlinear")
    assert not model.takes_texts  # a model of the given rows predicts from such rows


@pytest.mark.slow
def test_multirun_sweep_resumes_and_aggregates(tmp_path):
    env = {**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
    sweep = tmp_path / "sweep"
    cmd = [
        sys.executable,
        str(ROOT / "train.py"),
        "-m",
        *TINY,
        "train_xrlinear=false",
        "ranker=tfidf_tfn,tfidf_neural_tfn_man",
        "seed=0,1",
        f"paths.cache_dir={tmp_path / 'cache'}",
        f"hydra.sweep.dir={sweep}",
    ]
    # interrupt the sweep as soon as its first run has finished
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 600
    while not (sweep / "0" / "metrics.json").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    proc.kill()
    proc.wait()
    assert (sweep / "0" / "metrics.json").exists(), proc.stderr.read()[-3000:]

    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    runs = [json.loads((sweep / str(i) / "metrics.json").read_text()) for i in range(4)]
    assert runs[0]["stages"]["ran"] == []  # the finished run is redone from cache only
    # the two ranker options share each seed's matcher: at most 2 fine-tunings over both attempts
    assert sum("matcher" in r["stages"]["ran"] for r in runs[1:]) <= 1

    agg = subprocess.run(
        [sys.executable, "-m", "xtransformer.suite.aggregate", str(sweep)], env=env, capture_output=True, text=True
    )
    assert agg.returncode == 0, agg.stderr
    assert "±" in agg.stdout and (sweep / "results.md").is_file() and (sweep / "results_p_at_k.png").is_file()


@pytest.mark.slow
def test_ddp_from_hydra_entry_point_one_run_folder(tmp_path):
    """`python train.py trainer=ddp_cpu`: Lightning relaunches the script for rank 1; the run still
    has one output folder, one metrics.json, and rank 1 neither logs nor redoes the stages."""
    env = {**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
    cmd = [
        sys.executable,
        str(ROOT / "train.py"),
        *TINY,
        "trainer=ddp_cpu",
        "trainer.enable_progress_bar=false",
        f"paths.cache_dir={tmp_path / 'cache'}",
        f"paths.log_dir={tmp_path / 'logs'}",
    ]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    runs = list((tmp_path / "logs" / "train" / "runs").iterdir())
    assert len(runs) == 1, runs
    metrics = json.loads((runs[0] / "metrics.json").read_text())
    assert metrics["results"]["xtransformer"]["n_docs"] == 400
    assert metrics["config"]["trainer"]["strategy"] == "ddp" and metrics["config"]["trainer"]["devices"] == 2
    assert sorted(metrics["stages"]["ran"]) == [
        "documents",
        "indexing",
        "matcher",
        "matcher_outputs",
        "ranker",
        "tfidf",
        "xrlinear",
    ]
    stage_dirs = [p for p in (tmp_path / "cache" / "stages").glob("*/*") if p.is_dir() and p.name != "_work"]
    assert len(stage_dirs) == 7  # each stage built once, not once per rank


@pytest.mark.slow
def test_submitit_launcher_runs_members_as_jobs(tmp_path):
    """`hydra/launcher=submitit_local` submits each member as a job through submitit, the same code
    path as `hydra/launcher=slurm` minus the scheduler: the pipeline runs there end to end."""
    env = {**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
    sweep = tmp_path / "sweep"
    cmd = [
        sys.executable,
        str(ROOT / "train.py"),
        "-m",
        "hydra/launcher=submitit_local",
        "hydra.launcher.timeout_min=10",
        *TINY,
        "train_xrlinear=false",
        f"paths.cache_dir={tmp_path / 'cache'}",
        f"hydra.sweep.dir={sweep}",
        "seed=0",
    ]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    metrics = json.loads((sweep / "0" / "metrics.json").read_text())
    assert metrics["results"]["xtransformer"]["n_docs"] == 400
    assert any((sweep / ".submitit").rglob("*_result.pkl"))  # it really went through submitit


@pytest.mark.parametrize(
    "env,zero",
    [
        ({}, True),
        ({"LOCAL_RANK": "0", "NODE_RANK": "0"}, True),
        ({"LOCAL_RANK": "1"}, False),
        ({"SLURM_PROCID": "3"}, False),
        ({"RANK": "2"}, False),
        ({"SLURM_PROCID": "0"}, True),
    ],
)
def test_rank_zero_under_lightning_and_slurm(monkeypatch, env, zero):
    """Only rank 0 builds stages: Lightning's re-launched ranks and SLURM's other tasks only help train."""
    from xtransformer.utils.dist import is_rank_zero

    for key in ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert is_rank_zero() is zero
