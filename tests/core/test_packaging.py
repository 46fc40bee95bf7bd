"""A wheel built once installs without a compiler and works from any directory: configs shipped
inside the package, the compiled modules the wheel carries, ``xmc-train`` runs a job,
``xmc-predict`` predicts from its model folder; the sdist carries the sources the modules compile
from.

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
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

import xtransformer

ROOT = Path(__file__).resolve().parents[2]
SHARED_DATA = ROOT.parent / "shared" / "data"
# what a build reads: the sources, and what the package's metadata and the sdist carry beside them
SOURCES = (
    "pyproject.toml",
    "setup.py",
    "MANIFEST.in",
    "README.md",
    "LICENSE",
    "CHANGELOG.md",
    "CITATION.cff",
    "src",
    "configs",
)
KERNELS = ("xtransformer/ranker/kernels", "xtransformer/indexing/kmeans_level", "xtransformer/indexing/sparse_sums")
EXT_SUFFIX = sysconfig.get_config_var("EXT_SUFFIX")
# no compiler: an install that tried to build anything would fail
NO_COMPILER = {"CC": "false", "CXX": "false"}

pytestmark = pytest.mark.slow


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{cmd}\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    return out


def _seed_compiled_modules(src: Path) -> None:
    """The checkout's compiled modules (``make install`` built them from these sources), put where
    the wheel's build looks for them: it ships them instead of compiling the same sources again
    (~40 s). A source newer than its module (an edited ``.pyx``) is still compiled."""
    lib = src / "build" / f"lib.{sysconfig.get_platform()}-{sys.implementation.cache_tag}"
    for module in (ROOT / "src").rglob(f"*{EXT_SUFFIX}"):
        dest = lib / module.relative_to(ROOT / "src")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(module, dest)


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> Path:
    """A copy of what a build reads (the checkout stays clean: a build writes egg-info beside it)."""
    src = tmp_path_factory.mktemp("pkg") / "src-copy"
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(ROOT / name, src / name)
    return src


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


@pytest.fixture(scope="module")
def wheel(sources) -> Path:
    """``pip wheel . --no-deps``: built once by this interpreter's setuptools, compiled modules inside."""
    build = sources.parent / "build-tree"
    shutil.copytree(sources, build)
    _seed_compiled_modules(build)
    cmd = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w"]
    _run([*cmd, str(sources.parent / "dist"), str(build)], cwd=sources.parent, env=_env())
    return next((sources.parent / "dist").glob("xtransformer-*.whl"))


@pytest.fixture(scope="module")
def installed(wheel) -> tuple[Path, dict[str, str]]:
    root = wheel.parent.parent
    env_dir = root / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)  # ensurepip: offline
    py = env_dir / "bin" / "python"
    env = _env()
    # the dependencies are the ones this interpreter sees (its own site-packages, an outer virtual
    # environment's too): `system_site_packages` would reach the base interpreter's only
    inner = _run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=root, env=env)
    outer = [p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and Path(p).is_dir()]
    (Path(inner.stdout.strip()) / "_outer_site_packages.pth").write_text("\n".join(outer) + "\n")
    env.update(WANDB_MODE="offline", HF_HUB_OFFLINE="1", PATH=f"{env_dir / 'bin'}:{env.get('PATH', '')}")
    # the wheel installs where nothing can be compiled; dependencies come from the outer site-packages
    _run([str(py), "-m", "pip", "install", "--quiet", "--no-deps", str(wheel)], cwd=root, env={**env, **NO_COMPILER})
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


def test_wheel_ships_the_compiled_modules_license_and_typing_marker(wheel):
    version = xtransformer.__version__
    assert wheel.name.startswith(f"xtransformer-{version}-") and not wheel.name.endswith("-none-any.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        metadata = zf.read(f"xtransformer-{version}.dist-info/METADATA").decode()
    assert {f"{k}{EXT_SUFFIX}" for k in KERNELS} <= names
    assert not {n for n in names if n.endswith((".pyx", ".cpp"))}  # the sdist's business
    assert {"xtransformer/py.typed", f"xtransformer-{version}.dist-info/licenses/LICENSE"} <= names
    assert "License-Expression: Apache-2.0" in metadata and f"\nVersion: {version}\n" in metadata
    torch = [line for line in metadata.splitlines() if line.startswith("Requires-Dist: torch")]
    assert torch and "==" not in torch[0]  # a range: the exact torch is the installer's choice


# trains a tiny XR-Linear (the compiled solver, scoring and top-k), saves, loads and predicts
PROBE = """
import importlib, importlib.metadata as md, json, sys, tempfile
import xtransformer
from xtransformer import XMCModel, XRLinear
topics = ["oil crude opec barrel", "grain wheat corn harvest", "bank rate interest loan",
          "ship port cargo vessel", "gold metal mine ounce", "car auto vehicle engine"]
texts = [f"{topics[i % 6]} {topics[(i * 5 + 1) % 6].split()[i % 4]} report {i}" for i in range(120)]
labels = [[i % 6] for i in range(120)]
model = XRLinear.fit(texts, labels, tfidf={"min_df": 1})
folder = tempfile.mkdtemp() + "/model"
model.save(folder)
rows = XMCModel.load(folder).predict([topics[j] for j in range(6)], k=2)
record = {str(f) for f in md.files("xtransformer")}
modules = {m: importlib.import_module(m.replace("/", ".")).__file__ for m in sys.argv[1:]}
print(json.dumps({"top": [r["labels"][0] for r in rows], "modules": modules, "record": sorted(record),
                  "version": [xtransformer.__version__, md.version("xtransformer")]}))
"""


def test_installed_wheel_predicts_with_its_own_compiled_modules(installed, tmp_path):
    py, env = installed
    out = _run([str(py), "-c", PROBE, *KERNELS], cwd=tmp_path, env={**env, **NO_COMPILER})
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["top"] == ["0", "1", "2", "3", "4", "5"]  # each topic's own label first, from the loaded folder
    site = Path(got["modules"][KERNELS[0]]).parents[2]
    assert site.is_relative_to(py.parents[1]) and site.name == "site-packages"  # the venv's, not the checkout's
    for name, path in got["modules"].items():
        assert path == str(site / f"{name}{EXT_SUFFIX}") and f"{name}{EXT_SUFFIX}" in got["record"]
    assert got["version"] == [xtransformer.__version__] * 2


def test_sdist_carries_the_sources_and_compiles_the_modules_from_them(sources, tmp_path):
    """The sdist holds the ``.pyx`` sources, not the checkout's compiled modules or generated C++; a
    build from it generates C++ from them and reaches the compiler (none here: one line saying so)."""
    build_sdist = "import sys; from setuptools import build_meta as b; print(b.build_sdist(sys.argv[1]))"
    name = _run([sys.executable, "-c", build_sdist, str(tmp_path)], cwd=sources, env=_env()).stdout.split()[-1]
    with tarfile.open(tmp_path / name) as tf:
        members = {m.split("/", 1)[1] for m in tf.getnames() if "/" in m}
        tf.extractall(tmp_path, filter="data")
    assert {f"src/{k}.pyx" for k in KERNELS} <= members
    assert {"LICENSE", "CHANGELOG.md", "CITATION.cff", "setup.py", "configs/train.yaml"} <= members
    assert not {m for m in members if m.endswith((".so", ".cpp"))}
    unpacked = tmp_path / name.removesuffix(".tar.gz")
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), "."]
    out = subprocess.run(cmd, cwd=unpacked, env={**_env(), **NO_COMPILER}, capture_output=True, text=True, timeout=600)
    assert out.returncode != 0 and "needs a working C++ compiler" in out.stdout + out.stderr
    assert (unpacked / f"src/{KERNELS[0]}.cpp").is_file()  # generated from the .pyx the sdist carries


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
