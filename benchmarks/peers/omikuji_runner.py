"""omikuji with its default (Parabel-like: 3 trees, balanced 2-means, liblinear) hyper-parameters.

Runs inside ``benchmarks/.venvs/omikuji``. Its Python API trains only from an XC-format text file
(written once per dataset by the parent, untimed, next to the npz inputs) and predicts one document per call, so
its throughput measured from Python understates its Rust core.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import omikuji
import scipy.sparse as sp

from benchmarks import phases


class Omikuji(phases.System):
    def prepare(self, data_dir: Path, X: sp.csr_matrix, Y: sp.csr_matrix) -> None:
        # Written by the parent with xtransformer.data.write_xc_sparse (see SystemSpec.needs_xc_text).
        self.train_file = data_dir / phases.xc_text_file(self.args.train_split)
        if not self.train_file.is_file():
            raise phases.PhaseError(f"--data: omikuji needs {self.train_file} (XC text format)")

    def train(self, X: sp.csr_matrix, Y: sp.csr_matrix, model_dir: Path) -> None:
        self.n_labels = Y.shape[1]
        hp = omikuji.Model.default_hyper_param()
        self.model = omikuji.Model.train_on_data(str(self.train_file), hp, n_threads=self.threads)

    def save(self, model_dir: Path) -> None:
        self.model.save(str(model_dir))
        del self.model

    def load(self, model_dir: Path, variant: str) -> None:
        self.model = omikuji.Model.load(str(model_dir))

    def predict(self, X: sp.csr_matrix, k: int, variant: str) -> sp.csr_matrix:
        # The API takes one document at a time as (feature, value) pairs.
        rows = [
            self.model.predict(list(zip(X.indices[a:b].tolist(), X.data[a:b].tolist())), top_k=k)
            for a, b in zip(X.indptr[:-1], X.indptr[1:])
        ]
        lengths = np.array([len(r) for r in rows], dtype=np.int64)
        flat = np.array([p for r in rows for p in r], dtype=np.float64).reshape(-1, 2)
        indptr = np.concatenate([[0], np.cumsum(lengths)])
        return phases.topk_csr(flat[:, 0].astype(np.int64), flat[:, 1], indptr, self.n_labels)

    def extra_info(self) -> dict:
        from importlib.metadata import version

        hp = omikuji.Model.default_hyper_param()
        return {
            "library": "omikuji",
            "version": version("omikuji"),
            "settings": f"default_hyper_param (n_trees={hp.n_trees}, cluster_k={hp.cluster_k}, "
            f"max_depth={hp.max_depth}), beam 10, predict one doc per call",
        }


if __name__ == "__main__":
    phases.main(Omikuji)
