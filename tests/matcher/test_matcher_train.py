"""The matcher stage end to end on a tiny model (single CPU process): fine-tune, cache, encode."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
from matcher_helpers import LossRecorder, fine_tune, matcher_cfg, toy_data
from tiny_models import toy_xmc

from xtransformer.cache import StageCache
from xtransformer.context import TrainContext
from xtransformer.data.inputs import LabeledData
from xtransformer.encoders import ModelNotFoundError
from xtransformer.encoders import tokens as tokens_mod
from xtransformer.matcher import EncodeOptions, LoadedMatcher, MatcherConfig, MatcherInputError, fine_tune_matcher
from xtransformer.matcher import train as train_mod
from xtransformer.matcher.datamodule import instance_cluster_targets
from xtransformer.matcher.train import topb_recall


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, LossRecorder, MatcherConfig]:
    tmp = tmp_path_factory.mktemp("matcher")
    recorder = LossRecorder()
    cfg = matcher_cfg(tmp)
    return fine_tune(cfg, tmp / "cache", [recorder]), recorder, cfg


def test_folder_and_encodings_have_the_documented_shapes(trained: tuple) -> None:
    folder, _, cfg = trained
    assert (folder / "encoder" / "config.json").is_file() and (folder / "head.safetensors").is_file()
    assert (folder / "encoder" / "tokenizer.json").is_file() and (folder / "matcher_config.json").is_file()
    assert not list(folder.rglob("*.pt")), "no pickles in a matcher folder"
    matcher = LoadedMatcher.load(folder)
    assert matcher.meta["global_step"] == cfg.max_steps and "cache_dir" not in matcher.meta
    data, C = toy_data()
    for part in data.values():
        pred = matcher.encode(part.texts, EncodeOptions(topb=cfg.topb, normalize=True, progress=False))
        assert pred.embeddings.shape == (len(part), matcher.meta["hidden_size"]) and pred.embeddings.dtype == np.float32
        np.testing.assert_allclose(np.linalg.norm(pred.embeddings, axis=1), 1.0, atol=1e-5)
        assert sp.isspmatrix_csr(pred.topb) and pred.topb.shape == (len(part), C.shape[1])
        assert (np.diff(pred.topb.indptr) == cfg.topb).all()  # exactly b clusters per document


def test_loss_decreases_and_matcher_learns(trained: tuple) -> None:
    folder, recorder, cfg = trained
    losses = recorder.losses
    assert len(losses) == cfg.max_steps
    assert np.mean(losses[-4:]) < 0.5 * np.mean(losses[:4])
    # 4 clusters, top-3: a learnt matcher keeps almost every true cluster (chance: 0.75).
    data, C = toy_data()
    pred = LoadedMatcher.load(folder).encode(data["test"].texts, EncodeOptions(topb=3, progress=False))
    assert topb_recall(pred.topb, instance_cluster_targets(data["test"].Y, C)) > 0.9
    small = LoadedMatcher.load(folder).encode(["a new text nobody has seen"], EncodeOptions(topb=2, progress=False))
    assert small.topb.shape == (1, C.shape[1]) and small.topb.nnz == 2


def test_second_call_reuses_the_stage(trained: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    folder, _, cfg = trained

    def no_training(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("retrained although nothing that shapes the weights changed")

    monkeypatch.setattr(train_mod, "fit_resumable", no_training)
    again = fine_tune(cfg, folder.parents[3])
    assert again == folder


def test_missing_model_fails_before_any_data_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from xtransformer import XTransformer
    from xtransformer.data import inputs as inputs_mod

    def no_data_work(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("data work started before the model check")

    monkeypatch.setattr(tokens_mod, "_tokenize", no_data_work)
    monkeypatch.setattr(inputs_mod, "texts_fingerprint", no_data_work)
    texts, Y, _ = toy_xmc()
    with pytest.raises(ModelNotFoundError, match="matcher.model_name_or_path="):
        XTransformer.fit(texts["train"], Y["train"], matcher={"model_name_or_path": "no-such-org/not-a-model"})


def test_bad_inputs_are_named(tmp_path: Path) -> None:
    data, C = toy_data()
    cfg = matcher_cfg(tmp_path)
    with pytest.raises(MatcherInputError, match="trainer.max_steps"):
        fine_tune(cfg, tmp_path / "c", max_steps=3)
    from matcher_helpers import TRAINER

    ctx = TrainContext(cache=StageCache(tmp_path / "c"), lightning=TRAINER)
    with pytest.raises(MatcherInputError, match="C has"):
        fine_tune_matcher(ctx, "k", data["train"], C[:5], cfg)
    with pytest.raises(MatcherInputError, match="Y\\[train\\] · C is empty"):
        fine_tune_matcher(ctx, "k", data["train"], sp.csr_matrix(C.shape, dtype=np.float32), cfg)
    from xtransformer.data import DataError

    with pytest.raises(DataError, match="sparse N x L matrix or one list"):
        LabeledData.build(data["train"].texts, data["train"].Y.toarray())


def test_progress_log_reports_step_loss_and_eta(caplog: pytest.LogCaptureFixture) -> None:
    from types import SimpleNamespace

    import torch

    from xtransformer.matcher.progress import ProgressLog

    trainer = SimpleNamespace(global_step=0, max_steps=10, is_global_zero=True, callback_metrics={})
    cb = ProgressLog(every_s=0)
    cb.on_train_start(trainer, None)
    trainer.global_step, trainer.callback_metrics = 5, {"train/loss": torch.tensor(0.25)}
    with caplog.at_level("INFO", logger="xtransformer.matcher"):
        cb.on_train_batch_end(trainer, None, None, None, 4)
        trainer.is_global_zero = False  # other DDP ranks stay quiet
        cb.on_train_batch_end(trainer, None, None, None, 5)
    assert len(caplog.records) == 1
    msg = caplog.records[0].getMessage()
    assert "step 5/10" in msg and "loss 0.2500" in msg and "ETA" in msg
