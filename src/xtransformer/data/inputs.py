"""What a method's ``fit`` and ``evaluate`` read: documents, their labels and the label space.

:class:`LabeledData` takes the forms a user has at hand — texts or sparse feature rows, labels as
one list of label ids per document or as a sparse ``N x L`` matrix — checks them once, and keys
their content for the stage cache (the same documents and labels give the same key, wherever
they came from: a dataset folder, a notebook, another program).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from xtransformer.data.errors import DataError
from xtransformer.data.vocab import LabelVocab
from xtransformer.utils.io import settings_key, texts_fingerprint


@dataclass
class LabeledData:
    """Documents (``texts`` and/or ``features``), their labels ``Y`` (csr ``N x L``, 1.0 a
    positive) and the label space (``label_ids``, ``label_names``)."""

    Y: sp.csr_matrix
    label_ids: list[str]
    label_names: list[str]
    texts: list[str] | None = None
    features: sp.csr_matrix | None = None
    source: Path | None = None  # where they were read from (named in errors; not part of the key)

    def __post_init__(self) -> None:
        n = self.Y.shape[0]
        if self.texts is None and self.features is None:
            raise DataError("no documents: give texts (a list of strings) or a sparse feature matrix")
        if self.texts is not None and len(self.texts) != n:
            raise DataError(f"{len(self.texts)} texts but {n} label rows: texts and labels must align")
        if self.features is not None and self.features.shape[0] != n:
            raise DataError(f"{self.features.shape[0]} feature rows but {n} label rows: they must align")
        if self.Y.shape[1] != len(self.label_ids) or len(self.label_names) != len(self.label_ids):
            raise DataError(
                f"labels have {self.Y.shape[1]} columns, {len(self.label_ids)} label ids and "
                f"{len(self.label_names)} names: one of each per label"
            )

    # ------------------------------------------------------------------ building
    @classmethod
    def build(
        cls, inputs: Any, labels: Any, label_ids: Sequence[str] | None = None, label_names: Sequence[str] | None = None
    ) -> LabeledData:
        """From texts (a list of strings) or feature rows (a sparse matrix), and labels as a sparse
        ``N x L`` matrix (column j is ``label_ids[j]``, default ``"j"``) or as one list of label ids
        per document (the label space is ``label_ids``, default the sorted ids seen)."""
        if isinstance(inputs, LabeledData):
            return inputs
        texts, features = _documents(inputs)
        Y, ids = _label_matrix(labels, label_ids)
        names = list(label_names) if label_names is not None else list(ids)
        return cls(Y=Y, label_ids=ids, label_names=names, texts=texts, features=features)

    @classmethod
    def from_split(cls, ds: Any, split: str) -> LabeledData:
        """One split of an :class:`~xtransformer.data.XMCDataset`."""
        part = ds.splits[split]
        return cls(
            Y=part.Y,
            label_ids=list(ds.vocab.ids),
            label_names=list(ds.label_text),
            texts=part.texts,
            features=part.X,
            source=ds.root,
        )

    def like(self, inputs: Any, labels: Any) -> LabeledData:
        """Other documents in this label space (validation or evaluation data)."""
        if isinstance(inputs, LabeledData):
            if inputs.label_ids != self.label_ids:
                raise DataError("validation / evaluation labels are not in the training label space")
            return inputs
        return LabeledData.build(inputs, labels, self.label_ids, self.label_names)

    def take(self, rows: Any) -> LabeledData:
        """The documents of ``rows`` (an index array), in that order, in this label space."""
        rows = np.asarray(rows, dtype=np.int64)
        return LabeledData(
            Y=self.Y[rows],
            label_ids=self.label_ids,
            label_names=self.label_names,
            texts=[self.texts[i] for i in rows] if self.texts is not None else None,
            features=self.features[rows] if self.features is not None else None,
            source=self.source,
        )

    # ------------------------------------------------------------------ facts
    def __len__(self) -> int:
        return self.Y.shape[0]

    @property
    def n_labels(self) -> int:
        return len(self.label_ids)

    def require_texts(self, why: str) -> list[str]:
        """The texts, or one line saying that ``why`` needs them."""
        if self.texts is None:
            raise DataError(
                f"{why} needs the documents' texts, but these data have feature rows only "
                "(XC sparse or npz files, no *_texts.txt): use method=xrlinear",
                self.source,
            )
        return self.texts

    @cached_property
    def key(self) -> str:
        """Content key of the documents, the labels and the label space (cache keys build on it).
        Texts with feature rows (a dataset's own TF-IDF, ``tfidf=given``) key both."""
        docs = texts_fingerprint(self.texts) if self.texts is not None else csr_fingerprint(self.features)
        both = [csr_fingerprint(self.features)] if self.texts is not None and self.features is not None else []
        return settings_key("data", docs, csr_fingerprint(self.Y), self.label_ids, *both)


def csr_fingerprint(mat: sp.spmatrix) -> str:
    """sha256 of a sparse matrix's canonical csr form."""
    import hashlib

    m = sp.csr_matrix(mat)
    if not m.has_canonical_format:  # a copy to put in canonical form; a canonical matrix is read as it is
        m = m.copy()
        m.sum_duplicates()
        m.sort_indices()
    h = hashlib.sha256(repr((m.shape, str(m.dtype))).encode())
    for arr in (m.indptr, m.indices, m.data):
        h.update(np.ascontiguousarray(arr))  # its buffer: the same bytes as tobytes(), without a copy
    return h.hexdigest()


def _documents(inputs: Any) -> tuple[list[str] | None, sp.csr_matrix | None]:
    if sp.issparse(inputs):
        return None, sp.csr_matrix(inputs, dtype=np.float32)
    if isinstance(inputs, str) or not isinstance(inputs, Sequence):
        raise DataError(f"documents must be a list of texts or a sparse feature matrix, got {type(inputs).__name__}")
    bad = next((i for i, t in enumerate(inputs) if not isinstance(t, str)), None)
    if bad is not None:
        raise DataError(f"document {bad} is a {type(inputs[bad]).__name__}, not a string")
    return list(inputs), None


def _label_matrix(labels: Any, label_ids: Sequence[str] | None) -> tuple[sp.csr_matrix, list[str]]:
    if sp.issparse(labels):
        Y = sp.csr_matrix(labels, dtype=np.float32)
        Y.eliminate_zeros()
        Y.data[:] = 1.0
        ids = [str(i) for i in label_ids] if label_ids is not None else [str(j) for j in range(Y.shape[1])]
        return Y, ids
    if isinstance(labels, (str, bytes)) or not isinstance(labels, Sequence):
        raise DataError(
            f"labels must be a sparse N x L matrix or one list of label ids per document, got {type(labels).__name__}"
        )
    lists = [[str(x) for x in ([row] if isinstance(row, str) else row)] for row in labels]
    vocab = LabelVocab(list(label_ids)) if label_ids is not None else LabelVocab.from_labels(lists)
    rows, cols = [], []
    for i, row in enumerate(lists):
        for label in row:
            j = vocab.get(label)
            if j < 0:
                raise DataError(f"document {i}: label {label!r} is not in the label space ({len(vocab)} labels)")
            rows.append(i)
            cols.append(j)
    Y = sp.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)), shape=(len(lists), len(vocab)))
    Y.sum_duplicates()
    Y.data[:] = 1.0
    return Y, list(vocab.ids)
