"""Label copies: a label that lives in several leaf clusters is one pseudo-label per (label, cluster).

Label disentanglement (Liu et al., NeurIPS 2021) gives a label up to λ leaf clusters. The rankers
keep their one-cluster-per-column layout by training every (label, cluster) pair of the
overlapping ``C`` (``L x K``) as its own column: copy ``p`` is label ``label_of[p]`` in cluster
``C_copies[p]`` with that cluster's negatives, and the copy columns of ``Y`` are duplicates of the
label's column. At prediction the scores of the copies a document reached map back to their label
and merge into one score (``max``, or ``mean`` over the copies the beam reached, as PECOS's
``examples/overlap-xmc`` does) before the top-k.

A partition (one cluster per label) has no copies: :meth:`LabelCopies.of` returns ``None`` and the
models run exactly the code they ran before disentanglement existed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from xtransformer.ranker.errors import RankerError
from xtransformer.ranker.kernels import merge_copies
from xtransformer.ranker.negatives import binarize
from xtransformer.topk import Candidates
from xtransformer.utils.io import load_json, save_json

MERGES = ("max", "mean")
COPIES_DIR = "copies"


@dataclass
class LabelCopies:
    """The pseudo-label layout of an overlapping ``C``: copy ``p`` stands for label ``label_of[p]``.

    Copies are the nonzeros of ``C`` in row order (label-major, clusters ascending).
    """

    label_of: np.ndarray  # int64, one entry per copy
    n_labels: int
    merge: str = "max"

    def __post_init__(self) -> None:
        check_merge(self.merge)
        self.label_of = np.asarray(self.label_of, dtype=np.int64)

    @classmethod
    def of(cls, C: sp.spmatrix, merge: str = "max") -> tuple[LabelCopies | None, sp.csr_matrix]:
        """The copies of ``C`` and their one-cluster-per-row matrix ``C_copies`` (``P x K``).

        ``(None, C)`` when ``C`` is a partition: nothing to copy, nothing to merge.
        """
        check_merge(merge)
        C = binarize(C)
        C.sort_indices()
        per_label = np.diff(C.indptr)
        if np.all(per_label == 1):
            return None, C
        if np.any(per_label == 0):
            raise RankerError(f"label copies: label {int(np.flatnonzero(per_label == 0)[0])} is in no cluster")
        P = C.nnz
        C_copies = sp.csr_matrix(
            (np.ones(P, np.float32), C.indices.copy(), np.arange(P + 1, dtype=np.int64)), shape=(P, C.shape[1])
        )
        return cls(np.repeat(np.arange(C.shape[0], dtype=np.int64), per_label), C.shape[0], merge), C_copies

    @property
    def n_copies(self) -> int:
        return len(self.label_of)

    @property
    def max_per_label(self) -> int:
        return int(np.bincount(self.label_of, minlength=self.n_labels).max(initial=1))

    def expand(self, Y: sp.spmatrix) -> sp.csr_matrix:
        """``N x P`` targets: copy ``p``'s column is its label's column of ``Y``."""
        return sp.csr_matrix(sp.csc_matrix(Y)[:, self.label_of])

    def collapse(self, C_copies: sp.spmatrix) -> sp.csr_matrix:
        """The overlapping ``L x K`` assignment back from the copies' ``P x K``."""
        E = sp.csr_matrix(
            (np.ones(self.n_copies, np.float32), (self.label_of, np.arange(self.n_copies))),
            shape=(self.n_labels, self.n_copies),
        )
        return binarize(E @ C_copies)

    def search_width(self, k: int) -> int:
        """Copies to keep so that ``k`` distinct labels survive the merge (every label's copies may rank)."""
        return k * self.max_per_label

    def merge_topk(self, c: Candidates, k: int) -> Candidates:
        """Copies' scores -> one score per (document, label), merged by ``self.merge`` (``mean``: over
        the copies this document reached; PECOS: unreached copies are not zeros); the top ``k`` kept.
        ``c`` must be grouped by document (as every ``Candidates`` producer here leaves it)."""

        if k < 1:
            raise RankerError(f"label copies: k must be >= 1, got {k!r}")
        n = len(c.doc)
        out_doc, out_label, out_score = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.float32)
        kept = merge_copies(
            c.doc.astype(np.int64, copy=False),
            c.item.astype(np.int64, copy=False),
            c.score.astype(np.float32, copy=False),
            self.label_of,
            self.n_labels,
            k,
            self.merge == "mean",
            out_doc,
            out_label,
            out_score,
        )
        return Candidates(out_doc[:kept], out_label[:kept], out_score[:kept], c.n_docs)

    def merge_scores(self, S: sp.spmatrix, k: int) -> sp.csr_matrix:
        """``N x P`` copy scores -> ``N x L`` label scores (top ``k`` a row)."""
        if S.shape[1] != self.n_copies:
            raise RankerError(f"label copies: scores have {S.shape[1]} columns, expected {self.n_copies} copies")
        return self.merge_topk(Candidates.from_csr(S), k).to_csr(self.n_labels)

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        np.save(folder / "label_of.npy", self.label_of)
        save_json({"n_labels": self.n_labels, "merge": self.merge}, folder / "copies.json")

    @classmethod
    def load(cls, folder: Path) -> LabelCopies | None:
        """The copies saved in ``folder``; ``None`` when the model has none (a partition)."""
        if not (folder / "copies.json").is_file():
            return None
        meta = load_json(folder / "copies.json")
        return cls(np.load(folder / "label_of.npy"), int(meta["n_labels"]), meta["merge"])


def check_merge(merge: str, key: str = "merge") -> None:
    if merge not in MERGES:
        raise RankerError(f"{key} must be one of {list(MERGES)}, got {merge!r}")
