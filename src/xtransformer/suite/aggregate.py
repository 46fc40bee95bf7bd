"""Aggregate sweep results into a Table-5-style report: mean ± std over seeds per configuration.

Every run folder holds the ``metrics.json`` written by ``xtransformer.pipeline.run`` (method,
dataset, seed, ``metrics`` of the main method and the resolved Hydra ``config``); every ensemble
folder holds one written by ``xtransformer.ensemble`` (``"method": "ensemble"``, ``members``,
``ensemble_method``, ``metrics``). The suite

1. finds them under one or more sweep folders and turns each into a flat row (``runs.py``);
2. groups rows by configuration and averages over seeds (:func:`aggregate`, here), numbering the
   configurations like the paper's Table 5 when they match its rows (``paper_rows.py``);
3. renders Markdown, CSV and a P@k bar chart (``report.py``), with the papers' published rows the
   runs name (``metrics.json``'s ``published``, ``published.py``) after their data set's rows.

It imports neither Lightning nor Hydra, so it runs in a second anywhere the results are::

    python -m xtransformer.suite.aggregate outputs/train/multiruns/2026-01-01_00-00-00 [--out DIR]
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from xtransformer.suite.paper_rows import _sort_value, assign_config_ids
from xtransformer.suite.report import DECISION_METRICS, DEFAULT_METRICS, PLOT_METRICS, to_markdown, write_report
from xtransformer.suite.runs import (
    DEFAULT_IGNORE,
    AggregateError,
    AggregateWarning,
    _require_runs,
    config_keys,
    scan_runs,
)

# --------------------------------------------------------------------------- aggregation


def aggregate(
    rows: Sequence[Mapping[str, Any]],
    metrics: Sequence[str] = DEFAULT_METRICS,
    group_by: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """One row per configuration (all descriptor keys, or ``group_by``): mean and std over seeds.

    Each output row holds the grouping keys, ``config_id`` (Table 5 numbering where the grid
    matches it, else sequential; per dataset), ``paper_row``, ``n_seeds`` (runs averaged),
    ``seeds``, ``run_dirs``, ``mean`` and ``std`` (metric -> value; std is the sample std, ddof=1,
    and None with a single run). Rows come sorted by dataset, then config id.
    """
    if not rows:
        raise AggregateError("aggregate: no runs to aggregate (rows is empty)")
    metrics = tuple(metrics)
    available = set().union(*(r["metrics"] for r in rows))
    missing = [m for m in metrics if m not in available]
    if missing:
        raise AggregateError(f"metrics {missing} are in no run; available: {sorted(available)}")
    keys = config_keys(rows)
    if group_by is not None:
        unknown = [k for k in group_by if k not in keys]
        if unknown:
            raise AggregateError(f"group_by keys {unknown} are not configuration keys; available: {keys}")
        keys = list(group_by)
    groups: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(row.get(k) for k in keys), []).append(row)
    out = []
    for key, members in groups.items():
        config = dict(zip(keys, key))
        seeds = [m.get("seed") for m in members]
        repeated = sorted({s for s in seeds if s is not None and seeds.count(s) > 1})
        if repeated and group_by is None:  # an explicit group_by merges configurations on purpose
            warnings.warn(
                f"configuration {config} has several runs with seed(s) {repeated}: all are averaged",
                AggregateWarning,
                stacklevel=2,
            )
        out.append(_summarise(config, members, metrics))
    return assign_config_ids(out)


def _summarise(config: dict[str, Any], members: Sequence[Mapping[str, Any]], metrics: Sequence[str]) -> dict[str, Any]:
    seeds = [m.get("seed") for m in members]
    stats = {m: mean_std([r["metrics"].get(m) for r in members]) for m in metrics}
    return {
        **config,
        "n_seeds": len(members),
        "seeds": sorted(seeds, key=_sort_value),
        "run_dirs": sorted(str(m.get("run_dir")) for m in members),
        "mean": {m: s[0] for m, s in stats.items()},
        "std": {m: s[1] for m, s in stats.items()},
    }


def mean_std(values: Iterable[float | None]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (ddof=1) of the finite values; None where undefined."""
    arr = np.array([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    mean = float(arr.mean()) if arr.size else None
    std = float(arr.std(ddof=1)) if arr.size > 1 else None
    return mean, std


def report_sweep(sweep: Path) -> str:
    """Aggregate every run under ``sweep`` (with the published rows they name) into
    ``results.{md,csv,png}`` there; returns the Markdown table (the end of a sweep's callback)."""
    scan = scan_runs([sweep])
    _require_runs(scan, [sweep])
    table = aggregate(scan.rows)
    write_report(table, sweep, published=scan.published)
    return to_markdown(table, published=scan.published)


# --------------------------------------------------------------------------- command line


def _name_list(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m xtransformer.suite.aggregate",
        description="Aggregate sweep folders (metrics.json per run) into a Table-5-style report: "
        "mean ± std over seeds per configuration, as Markdown, CSV and a P@k bar chart.",
    )
    parser.add_argument(
        "sweep_dirs",
        nargs="+",
        type=Path,
        metavar="SWEEP_DIR",
        help="sweep or run folders, searched recursively for metrics.json",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder for results.md, results.csv, results_p_at_k.png (default: the first SWEEP_DIR)",
    )
    parser.add_argument(
        "--metrics",
        type=_name_list,
        default=None,
        help=f"comma-separated metrics for the tables (default: {','.join(DEFAULT_METRICS)}, and those of "
        f"{','.join(DECISION_METRICS)} some run has)",
    )
    parser.add_argument(
        "--ignore",
        type=_name_list,
        default=[],
        help="extra comma-separated config-leaf patterns (fnmatch on dotted paths) that do "
        "not distinguish configurations, e.g. 'trainer.devices,matcher.num_workers'",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        scan = scan_runs(args.sweep_dirs, ignore=(*DEFAULT_IGNORE, *args.ignore))
        for path, why in scan.skipped:
            print(f"skipped incomplete run {path}: {why}", file=sys.stderr)
        _require_runs(scan, args.sweep_dirs)
        plot_metrics = [m for m in PLOT_METRICS if any(m in r["metrics"] for r in scan.rows)]
        if args.metrics is None:
            present = [m for m in DECISION_METRICS if any(m in r["metrics"] for r in scan.rows)]
            args.metrics = [*DEFAULT_METRICS, *present]
        agg = aggregate(scan.rows, metrics=tuple(dict.fromkeys([*args.metrics, *plot_metrics])))
        first = args.sweep_dirs[0]
        out = args.out or (first.parent if first.is_file() else first)
        written = write_report(agg, out, args.metrics, plot_metrics, published=scan.published)
    except AggregateError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(to_markdown(agg, args.metrics, published=scan.published), end="")
    print(
        f"{len(scan.rows)} run(s), {len(agg)} configuration(s), {len(scan.skipped)} skipped; wrote "
        + ", ".join(str(p) for p in written.values()),
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
