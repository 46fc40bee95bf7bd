"""Experiment-suite tools: turn sweep folders into paper-style result tables.

``runs`` (sweep folders -> rows), ``aggregate`` (mean ± std per configuration, and the command
line), ``paper_rows`` (Table 5 numbering), ``report`` (Markdown / CSV / plot), ``table5`` (the
ensembles of rows 7-9 and the end-of-sweep callback), ``ensembles`` (the papers' ensemble sweeps),
``published`` (the seed papers' published rows, ``published.yaml``, set beside runs and tables).

Names are loaded lazily so that ``python -m xtransformer.suite.aggregate`` does not import the
module twice (runpy warns when a package's ``__init__`` already imported the module it runs).
The function ``aggregate`` is imported from ``xtransformer.suite.aggregate`` itself: the package
attribute of that name is the submodule.
"""

from __future__ import annotations

from xtransformer.utils.lazy import lazy_exports

_EXPORTS = {
    "AggregateError": "runs",
    "AggregateWarning": "runs",
    "RunScan": "runs",
    "collect_runs": "runs",
    "scan_runs": "runs",
    "table5_row": "paper_rows",
    "PublishedRow": "published",
    "published_rows": "published",
    "plot_p_at_k": "report",
    "to_csv": "report",
    "to_markdown": "report",
    "write_report": "report",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
