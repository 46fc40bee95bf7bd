"""Portable model folders: a run writes model/<method>/ for every method it trained; after the
cache is deleted and the folder moved, ``xmc-predict`` on the eval split's texts reproduces the
run's ``predictions/<method>/<split>.npz`` exactly. Plus the folder's failure modes, each one
line naming what is wrong."""

from __future__ import annotations

import gc
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from run_helpers import FIXTURES, compose_run

from xtransformer.model import FORMAT_VERSION, ModelError, XMCModel
from xtransformer.utils.io import load_csr

# the tiny end-to-end run of test_pipeline.py, plus a non-default post-processor and top-b so that
# the test shows the folder carries the run's prediction settings
TINY = [
    "data.max_docs=400",
    "matcher=tiny_bert",
    "matcher.max_steps=4",
    "matcher.batch_size=16",
    "matcher.max_length=32",
    "matcher.progress=false",
    "matcher.topb=4",
    "indexing.n_clusters=8",
    "tfidf.max_features=5000",
    "logger=none",
    "ranker.post_processor=l2-hinge",
    "xrlinear.model.beam_size=5",
]
METHODS = ("xtransformer", "xrlinear", "xtransformer+xrlinear")


@pytest.fixture(scope="module")
def moved_run(tmp_path_factory):
    return _moved_run(tmp_path_factory, TINY)


@pytest.fixture(scope="module")
def moved_xr_run(tmp_path_factory):
    """The same for XR-Transformer (two fine-tuned levels, then the final linear model), embedding
    documents on more tokens than it fine-tuned on and combining with XR-Linear at 0.7 : 0.3."""
    return _moved_run(
        tmp_path_factory,
        [
            *TINY,
            "method=xrtransformer",
            "matcher.level_steps=[2,3]",
            "xrtransformer.nr_splits=8",
            "xrtransformer.eval_docs=50",
            "matcher.embed_max_length=48",
            "combine_weight=0.7",
        ],
    )


def _moved_run(tmp_path_factory, overrides: list[str]) -> dict:
    """Run the pipeline once, then move its model folder away and delete the cache. Counts the
    linear tree models alive when the neural method starts training."""
    from xtransformer.matcher import train as matcher_train
    from xtransformer.methods.xrtransformer import finetune
    from xtransformer.methods.xtransformer import model as xtransformer_model
    from xtransformer.pipeline.run import run

    tmp = tmp_path_factory.mktemp("run")
    cfg = compose_run(overrides, tmp)
    from xtransformer.ranker import HierarchicalLinear, LinearForest

    def linear_models() -> list:
        gc.collect()
        return [o for o in gc.get_objects() if isinstance(o, (HierarchicalLinear, LinearForest))]

    # models other tests of this process left behind are not this run's: held (no id is reused), not counted
    earlier = linear_models()
    alive: list[int] = []

    def counting(stage):
        def wrapped(*args, **kwargs):
            known = {id(o) for o in earlier}
            alive.append(sum(id(o) not in known for o in linear_models()))
            return stage(*args, **kwargs)

        return wrapped

    with pytest.MonkeyPatch.context() as mp:  # where each neural method starts fine-tuning
        mp.setattr(xtransformer_model, "fine_tune_matcher", counting(matcher_train.fine_tune_matcher))
        mp.setattr(finetune, "fine_tune", counting(finetune.fine_tune))
        metrics = run(cfg)
    split = metrics["eval_split"]
    moved = tmp / "elsewhere" / "model"
    moved.parent.mkdir()
    shutil.move(str(tmp / "run" / "model"), moved)
    shutil.rmtree(tmp / "cache")
    # the eval split's texts and labels as a user would have them
    from xtransformer.data import DataConfig, load_dataset

    ds = load_dataset(DataConfig(name="reuters21578", max_docs=400), cache_dir=tmp / "data-cache")
    texts = tmp / "texts.txt"
    texts.write_text("".join(t.replace("\n", " ") + "\n" for t in ds.splits[split].texts), encoding="utf-8")
    labels = tmp / "labels.txt"
    Y = ds.splits[split].Y
    labels.write_text(
        "".join(
            " ".join(ds.vocab.ids[j] for j in Y.indices[Y.indptr[i] : Y.indptr[i + 1]]) + "\n"
            for i in range(Y.shape[0])
        ),
        encoding="utf-8",
    )
    return {
        "model": moved,
        "run": tmp / "run",
        "split": split,
        "texts": texts,
        "labels": labels,
        "ds": ds,
        "metrics": metrics,
        "cache": str(tmp / "cache"),
        "linear_models_alive": alive,
    }


def _xmc_predict(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "xtransformer", "predict", *args, "--no-progress"],
        capture_output=True,
        text=True,
        timeout=300,
    )


def _jsonl_to_csr(path: Path, ids: list[str]) -> sp.csr_matrix:
    index = {label: i for i, label in enumerate(ids)}
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    data = np.array([s for r in rows for s in r["scores"]], dtype=np.float32)
    cols = [index[label] for r in rows for label in r["labels"]]
    indptr = np.r_[0, np.cumsum([len(r["labels"]) for r in rows])]
    out = sp.csr_matrix((data, cols, indptr), shape=(len(rows), len(ids)))
    out.sort_indices()
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    "run_name, method",
    [("moved_run", m) for m in METHODS] + [("moved_xr_run", m) for m in ("xrtransformer", "xrtransformer+xrlinear")],
)
def test_xmc_predict_reproduces_the_run_after_move_and_cache_deletion(run_name, method, tmp_path, request):
    moved_run = request.getfixturevalue(run_name)
    folder = moved_run["model"] / method
    out = tmp_path / "pred.jsonl"
    # the default chunk holds the whole split: the encoder sees the same batches as in the run
    res = _xmc_predict(
        "--model",
        str(folder),
        "--input",
        str(moved_run["texts"]),
        "--k",
        "20",
        "--output",
        str(out),
        "--labels",
        str(moved_run["labels"]),
    )
    assert res.returncode == 0, res.stderr
    manifest = json.loads((folder / "manifest.json").read_text())
    got = _jsonl_to_csr(out, json.loads((folder / "labels.json").read_text())["ids"])
    want = load_csr(moved_run["run"] / "predictions" / method / f"{moved_run['split']}.npz")
    want.sort_indices()
    assert got.shape == want.shape
    assert np.array_equal(got.indptr, want.indptr) and np.array_equal(got.indices, want.indices)
    assert np.array_equal(got.data, want.data)
    # metrics printed from the labels file are the run's
    p1 = moved_run["metrics"]["results"][method]["P@1"]
    assert f"{p1:.2f}" in res.stdout
    assert manifest["format_version"] == FORMAT_VERSION and manifest["method"] == method


@pytest.mark.slow
@pytest.mark.parametrize("run_name", ["moved_run", "moved_xr_run"])
def test_linear_model_let_go_while_the_encoder_trains(run_name, request):
    """XR-Linear's model (1.3 GiB on EURLEX57K as a forest pruned at 0.01) is not held while the
    matcher or the XR-Transformer levels train; the model folder reads it again from its stage
    folder (the reproduction test above covers what it then predicts)."""
    moved = request.getfixturevalue(run_name)
    assert moved["linear_models_alive"] == [0]
    assert (moved["model"] / "xrlinear" / "manifest.json").is_file()


@pytest.mark.slow
def test_embedding_length_and_combination_weight_travel_with_the_folder(moved_xr_run):
    """``matcher.embed_max_length`` and ``combine_weight`` are part of what the folder predicts with
    (the reproduction test above shows the run embedded and combined exactly so)."""
    from xtransformer.matcher import EncodeOptions

    model = moved_xr_run["model"]
    features = json.loads((model / "xrtransformer" / "manifest.json").read_text())["components"]["features"]
    assert features["max_length"] == 48
    both = json.loads((model / "xrtransformer+xrlinear" / "predict_settings.json").read_text())
    assert both["weights"] == pytest.approx([0.7, 0.3])
    # on these texts 48 tokens are not 32: the length the folder records is one that matters
    texts = moved_xr_run["texts"].read_text(encoding="utf-8").splitlines()[:8]
    matcher = XMCModel.load(model, method="xrtransformer").matcher
    e32, e48 = (matcher.encode(texts, EncodeOptions(max_length=n, progress=False)).embeddings for n in (32, 48))
    assert not np.allclose(e32, e48)


@pytest.mark.slow
def test_folder_layout_records_and_no_cache_paths(moved_run):
    model = moved_run["model"]
    index = json.loads((model / "models.json").read_text())
    assert index["main"] == "xtransformer" and sorted(index["methods"]) == sorted(METHODS)
    for method in METHODS:
        folder = model / method
        for name in ("manifest.json", "train_settings.json", "predict_settings.json", "labels.json"):
            assert (folder / name).is_file(), (method, name)
        files = [p for p in folder.rglob("*") if p.is_file()]
        assert not [p for p in files if p.suffix in (".pkl", ".pt", ".bin", ".pickle")], "no pickles"
        for p in files:  # nothing refers to the (deleted) cache
            if p.suffix in (".json", ".txt"):
                assert moved_run["cache"] not in p.read_text(encoding="utf-8"), p
    xt = json.loads((model / "xtransformer" / "predict_settings.json").read_text())
    assert xt["post_processor"] == "l2-hinge" and xt["topb"] == 4 and xt["matcher_weight"] == 0.0
    assert json.loads((model / "xrlinear" / "predict_settings.json").read_text())["beam_size"] == 5
    train = json.loads((model / "xrlinear" / "train_settings.json").read_text())["xrlinear"]
    assert "beam_size" not in train["model"] and train["model"]["negatives"] == "tfn"
    assert (model / "xtransformer" / "matcher" / "head.safetensors").is_file()
    assert (model / "xrlinear" / "tfidf" / "idf.npz").is_file()


@pytest.mark.slow
def test_xr_folder_records_the_precision_the_run_resolved(moved_xr_run):
    """method=xrtransformer asks for trainer.precision=auto: the folder holds what ran, never `auto`."""
    from xtransformer.utils.hardware import native_bf16

    ran = "bf16-mixed" if native_bf16("cpu") else "32-true"
    folder = moved_xr_run["model"] / "xrtransformer"
    train = json.loads((folder / "train_settings.json").read_text())
    assert train["trainer"]["precision"] == ran
    assert json.loads((folder / "predict_settings.json").read_text())["inference_precision"] == ran


@pytest.mark.slow
def test_api_predict_names_overrides_and_empty_text(moved_run):
    model = XMCModel.load(moved_run["model"], method="xrlinear")  # a run's model/ folder + method
    assert XMCModel.load(moved_run["model"]).method == "xtransformer"  # the run's main method
    texts = moved_run["texts"].read_text(encoding="utf-8").splitlines()[:3]
    out = model.predict([texts[0], "", "   ", texts[1]], k=3)
    assert len(out) == 4 and out[1] == out[2] == {"labels": [], "names": [], "scores": []}
    assert len(out[0]["labels"]) == 3 and out[0]["scores"] == sorted(out[0]["scores"], reverse=True)
    assert all(isinstance(n, str) for n in out[0]["names"])
    # TF-IDF rows in, same answer (linear models predict from features)
    X = model.tfidf.from_texts([texts[0]])
    assert model.predict_features(X, k=3)[0] == out[0]
    assert len(model.predict(texts, k=30)[0]["labels"]) == 30  # k above the stored top-k
    assert model.predict(texts, k=3, post_processor="noop")[0]["scores"] != out[0]["scores"]
    with pytest.raises(ModelError, match="unknown prediction setting"):
        model.predict(texts, k=3, no_such=1)
    neural = XMCModel.load(moved_run["model"], method="xtransformer")
    assert not hasattr(neural, "predict_features")  # it reads texts: the verb is not there to fail
    with pytest.raises(ModelError, match=r"^evaluate on feature rows: a xtransformer model cannot predict from"):
        neural.evaluate(X, sp.csr_matrix((1, neural.n_labels)))


@pytest.mark.slow
def test_linear_model_predicts_without_torch_lightning_hydra_wandb(moved_run):
    code = f"""
import sys
from xtransformer import XMCModel
m = XMCModel.load({str(moved_run["model"] / "xrlinear")!r})
print(m.predict(["oil prices rose in opec talks"], k=2)[0]["labels"])
heavy = [n for n in ("torch", "lightning", "hydra", "wandb", "transformers") if n in sys.modules]
assert not heavy, heavy
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr


# ------------------------------------------------------------------------------------ failures
def _one_line_error(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    return lines[0]


@pytest.mark.slow
def test_bad_model_folders_fail_with_one_line(moved_run, tmp_path):
    texts = str(moved_run["texts"])
    line = _one_line_error(_xmc_predict("--model", str(tmp_path / "nope"), "--input", texts))
    assert "no such model folder" in line
    bad = tmp_path / "xrlinear"
    shutil.copytree(moved_run["model"] / "xrlinear", bad)
    with open(bad / "ranker" / "level_0" / "W.npz", "r+b") as fh:  # flip one byte
        fh.seek(100)
        byte = fh.read(1)
        fh.seek(100)
        fh.write(bytes([byte[0] ^ 0xFF]))
    line = _one_line_error(_xmc_predict("--model", str(bad), "--input", texts))
    assert "ranker/level_0/W.npz" in line and "checksum" in line
    manifest = json.loads((bad / "manifest.json").read_text())
    manifest["format_version"] = FORMAT_VERSION + 1
    (bad / "manifest.json").write_text(json.dumps(manifest))
    line = _one_line_error(_xmc_predict("--model", str(bad), "--input", texts))
    assert "newer" in line and "upgrade" in line
    (bad / "manifest.json").write_text("{not json")
    assert "corrupt manifest" in _one_line_error(_xmc_predict("--model", str(bad), "--input", texts))


@pytest.mark.slow
def test_non_utf8_input_names_the_line(moved_run, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine text\nalso fine\nbad \xff byte\n")
    line = _one_line_error(_xmc_predict("--model", str(moved_run["model"] / "xrlinear"), "--input", str(bad)))
    assert f"{bad}:3: not UTF-8" in line


@pytest.mark.slow
def test_tsv_output_and_chunked_stream(moved_run, tmp_path):
    out = tmp_path / "pred.tsv"
    res = _xmc_predict(
        "--model",
        str(moved_run["model"]),
        "--method",
        "xrlinear",
        "--input",
        str(moved_run["texts"]),
        "--format",
        "tsv",
        "--k",
        "2",
        "--chunk-size",
        "7",
        "--output",
        str(out),
    )
    assert res.returncode == 0, res.stderr
    rows = out.read_text(encoding="utf-8").splitlines()
    assert len(rows) == len(moved_run["texts"].read_text(encoding="utf-8").splitlines())
    assert all(len(r.split("\t")) == 2 and ":" in r for r in rows)


# ------------------------------------------------------------------------------------ older folders
FORMAT1 = FIXTURES / "format1"


@pytest.mark.parametrize("run", ["xtransformer-run", "xrtransformer-run"])
def test_folders_of_the_earlier_layout_load_and_predict_as_before(run):
    """Folders written before the methods became classes (format version 1, no label tree in an
    XR-Transformer folder, the matcher head as safetensors) load as their classes and predict what
    that version predicted."""
    folder = FORMAT1 / run
    texts = json.loads((folder / "texts.json").read_text())
    expected = json.loads((folder / "expected.json").read_text())
    for method, rows in expected.items():
        model = XMCModel.load(folder / "model", method=method)
        assert model.method == method and type(model).__name__ in (
            "XRLinear",
            "XTransformer",
            "XRTransformer",
            "Combination",
        )
        got = model.predict(texts, k=5)
        for g, want in zip(got, rows):
            assert g["labels"] == want["labels"], (method, g, want)
            np.testing.assert_allclose(g["scores"], want["scores"], rtol=1e-5, atol=1e-6)
