"""A non-editable ``pip install .`` works from any directory: configs shipped inside the package,
``xmc-train`` runs a job, ``xmc-predict`` predicts from its model folder.

The virtual environment reuses the site-packages of the interpreter running the tests for the
dependencies (no download, no second torch), whether that is a system Python or another virtual
environment, and the package itself is built into it from the checkout; the test checks that what
runs is the installed copy, not the checkout's ``src/``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARED_DATA = ROOT.parent / "shared" / "data"

pytestmark = pytest.mark.slow


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{cmd}\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    return out


def _seed_compiled_modules(src: Path) -> None:
    """The checkout's compiled modules (``make install`` built them from these sources), put where
    the wheel's build looks for them: it ships them instead of compiling the same sources again
    (~40 s). A source newer than its module (an edited ``.pyx``) is still compiled."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    lib = src / "build" / f"lib.{sysconfig.get_platform()}-{sys.implementation.cache_tag}"
    for module in (ROOT / "src").rglob(f"*{suffix}"):
        dest = lib / module.relative_to(ROOT / "src")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(module, dest)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("pkg")
    env_dir = root / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)  # ensurepip: offline
    py = env_dir / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # the dependencies are the ones this interpreter sees (its own site-packages, an outer virtual
    # environment's too): `system_site_packages` would reach the base interpreter's only
    inner = _run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=root, env=env)
    outer = [p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and Path(p).is_dir()]
    (Path(inner.stdout.strip()) / "_outer_site_packages.pth").write_text("\n".join(outer) + "\n")
    env.update(WANDB_MODE="offline", HF_HUB_OFFLINE="1", PATH=f"{env_dir / 'bin'}:{env.get('PATH', '')}")
    # a wheel built by this interpreter's setuptools from a copy of the sources (the checkout stays
    # clean), installed into the venv; dependencies come from the outer site-packages (no download)
    src = root / "src-copy"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "src", "configs"):
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy2
        copy(
            ROOT / name,
            src / name,
            **({"ignore": shutil.ignore_patterns("__pycache__", "*.egg-info")} if (ROOT / name).is_dir() else {}),
        )
    _seed_compiled_modules(src)
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(root / "dist"),
            str(src),
        ],
        cwd=root,
        env=env,
    )
    wheel = next((root / "dist").glob("xtransformer-*.whl"))
    _run([str(py), "-m", "pip", "install", "--quiet", "--no-deps", str(wheel)], cwd=root, env=env)
    return py, env


def test_installed_package_is_used_and_ships_its_configs(installed, tmp_path):
    py, env = installed
    out = _run(
        [
            str(py),
            "-c",
            "import xtransformer, xtransformer.configuration as c; print(xtransformer.__file__); print(c.config_dir())",
        ],
        cwd=tmp_path,
        env=env,
    )
    module_file, config_dir = out.stdout.split()
    assert str(ROOT / "src") not in module_file and "site-packages" in module_file
    assert Path(config_dir, "train.yaml").is_file() and "site-packages" in config_dir
    help_text = _run([str(py), "-m", "xtransformer", "train", "--help"], cwd=tmp_path, env=env).stdout
    assert "method" in help_text and "matcher" in help_text
    # the shipped option files extend the base nodes the records generate
    probe = "from xtransformer.pipeline.settings import compose_settings as c; s = c('xrlinear=hard_negatives')"
    probe += "; print(s.methods['xrlinear'].xrlinear.n_trees, s.methods['xrlinear'].xrlinear.model.added_max_iter)"
    assert _run([str(py), "-c", probe], cwd=tmp_path, env=env).stdout.split()[-2:] == ["3", "2"]
    # the seed papers' published rows are package data
    probe = "from xtransformer.suite.published import select; print(select(['x-transformer/eurlex-4k/parabel'])[0].url)"
    assert _run([str(py), "-c", probe], cwd=tmp_path, env=env).stdout.split()[-1].startswith("https://")


def test_installed_xmc_train_and_predict_from_any_directory(installed, tmp_path):
    if not (SHARED_DATA / "reuters21578").is_dir():
        pytest.skip("shared data not available")
    py, env = installed
    bin_dir = py.parent
    run_dir = tmp_path / "run"
    _run(
        [
            str(bin_dir / "xmc-train"),
            "method=xrlinear",
            "logger=none",
            "data.max_docs=300",
            f"data.data_dir={SHARED_DATA}",
            f"paths.cache_dir={tmp_path / 'cache'}",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=tmp_path,
        env=env,
    )
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["metrics"]["P@1"] > 0.3
    texts = tmp_path / "texts.txt"
    texts.write_text("oil prices rose as opec cut output\ngrain exports fell\n")
    out = _run(
        [
            str(bin_dir / "xmc-predict"),
            "--model",
            str(run_dir / "model" / "xrlinear"),
            "--input",
            str(texts),
            "--k",
            "3",
        ],
        cwd=tmp_path,
        env=env,
    )
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    assert len(rows) == 2 and all(len(r["labels"]) == 3 for r in rows)
