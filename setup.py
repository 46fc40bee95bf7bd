"""Build hooks: the compiled loops of the linear path, and the Hydra configs inside the package.

The linear path's inner loops (the ranker's solver and scoring, the k-means levels) are Cython
modules compiled here, at install: ``pip install .`` or ``-e .`` builds them (Cython comes from the
build requirements), so no user runs a build step by hand. They need no numpy headers. A wheel
(``pip wheel . --no-deps -w dist/``) carries them compiled, so installing it needs no compiler; the
sdist carries their ``.pyx`` sources (MANIFEST.in), never generated C++, and compiles them.

The top-level ``configs/`` folder stays the source of truth (Hydra, the tests and other branches
edit it there); building a wheel copies it to ``xtransformer/configs/`` so that a non-editable
install finds it through ``importlib.resources`` from any directory (see ``xtransformer.cli``).
"""

import shutil
from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py
from setuptools.errors import CCompilerError, CompileError, ExecError, PlatformError

ROOT = Path(__file__).resolve().parent


class BuildPyWithConfigs(build_py):
    def run(self) -> None:
        super().run()
        src = ROOT / "configs"
        if src.is_dir():  # an sdist carries configs/ too (MANIFEST.in)
            shutil.copytree(
                src,
                Path(self.build_lib) / "xtransformer" / "configs",
                dirs_exist_ok=True,
                ignore=shutil.ignore_patterns("__pycache__"),
            )


class BuildExtSaysWhy(build_ext):
    """A machine without a C++ compiler gets one line saying what to do, not the compiler's trace."""

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except (CCompilerError, CompileError, ExecError, PlatformError) as err:
            raise SystemExit(
                f"error: compiling {ext.name} needs a working C++ compiler (g++ or clang++): install one, or "
                f"install a wheel built where there is one (pip wheel . --no-deps -w dist/); the build said: {err}"
            ) from None


# (module, source): one extension per compiled module, C++ for std::sort; -g stripped (10x smaller)
KERNELS = [
    ("xtransformer.ranker.kernels", "src/xtransformer/ranker/kernels.pyx"),
    ("xtransformer.indexing.kmeans_level", "src/xtransformer/indexing/kmeans_level.pyx"),
    ("xtransformer.indexing.sparse_sums", "src/xtransformer/indexing/sparse_sums.pyx"),
]
# no fused multiply-adds: the solver's row loops are also compiled for AVX2 and AVX-512 (picked at
# load), and every variant, on every host, must round as the baseline does (the same weights)
COMPILE_ARGS = ["-O3", "-g0", "-ffp-contract=off"]
extensions = [
    Extension(name, [source], language="c++", extra_compile_args=COMPILE_ARGS, extra_link_args=["-s"])
    for name, source in KERNELS
]

setup(
    cmdclass={"build_py": BuildPyWithConfigs, "build_ext": BuildExtSaysWhy},
    ext_modules=cythonize(extensions, language_level=3, quiet=True),
)
