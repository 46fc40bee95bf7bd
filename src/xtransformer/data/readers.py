"""Readers and writers for the file formats XMC data comes in.

- raw-text layout: ``{split}_texts.txt`` (one document a line), ``{split}_labels.txt``
  (space-separated string label ids), ``{split}_ids.txt``, ``label_map.txt``, ``label_text.txt``
  (id TAB name [TAB alternative names]);
- the sparse XC-repository format: header ``N F L`` then ``l1,l2 f:v f:v ...`` per line;
- ``X.{split}.npz`` / ``Y.{split}.npz`` CSR pairs (see ``xtransformer.utils.io``).

Every reader reports bad input as a ``DataError`` naming the file and the line.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from xtransformer.data.errors import DataError
from xtransformer.data.vocab import LabelVocab
from xtransformer.utils.io import atomic_path


def read_lines(path: str | os.PathLike) -> list[str]:
    """Read a UTF-8 file as lines; LF, CRLF and CR-only (old Mac) line ends are all accepted.

    A file's line end is ``\\n`` (a ``\\r`` before it is dropped) unless the file has no ``\\n`` at
    all, in which case it is ``\\r``: a lone ``\\r`` inside a document of an LF file stays text.
    ``str.splitlines`` would also split on form feeds and Unicode separators that occur inside
    documents and silently misalign texts with labels, so it is not used. A UTF-8 byte order mark
    (written by Windows editors) is dropped: it would otherwise become part of the first label id
    or word.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError("file not found", path)
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n" if b"\n" in raw else b"\r", 0, err.start) + 1
        raise DataError(
            f"undecodable bytes {raw[err.start : err.end]!r} (not UTF-8): {err.reason}", path, line
        ) from None
    text = text.removeprefix("\ufeff")
    if not text:
        return []
    end = "\n" if "\n" in text else "\r"
    lines = text.split(end)
    if lines[-1] == "":
        lines.pop()
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines]


def read_texts(path: str | os.PathLike, allow_empty: bool = False) -> list[str]:
    texts = read_lines(path)
    if not allow_empty:
        for i, t in enumerate(texts):
            if not t.strip():
                raise DataError("empty document (set data.allow_empty_docs=true to keep it)", path, i + 1)
    return texts


def check_label_id(label: str, path: str | os.PathLike, line: int) -> None:
    """Label ids are separated by white space only. A comma in an id almost always means a file
    written for the comma-separated XC convention: read as one id, ``a,b`` would silently become
    one compound label, so it is rejected with the line named."""
    if "," in label:
        raise DataError(
            f"label id {label!r} contains a comma: label ids are separated by spaces "
            f"(write {' '.join(p for p in label.split(',') if p)!r}); ids may not contain commas",
            path,
            line,
        )


def read_label_lines(path: str | os.PathLike, allow_empty: bool = False) -> list[list[str]]:
    rows = [line.split() for line in read_lines(path)]
    for i, row in enumerate(rows):
        if not row and not allow_empty:
            raise DataError(
                "empty label line (every document needs at least one label; "
                "set data.allow_empty_labels=true to keep unlabeled documents)",
                path,
                i + 1,
            )
        for label in row:
            check_label_id(label, path, i + 1)
    return rows


def read_label_map(path: str | os.PathLike) -> LabelVocab:
    ids = []
    for i, line in enumerate(read_lines(path)):
        label = line.strip()
        if not label or len(label.split()) != 1:
            raise DataError(f"expected one label id per line, got {line!r}", path, i + 1)
        check_label_id(label, path, i + 1)
        ids.append(label)
    try:
        return LabelVocab(ids)
    except DataError as err:
        raise DataError(str(err), path) from None


def read_label_text(path: str | os.PathLike, vocab: LabelVocab) -> tuple[list[str], int]:
    """Label names aligned with ``vocab``: ``name`` plus alternative names when given.

    Labels missing from the file fall back to their id; the count of those is returned.
    """
    names: list[str | None] = [None] * len(vocab)
    for i, line in enumerate(read_lines(path)):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) < 2:
            raise DataError("expected 'id<TAB>name[<TAB>alternative names]'", path, i + 1)
        idx = vocab.get(parts[0].strip())
        if idx < 0:
            continue  # a name for a label outside the label space is harmless
        text = parts[1].strip()
        if len(parts) > 2 and parts[2].strip():
            text = f"{text} ({parts[2].strip()})"
        names[idx] = text or None
    missing = sum(n is None for n in names)
    return [n if n is not None else vocab.ids[j] for j, n in enumerate(names)], missing


def labels_to_csr(
    rows: Sequence[Sequence[str]], vocab: LabelVocab, path: str | os.PathLike | None = None
) -> sp.csr_matrix:
    """Binary N x L CSR from per-document label id lists; unknown ids raise with their line."""
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    flat = [label for r in rows for label in r]
    cols = np.fromiter((vocab.get(label) for label in flat), dtype=np.int64, count=len(flat))
    if (cols < 0).any():
        pos = int(np.flatnonzero(cols < 0)[0])
        line = int(np.searchsorted(np.cumsum(lengths), pos, side="right")) + 1
        raise DataError(f"label id {flat[pos]!r} is not in the label map (label_map.txt)", path, line)
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    Y = sp.csr_matrix((np.ones(len(cols), dtype=np.float32), cols, indptr), shape=(len(rows), len(vocab)))
    Y.sum_duplicates()
    Y.data[:] = 1.0  # a label repeated on one line is still one positive
    return Y


def read_xc_sparse(path: str | os.PathLike) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """Read the XC-repository sparse format into (X: N x F, Y: N x L) float32 CSR."""
    lines = read_lines(path)
    if not lines:
        raise DataError("empty file; expected a header 'N F L'", path, 1)
    try:
        n, n_feat, n_lab = (int(v) for v in lines[0].split())
    except ValueError:
        raise DataError(f"bad header {lines[0]!r}; expected 'N F L'", path, 1) from None
    body = lines[1:]
    if len(body) != n:
        raise DataError(f"header says {n} documents, found {len(body)} lines", path, 1)
    x_ptr, x_idx, x_val, y_ptr, y_idx = [0], [], [], [0], []
    for i, line in enumerate(body):
        lineno = i + 2
        parts = line.split()
        if parts and ":" not in parts[0]:
            labels, feats = parts[0], parts[1:]
            try:
                y_idx.extend(int(v) for v in labels.split(",") if v)
            except ValueError:
                raise DataError(f"bad label list {labels!r}", path, lineno) from None
        else:
            feats = parts
        try:
            for tok in feats:
                f, v = tok.split(":")
                x_idx.append(int(f))
                x_val.append(float(v))
        except ValueError:
            raise DataError(f"bad feature entry {tok!r}; expected 'index:value'", path, lineno) from None
        x_ptr.append(len(x_idx))
        y_ptr.append(len(y_idx))
    x_idx_a, y_idx_a = np.asarray(x_idx, dtype=np.int64), np.asarray(y_idx, dtype=np.int64)
    for arr, bound, what in ((x_idx_a, n_feat, "feature"), (y_idx_a, n_lab, "label")):
        bad = np.flatnonzero((arr < 0) | (arr >= bound))
        if len(bad):
            ptr = np.asarray(x_ptr if what == "feature" else y_ptr)
            line = int(np.searchsorted(ptr, bad[0], side="right")) + 1
            raise DataError(f"{what} index {arr[bad[0]]} outside [0, {bound})", path, line)
    X = sp.csr_matrix((np.asarray(x_val, dtype=np.float32), x_idx_a, x_ptr), shape=(n, n_feat))
    Y = sp.csr_matrix((np.ones(len(y_idx_a), np.float32), y_idx_a, y_ptr), shape=(n, n_lab))
    X.sum_duplicates()
    Y.sum_duplicates()
    Y.data[:] = 1.0
    return X, Y


def write_xc_sparse(X: sp.spmatrix, Y: sp.spmatrix, path: str | os.PathLike) -> None:
    """Write (X, Y) in the XC-repository sparse format, atomically."""
    X, Y = sp.csr_matrix(X), sp.csr_matrix(Y)
    if X.shape[0] != Y.shape[0]:
        raise ValueError(f"X has {X.shape[0]} rows, Y has {Y.shape[0]}")
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        fh.write(f"{X.shape[0]} {X.shape[1]} {Y.shape[1]}\n")
        for i in range(X.shape[0]):
            ys, ye, xs, xe = Y.indptr[i], Y.indptr[i + 1], X.indptr[i], X.indptr[i + 1]
            labels = ",".join(map(str, Y.indices[ys:ye]))
            feats = " ".join(f"{f}:{v:.6g}" for f, v in zip(X.indices[xs:xe], X.data[xs:xe]))
            fh.write(f"{labels} {feats}".rstrip() + "\n")
