"""One level of one-vs-all linear rankers: weights ``W`` over clusters ``C``, scored on a beam.

The shared core of XR-Linear's levels (``hierarchical.py``) and the neural path's ranker
(``linear.py``). Training is ``fit.train_levels``; the scoring layout is ``scoring.PairScorer``.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from xtransformer.ranker.errors import RankerError
from xtransformer.ranker.kernels import select_topk
from xtransformer.ranker.postprocess import PostProcessor
from xtransformer.ranker.scoring import PairScorer, pair_chunks
from xtransformer.topk import Candidates, concat, dedupe_max, topk
from xtransformer.utils.io import load_csr, load_json, save_csr, save_json
from xtransformer.utils.memory import release_free_memory


@dataclass(eq=False)
class LinearLevel:
    """OVA weights of one level: ``W`` (``(F + has_bias) x L``; csc as trained, csr as loaded) and
    clusters ``C`` (``L x K``).

    A level loaded to predict keeps its weights only in the scoring layout (``PairScorer``), which
    holds each of them once: ``W`` is rebuilt from it if asked for (saving, inspecting).
    """

    _W: sp.csc_matrix | sp.csr_matrix | None
    C: sp.csr_matrix
    bias: float
    _scorer: PairScorer | None = field(default=None, repr=False)

    @property
    def W(self) -> sp.csc_matrix | sp.csr_matrix:
        if self._W is None:
            self._W = self._scorer.weights()
        return self._W

    @property
    def n_features(self) -> int:
        return self._shape[0] - (1 if self.bias > 0 else 0)

    @property
    def n_labels(self) -> int:
        return self._shape[1]

    @property
    def n_weights(self) -> int:
        return int(self._W.nnz) if self._W is not None else self._scorer.n_weights

    @property
    def _shape(self) -> tuple[int, int]:
        return self._W.shape if self._W is not None else (self._scorer.F1, self._scorer.n_labels)

    def columns(self, first: int) -> sp.csr_matrix:
        """``W``'s columns from ``first`` on (csr ``(F + has_bias) x (L - first)``), without
        rebuilding the rest from the scoring layout."""
        if self._W is not None:  # csr sliced as it is: converting the whole level costs more than the slice
            W = self._W if sp.isspmatrix_csr(self._W) else sp.csc_matrix(self._W)
            return sp.csr_matrix(W[:, first:])
        return self._scorer.weights(first)

    def keep_layout_only(self) -> LinearLevel:
        """Drop ``W`` once the scoring layout holds it (a level where each label sits in one
        cluster: the layout then holds every weight once)."""
        if self._get_scorer().hard:
            self._W = None
        return self

    def appended_in_layout(self, new: LinearLevel, threads: int = 1) -> LinearLevel | None:
        """This level with ``new``'s columns after its own, in the scoring layout alone (the one
        this level keeps: fitted or loaded, ``W`` is never rebuilt), merged in ``threads``
        threads; None where it keeps ``W``."""
        if self._W is not None:
            return None
        scorer = self._scorer.appended(sp.csr_matrix(new.W), new.C, threads)
        return LinearLevel(None, sp.vstack([self.C, new.C], format="csr"), self.bias, scorer)

    @property
    def n_clusters(self) -> int:
        return self.C.shape[1]

    def _get_scorer(self) -> PairScorer:
        if self._scorer is None:
            self._scorer = PairScorer(self.W, self.C, self.bias)
        return self._scorer

    def prepare(self) -> LinearLevel:
        """Build the scoring layout now (a loaded model's first prediction is then as fast as the next)."""
        self._get_scorer()
        return self

    def score(
        self, X: sp.csr_matrix, parents: Candidates, post: PostProcessor, keep: int, threads: int = 1
    ) -> Candidates:
        """Score the labels of every (document, cluster) pair in ``parents``; keep ``keep`` per doc.

        ``parents.score`` must already be in the post-processor's combined space.
        """
        if X.shape[1] != self.n_features:
            raise RankerError(f"ranker: `X` has {X.shape[1]} features but the model was trained on {self.n_features}")
        if len(parents.item) and (parents.item.max() >= self.n_clusters or parents.item.min() < 0):
            raise RankerError(f"ranker: shortlist cluster ids must lie in [0, {self.n_clusters})")
        scorer = self._get_scorer()
        chunks = pair_chunks(parents, np.diff(X.indptr), scorer.n_max, threads)
        hard = scorer.hard

        def run(sel: slice) -> Candidates:
            doc, node, parent = parents.doc[sel], parents.item[sel], parents.score[sel]
            raw = scorer.pair_scores(X, doc, node)
            labels = scorer.slot_label[node]
            final = post.combine(raw, parent[:, None])
            if hard:
                return best_labels(doc, final, labels, parents.n_docs, keep)
            valid = labels >= 0  # a label under several kept clusters: keep its best score once
            c = Candidates(
                np.broadcast_to(doc[:, None], labels.shape)[valid], labels[valid], final[valid], parents.n_docs
            )
            return topk(dedupe_max(c), keep)

        if threads > 1 and len(chunks) > 1:
            with ThreadPoolExecutor(threads) as pool:  # scipy's sparse products release the GIL
                parts = list(pool.map(run, chunks))
        else:
            parts = [run(s) for s in chunks]
        return concat(parts, parents.n_docs)


def best_labels(doc: np.ndarray, score: np.ndarray, label: np.ndarray, n_docs: int, k: int) -> Candidates:
    """The ``k`` best labels of each document from ``P x S`` score / label rows (row ``p`` is
    document ``doc[p]``'s, grouped; label -1 is padding), best first, ties to the smaller label."""
    if k < 1:
        raise RankerError(f"ranker: keep must be >= 1, got {k!r}")
    n = min(len(doc) * label.shape[1], k * len(doc))  # at most k a document, and no more than the cells
    out_doc, out_label, out_score = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.float32)
    kept = select_topk(
        doc.astype(np.int64, copy=False),
        score.astype(np.float32, copy=False),
        label.astype(np.int64, copy=False),
        k,
        out_doc,
        out_label,
        out_score,
    )
    return Candidates(out_doc[:kept], out_label[:kept], out_score[:kept], n_docs)


def save_level(level: LinearLevel, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    save_csr(level.W.tocsr(), folder / "W.npz")
    save_csr(level.C, folder / "C.npz")
    save_json({"bias": level.bias, "n_features": level.n_features}, folder / "level.json")


def load_level(folder: Path) -> LinearLevel:
    for name in ("W.npz", "C.npz", "level.json"):
        if not (folder / name).is_file():
            raise RankerError(f"{folder}: missing {name}; not a saved ranker level")
    meta = load_json(folder / "level.json")
    # W stays csr, as stored: the scoring layout is built from its rows (no csc copy to predict)
    level = LinearLevel(load_csr(folder / "W.npz"), load_csr(folder / "C.npz"), float(meta["bias"]))
    if level.n_features != int(meta["n_features"]) or level.C.shape[0] != level.n_labels:
        raise RankerError(f"{folder}: W {level.W.shape} and C {level.C.shape} do not match level.json {meta}")
    level.prepare().keep_layout_only()  # a loaded level is there to predict
    release_free_memory()  # W and the layout's build scratch: a serving process keeps only the layout
    return level
