"""Whether the hardware computes bf16 natively, the precision ``trainer.precision=auto`` picks, and
the device a loaded model predicts on (``--device``: :func:`predict_device`).

bf16 autocast pays off only where the hardware multiplies bf16 itself: a CUDA GPU that supports it,
or a CPU with AMX-BF16 or AVX512-BF16. On any other CPU, PyTorch emulates it: on a 2-core AVX2
host a MiniLM training step took 25x as long as in fp32 and encoding 8x
(``experiments/precision``). ``auto`` is therefore bf16-mixed where it is native and
32-true elsewhere.
"""

from __future__ import annotations

import functools
import logging
import os

from xtransformer.errors import UserError

log = logging.getLogger(__name__)

AUTO = "auto"
DEVICES = ("cpu", "cuda", AUTO)  # --device; the API also takes cuda:N
DEVICE_HELP = (
    "where the model's networks (encoder, CNN) predict: cpu (default), cuda (a GPU) or auto (cuda when "
    "a GPU is visible, else cpu); the linear stages always run on the CPU"
)


class DeviceError(UserError):
    """A device that is not there (``--device cuda`` on a machine without a GPU); the message names it."""


@functools.cache
def native_bf16(device_type: str) -> bool:
    """True when ``device_type`` ("cpu", "cuda") multiplies bf16 natively (False when unknown)."""
    import torch

    if device_type == "cuda":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    if device_type != "cpu":
        return False
    try:
        caps = torch.cpu.get_capabilities()
        return bool(caps.get("amx_bf16") or caps.get("avx512_bf16"))
    except (AttributeError, RuntimeError):  # an older torch: its private probes, else assume emulation
        probes = [getattr(torch.cpu, n, None) for n in ("_is_amx_tile_supported", "_is_avx512_bf16_supported")]
        return any(bool(p()) for p in probes if p is not None)


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one, e.g. a container's cpuset)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def device_type(accelerator: str) -> str:
    """The device a Lightning ``accelerator`` setting trains on ("auto": a CUDA GPU when one is visible)."""
    if accelerator == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cuda" if accelerator == "gpu" else accelerator


def resolve_precision(precision: str | int, accelerator: str) -> str:
    """``trainer.precision``, with ``auto`` made concrete: bf16-mixed where bf16 is native, else 32-true.

    Any other value is returned as given; an explicit bf16 on a CPU that emulates it gets a warning.
    """
    dev = device_type(accelerator)
    if str(precision) == AUTO:
        chosen = "bf16-mixed" if native_bf16(dev) else "32-true"
        log.info(
            "trainer.precision=auto: %s (%s %s native bf16)", chosen, dev, "has" if chosen != "32-true" else "lacks"
        )
        return chosen
    if dev == "cpu":
        warn_emulated_bf16(str(precision), "trainer.precision")
    return str(precision)


@functools.cache
def warn_emulated_bf16(precision: str, key: str) -> None:
    """Warn (once per precision and key) when bf16 would run emulated on this CPU."""
    if precision.lower().startswith("bf16") and not native_bf16("cpu"):
        log.warning(
            "%s=%s: this CPU has no native bf16 (no AMX-BF16 / AVX512-BF16), so bf16 runs emulated, "
            "several times slower than fp32; use %s=%s",
            key,
            precision,
            key,
            "auto" if key == "trainer.precision" else "32-true",
        )


def check_device(device: str) -> str:
    """``device`` if it is ``cpu``, ``cuda``, ``cuda:N`` or ``auto`` (checked without torch)."""
    name = str(device).strip().lower()
    kind, _, index = name.partition(":")
    if name in DEVICES or (kind == "cuda" and index.isdigit()):
        return name
    raise DeviceError(f"device {device!r}: expected one of {list(DEVICES)} or cuda:N")


def predict_device(device: str) -> str:
    """The torch device a model's networks predict on: ``auto`` is ``cuda`` when a GPU is visible, else
    ``cpu``; a GPU that is not visible fails in one line naming what is."""
    import torch

    name = check_device(device)
    n_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if name == AUTO:
        return "cuda" if n_gpus else "cpu"
    index = int(name.partition(":")[2] or 0)
    if name.startswith("cuda") and index >= n_gpus:
        build = "" if torch.version.cuda else ", a build without CUDA"
        seen = f"{n_gpus} CUDA GPU(s) visible" if n_gpus else "no CUDA GPU is visible"
        available = ", ".join(["cpu", *(f"cuda:{i}" for i in range(n_gpus))])
        raise DeviceError(f"device {name!r}: {seen} to torch {torch.__version__}{build}; available: {available}")
    return name
