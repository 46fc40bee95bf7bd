"""Labels added to a trained model: which labels are new, and the documents in the grown label space.

A taxonomy grows: ``XMCModel.add_labels`` takes documents annotated with the new labels (they may
carry old labels too; documents with neither serve as negatives) and gives a model whose label
space is the old one followed by the new labels, in the order the documents' label space lists
them. What is checked here, before any work, fails as one line: a new label listed twice, a new
id that is already one of the model's, a new label no document carries, documents that carry no
new label at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from xtransformer.cache import StageCache
from xtransformer.data.inputs import LabeledData
from xtransformer.indexing.placement import Placing
from xtransformer.methods.reuse import RunRows
from xtransformer.model.folder import ModelError


@dataclass
class Additions:
    """The documents in the grown label space (old labels first, then ``new_ids``) and how the new
    labels are placed."""

    data: LabeledData
    n_old: int
    new_ids: list[str]
    placing: Placing = Placing()
    cache: StageCache | None = None  # the training run's stage cache: rows of documents it read (methods/reuse.py)

    def run_rows(self, stages: dict[str, str] | None, wanted: Sequence[str]) -> RunRows | None:
        """The given documents matched to those of the run that recorded ``stages`` (a model's
        ``train_settings["stages"]``), with its ``wanted`` stages' folders; None without a cache or a match."""
        texts = self.data.texts
        return None if texts is None else RunRows.find(self.cache, stages, texts, wanted)

    @property
    def new_names(self) -> list[str]:
        return self.data.label_names[self.n_old :]

    def summary(self) -> dict:
        counts = np.diff(sp.csc_matrix(self.data.Y[:, self.n_old :]).indptr)
        return {"n_added": len(self.new_ids), "n_docs": len(self.data), "docs_per_new_label_min": int(counts.min())}

    def record(self) -> dict:
        """What the grown model's training record keeps of this addition (provenance)."""
        p = self.placing
        return {"ids": list(self.new_ids), "n_docs": len(self.data), "placement": p.by, "negatives": p.negatives}


def plan_additions(
    old_ids: Sequence[str],
    old_names: Sequence[str],
    data: LabeledData,
    new_labels: Sequence[str] | None = None,
    placing: Placing | None = None,
) -> Additions:
    """Check ``new_labels`` (default: every label of ``data`` the model does not know that a
    document carries) against the model's ``old_ids`` and ``data``, and align ``data`` to the
    grown label space."""
    known = {label: i for i, label in enumerate(old_ids)}
    carried = np.diff(sp.csc_matrix(data.Y).indptr) > 0
    if new_labels is None:
        new = [label for label, c in zip(data.label_ids, carried) if c and label not in known]
        if not new:
            raise ModelError("the documents carry no label the model does not already have: nothing to add")
    else:
        new = _checked_new(list(new_labels), known, data, carried)
    where = {label: j for j, label in enumerate(data.label_ids)}
    unknown = [label for label, c in zip(data.label_ids, carried) if c and label not in known and label not in new]
    if unknown:
        raise ModelError(f"label {unknown[0]!r} is carried by the documents but neither the model's nor a new label")
    order = [where.get(label, -1) for label in [*old_ids, *new]]
    names = [*old_names, *(data.label_names[where[label]] for label in new)]
    grown = LabeledData(_columns(data.Y, order), [*old_ids, *new], names, data.texts, data.features, data.source)
    return Additions(grown, len(old_ids), new, placing or Placing())


def _checked_new(new: list[str], known: dict[str, int], data: LabeledData, carried: np.ndarray) -> list[str]:
    """``new`` as given, or one line naming the first label that cannot be added."""
    if not new:
        raise ModelError("new_labels is empty: nothing to add")
    seen: set[str] = set()
    where = {label: j for j, label in enumerate(data.label_ids)}
    for label in new:
        if label in seen:
            raise ModelError(f"new label {label!r} is listed twice")
        if label in known:
            raise ModelError(f"new label {label!r} collides with the model's label {label!r} (index {known[label]})")
        if label not in where or not carried[where[label]]:
            raise ModelError(f"new label {label!r}: no document carries it, so there is nothing to train it on")
        seen.add(label)
    return new


def _columns(Y: sp.csr_matrix, order: list[int]) -> sp.csr_matrix:
    """``Y``'s columns in ``order`` (-1: an empty column), as csr."""
    order_arr = np.asarray(order, dtype=np.int64)
    present = np.flatnonzero(order_arr >= 0)
    S = sp.csr_matrix(
        (np.ones(len(present), np.float32), (order_arr[present], present)), shape=(Y.shape[1], len(order))
    )
    out = sp.csr_matrix(Y @ S, dtype=np.float32)
    out.sort_indices()
    return out


def grown_report(report: dict, new_ids: Sequence[str]) -> dict:
    """A tree's add report for the model: the leaves as lists per new label id, the rest as is."""
    leaves = report["leaves"]
    lists = {label: leaves.indices[leaves.indptr[i] : leaves.indptr[i + 1]].tolist() for i, label in enumerate(new_ids)}
    return {k: v for k, v in report.items() if k != "leaves"} | {"leaves": lists}


def grown_reach(settings: dict, default: str, negatives: str) -> str:
    """A grown tree model's ``added_reach``: its own (``default``, the tree model's, for a folder
    saved before the setting), but never ``alone`` once labels trained on their leaves' documents
    only are among the added ones: they have seen no other document (``all`` instead)."""
    reach = settings.get("added_reach", default)
    return "all" if reach == "alone" and negatives == "leaf" else reach


def read_folder(folder: str | Path, split: str = "train") -> LabeledData:
    """The documents of ``folder``'s ``split`` in the standard text layout (``{split}_texts.txt``,
    ``{split}_labels.txt``; names from ``label_text.txt`` when present), their label space the ids
    they carry (sorted)."""
    from xtransformer.data.errors import DataError
    from xtransformer.data.readers import read_label_lines, read_label_text, read_texts
    from xtransformer.data.vocab import LabelVocab

    folder = Path(folder)
    texts_path, labels_path = folder / f"{split}_texts.txt", folder / f"{split}_labels.txt"
    for path in (texts_path, labels_path):
        if not path.is_file():
            raise DataError(
                f"no {path.name} (the documents to add labels from: {split}_texts.txt, {split}_labels.txt)", folder
            )
    texts, rows = read_texts(texts_path), read_label_lines(labels_path, allow_empty=True)  # negatives only
    if len(texts) != len(rows):
        raise DataError(f"{len(texts)} texts but {len(rows)} label lines in {labels_path.name}", folder)
    vocab = LabelVocab.from_labels(rows)
    names = read_label_text(folder / "label_text.txt", vocab)[0] if (folder / "label_text.txt").is_file() else None
    data = LabeledData.build(texts, rows, vocab.ids, names)
    data.source = folder
    return data


def read_new_labels(path: str | Path) -> list[str]:
    """One new label id a line; a repeated id names its line."""
    from xtransformer.data.errors import DataError
    from xtransformer.data.readers import read_lines

    out: dict[str, int] = {}
    for i, line in enumerate(read_lines(path), start=1):
        label = line.strip()
        if not label:
            continue
        if label in out:
            raise DataError(f"new label {label!r} is listed twice (first on line {out[label]})", path, i)
        out[label] = i
    return list(out)


def zero_shot_data(folder: str | Path, split: str, label_ids: Sequence[str], label_names: Sequence[str]) -> LabeledData:
    """``folder``'s ``split`` documents in a model's label space (``label_ids``), the labels named by
    ``label_text.txt`` where it names them (else as the model does): what ``fit_zero_shot`` reads."""
    from xtransformer.data.errors import DataError
    from xtransformer.data.readers import read_label_text
    from xtransformer.data.vocab import LabelVocab

    data = read_folder(folder, split)
    known = set(label_ids)
    unknown = [label for label in data.label_ids if label not in known]
    if unknown:
        raise DataError(f"label {unknown[0]!r} of {split}_labels.txt is not one of the model's labels", folder)
    where = {label: j for j, label in enumerate(data.label_ids)}
    names = list(label_names)
    path = Path(folder) / "label_text.txt"
    if path.is_file():
        given = read_label_text(path, LabelVocab(list(label_ids)))[0]
        names = [g if g != label else n for g, label, n in zip(given, label_ids, names)]
    Y = _columns(data.Y, [where.get(label, -1) for label in label_ids])
    return LabeledData(Y, list(label_ids), names, data.texts, None, data.source)
