"""Render aggregated sweep results: Markdown and CSV tables (mean ± std over seeds) and a P@k bar chart."""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from xtransformer.suite.paper_rows import _sort_value
from xtransformer.suite.published import PublishedRow
from xtransformer.suite.runs import STAT_KEYS, AggregateError, config_keys
from xtransformer.utils.io import atomic_path

DEFAULT_METRICS = ("P@1", "P@3", "P@5", "R@1", "R@3", "R@5")
# added to the default tables when some run has them: R-Precision, and a calibrated model's
# decided-set F1 scores (global threshold) and expected calibration error
DECISION_METRICS = ("RP@5", "micro-F1", "macro-F1", "example-F1", "ECE")
PLOT_METRICS = ("P@1", "P@3", "P@5")
REPORT_FILES = {"md": "results.md", "csv": "results.csv", "png": "results_p_at_k.png"}

# --------------------------------------------------------------------------- rendering

# Table 5's columns: (row key, header).
TABLE_COLUMNS = (
    ("dataset", "Dataset"),
    ("config_id", "Config. ID"),
    ("indexing", "indexing"),
    ("matcher", "matching"),
    ("ranker_features", "ranker input"),
    ("negatives", "negative-sampling"),
)


def _aggregated_metrics(agg: Sequence[Mapping[str, Any]], metrics: Sequence[str] | None) -> list[str]:
    """``metrics``, or all those aggregated; a metric that was not aggregated is an error."""
    done = list(dict.fromkeys(m for r in agg for m in r["mean"]))
    if metrics is None:
        return done
    missing = [m for m in metrics if m not in done]
    if missing:
        raise AggregateError(f"metrics {missing} were not aggregated; pass them to aggregate() (have {done})")
    return list(metrics)


def _cell(key: str, value: Any) -> str:
    if value is None:
        return "—"
    text = str(value)
    return text.upper() if key == "negatives" else text


def format_mean_std(mean: float | None, std: float | None, digits: int = 2) -> str:
    if mean is None:
        return "—"
    return f"{mean:.{digits}f}" if std is None else f"{mean:.{digits}f} ± {std:.{digits}f}"


def extra_columns(agg: Sequence[Mapping[str, Any]]) -> list[str]:
    """Descriptor keys outside Table 5's columns whose values differ between configurations."""
    shown = {k for k, _ in TABLE_COLUMNS}
    keys = [k for k in config_keys(agg) if k not in shown and k not in STAT_KEYS]
    return [k for k in keys if len({_sort_value(r.get(k)) for r in agg}) > 1]


# published rows: their record (metrics.json's ``published``) by id
Published = Mapping[str, Mapping[str, Any]]


def to_markdown(
    agg: Sequence[Mapping[str, Any]],
    metrics: Sequence[str] | None = None,
    digits: int = 2,
    published: Published | None = None,
) -> str:
    """A Markdown table laid out like the paper's Table 5, metrics as "mean ± std", plus seeds.

    ``metrics`` defaults to every metric that was aggregated. ``published``: the papers' rows the
    runs name, each after its data set's configurations (Config. ID ``published: <id>``, the
    figures as printed, — where the paper has none).
    """
    metrics = _aggregated_metrics(agg, metrics)
    extras = extra_columns(agg)
    header = [h for _, h in TABLE_COLUMNS] + extras + list(metrics) + ["seeds"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for row in with_published(agg, published):
        if isinstance(row, PublishedRow):
            cells = published_cells(row, len(extras), metrics)
        else:
            cells = [_cell(k, row.get(k)) for k, _ in TABLE_COLUMNS] + [_cell(k, row.get(k)) for k in extras]
            cells += [format_mean_std(row["mean"].get(m), row["std"].get(m), digits) for m in metrics]
            cells.append(str(row["n_seeds"]))
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def with_published(agg: Sequence[Mapping[str, Any]], published: Published | None) -> list[Any]:
    """``agg``'s rows with each data set's published rows after its block (sets no run has: last)."""
    rows = [PublishedRow.from_record(k, v) for k, v in (published or {}).items()]
    out: list[Any] = []
    for i, row in enumerate(agg):
        out.append(row)
        dataset = str(row.get("dataset"))
        if i + 1 == len(agg) or str(agg[i + 1].get("dataset")) != dataset:
            out += [p for p in rows if p.dataset == dataset]
    shown = {str(r.get("dataset")) for r in agg}
    return out + [p for p in rows if p.dataset not in shown]


def published_cells(row: PublishedRow, n_extras: int, metrics: Sequence[str]) -> list[str]:
    """A published row's cells: Table 5's configuration columns where the paper gives them (else
    its method as the matching), the figures as printed."""
    c = row.config
    cells = [row.dataset, f"published: {row.id}", c.get("indexing", "—"), c.get("matching", row.method)]
    cells += [c.get("ranker input", "—"), c.get("negatives", "—")] + ["—"] * n_extras
    return cells + [row.printed.get(m, "—") for m in metrics] + ["—"]


def to_csv(
    agg: Sequence[Mapping[str, Any]], metrics: Sequence[str] | None = None, published: Published | None = None
) -> str:
    """CSV: config columns, ``n_seeds``, ``seeds``, then ``<metric>_mean`` and ``<metric>_std``;
    a published row (``config_id`` ``published: <id>``) has its printed figure as the mean."""
    metrics = _aggregated_metrics(agg, metrics)
    keys = [k for k in config_keys(agg) if k not in STAT_KEYS and k != "dataset"]
    header = ["dataset", "config_id", "paper_row", *keys, "n_seeds", "seeds"]
    header += [f"{m}_{stat}" for m in metrics for stat in ("mean", "std")] + ["run_dirs"]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    for row in agg:
        values = [row.get(k) for k in ("dataset", "config_id", "paper_row", *keys, "n_seeds")]
        values.append(" ".join(str(s) for s in row["seeds"]))
        values += [row[stat].get(m) for m in metrics for stat in ("mean", "std")]
        values.append(";".join(row["run_dirs"]))
        writer.writerow(["" if v is None else v for v in values])
    for p in (r for r in with_published(agg, published) if isinstance(r, PublishedRow)):
        figures = [p.printed.get(m, "") if stat == "mean" else "" for m in metrics for stat in ("mean", "std")]
        writer.writerow([p.dataset, f"published: {p.id}", "", *[""] * (len(keys) + 2), *figures, ""])
    return buf.getvalue()


def plot_p_at_k(
    agg: Sequence[Mapping[str, Any]], path: str | os.PathLike, metrics: Sequence[str] = PLOT_METRICS
) -> Path:
    """Grouped bar chart of ``metrics`` per configuration id with std error bars; one panel per dataset."""
    # Figure + Agg canvas, not pyplot: no global backend switch, safe next to other plotting code.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    metrics = [m for m in metrics if any(r["mean"].get(m) is not None for r in agg)]
    if not agg or not metrics:
        raise AggregateError(f"plot_p_at_k: nothing to plot (no configuration has any of {list(metrics)})")
    datasets = list(dict.fromkeys(str(r.get("dataset")) for r in agg))
    widest = max(sum(str(r.get("dataset")) == d for r in agg) for d in datasets)
    fig = Figure(figsize=(max(5.0, 0.2 * widest * len(metrics) + 2.5), 3.2 * len(datasets)))
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(datasets), 1, squeeze=False)[:, 0]
    width = 0.8 / len(metrics)
    for ax, dataset in zip(axes, datasets):
        block = [r for r in agg if str(r.get("dataset")) == dataset]
        x = np.arange(len(block))
        for j, metric in enumerate(metrics):
            means = [np.nan if r["mean"].get(metric) is None else r["mean"][metric] for r in block]
            errs = [r["std"].get(metric) or 0.0 for r in block]
            ax.bar(x + (j - (len(metrics) - 1) / 2) * width, means, width, yerr=errs, capsize=3, label=metric)
        ax.set_xticks(x, [str(r["config_id"]) for r in block])
        ax.set(xlabel="config id", ylabel="%", title=dataset)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")  # never over the bars
    fig.tight_layout()
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    return path


def _write_text(text: str, path: Path) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return path


def write_report(
    agg: Sequence[Mapping[str, Any]],
    out_dir: str | os.PathLike,
    metrics: Sequence[str] | None = None,
    plot_metrics: Sequence[str] = PLOT_METRICS,
    published: Published | None = None,
) -> dict[str, Path]:
    """Write ``results.md``, ``results.csv`` (both with the ``published`` rows) and
    ``results_p_at_k.png`` into ``out_dir`` atomically."""
    out = Path(out_dir)
    return {
        "md": _write_text(to_markdown(agg, metrics, published=published), out / REPORT_FILES["md"]),
        "csv": _write_text(to_csv(agg, metrics, published), out / REPORT_FILES["csv"]),
        "png": plot_p_at_k(agg, out / REPORT_FILES["png"], plot_metrics),
    }
