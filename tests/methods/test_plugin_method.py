"""A method from another package: ``pip install examples/plugin_method`` registers ``popularity`` by
its entry point, ``python train.py method=popularity`` trains it beside XR-Linear with the settings
its record declares, and its folder loads back as its class; the suite's own code is not touched.

The package is installed into a fresh virtual environment that sees this interpreter's packages
(no download) and the checkout's ``src/``, so the test leaves this interpreter as it was."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "plugin_method"

pytestmark = pytest.mark.slow


def _run(cmd: list[str], env: dict[str, str], cwd: Path = ROOT) -> subprocess.CompletedProcess:
    out = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"{cmd}\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module")
def plugin_python(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("plugin")
    venv.EnvBuilder(with_pip=True).create(root / "venv")
    py = root / "venv" / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env |= {"PYTHONPATH": str(ROOT / "src"), "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
    inner = _run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], env)
    outer = [p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and Path(p).is_dir()]
    (Path(inner.stdout.strip()) / "_outer_site_packages.pth").write_text("\n".join(outer) + "\n")
    # what a user types, without the index (the dependencies are here already), from a copy: a build
    # leaves its egg-info beside the sources, which would register the method for every test after it
    source = shutil.copytree(EXAMPLE, root / "plugin_method")
    _run([py, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index", source], env)
    return py, env


def test_an_installed_plugin_trains_through_the_run_and_loads_back(plugin_python, tmp_path):
    py, env = plugin_python
    run_dir = tmp_path / "run"
    _run(
        [
            py,
            "train.py",
            "method=popularity",
            "popularity.smoothing=1.0",  # a key of the plugin's own record: its group exists
            "data.max_docs=300",
            "tfidf.max_features=2000",
            "logger=none",
            f"paths.cache_dir={tmp_path / 'cache'}",
            f"hydra.run.dir={run_dir}",
        ],
        env,
    )
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["method"] == "popularity" and set(metrics["results"]) == {
        "xrlinear",
        "popularity",
        "popularity+xrlinear",
    }
    assert metrics["settings"]["train"]["popularity"] == {"smoothing": 1.0}
    assert 0 < metrics["results"]["popularity"]["P@1"] < metrics["results"]["xrlinear"]["P@1"]
    check = (
        "import sys; from xtransformer import XMCModel; m = XMCModel.load(sys.argv[1]); "
        "print(type(m).__module__, sorted(map(str, m.abilities)), m.predict(['any text'], k=2)[0]['labels'])"
    )
    out = _run([py, "-c", check, run_dir], env).stdout.split(maxsplit=1)
    assert out[0] == "xtransformer_popularity"
    assert out[1].strip() == "['calibration', 'feature_rows'] ['earn', 'acq']"


def test_without_the_package_its_folder_fails_in_one_line(plugin_python, tmp_path, monkeypatch):
    py, env = plugin_python
    folder = tmp_path / "pop"
    code = (
        "import sys; from xtransformer_popularity import Popularity; "
        "Popularity.fit(['a b', 'c d'], [['x'], ['y']]).save(sys.argv[1])"
    )
    _run([py, "-c", code, folder], env)
    from xtransformer import XMCModel, methods
    from xtransformer.model import ModelError

    monkeypatch.setattr(methods, "plugin_methods", dict)  # a Python without the package, whatever this one has
    with pytest.raises(ModelError, match=r"unknown model kind 'popularity'; this xtransformer knows .* installed\)$"):
        XMCModel.load(folder)
