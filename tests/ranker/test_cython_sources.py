"""The compiled modules are built with ``wraparound=False``: Cython may then hand a negative index
straight to the object, so ``arr[-1]`` is undefined behaviour even on a numpy array. Built on a
lent GPU machine (Python 3.12, its own Cython), PIFA's ``label_sums`` read ``work[-1]`` as index
-91 of 90 and every run failed in indexing; this machine's build happened to work. Plain
Python code in these modules that indexes from the end must sit in a function decorated with
``@cython.wraparound(True)``.
"""

from __future__ import annotations

import io
import tokenize
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "xtransformer"
PYX = sorted(SRC.rglob("*.pyx"))


def negative_indices(text: str) -> list[tuple[int, str]]:
    """``(line, function)`` of every negative literal index or slice bound (``a[-1]``, ``a[1:-1]``,
    ``a[i, -1]``) outside functions decorated ``@cython.wraparound(True)``."""
    found, brackets, func, safe, decorators = [], [], "<module>", False, []
    prev = None
    toks = [
        t
        for t in tokenize.generate_tokens(io.StringIO(text).readline)
        if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
    ]
    for i, tok in enumerate(toks):
        if tok.start[1] == 0 and tok.type == tokenize.OP and tok.string == "@":
            decorators.append(text.splitlines()[tok.start[0] - 1])
        elif tok.start[1] == 0 and tok.type == tokenize.NAME and tok.string in ("def", "cdef", "cpdef"):
            func = toks[i + 1].string
            safe = any("wraparound(True)" in d for d in decorators)
            decorators = []
        if tok.type == tokenize.OP and tok.string in "([{":
            brackets.append(tok.string)
        elif tok.type == tokenize.OP and tok.string in ")]}":
            brackets and brackets.pop()
        elif (
            tok.type == tokenize.OP
            and tok.string == "-"
            and brackets
            and brackets[-1] == "["
            and prev is not None
            and prev.string in ("[", ":", ",")
            and i + 1 < len(toks)
            and toks[i + 1].type == tokenize.NUMBER
            and not safe
        ):
            found.append((tok.start[0], func))
        prev = tok
    return found


def test_the_check_sees_negative_indices_and_the_decorator():
    src = (
        "def f(a):\n    return a[-1] + a[1:-1].sum() + a[0, -2]\n\n"
        "@cython.wraparound(True)\ndef g(a):\n    return a[-1]\n\n"
        "def h(a):\n    return f(a, -1) + a[i - 1]  # a[-1] in a comment\n"
    )
    assert negative_indices(src) == [(2, "f"), (2, "f"), (2, "f")]


@pytest.mark.parametrize("path", PYX, ids=[p.name for p in PYX])
def test_compiled_modules_index_from_the_end_only_where_wraparound_is_on(path):
    text = path.read_text(encoding="utf-8")
    assert "wraparound=False" in text.splitlines()[0], f"{path.name}: expected the module-wide directives on line 1"
    bad = negative_indices(text)
    assert not bad, (
        f"{path.name}: negative index under wraparound=False at "
        + ", ".join(f"line {n} ({fn})" for n, fn in bad)
        + "; decorate the function with @cython.wraparound(True) or index with len() - 1"
    )
