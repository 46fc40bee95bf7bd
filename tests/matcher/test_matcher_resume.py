"""A killed matcher run, started again with the same call, ends where an uninterrupted one does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from matcher_helpers import Crash, LossRecorder, fine_tune
from tiny_models import tiny_model_dir

from xtransformer.matcher import MatcherConfig


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    head = load_file(folder / "head.safetensors")
    encoder = load_file(folder / "encoder" / "model.safetensors")
    return {**{f"head.{k}": v for k, v in head.items()}, **encoder}


@pytest.mark.parametrize(
    "batch_size,every,crash_at,resumed_step",
    [
        (16, 2, 3, 2),  # 6 batches per epoch: resume in the middle of epoch 0
        (32, 3, 5, 3),  # 3 batches per epoch: resume from the checkpoint at the end of epoch 0
    ],
)
def test_resume_equals_uninterrupted(
    tmp_path: Path, batch_size: int, every: int, crash_at: int, resumed_step: int
) -> None:
    cfg = MatcherConfig(
        model_name_or_path=str(tiny_model_dir("bert")),
        max_length=32,
        batch_size=batch_size,
        lr=3e-3,
        head_lr=3e-2,
        max_steps=6,
        checkpoint_every_n_steps=every,
        topb=2,
        cache_dir=str(tmp_path / "cache"),
        progress=False,
        seed=7,
    )
    straight = LossRecorder()
    first = fine_tune(cfg, tmp_path / "straight", [straight])

    with pytest.raises(RuntimeError, match="simulated crash"):
        fine_tune(cfg, tmp_path / "resumed", [Crash(crash_at)])
    assert not list((tmp_path / "resumed" / "stages" / "matcher").glob("toy")), "a crashed stage is not committed"
    resumed = LossRecorder()
    second = fine_tune(cfg, tmp_path / "resumed", [resumed])

    assert len(resumed.losses) == cfg.max_steps - resumed_step  # only the missing steps ran
    assert resumed.losses == pytest.approx(straight.losses[resumed_step:], abs=1e-5)
    a, b = _weights(first), _weights(second)
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-5, rtol=1e-5, msg=name)
