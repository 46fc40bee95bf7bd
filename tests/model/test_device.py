"""Where a loaded model predicts (``XMCModel.load(..., device=)``, ``--device``): its networks move,
its linear stages stay on the CPU. On the CPU, predictions are those of a model loaded without a
device; a GPU that is not there is one line before any prediction; ``auto`` is the CPU on a machine
without a GPU; an XR-Linear folder loads with any device and never imports torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from model_helpers import save_toy_kimcnn, save_toy_xrlinear

from xtransformer.cli import predict_main
from xtransformer.methods.combination import Combination
from xtransformer.model import XMCModel
from xtransformer.serve import main as serve_main
from xtransformer.utils.hardware import DeviceError

NO_GPU = not torch.cuda.is_available()
TEXTS = ["zubeka lomira tesano", "", "a text of words the tokenizer has never seen"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("device")
    xrlinear, texts = save_toy_xrlinear(tmp / "xrlinear")
    (tmp / "texts.txt").write_text("".join(t + "\n" for t in [*texts["test"][:20], *TEXTS]), encoding="utf-8")
    return {"kimcnn": save_toy_kimcnn(tmp / "kimcnn"), "xrlinear": xrlinear, "texts": tmp / "texts.txt"}


def test_cpu_and_auto_predict_as_a_model_loaded_without_a_device(folders) -> None:
    texts = folders["texts"].read_text(encoding="utf-8").splitlines()
    default = XMCModel.load(folders["kimcnn"]).predict_csr(texts)
    for device in ("cpu", "auto"):
        model = XMCModel.load(folders["kimcnn"], device=device)
        assert model.device == ("cpu" if NO_GPU or device == "cpu" else "cuda")
        if model.device == "cpu":
            assert (model.predict_csr(texts) != default).nnz == 0


@pytest.mark.skipif(not NO_GPU, reason="a machine without a GPU")
def test_cuda_without_a_gpu_is_one_line_naming_what_is_there(folders, tmp_path: Path, capsys) -> None:
    with pytest.raises(DeviceError, match=r"device 'cuda': no CUDA GPU is visible .*; available: cpu$"):
        XMCModel.load(folders["kimcnn"], device="cuda")
    out = tmp_path / "out.jsonl"
    args = ["--model", str(folders["kimcnn"]), "--input", str(folders["texts"]), "--output", str(out)]
    assert predict_main([*args, "--device", "cuda", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("xmc-predict: error: device 'cuda'") and "available: cpu" in err[0]
    assert not out.exists()  # failed before any prediction
    assert serve_main(["--model", str(folders["kimcnn"]), "--device", "cuda", "--port", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("xmc-serve: error: device 'cuda'"), err


def test_xmc_predict_on_cpu_writes_what_the_default_writes(folders, tmp_path: Path) -> None:
    outputs = []
    for extra in ([], ["--device", "cpu"]):
        out = tmp_path / f"out{len(outputs)}.jsonl"
        args = ["--model", str(folders["kimcnn"]), "--input", str(folders["texts"]), "--output", str(out)]
        assert predict_main([*args, "--no-progress", *extra]) == 0
        outputs.append(out.read_text(encoding="utf-8"))
    assert outputs[0] == outputs[1] and outputs[0].count("\n") == 23


def test_a_combination_moves_its_network_members_only(folders) -> None:
    both = Combination([XMCModel.load(folders["xrlinear"]), XMCModel.load(folders["kimcnn"])])
    texts = folders["texts"].read_text(encoding="utf-8").splitlines()
    before = both.predict_csr(texts)
    assert both.to("auto") is both
    linear, cnn = both.members
    assert linear.device == "cpu" and cnn.device == both.device == ("cpu" if NO_GPU else "cuda")
    if NO_GPU:
        assert (both.predict_csr(texts) != before).nnz == 0
        with pytest.raises(DeviceError, match="cuda"):
            both.to("cuda")
    with pytest.raises(DeviceError, match="expected one of"):
        both.to("gpu")


def test_a_served_model_on_a_gpu_takes_one_worker() -> None:
    from types import SimpleNamespace

    from xtransformer.serve.cli import check_workers_device

    options = SimpleNamespace(workers=4)
    check_workers_device(options, SimpleNamespace(device="cpu"))
    with pytest.raises(ValueError, match="--workers 4: the model predicts on cuda"):
        check_workers_device(options, SimpleNamespace(device="cuda"))


_LINEAR = """
import sys
from xtransformer import XMCModel
for device in ("auto", "cuda", "cpu"):
    model = XMCModel.load(sys.argv[1], device=device)
    assert model.device == "cpu", model.device
    print(model.predict(["oil prices rose"], k=2)[0]["labels"])
assert "torch" not in sys.modules
"""


def test_an_xrlinear_folder_loads_with_any_device_without_torch(folders) -> None:
    out = subprocess.run(
        [sys.executable, "-c", _LINEAR, str(folders["xrlinear"])], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert len(set(out.stdout.strip().splitlines())) == 1  # the same labels on every device


@pytest.mark.skipif(NO_GPU, reason="needs a CUDA GPU")
def test_on_a_gpu_the_network_moves_and_predicts_the_same_labels(folders) -> None:
    texts = folders["texts"].read_text(encoding="utf-8").splitlines()
    cpu, gpu = XMCModel.load(folders["kimcnn"]), XMCModel.load(folders["kimcnn"], device="cuda")
    assert next(gpu.network.parameters()).device.type == "cuda"
    a, b = cpu.predict_csr(texts), gpu.predict_csr(texts)
    assert (a.indices == b.indices).mean() > 0.95 and abs(a - b).max() < 1e-3
