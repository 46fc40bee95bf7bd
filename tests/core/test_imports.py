"""Importing the package changes nothing outside it, and its modules import no cycle.

A library call must not switch a user's process into another mode: importing any module leaves
every environment variable, the logging and warning set-up, the OmegaConf resolvers, Hydra's config
store and torch's threads as they were (offline mode is the user's choice; the Makefile and CI set
it). An import cycle, even through an import inside a function, makes a module's meaning depend on
which one was imported first."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "xtransformer"

# every module of the package imported in a clean child, and what the process looked like before / after
_PROBE = r"""
import json, logging, os, pkgutil, sys, warnings, importlib
def state():
    from omegaconf import OmegaConf
    from hydra.core.config_store import ConfigStore
    import torch
    return {
        "env": dict(os.environ),
        "root_handlers": len(logging.getLogger().handlers),
        "root_level": logging.getLogger().level,
        "warning_filters": len(warnings.filters),
        "resolvers": OmegaConf.has_resolver("by_scale"),
        "config_store": sorted(ConfigStore.instance().repo),
        "threads": torch.get_num_threads(),
    }
for lib in sys.argv[1:]:  # what the package's modules import, first: their own set-up is theirs
    try:
        importlib.import_module(lib)
    except ImportError:
        pass
before = state()
import xtransformer
names = [m.name for m in pkgutil.walk_packages(xtransformer.__path__, "xtransformer.")]
names = [name for name in names if not name.endswith("__main__")]
for name in names:
    importlib.import_module(name)
print(json.dumps({"before": before, "after": state(), "modules": len(names)}))
"""


def test_importing_every_module_changes_no_global_setting():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "WANDB_", "TOKENIZERS_"))}
    env["PYTHONPATH"] = str(SRC)
    files = [*PACKAGE.rglob("*.py")]
    libraries = sorted({m.split(".")[0] for p in files for m in _imported_names(p)} - {"xtransformer", "__future__"})
    cmd = [sys.executable, "-c", _PROBE, *libraries]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["modules"] > 100  # the walk found the package
    before, after = seen["before"], seen["after"]
    added = sorted(set(after["env"]) - set(before["env"]))
    changed = sorted(k for k in before["env"] if after["env"].get(k) != before["env"][k])
    assert not added and not changed, (added, changed)
    assert {k: v for k, v in after.items() if k != "env"} == {k: v for k, v in before.items() if k != "env"}


def _imported_names(path: Path) -> set[str]:
    """Every absolute module name ``path`` imports, anywhere in it."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
    return out


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that ``path`` imports anywhere (functions included), TYPE_CHECKING aside."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()

    def resolve(target: str) -> None:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != name:
            out.add(target)

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, ast.Import):
                for alias in node.names:
                    resolve(alias.name)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                for alias in node.names:  # `from pkg import submodule` reaches the submodule only
                    sub = f"{base}.{alias.name}"
                    resolve(sub if sub in modules else base)
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    visit([child])

    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    return out


def test_no_import_cycle_among_the_modules():
    files = {_module_name(p): p for p in [*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.pyx")]}
    modules = set(files)
    graph = {m: (_imports(p, modules) if p.suffix == ".py" else set()) for m, p in files.items()}
    cycles, done = [], set()

    def walk(node: str, path: list[str]) -> None:
        if node in path:
            cycles.append(path[path.index(node) :] + [node])
            return
        if node in done:
            return
        for nxt in sorted(graph[node]):
            walk(nxt, [*path, node])
        done.add(node)

    for module in sorted(graph):
        walk(module, [])
    assert not cycles, [" -> ".join(c) for c in cycles]
