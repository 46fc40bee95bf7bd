"""How well probabilities match frequencies: the reliability table, its expected calibration
error (ECE) and the reliability diagram.

The events are a document's candidate labels (the labels its prediction stores: the model's top
``topk``), each with a probability and whether it is one of the document's labels. ECE =
sum over ``bins`` equal-width probability bins of (share of the events in the bin) x |mean
probability - frequency of true labels| in it; ``ECE@1`` takes each document's most probable label
only (where the probabilities are far from 0 and a decision hangs on them). Labels no candidate
reaches are not events: counted, they would add ~L near-zero probabilities a document and make any
ECE look small.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from xtransformer.calibration.calibrator import entry_targets, row_ranks
from xtransformer.utils.io import atomic_path


@dataclass
class ReliabilityTable:
    """Per probability bin: the events, their mean probability and the frequency of true labels."""

    edges: np.ndarray  # bins + 1
    count: np.ndarray
    mean_prob: np.ndarray  # NaN in an empty bin
    frequency: np.ndarray

    @classmethod
    def of(cls, prob: np.ndarray, target: np.ndarray, bins: int) -> ReliabilityTable:
        edges = np.linspace(0.0, 1.0, bins + 1)
        which = np.clip(np.searchsorted(edges, prob, side="right") - 1, 0, bins - 1)
        count = np.bincount(which, minlength=bins).astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean_prob = np.bincount(which, weights=prob, minlength=bins) / count
            frequency = np.bincount(which, weights=target, minlength=bins) / count
        return cls(edges, count, mean_prob, frequency)

    @property
    def ece(self) -> float:
        filled = self.count > 0
        gaps = np.abs(self.mean_prob[filled] - self.frequency[filled])
        return float((self.count[filled] * gaps).sum() / max(self.count.sum(), 1.0))


def reliability(prob: sp.csr_matrix, Y: sp.spmatrix, bins: int, top1: bool = False) -> ReliabilityTable:
    """The reliability table of the candidate probabilities ``prob`` (csr ``N x L``) against ``Y``;
    ``top1``: each document's most probable label only."""
    prob = sp.csr_matrix(prob)
    target = entry_targets(prob, sp.csr_matrix(Y))
    data = prob.data.astype(np.float64)
    if top1:
        first = row_ranks(prob) == 0
        data, target = data[first], target[first]
    return ReliabilityTable.of(data, target, bins)


def plot_reliability(tables: dict[str, ReliabilityTable], path: Path, title: str) -> Path:
    """The reliability diagram (frequency against mean probability per bin, the diagonal being
    perfect calibration) with the events per bin below, one curve per table."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.0, 6.0))
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    top.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1, label="perfect")
    for name, t in tables.items():
        filled = t.count > 0
        top.plot(t.mean_prob[filled], t.frequency[filled], marker="o", label=f"{name} (ECE {t.ece:.4f})")
        centres = (t.edges[:-1] + t.edges[1:]) / 2
        bottom.bar(centres, t.count, width=np.diff(t.edges) * 0.9, alpha=0.5, label=name)
    top.set(ylabel="frequency of true labels", title=title, xlim=(0, 1), ylim=(0, 1))
    top.legend(fontsize="small", loc="upper left")
    top.grid(alpha=0.3)
    bottom.set(xlabel="predicted probability", ylabel="candidates", yscale="log")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    return path
