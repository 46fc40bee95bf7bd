"""Benchmark inputs: one TF-IDF build per problem, written as CSR ``.npz`` for every system.

A problem is a real dataset (``xtransformer.api.load_dataset`` + ``tfidf_features``) or a
synthetic one (``benchmarks.synthetic``). Its folder ``<work>/<problem>/data`` holds
``X.<split>.npz`` / ``Y.<split>.npz`` and ``problem.json``; it is built once (atomically, with a
completion marker) and reused by every system and repeat.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import scipy.sparse as sp

from benchmarks.phases import PROBLEM_FILE, texts_file, xc_text_file
from benchmarks.synthetic import SyntheticSpec, generate
from xtransformer.api import atomic_dir, is_complete, load_csr, load_json, save_csr, save_json


class ProblemError(ValueError):
    """A problem lacks what a system needs (e.g. documents for a system that reads texts)."""


@dataclass(frozen=True)
class Problem:
    """A prepared benchmark problem: where its matrices are and what they hold."""

    name: str
    data_dir: Path
    train_split: str
    eval_split: str
    info: dict[str, Any]

    def Y(self, split: str) -> sp.csr_matrix:
        return load_csr(self.data_dir / f"Y.{split}.npz")

    def X(self, split: str) -> sp.csr_matrix:
        return load_csr(self.data_dir / f"X.{split}.npz")

    def ensure_xc_text(self, split: str) -> Path:
        """The split in XC text format (omikuji trains only from such a file); written once."""
        from xtransformer.api import write_xc_sparse

        path = self.data_dir / xc_text_file(split)
        if not path.is_file():
            write_xc_sparse(self.X(split), self.Y(split), path)
        return path

    def ensure_texts(self) -> None:
        """The documents of the train and eval splits as JSON lines (systems that read texts),
        loaded again from the dataset the matrices came from, checked row for row; written once."""
        splits = (self.train_split, self.eval_split)
        if all((self.data_dir / texts_file(s)).is_file() for s in splits):
            return
        source = self.info["source"]
        if "load_as" not in source:
            raise ProblemError(
                f"{self.name} has no documents (a synthetic problem, or one prepared before documents were "
                "kept: prepare it again with --rebuild-data)"
            )
        from xtransformer.api import load_dataset

        ds = load_dataset(
            source["load_as"], max_docs=source.get("max_docs"), eval_split=self.eval_split, **held_out(source)
        )
        for split in splits:
            part, Y = ds.splits[split], self.Y(split)
            if Y.shape != part.Y.shape or (Y != part.Y).nnz:
                raise ProblemError(f"{self.name}: the {split} labels of {source['load_as']} changed since its matrices")
            _write_lines(self.data_dir / texts_file(split), [json.dumps(t) for t in part.texts])


def _write_lines(path: Path, lines: list[str]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    os.replace(tmp, path)


def _shape_info(mats: dict[str, tuple[sp.csr_matrix, sp.csr_matrix]]) -> dict[str, Any]:
    X_tr, Y_tr = mats["train"]
    return {
        "n_features": int(X_tr.shape[1]),
        "n_labels": int(Y_tr.shape[1]),
        "labels_in_train": int((Y_tr.getnnz(axis=0) > 0).sum()),
        "splits": {
            s: {
                "docs": int(X.shape[0]),
                "x_nnz_per_doc": round(X.nnz / max(X.shape[0], 1), 2),
                "labels_per_doc": round(Y.nnz / max(Y.shape[0], 1), 3),
            }
            for s, (X, Y) in mats.items()
        },
    }


def _write(
    folder: Path,
    name: str,
    train_split: str,
    eval_split: str,
    mats: dict[str, tuple[sp.csr_matrix, sp.csr_matrix]],
    source: dict[str, Any],
) -> Problem:
    info = {"source": source, **_shape_info(mats)}
    with atomic_dir(folder) as tmp:
        for split, (X, Y) in mats.items():
            save_csr(X, tmp / f"X.{split}.npz")
            save_csr(Y, tmp / f"Y.{split}.npz")
        save_json(
            {"name": name, "train_split": train_split, "eval_split": eval_split, "info": info}, tmp / PROBLEM_FILE
        )
    return read_problem(folder)


def read_problem(folder: Path) -> Problem:
    """A problem prepared earlier (its folder holds the npz pairs and problem.json)."""
    meta = load_json(folder / PROBLEM_FILE)
    return Problem(meta["name"], folder, meta["train_split"], meta["eval_split"], meta["info"])


def held_out(source: dict[str, Any]) -> dict[str, int]:
    """``load_dataset``'s held-out split settings of a problem (none for one evaluated on dev / test)."""
    return {"holdout": source["holdout"], "holdout_seed": source["holdout_seed"]} if source.get("holdout") else {}


def prepare_dataset(
    name: str,
    work_root: Path,
    eval_split: str | None = None,
    max_docs: int | None = None,
    rebuild: bool = False,
    tfidf: dict[str, Any] | None = None,
    holdout: int = 0,
) -> Problem:
    """Load ``name`` with the data layer, build its TF-IDF once (``TfidfConfig`` defaults, or those
    with the ``tfidf`` settings changed), write the npz pairs. ``holdout``: that many training documents
    (``data.holdout``, seed 0) become the eval split, the rest the training split: a problem to choose
    settings on, whose name says so."""
    from xtransformer.api import TfidfConfig, settings_key

    cfg = TfidfConfig.from_mapping(tfidf or {})
    suffix = (f"-max{max_docs}" if max_docs else "") + (f"-holdout{holdout}" if holdout else "")
    suffix += f"-tfidf{settings_key(cfg.training_settings())[:8]}" if tfidf else ""
    if holdout:
        eval_split = "holdout"
    folder = work_root.resolve() / f"{Path(name).name}{suffix}" / "data"
    if is_complete(folder) and not rebuild:
        problem = read_problem(folder)
        if eval_split in (None, problem.eval_split):
            return problem
    from xtransformer.api import load_dataset, tfidf_features

    held = {"holdout": holdout, "holdout_seed": 0} if holdout else {}
    ds = load_dataset(name, max_docs=max_docs, **({"eval_split": eval_split} if eval_split else {}), **held)
    X = tfidf_features(ds, cfg)
    mats = {split: (X[split], ds.splits[split].Y) for split in ds.splits}
    from xtransformer.api import LabeledData

    source = {
        "dataset": ds.name,
        # what load_dataset was given (a folder made absolute): the documents are loaded again from it
        "load_as": str(Path(name).resolve()) if Path(name).exists() else name,
        "root": str(ds.root),
        "train_key": LabeledData.from_split(ds, "train").key,
        "dev_carved_from_train": ds.dev_carved_from_train,
        "max_docs": max_docs,
        **held,
        "tfidf": cfg.training_settings() if tfidf else "xtransformer TfidfConfig defaults",
    }
    return _write(folder, ds.name + suffix, "train", ds.eval_split, mats, source)


def prepare_synthetic(spec: SyntheticSpec, work_root: Path, rebuild: bool = False) -> Problem:
    """Generate the synthetic problem of ``spec`` (train/test) unless already on disk."""
    folder = work_root.resolve() / spec.tag / "data"
    if is_complete(folder) and not rebuild:
        problem = read_problem(folder)
        if problem.info["source"].get("synthetic") == spec.as_dict():
            return problem
    mats = generate(spec)
    return _write(folder, spec.tag, "train", "test", mats, {"synthetic": spec.as_dict()})
