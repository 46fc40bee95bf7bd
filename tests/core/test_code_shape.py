"""The house rules a reader relies on: no Python function in ``src/`` takes more than 8 parameters
or runs over 60 lines (a context record carries what many layers share). The compiled kernels
(``*.pyx``) are outside the rule: their arguments are the raw arrays of the matrices they loop over."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "xtransformer"
MAX_PARAMS, MAX_LINES = 8, 60


def _functions() -> list[tuple[str, int, int]]:
    """(where, parameters, lines) of every function and method in src/ (self / cls not counted)."""
    out = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                names = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs if p.arg not in ("self", "cls")]
                n = len(names) + (a.vararg is not None) + (a.kwarg is not None)
                out.append((f"{path.relative_to(SRC)}:{node.lineno} {node.name}", n, node.end_lineno - node.lineno + 1))
    return out


def test_no_function_takes_more_than_8_parameters_or_runs_over_60_lines():
    functions = _functions()
    assert len(functions) > 500  # the walk found the package
    too_many = [f"{where} ({n} parameters)" for where, n, _ in functions if n > MAX_PARAMS]
    too_long = [f"{where} ({lines} lines)" for where, _, lines in functions if lines > MAX_LINES]
    assert not too_many and not too_long, too_many + too_long


def test_no_module_runs_over_600_lines():
    """A module past 600 lines holds more than one concept (``serve/`` was one file of 1,168)."""
    long = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py") if (n := len(p.read_text().splitlines())) > 600}
    assert not long, long
