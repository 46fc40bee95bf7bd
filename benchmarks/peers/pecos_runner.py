"""libpecos XR-Linear: PIFA label embeddings, hierarchical k-means tree, XLinearModel, defaults.

Runs inside ``benchmarks/.venvs/pecos``. Prediction goes through PECOS's C++ path
(``XLinearModel.load(dir, is_predict_only=True)``), about 20x faster than the Python path.
"""

from __future__ import annotations

from pathlib import Path

import scipy.sparse as sp
from pecos.xmc import Indexer, LabelEmbeddingFactory
from pecos.xmc.xlinear.model import XLinearModel

from benchmarks import phases


class Pecos(phases.System):
    has_index = True

    def index(self, X: sp.csr_matrix, Y: sp.csr_matrix) -> None:
        label_feat = LabelEmbeddingFactory.create(Y, X, method="pifa")
        self.chain = Indexer.gen(label_feat, indexer_type="hierarchicalkmeans", threads=self.threads, seed=self.seed)

    def train(self, X: sp.csr_matrix, Y: sp.csr_matrix, model_dir: Path) -> None:
        self.model = XLinearModel.train(X, Y, C=self.chain, threads=self.threads)

    def save(self, model_dir: Path) -> None:
        self.model.save(str(model_dir))
        del self.model  # predict from disk, like a user would

    def load(self, model_dir: Path, variant: str) -> None:
        self.model = XLinearModel.load(str(model_dir), is_predict_only=True)

    def predict(self, X: sp.csr_matrix, k: int, variant: str) -> sp.csr_matrix:
        return self.model.predict(X, only_topk=k, threads=self.threads)

    def extra_info(self) -> dict:
        import pecos

        return {
            "library": "libpecos",
            "version": pecos.__version__,
            "settings": "PIFA + hierarchicalkmeans (defaults), XLinearModel.train defaults, predict-only C++ path",
        }


if __name__ == "__main__":
    phases.main(Pecos)
