"""A text CNN as X-Transformer's matcher (``method=xtransformer matcher=xmlcnn | kimcnn``): over the
leaf clusters of the same label tree, ranked by the same linear rankers. A tiny one on a Reuters
slice learns (cluster recall and P@1 above popularity), its folder round-trips with identical
predictions, ``xmc-predict`` reads it, and XR-Transformer refuses it in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
from matcher_helpers import TRAINER

from xtransformer.errors import UserError
from xtransformer.matcher.train import topb_recall
from xtransformer.methods.cnn.matcher import CNNMatcher
from xtransformer.methods.xtransformer import XTransformer
from xtransformer.pipeline.settings import compose_settings
from xtransformer.ranker.negatives import binarize

TINY_CNN = {
    "encoder": "tiny:bert",
    "max_length": 64,
    "filter_widths": [2, 3],
    "feature_maps": 32,
    "batch_size": 32,
    "lr": 1e-2,
    "max_epochs": None,
    "max_steps": 100,
    "checkpoint_every_n_steps": 50,
    "progress": False,
}
XML = {"pooling_chunks": 2, "bottleneck": 32, "embed_dropout": 0.0, "dropout": 0.1}
TOPB = 2


@pytest.fixture(scope="module")
def reuters():
    from xtransformer.data import load_dataset

    return load_dataset("reuters21578", max_docs=1500, eval_split="dev")


def _fit(reuters: Any, cache: Path, option: str, **cnn: Any) -> XTransformer:
    """``method=xtransformer matcher=<option>`` from the configs, sized down for a test."""
    from xtransformer.cache import StageCache
    from xtransformer.context import TrainContext
    from xtransformer.data.inputs import LabeledData

    s = compose_settings("method=xtransformer", f"matcher={option}").main
    ctx = TrainContext(cache=StageCache(cache), lightning=TRAINER)
    return XTransformer.fit(
        LabeledData.from_split(reuters, "train"),
        settings=s,
        context=ctx,
        matcher={"model_name_or_path": "tiny:bert", "topb": TOPB, "progress": False},
        indexing={"n_clusters": 16},
        cnn={**s.cnn.to_dict(), **TINY_CNN, "cache_dir": str(cache / "tok"), **cnn},
    )


def _popularity_p1(reuters: Any) -> float:
    train, dev = reuters.splits["train"], reuters.splits["dev"]
    top = int(np.asarray(train.Y.sum(axis=0)).ravel().argmax())
    return 100 * float(dev.Y[:, top].sum()) / dev.Y.shape[0]


def _popularity_cluster_recall(reuters: Any, C: sp.csr_matrix) -> float:
    """Cluster recall@b of the b clusters most training documents fall in, for every document."""
    train, dev = (binarize(reuters.splits[s].Y @ C) for s in ("train", "dev"))
    top = np.argsort(-np.asarray(train.sum(axis=0)).ravel())[:TOPB]
    rows = np.repeat(np.arange(dev.shape[0]), TOPB)
    shortlist = sp.csr_matrix((np.ones(len(rows)), (rows, np.tile(top, dev.shape[0]))), shape=dev.shape)
    return 100 * topb_recall(shortlist, dev)


@pytest.mark.slow
@pytest.mark.parametrize("option, cnn", [("xmlcnn", XML), ("kimcnn", {})])
def test_a_tiny_cnn_matcher_learns_and_its_folder_round_trips(tmp_path, reuters, option, cnn):
    model = _fit(reuters, tmp_path, option, **cnn)
    assert isinstance(model.matcher, CNNMatcher)
    assert model.matcher.network.output.out_features == model.chain.leaf_assignment.shape[1]
    assert model.train_settings["cnn"]["pooling_chunks"] == (2 if option == "xmlcnn" else 1)
    dev = reuters.splits["dev"]
    result = model.evaluate(dev.texts, dev.Y)
    recall = result.diagnostics["matcher_cluster_recall"][f"cluster_recall@{TOPB}"]
    popular = _popularity_cluster_recall(reuters, model.chain.leaf_assignment)
    assert recall > popular + 5, (recall, popular)
    assert result.metrics["P@1"] > _popularity_p1(reuters) + 10, (result.metrics["P@1"], _popularity_p1(reuters))

    folder = model.save(tmp_path / "model")
    assert (folder / "matcher" / "cnn.json").is_file() and not (folder / "matcher" / "encoder").exists()
    loaded = XTransformer.load(folder)
    assert isinstance(loaded.matcher, CNNMatcher)
    texts = [*dev.texts[:40], ""]
    a, b = model.predict_csr(texts), loaded.predict_csr(texts)
    assert (a != b).nnz == 0 and a.shape == (41, reuters.n_labels)
    if option == "xmlcnn":  # the command line reads the same folder
        _xmc_predict_matches(folder, dev.texts[:20], model.predict_csr(dev.texts[:20]), tmp_path)


def _xmc_predict_matches(folder: Path, texts: list[str], expected: sp.csr_matrix, tmp_path: Path) -> None:
    import json

    src, out = tmp_path / "texts.txt", tmp_path / "pred.jsonl"
    src.write_text("".join(t.replace("\n", " ") + "\n" for t in texts), encoding="utf-8")
    args = ["--model", str(folder), "--input", str(src), "--k", "5", "--output", str(out), "--no-progress"]
    done = subprocess.run([sys.executable, "-m", "xtransformer", "predict", *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    ids = json.loads((folder / "labels.json").read_text())["ids"]
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == len(texts)
    for i, row in enumerate(rows):  # the same top 5 labels with the same scores as in this process
        want = dict(zip(expected[i].indices.tolist(), expected[i].data.tolist()))
        top = sorted(want, key=lambda j: -want[j])[:5]
        assert [ids.index(label) for label in row["labels"]] == top
        assert row["scores"] == pytest.approx([want[j] for j in top], abs=0)


def test_keys_follow_the_cnn_only_with_a_cnn_matcher():
    def keys(*overrides: str) -> dict[str, str]:
        s = compose_settings("method=xtransformer", *overrides)
        return XTransformer.stage_keys(s.main, "data", 90, s.trainer)

    cnn, transformer = keys("matcher=xmlcnn"), keys()
    assert cnn["indexing"] == transformer["indexing"]  # the same tree for either matcher
    assert cnn["matcher"] != transformer["matcher"]
    assert keys("matcher=xmlcnn", "cnn.lr=0.01")["matcher"] != cnn["matcher"]
    assert keys("matcher=xmlcnn", "cnn.feature_maps=64")["ranker"] != cnn["ranker"]
    assert keys("matcher=xmlcnn", "matcher.lr=0.01") == cnn  # the transformer's recipe: unread
    assert keys("cnn.lr=0.01") == transformer  # the cnn group: unread by a transformer matcher
    assert "cnn" not in compose_settings("method=xtransformer").main.training_settings()


def test_xrtransformer_refuses_a_cnn_matcher_in_one_line():
    with pytest.raises(UserError, match=r"^matcher\.architecture='cnn': XR-Transformer fine-tunes") as err:
        compose_settings("method=xrtransformer", "matcher=xmlcnn")
    assert "\n" not in str(err.value)
    with pytest.raises(UserError, match=r"^matcher\.architecture='rnn': expected one of \['transformer', 'cnn'\]"):
        compose_settings("matcher.architecture=rnn")
