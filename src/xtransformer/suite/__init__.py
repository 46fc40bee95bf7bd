"""Experiment-suite tools: turn sweep folders into paper-style result tables.

Names are loaded lazily so that ``python -m xtransformer.suite.aggregate`` does not import the
module twice (runpy warns when a package's ``__init__`` already imported the module it runs).
The function ``aggregate`` is imported from ``xtransformer.suite.aggregate`` itself: the package
attribute of that name is the submodule.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "AggregateError": "aggregate",
    "AggregateWarning": "aggregate",
    "RunScan": "aggregate",
    "collect_runs": "aggregate",
    "plot_p_at_k": "aggregate",
    "scan_runs": "aggregate",
    "table5_row": "aggregate",
    "to_csv": "aggregate",
    "to_markdown": "aggregate",
    "write_report": "aggregate",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
