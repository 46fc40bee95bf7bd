"""Growth-curve plot for the scaling benchmark (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from xtransformer.api import atomic_path

# phase field -> (legend suffix, line style)
PHASE_STYLES = {"index_s": ("index", "-"), "train_s": ("train", "--"), "predict_s": ("predict", ":")}
AXES = (("labels", "L (labels)"), ("docs", "N (training documents)"))


def plot_scaling(curves: dict[str, dict[str, dict[str, list[list[float]]]]], path: Path, title: str) -> Path:
    """Draw time and peak RSS against L and against N, one colour per system row.

    ``curves[axis][row][field]`` is a list of ``[x, median]`` points; ``axis`` is ``labels`` or
    ``docs``, ``field`` one of ``PHASE_STYLES`` or ``peak_rss_mb``.
    """
    fig, grid = plt.subplots(2, 2, figsize=(11, 8), squeeze=False)
    rows = sorted({row for axis in curves.values() for row in axis})
    colours = {row: f"C{i}" for i, row in enumerate(rows)}
    for col, (axis, xlabel) in enumerate(AXES):
        t_ax, m_ax = grid[0][col], grid[1][col]
        for row, fields in curves.get(axis, {}).items():
            for field, (suffix, style) in PHASE_STYLES.items():
                _line(t_ax, fields.get(field), f"{row} {suffix}", colours[row], style)
            _line(m_ax, fields.get("peak_rss_mb"), row, colours[row], "-")
        t_ax.set_yscale("log")  # times span decades; memory mostly does not
        for ax, ylabel in ((t_ax, "wall time (s)"), (m_ax, "peak RSS (MiB)")):
            ax.set_xscale("log")
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", alpha=0.3)
            if ax.lines:
                ax.legend(fontsize=7)
    fig.suptitle("\n".join(textwrap.wrap(title, 120)), fontsize=9)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return path


def _line(ax: Any, points: list[list[float]] | None, label: str, colour: str, style: str) -> None:
    if points:
        xs, ys = zip(*sorted(points))
        ax.plot(xs, ys, style, color=colour, marker="o", markersize=3, label=label)
