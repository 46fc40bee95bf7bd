"""LibMultiLabel's linear models on the given TF-IDF: one-vs-rest (``--model 1vsrest``) or its tree.

Runs inside ``benchmarks/.venvs/libmultilabel`` (``libmultilabel`` 0.10.0 from PyPI). Both models are
LibMultiLabel's API with its defaults, as its linear tutorial calls them: ``train_1vsrest(y, x, options="")``
(LIBLINEAR ``-s 1``: L2-regularised L2-loss SVM, dual, C = 1) and ``train_tree(y, x)`` (label tree of
degree K = 100, depth at most 10, built by k-means on label representations; predicted with beam 10).
The library trains on every physical core (its own thread pool): on a 2-core host that is the
harness's 2 threads. Its one-vs-rest model holds dense weights, ``F x L`` float64 (about 7 GB
for 200k features and 4,271 labels): they are saved with ``numpy.save`` beside the pickled rest, so
saving does not copy them. Its ``predict_values`` returns dense ``N x L`` scores; the runner keeps
each row's top k, in chunks of documents.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import libmultilabel.linear as linear
import numpy as np
import scipy.sparse as sp

from benchmarks import phases

MODELS = ("1vsrest", "tree")
CHUNK_DOCS = 2000  # documents scored at a time (dense N x L scores)


class LibMultiLabel(phases.System):
    def train(self, X: sp.csr_matrix, Y: sp.csr_matrix, model_dir: Path) -> None:
        if self.args.model == "tree":
            self.model = linear.train_tree(Y, X, options="", verbose=False)
        else:
            self.model = linear.train_1vsrest(Y, X, options="", verbose=False)

    def save(self, model_dir: Path) -> None:
        flat = self.model if self.args.model == "1vsrest" else None
        if flat is not None and not sp.issparse(flat.weights):
            np.save(model_dir / "weights.npy", np.asarray(flat.weights))
            flat.weights = None
        with open(model_dir / "model.pickle", "wb") as fh:
            pickle.dump(self.model, fh, protocol=pickle.HIGHEST_PROTOCOL)
        del self.model  # predict from disk, like a user would

    def load(self, model_dir: Path, variant: str) -> None:
        with open(model_dir / "model.pickle", "rb") as fh:
            self.model = pickle.load(fh)
        weights = model_dir / "weights.npy"
        if weights.is_file():
            self.model.weights = np.asmatrix(np.load(weights))

    def predict(self, X: sp.csr_matrix, k: int, variant: str) -> sp.csr_matrix:
        starts = range(0, max(X.shape[0], 1), CHUNK_DOCS)
        return sp.vstack([self._topk(X[a : a + CHUNK_DOCS], k) for a in starts], format="csr")

    def _topk(self, X: sp.csr_matrix, k: int) -> sp.csr_matrix:
        scores = np.asarray(linear.predict_values(self.model, X), dtype=np.float32)
        n, n_labels = scores.shape
        k = min(k, n_labels)
        top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        values = np.take_along_axis(scores, top, axis=1)
        indptr = np.arange(n + 1, dtype=np.int64) * k
        return phases.topk_csr(top.ravel(), values.ravel(), indptr, n_labels)

    def extra_info(self) -> dict:
        from importlib.metadata import version

        settings = {
            "1vsrest": "train_1vsrest(options='') (LIBLINEAR -s 1, C 1), dense weights",
            "tree": "train_tree defaults (K 100, dmax 10), predict_values beam 10",
        }[self.args.model]
        return {
            "library": "libmultilabel",
            "version": version("libmultilabel"),
            "liblinear": version("liblinear-multicore"),
            "settings": settings,
        }


EXTRA = (("--model", {"choices": MODELS, "required": True, "help": "LibMultiLabel linear technique"}),)

if __name__ == "__main__":
    phases.main(LibMultiLabel, extra=EXTRA)
