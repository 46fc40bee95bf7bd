"""Build hook: ship the Hydra configs inside the package.

The top-level ``configs/`` folder stays the source of truth (Hydra, the tests and other branches
edit it there); building a wheel copies it to ``xtransformer/configs/`` so that a non-editable
install finds it through ``importlib.resources`` from any directory (see ``xtransformer.cli``).
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildPyWithConfigs(build_py):
    def run(self) -> None:
        super().run()
        src = ROOT / "configs"
        if src.is_dir():  # an sdist carries configs/ too (MANIFEST.in)
            shutil.copytree(src, Path(self.build_lib) / "xtransformer" / "configs", dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__"))


setup(cmdclass={"build_py": BuildPyWithConfigs})
