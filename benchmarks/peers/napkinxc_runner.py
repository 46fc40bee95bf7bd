"""napkinXC Probabilistic Label Tree with its defaults; predicts with exact and beam search.

Runs inside ``benchmarks/.venvs/napkinxc``. The PLT builds its hierarchical k-means tree inside
``fit`` (so there is no separate index phase) and writes the model to its output folder as it
trains. Its default exact search is several times slower than beam search at the same P@k, so
both are reported as variants of one trained model.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from napkinxc.models import PLT

from benchmarks import phases


class Napkinxc(phases.System):
    variants = ("exact", "beam")

    def train(self, X: sp.csr_matrix, Y: sp.csr_matrix, model_dir: Path) -> None:
        self.n_labels = Y.shape[1]
        self.model = PLT(str(model_dir), threads=self.threads, seed=self.seed)
        self.model.fit(X, Y)

    def save(self, model_dir: Path) -> None:
        del self.model  # fit already wrote it; predict from disk

    def load(self, model_dir: Path, variant: str) -> None:
        # A fresh object per variant: set_params() on a fitted PLT crashes napkinXC 0.7.2.
        self.model = PLT(str(model_dir), threads=self.threads, tree_search_type=variant)
        self.model.load()

    def predict(self, X: sp.csr_matrix, k: int, variant: str) -> sp.csr_matrix:
        pred = _pairs_to_csr(self.model.predict_proba(X, top_k=k), self.n_labels)
        self.model.unload()
        return pred

    def extra_info(self) -> dict:
        from importlib.metadata import version

        return {
            "library": "napkinxc",
            "version": version("napkinxc"),
            "settings": "PLT defaults (hierarchicalKmeans arity 2, liblinear log loss); "
            "variants: exact search (default) and beam search (width 10)",
        }


def _pairs_to_csr(rows: list, n_labels: int) -> sp.csr_matrix:
    """napkinXC returns one list of (label, prob) per document; flatten without a per-row loop body."""
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    flat = np.array(list(itertools.chain.from_iterable(rows)), dtype=np.float64).reshape(-1, 2)
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    return phases.topk_csr(flat[:, 0].astype(np.int64), flat[:, 1], indptr, n_labels)


if __name__ == "__main__":
    phases.main(Napkinxc)
