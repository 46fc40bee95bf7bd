"""The xmc-base layout: PECOS's archives of the seed papers' datasets (Eurlex-4K, Wiki10-31K,
AmazonCat-13K, Wiki-500K, Amazon-670K, Amazon-3M), as its XR-Transformer example reads them
(amzn/pecos ``examples/xr-transformer-neurips21/train_and_predict.sh``):

- ``X.trn.txt`` / ``X.tst.txt``: one document a line;
- ``Y.trn.npz`` / ``Y.tst.npz``: the label matrices, csr ``N x L`` (``scipy.sparse.save_npz``);
- ``tfidf-attnxml/X.trn.npz`` / ``X.tst.npz``: the TF-IDF rows the papers trained on (``tfidf=given``);
- ``output-items.txt`` (where the set has it): label ``j``'s name on line ``j + 1``.

Labels are the matrices' columns: label ``j`` has the id ``"j"``. The given TF-IDF rows are read
only when asked for (``given=True``): the largest sets' matrices run to gigabytes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from xtransformer.data.errors import DataError
from xtransformer.data.readers import read_lines, read_texts
from xtransformer.data.vocab import LabelVocab
from xtransformer.utils.io import atomic_path, save_csr

TEXTS = {"train": "X.trn.txt", "test": "X.tst.txt"}
LABELS = {"train": "Y.trn.npz", "test": "Y.tst.npz"}
GIVEN_DIR = "tfidf-attnxml"
GIVEN = {split: f"{GIVEN_DIR}/{name.replace('.txt', '.npz')}" for split, name in TEXTS.items()}
LABEL_NAMES = "output-items.txt"
FILES = (*TEXTS.values(), *LABELS.values(), *GIVEN.values())  # what every archive holds (names are optional)
_CHUNK = 1 << 24


def is_xmc_base(folder: Path) -> bool:
    return (folder / TEXTS["train"]).is_file() and (folder / LABELS["train"]).is_file()


def count_lines(path: Path) -> int:
    """Documents in a one-document-a-line file, without reading it into memory (a last line
    without its line end counts)."""
    n, last = 0, b"\n"
    with open(path, "rb") as fh:
        while block := fh.read(_CHUNK):
            n += block.count(b"\n")
            last = block[-1:]
    return n + (last != b"\n")


def npz_shape(path: Path) -> tuple[int, int]:
    """A saved sparse matrix's shape, read from the archive without its arrays."""
    if not path.is_file():
        raise DataError("file not found", path)
    try:
        with np.load(path, allow_pickle=False) as z:
            shape = tuple(int(v) for v in z["shape"])
    except (OSError, ValueError, KeyError) as err:
        raise DataError(f"not a sparse matrix saved with scipy.sparse.save_npz ({err})", path) from None
    if len(shape) != 2:
        raise DataError(f"expected a 2-d matrix, got shape {shape}", path)
    return shape  # type: ignore[return-value]


def layout_counts(folder: Path) -> dict[str, dict[str, int]]:
    """Per split, its documents (``docs``) and the label matrices' columns (``labels``), every file
    of the layout checked against the others: one line naming the first file that disagrees."""
    out: dict[str, dict[str, int]] = {}
    for split in TEXTS:
        texts = folder / TEXTS[split]
        if not texts.is_file():
            raise DataError(f"missing split {split!r}: no {TEXTS[split]}", folder)
        docs = count_lines(texts)
        rows, cols = npz_shape(folder / LABELS[split])
        if rows != docs:
            raise DataError(f"{rows} label rows but {TEXTS[split]} has {docs} lines", folder / LABELS[split])
        given = folder / GIVEN[split]
        if given.is_file() and npz_shape(given)[0] != docs:
            raise DataError(f"{npz_shape(given)[0]} rows but {TEXTS[split]} has {docs} lines", given)
        out[split] = {"docs": docs, "labels": cols}
    if out["train"]["labels"] != out["test"]["labels"]:
        n_train, n_test = out["train"]["labels"], out["test"]["labels"]
        raise DataError(f"{n_test} label columns, train has {n_train}", folder / LABELS["test"])
    given = [folder / GIVEN[s] for s in TEXTS if (folder / GIVEN[s]).is_file()]
    if len(given) == 2 and npz_shape(given[0])[1] != npz_shape(given[1])[1]:
        raise DataError(f"{npz_shape(given[1])[1]} feature columns, train has {npz_shape(given[0])[1]}", given[1])
    return out


def read_matrix(path: Path, shape: tuple[int, int] | None = None) -> sp.csr_matrix:
    """A csr float32 matrix of a ``.npz`` file; ``shape`` (a ``-1`` matches any size) is checked."""
    if not path.is_file():
        raise DataError("file not found", path)
    try:
        M = sp.load_npz(path).tocsr().astype(np.float32, copy=False)
    except (OSError, ValueError, KeyError) as err:
        raise DataError(f"not a sparse matrix saved with scipy.sparse.save_npz ({err})", path) from None
    if shape is not None and any(want not in (-1, got) for want, got in zip(shape, M.shape)):
        wanted = " x ".join("any" if v == -1 else str(v) for v in shape)
        raise DataError(f"shape {M.shape[0]} x {M.shape[1]}, expected {wanted}", path)
    return M


def read_label_names(folder: Path, n_labels: int) -> tuple[list[str], int]:
    """Label ``j``'s name from line ``j + 1`` of ``output-items.txt``, else its id ``"j"``;
    returns the names and how many labels have none."""
    path = folder / LABEL_NAMES
    if not path.is_file():
        return [str(j) for j in range(n_labels)], n_labels
    names = read_lines(path)
    if len(names) != n_labels:
        raise DataError(f"{len(names)} label names, the label matrices have {n_labels} columns", path)
    missing = [j for j, name in enumerate(names) if not name.strip()]
    return [name.strip() or str(j) for j, name in enumerate(names)], len(missing)


def read_xmc_base(folder: Path, allow_empty_docs: bool, given: bool) -> dict[str, dict[str, Any]]:
    """Per split its ``texts``, ``Y`` (csr, 1.0 a positive) and, with ``given``, the shipped TF-IDF
    rows ``X``; every file's shape checked against the texts (one line naming the file)."""
    counts = layout_counts(folder)
    if given and not all((folder / GIVEN[s]).is_file() for s in TEXTS):
        raise DataError(f"tfidf.source=given: no {GIVEN_DIR}/X.trn.npz + X.tst.npz here (none shipped)", folder)
    out: dict[str, dict[str, Any]] = {}
    n_labels = counts["train"]["labels"]
    for split in TEXTS:
        Y = read_matrix(folder / LABELS[split], (counts[split]["docs"], n_labels))
        Y.eliminate_zeros()
        Y.data[:] = 1.0
        out[split] = {"texts": read_texts(folder / TEXTS[split], allow_empty=allow_empty_docs), "Y": Y}
        if given:
            out[split]["X"] = read_matrix(folder / GIVEN[split], (counts[split]["docs"], -1))
    return out


def label_space(folder: Path, n_labels: int) -> tuple[LabelVocab, list[str], int]:
    """The label ids (the columns' numbers) and names of an xmc-base folder."""
    names, missing = read_label_names(folder, n_labels)
    return LabelVocab([str(j) for j in range(n_labels)]), names, missing


def write_xmc_base(
    folder: str | os.PathLike,
    texts: dict[str, Sequence[str]],
    Y: dict[str, sp.spmatrix],
    label_names: Sequence[str] | None = None,
    tfidf: dict[str, sp.spmatrix] | None = None,
) -> Path:
    """Write ``train`` and ``test`` (texts, label matrices; optionally TF-IDF rows and the label
    names) in the xmc-base layout, each file atomically. Returns the folder."""
    folder = Path(folder)
    for split in TEXTS:
        if any("\n" in t or "\r" in t for t in texts[split]):
            raise DataError(f"{split}: a text holds a line break; the layout has one document a line")
        with atomic_path(folder / TEXTS[split]) as tmp:
            tmp.write_text("".join(f"{t}\n" for t in texts[split]), encoding="utf-8")
        save_csr(sp.csr_matrix(Y[split], dtype=np.float32), folder / LABELS[split])
        if tfidf is not None:
            save_csr(sp.csr_matrix(tfidf[split], dtype=np.float32), folder / GIVEN[split])
    if label_names is not None:
        with atomic_path(folder / LABEL_NAMES) as tmp:
            tmp.write_text("".join(f"{n}\n" for n in label_names), encoding="utf-8")
    return folder
