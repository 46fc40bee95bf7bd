"""Registry of benchmarked systems: which module runs them, with which interpreter.

A system is a module following the ``benchmarks/phases.py`` protocol, run as ``python -m MODULE``
from the repository root (``benchmarks.ours``, ``benchmarks.peers.pecos_runner``, ...). Peers run
with the python of their own virtual environment (created on demand by ``peers/setup_venvs.sh``);
ours run with this interpreter and are skipped, with the reason, while a name they need is not
importable. Adding a system is one ``SystemSpec`` entry here (plus, for ours, an adapter in ``ours.py``).
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
SETUP_SCRIPT = BENCH_DIR / "peers" / "setup_venvs.sh"


class SystemSetupError(ValueError):
    """Unknown system name, or a peer environment that could not be created."""


@dataclass(frozen=True)
class SystemSpec:
    name: str
    description: str
    module: str  # run as `python -m <module>` from the repository root
    venv: str | None = None  # peer venv name under benchmarks/.venvs; None: this interpreter
    args: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()  # "module:attribute" needed in our env (ours only), e.g. "xtransformer.api:XRLinear"
    needs_xc_text: bool = False  # trains from an XC text file of the train split
    needs_texts: bool = False  # reads the documents (a neural system): text datasets only

    @property
    def is_peer(self) -> bool:
        return self.venv is not None

    def unavailable_reason(self) -> str | None:
        """Why this system cannot run now (a missing module of ours), or None."""
        for req in self.requires:
            module, _, attr = req.partition(":")
            try:
                mod = importlib.import_module(module)
            except ImportError as exc:
                return f"{module} is not importable yet ({exc})"
            try:
                if attr:
                    getattr(mod, attr)
            except ImportError as exc:  # a lazily loaded name whose module does not import
                return f"{module}.{attr} is not importable yet ({exc})"
            except AttributeError:
                return f"{module} has no {attr} yet"
        return None

    def python(self) -> str:
        """The interpreter to run the module with; creates a peer's venv if it is missing."""
        if self.venv is None:
            return sys.executable
        proc = subprocess.run(["bash", str(SETUP_SCRIPT), self.venv], capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemSetupError(
                f"could not create the {self.venv!r} environment with {SETUP_SCRIPT}:\n{proc.stderr[-2000:]}"
            )
        return proc.stdout.strip().splitlines()[-1]

    def argv(self) -> list[str]:
        """The command line, to run with the repository root as the working directory."""
        return [self.python(), "-m", self.module, *self.args]


def _peer(name: str, description: str, runner: str | None = None, venv: str | None = None, **kw: object) -> SystemSpec:
    """A peer library's system: ``benchmarks.peers.<runner>_runner`` run in ``.venvs/<venv>`` (both
    default: ``name``)."""
    module = f"benchmarks.peers.{(runner or name).replace('-', '_')}_runner"
    return SystemSpec(name, description, module, venv=venv or name, **kw)  # type: ignore[arg-type]


def _ours(name: str, description: str, requires: tuple[str, ...], **kw: object) -> SystemSpec:
    adapter = name.removeprefix("ours-")
    return SystemSpec(name, description, "benchmarks.ours", args=("--adapter", adapter), requires=requires, **kw)  # type: ignore[arg-type]


REGISTRY: dict[str, SystemSpec] = {
    s.name: s
    for s in (
        _peer("pecos", "libpecos XLinearModel, PIFA + HierarchicalKMeans, defaults, C++ predict path"),
        _peer("napkinxc", "napkinXC PLT, defaults; exact (default) and beam search"),
        _peer("omikuji", "omikuji, Parabel-like defaults (3 trees)", needs_xc_text=True),
        _peer(
            "pecos-xrt",
            "libpecos XR-Transformer, PECOS's Eurlex-4K recipe with the encoder swapped (--encoder, --steps-scale)",
            needs_texts=True,
        ),
        _peer(
            "lml-linear",
            "LibMultiLabel linear one-vs-rest (train_1vsrest, LIBLINEAR defaults)",
            runner="libmultilabel",
            venv="libmultilabel",
            args=("--model", "1vsrest"),
        ),
        _peer(
            "lml-tree",
            "LibMultiLabel linear tree (train_tree, K=100, dmax=10, beam 10)",
            runner="libmultilabel",
            venv="libmultilabel",
            args=("--model", "tree"),
        ),
        SystemSpec(
            "popular",
            "k most frequent training labels for every document (sanity floor)",
            "benchmarks.ours",
            args=("--adapter", "popular"),
        ),
        _ours(
            "ours-indexing",
            "xtransformer PIFA + hierarchical balanced k-means (index phase only)",
            ("xtransformer.api:build_index", "xtransformer.api:IndexingConfig"),
        ),
        _ours(
            "ours-xrlinear",
            "xtransformer XR-Linear: XRLinear.fit with the settings of `python train.py method=xrlinear`",
            ("xtransformer.api:XRLinear", "xtransformer.api:compose_settings"),
        ),
        _ours(
            "ours-xrtransformer",
            "xtransformer XR-Transformer (+ XR-Linear and their combination when the settings train it) "
            "through the public API (--xr-override)",
            ("xtransformer.api:XRTransformer", "xtransformer.api:compose_settings"),
            needs_texts=True,
        ),
        _ours(
            "ours-pipeline",
            "xtransformer full pipeline (matcher + ranker), default config; text datasets only",
            ("xtransformer.api:run_pipeline", "xtransformer.api:compose_config"),
        ),
    )
}


def get_systems(names: str | list[str]) -> list[SystemSpec]:
    """Look up a comma-separated list (or list) of system names; ``all`` means every one."""
    items = names.split(",") if isinstance(names, str) else list(names)
    items = [n.strip() for n in items if n.strip()]
    if items == ["all"]:
        return list(REGISTRY.values())
    unknown = [n for n in items if n not in REGISTRY]
    if unknown or not items:
        raise SystemSetupError(f"--systems: unknown {unknown or '(empty)'}; known: {', '.join(REGISTRY)}")
    return [REGISTRY[n] for n in items]
