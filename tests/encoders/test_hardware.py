"""``trainer.precision=auto``: bf16 only where the hardware computes it natively, and a warning
wherever bf16 would run emulated (25x slower training steps than fp32 on an AVX2-only CPU)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from xtransformer.encoders.embed import autocast_context
from xtransformer.pipeline.settings import compose_settings
from xtransformer.utils import hardware

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def _settings(*overrides: str):
    return compose_settings("logger=none", *overrides)


@pytest.fixture
def cpu_bf16(monkeypatch):
    """Set whether this CPU 'has' native bf16; the once-only warnings are forgotten around the test."""

    def native(value: bool) -> None:
        monkeypatch.setattr(hardware, "native_bf16", lambda device_type: value)

    hardware.warn_emulated_bf16.cache_clear()
    yield native
    hardware.warn_emulated_bf16.cache_clear()


@pytest.mark.parametrize("native, expected", [(True, "bf16-mixed"), (False, "32-true")])
def test_auto_precision_is_bf16_only_where_native(cpu_bf16, native, expected):
    cpu_bf16(native)
    s = _settings("method=xrtransformer")  # the method's config asks for auto
    assert s.trainer.precision == expected
    from xtransformer.context import TrainContext

    assert TrainContext(trainer=s.trainer, lightning=s.lightning).trainer_kwargs["precision"] == expected  # Lightning
    assert s.records()["train"]["trainer"]["precision"] == expected  # what the model folder and loggers read


def test_auto_precision_keys_the_weights_it_trains(cpu_bf16):
    """Weights fine-tuned in bf16 and in fp32 differ, so the two resolutions never share a cache entry."""
    keys = {}
    for native in (True, False):
        cpu_bf16(native)
        keys[native] = _settings("method=xrtransformer").stage_keys("src", 90)
    assert keys[True]["xrtransformer"]["xrlevel"][0] != keys[False]["xrtransformer"]["xrlevel"][0]
    assert keys[True]["xrlinear"] == keys[False]["xrlinear"]
    assert keys[True]["xrtransformer"]["tfidf"] == keys[False]["xrtransformer"]["tfidf"]


def test_explicit_bf16_on_an_emulating_cpu_is_kept_with_a_warning(cpu_bf16, caplog):
    cpu_bf16(False)
    with caplog.at_level(logging.WARNING, logger="xtransformer.utils.hardware"):
        s = _settings("method=xrtransformer", "trainer.precision=bf16-mixed")
        _settings("method=xrtransformer", "trainer.precision=bf16-mixed")  # warned once, not per call
    assert s.trainer.precision == "bf16-mixed"
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and warned[0].startswith("trainer.precision=bf16-mixed: this CPU has no native bf16")
    assert "use trainer.precision=auto" in warned[0]


def test_bf16_prediction_on_an_emulating_cpu_warns_naming_the_setting(cpu_bf16, caplog):
    cpu_bf16(False)
    with (
        caplog.at_level(logging.WARNING, logger="xtransformer.utils.hardware"),
        autocast_context("bf16-mixed", torch.device("cpu")),
    ):
        pass
    assert any(
        r.getMessage().startswith("inference_precision=bf16-mixed: this CPU has no native bf16") for r in caplog.records
    )
    caplog.clear()
    cpu_bf16(True)
    hardware.warn_emulated_bf16.cache_clear()
    cpu = torch.device("cpu")
    with (
        caplog.at_level(logging.WARNING, logger="xtransformer.utils.hardware"),
        autocast_context("bf16-mixed", cpu),
        autocast_context("32-true", cpu),
    ):
        pass
    assert not caplog.records


@pytest.mark.parametrize(
    "caps, expected",
    [
        ({"amx_bf16": True, "avx512_bf16": False}, True),
        ({"amx_bf16": False, "avx512_bf16": True}, True),
        ({"amx_bf16": False, "avx512_bf16": False, "avx2": True}, False),
    ],
)
def test_native_bf16_reads_the_cpu_capabilities(monkeypatch, caps, expected):
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: caps)
    hardware.native_bf16.cache_clear()
    try:
        assert hardware.native_bf16("cpu") is expected
    finally:
        hardware.native_bf16.cache_clear()
