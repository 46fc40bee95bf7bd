"""train_matcher / predict_matcher end to end on a tiny model (single CPU process)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import pytest
import scipy.sparse as sp

from tiny_models import tiny_model_dir, toy_xmc
from xtransformer.encoders import ModelNotFoundError
from xtransformer.matcher import (
    MatcherConfig,
    MatcherInputError,
    MatcherOutputs,
    load_matcher_model,
    predict_matcher,
    train_matcher,
)
from xtransformer.encoders import tokens as tokens_mod
from xtransformer.matcher import train as train_mod

TRAINER = {"accelerator": "cpu", "devices": 1, "enable_progress_bar": False, "enable_model_summary": False,
           "num_sanity_val_steps": 0, "log_every_n_steps": 1}


class LossRecorder(pl.Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        self.losses.append(float(trainer.callback_metrics["train/loss"]))


def _cfg(tmp_path: Path, **overrides: Any) -> MatcherConfig:
    # Mean pooling: a random tiny model's first token needs far more steps to learn to summarise.
    values = dict(model_name_or_path=str(tiny_model_dir("bert")), pooling="mean", max_length=32, batch_size=16,
                  lr=3e-3, head_lr=3e-2, warmup_ratio=0.2, max_steps=36, topb=3, checkpoint_every_n_steps=10,
                  val_every_n_steps=12, cache_dir=str(tmp_path / "cache"), progress=False)
    values.update(overrides)
    return MatcherConfig(**values)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[MatcherOutputs, LossRecorder, MatcherConfig, tuple]:
    tmp = tmp_path_factory.mktemp("matcher")
    data = toy_xmc()
    recorder = LossRecorder()
    cfg = _cfg(tmp, save_embeddings_dtype="float16", normalize_embeddings=True)
    out = train_matcher(cfg, TRAINER, *data, tmp / "out", callbacks=[recorder])
    return out, recorder, cfg, data


def test_artifacts_have_the_documented_shapes(trained: tuple) -> None:
    out, _, cfg, (texts, Y, C) = trained
    hidden = load_matcher_model(out.model_dir).meta["hidden_size"]
    assert out.splits == ("train", "dev", "test")
    for split, docs in texts.items():
        emb = out.embeddings(split)
        assert emb.shape == (len(docs), hidden) and emb.dtype == np.float16
        np.testing.assert_allclose(np.linalg.norm(emb.astype(np.float32), axis=1), 1.0, atol=2e-3)
        top = out.topb(split)
        assert sp.isspmatrix_csr(top) and top.shape == (len(docs), C.shape[1])
        assert (np.diff(top.indptr) == cfg.topb).all()  # exactly b clusters per document
    model = out.model_dir
    assert (model / "encoder" / "config.json").is_file() and (model / "head.pt").is_file()
    assert (model / "encoder" / "tokenizer.json").is_file() and (model / "matcher_config.json").is_file()
    metrics = out.metrics
    assert set(metrics[f"recall@{cfg.topb}"]) == {"train", "dev", "test"}
    assert metrics["global_step"] == cfg.max_steps
    assert (out.out_dir / "logs").is_dir()


def test_loss_decreases_and_matcher_learns(trained: tuple) -> None:
    out, recorder, cfg, _ = trained
    losses = recorder.losses
    assert len(losses) == cfg.max_steps
    assert np.mean(losses[-4:]) < 0.5 * np.mean(losses[:4])
    # 4 clusters, top-3: a learnt matcher keeps almost every true cluster (chance: 0.75).
    assert out.metrics["recall@3"]["test"] > 0.9


def test_predict_matcher_matches_saved_artifacts(trained: tuple) -> None:
    out, _, cfg, (texts, _, _) = trained
    pred = predict_matcher(out.model_dir, texts["test"], progress=False)
    assert pred.embeddings.dtype == np.float32
    np.testing.assert_allclose(pred.embeddings, out.embeddings("test").astype(np.float32), atol=2e-3)
    saved = out.topb("test")
    np.testing.assert_array_equal(pred.topb.indices, saved.indices)
    np.testing.assert_allclose(pred.topb.data, saved.data, atol=1e-4)
    small = predict_matcher(out.model_dir, ["a new text nobody has seen"], topb=2, progress=False)
    assert small.topb.shape == (1, saved.shape[1]) and small.topb.nnz == 2


def test_second_call_reuses_outputs_and_model(trained: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    out, _, cfg, data = trained

    def no_training(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("retrained although nothing that shapes the weights changed")

    monkeypatch.setattr(train_mod, "_fit", no_training)
    again = train_matcher(cfg, TRAINER, *data, out.out_dir)
    assert again.splits == out.splits
    np.testing.assert_array_equal(again.embeddings("dev"), out.embeddings("dev"))
    # Only an inference setting changes: the fine-tuned model is reused, the shortlist redone.
    wider = train_matcher(_cfg(out.out_dir.parent, save_embeddings_dtype="float16", normalize_embeddings=True,
                               topb=2), TRAINER, *data, out.out_dir)
    assert (np.diff(wider.topb("test").indptr) == 2).all()


def test_missing_model_fails_before_any_data_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_tokenising(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("data work started before the model check")

    monkeypatch.setattr(tokens_mod, "_tokenize", no_tokenising)
    monkeypatch.setattr(train_mod, "texts_fingerprint", no_tokenising)
    with pytest.raises(ModelNotFoundError, match="matcher.model_name_or_path="):
        train_matcher(_cfg(tmp_path, model_name_or_path="no-such-org/not-a-model"), TRAINER, *toy_xmc(),
                      tmp_path / "out")


def test_bad_inputs_are_named(tmp_path: Path) -> None:
    texts, Y, C = toy_xmc()
    cfg = _cfg(tmp_path)
    with pytest.raises(MatcherInputError, match="trainer.max_steps"):
        train_matcher(cfg, {**TRAINER, "max_steps": 3}, texts, Y, C, tmp_path)
    with pytest.raises(MatcherInputError, match="C has"):
        train_matcher(cfg, TRAINER, texts, Y, C[:5], tmp_path)
    with pytest.raises(MatcherInputError, match="'train'"):
        train_matcher(cfg, TRAINER, {"dev": texts["dev"]}, Y, C, tmp_path)
    with pytest.raises(MatcherInputError, match="dense|sparse"):
        train_matcher(cfg, TRAINER, texts, {**Y, "train": Y["train"].toarray()}, C, tmp_path)


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
