"""Datasets in the standard XMC layouts, loaded into one in-memory form.

A dataset folder holds one of:
- the raw-text layout (``train_texts.txt`` + ``train_labels.txt``, optional dev/test, ids,
  ``label_map.txt``, ``label_text.txt``);
- the XC-repository sparse format (``train.txt``, ``dev.txt``/``test.txt``);
- CSR pairs ``X.train.npz`` / ``Y.train.npz`` (labels then have no string ids unless a
  ``label_map.txt`` is given: they are named by their column number);
- PECOS's xmc-base layout (``X.trn.txt``, ``Y.trn.npz``, ...; ``data/xmcbase.py``);
- or ``.tar.gz`` archives of any of these, unpacked once into the cache.

A named dataset (``data/catalog.py``) read from its own place (``data.path`` unset) has its
document counts checked against the published ones before anything trains on it.
"""

from __future__ import annotations

import dataclasses
import logging
import tarfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import scipy.sparse as sp

from xtransformer.data import catalog
from xtransformer.data.errors import DataError
from xtransformer.data.paths import default_cache_dir, default_data_dir
from xtransformer.data.readers import (
    labels_to_csr,
    read_label_lines,
    read_label_map,
    read_label_text,
    read_lines,
    read_texts,
    read_xc_sparse,
)
from xtransformer.data.vocab import LabelVocab
from xtransformer.data.xmcbase import LABELS, TEXTS, is_xmc_base, label_space, read_xmc_base
from xtransformer.settings import Settings, run_field
from xtransformer.utils.io import atomic_dir, file_fingerprint, is_complete, load_csr, settings_key

log = logging.getLogger(__name__)

SPLITS = ("train", "dev", "test")


@dataclass
class DataConfig(Settings):
    """The ``data`` config group's record. Where the files are is a run setting (the data's key is
    its content); what is read from them, and how, is a training setting."""

    where = "data"
    error = DataError

    name: str = "reuters21578"
    # dataset folder; default <data_dir>/<name>. A data option must give it (??? in the group's base
    # node; OmegaConf merges no ??? over a value): null for a known dataset, a folder for data=custom
    path: str | None = run_field(None, hydra="???")
    # default $XMC_DATA_DIR, else ../shared/data
    data_dir: str | None = run_field(None, hydra="${oc.env:XMC_DATA_DIR,null}")
    format: str = "auto"  # auto | text | xc | npz | xmc-base
    dev_fraction: float = 0.1  # carved from train when the dataset has no dev split
    dev_seed: int = 0
    eval_split: str | None = run_field(None)  # default: test if present, else dev; `holdout` with data.holdout
    holdout: int = 0  # training documents held out as split `holdout`, never trained on: choose settings there
    holdout_seed: int = 0  # the draw (held_out_rows: the studies' held-out documents are seed 0's)
    max_docs: int | None = None  # keep the first N documents of each split (quick runs, tests)
    allow_empty_docs: bool = False
    allow_empty_labels: bool = False

    def check(self) -> None:
        # Checked before any file is read. A negative max_docs would slice from the end
        # (items[:-5]) and silently drop documents; zero leaves nothing to train on.
        if self.max_docs is not None and self.max_docs < 1:
            raise self.bad("max_docs", "must be null (all documents) or an int >= 1")
        if self.holdout < 0:
            raise self.bad("holdout", "must be 0 (none) or the number of training documents to hold out")
        for key in ("dev_seed", "holdout_seed"):  # numpy's generator takes no negative seed
            if getattr(self, key) < 0:
                raise self.bad(key, "must be an int >= 0")
        if self.path == "???":  # data=custom's mandatory value, left unset
            raise DataError(
                "data.path is not set: data=custom needs data.path=/path/to/your/folder "
                "(the layout is in configs/data/custom.yaml)"
            )


@dataclass
class Split:
    name: str
    Y: sp.csr_matrix
    texts: list[str] | None = None
    ids: list[str] | None = None
    X: sp.csr_matrix | None = None  # given features (XC / npz formats)

    def __len__(self) -> int:
        return self.Y.shape[0]


@dataclass
class XMCDataset:
    name: str
    root: Path
    vocab: LabelVocab
    splits: dict[str, Split]
    label_text: list[str]
    n_label_text_missing: int
    eval_split: str
    dev_carved_from_train: bool = False
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def n_labels(self) -> int:
        return len(self.vocab)

    @property
    def has_texts(self) -> bool:
        return all(s.texts is not None for s in self.splits.values())

    def require_texts(self, why: str) -> None:
        """Fail with one line when a method that reads documents gets feature-only data."""
        if not self.has_texts:
            raise DataError(
                f"{why} needs the documents' texts, but this dataset has features only "
                "(XC sparse or npz files, no *_texts.txt): use method=xrlinear",
                self.root,
            )

    def unseen_labels(self, split: str | None = None) -> dict[str, Any]:
        """Labels of ``split`` (default: the eval split) that no training document has.

        No method can learn them, so they hold P@k / R@k below 100 whatever is trained: a test
        set made of them alone scores P@1 = 0. ``docs_only_unseen`` counts documents none of
        whose labels can be predicted.
        """
        split = split or self.eval_split
        Y = self.splits[split].Y
        in_train = np.asarray(self.splits["train"].Y.sum(axis=0)).ravel() > 0
        unseen = ~in_train[Y.indices]
        sizes = np.diff(Y.indptr)
        per_doc = np.bincount(np.repeat(np.arange(Y.shape[0]), sizes), weights=unseen, minlength=Y.shape[0])
        return {
            "split": split,
            "labels": int(len(np.unique(Y.indices[unseen]))),
            "positives": int(unseen.sum()),
            "docs": int((per_doc > 0).sum()),
            "docs_only_unseen": int(((per_doc > 0) & (per_doc == sizes)).sum()),
            "n_docs": int(Y.shape[0]),
        }

    def summary(self) -> dict[str, Any]:
        train_counts = np.asarray(self.splits["train"].Y.sum(axis=0)).ravel()
        out: dict[str, Any] = {
            "name": self.name,
            "root": str(self.root),
            "n_labels": self.n_labels,
            "labels_in_train": int((train_counts > 0).sum()),
            "labels_without_train_docs": int((train_counts == 0).sum()),
            "label_text_missing": self.n_label_text_missing,
            "eval_split": self.eval_split,
            "dev_carved_from_train": self.dev_carved_from_train,
            "splits": {},
        }
        for name, s in self.splits.items():
            counts = np.asarray(s.Y.sum(axis=0)).ravel()
            only_here = self.unseen_labels(name)["labels"] if name != "train" else 0
            out["splits"][name] = {
                "docs": len(s),
                "labels_per_doc": round(float(s.Y.nnz / max(len(s), 1)), 3),
                "distinct_labels": int((counts > 0).sum()),
                "labels_not_in_train": only_here,
                "docs_without_labels": int((np.diff(s.Y.indptr) == 0).sum()),
            }
        return out


def warn_unseen_labels(ds: XMCDataset) -> dict[str, Any]:
    """:meth:`XMCDataset.unseen_labels` of the eval split, with a warning when there are any (for
    ``metrics.json``): otherwise a test set of new labels just looks like a model that failed."""
    found = ds.unseen_labels()
    if found["labels"]:
        log.warning(
            "%d labels of the %s split (%d of its %d documents; %d have no other label) occur in no "
            "training document: no method can predict them, so P@k and R@k stay below 100",
            found["labels"],
            found["split"],
            found["docs"],
            found["n_docs"],
            found["docs_only_unseen"],
        )
    return found


def resolve_dataset_dir(cfg: DataConfig, cache_dir: str | Path | None = None) -> Path:
    """The folder holding the dataset's files, unpacking archives into the cache if needed."""
    data_dir = Path(cfg.data_dir).expanduser() if cfg.data_dir else default_data_dir()
    folder = Path(cfg.path).expanduser() if cfg.path else data_dir / cfg.name
    if not folder.exists():
        archive = data_dir / f"{cfg.name}.tar.gz"
        if archive.is_file():
            return _unpack([archive], cfg.name, cache_dir)
        raise _missing(cfg, folder, data_dir)
    if detect_format(folder) is None:
        archives = sorted(folder.glob("*.tar.gz"))
        if archives:
            return _unpack(archives, cfg.name, cache_dir)
    return folder


def _missing(cfg: DataConfig, folder: Path, data_dir: Path) -> DataError:
    """One line for a dataset that is not there: how to get a named one, else the ones there are."""
    named = catalog.find(cfg.name)
    if cfg.path is None and named is not None and named.downloadable:
        return DataError(
            f"dataset {cfg.name!r} is not in {data_dir}: run `xmc-data get {cfg.name} --dir {data_dir}` "
            f"(it downloads {named.url}), or put {cfg.name}.tar.gz there"
        )
    known = sorted(p.name for p in data_dir.iterdir() if p.is_dir()) if data_dir.is_dir() else []
    return DataError(
        f"unknown dataset {cfg.name!r}: no folder {folder}"
        + (f" (datasets found in {data_dir}: {', '.join(known)})" if known else "")
        + "; set data.path=/path/to/folder, data.data_dir=..., or $XMC_DATA_DIR"
    )


def extract_archives(archives: list[Path], into: Path) -> None:
    """Unpack ``.tar.gz`` ``archives`` into the folder ``into``. Folders that wrap all the files
    (one top folder; PECOS's ``xmc-base/<name>/``: two) are flattened away."""
    for archive in archives:
        try:
            with tarfile.open(archive, "r:gz") as tar:
                tar.extractall(into, filter="data")
        except (tarfile.TarError, OSError, EOFError, zlib.error) as err:
            raise DataError(f"cannot unpack archive: {err}", archive) from None
    while len(entries := list(into.iterdir())) == 1 and entries[0].is_dir():
        inner = entries[0].rename(into / f".{entries[0].name}.unwrapped")  # a child may share its name
        for p in inner.iterdir():
            p.rename(into / p.name)
        inner.rmdir()


def unpacked_dir(archives: list[Path], name: str, cache_dir: str | Path | None) -> Path:
    """Where the cache holds ``archives`` unpacked (keyed by their content)."""
    key = settings_key([file_fingerprint(a) for a in archives])
    return Path(cache_dir or default_cache_dir()) / "datasets" / f"{name}-{key}"


def _unpack(archives: list[Path], name: str, cache_dir: str | Path | None) -> Path:
    target = unpacked_dir(archives, name, cache_dir)
    if is_complete(target):
        return target
    log.info("unpacking %s into %s", ", ".join(a.name for a in archives), target)
    with atomic_dir(target) as tmp:
        extract_archives(archives, tmp)
    return target


def detect_format(folder: Path) -> str | None:
    if (folder / "train_texts.txt").is_file():
        return "text"
    if is_xmc_base(folder):
        return "xmc-base"
    if (folder / "X.train.npz").is_file():
        return "npz"
    if (folder / "train.txt").is_file():
        return "xc"
    return None


class Loaded(NamedTuple):
    """What a layout's reader returns: the label space, the splits (``data.max_docs`` applied) and
    per split the file its documents were counted in and their number (before ``max_docs``)."""

    vocab: LabelVocab
    splits: dict[str, Split]
    label_text: list[str]
    n_missing: int
    docs: dict[str, tuple[Path, int]]


def load_dataset(
    name_or_cfg: str | DataConfig | dict,
    cache_dir: str | Path | None = None,
    given_tfidf: bool = False,
    **overrides: Any,
) -> XMCDataset:
    """Load a dataset by name (a folder under the data dir), path, or ``DataConfig``. With
    ``given_tfidf`` the splits also hold the TF-IDF rows the dataset ships (``tfidf=given``)."""
    cfg = _data_config(name_or_cfg, overrides)
    folder = resolve_dataset_dir(cfg, cache_dir)
    got = read_folder(folder, cfg, given_tfidf)
    named = catalog.find(cfg.name)
    if named is not None and cfg.path is None:  # its own files: the published counts hold
        catalog.check_sizes(named, got.docs, len(got.vocab))
    elif named is not None:
        log.info("data.path is set: %s is read from %s, its published sizes are not checked", cfg.name, folder)
    splits = got.splits
    carved = "dev" not in splits
    if carved:
        n_dev = int(round(len(splits["train"]) * cfg.dev_fraction))
        splits = _carve(splits, "dev", n_dev, cfg.dev_seed, f"data.dev_fraction={cfg.dev_fraction}")
    if cfg.holdout:
        splits = _carve(splits, "holdout", cfg.holdout, cfg.holdout_seed, f"data.holdout={cfg.holdout}")
    eval_split = cfg.eval_split or ("test" if "test" in splits else "dev")
    if eval_split not in splits:
        hint = " (it needs data.holdout=N: N training documents held out)" if eval_split == "holdout" else ""
        raise DataError(f"data.eval_split={eval_split!r} but the dataset has splits {sorted(splits)}{hint}")
    return XMCDataset(
        name=cfg.name,
        root=folder,
        vocab=got.vocab,
        splits=splits,
        label_text=got.label_text,
        n_label_text_missing=got.n_missing,
        eval_split=eval_split,
        dev_carved_from_train=carved,
    )


def _data_config(name_or_cfg: str | DataConfig | dict, overrides: dict[str, Any]) -> DataConfig:
    if isinstance(name_or_cfg, str):
        cfg = DataConfig(name=name_or_cfg, **overrides)
        if Path(name_or_cfg).expanduser().is_dir() and "path" not in overrides:
            cfg = dataclasses.replace(cfg, name=Path(name_or_cfg).name, path=name_or_cfg)
        return cfg
    if isinstance(name_or_cfg, dict):
        return DataConfig.from_mapping({**name_or_cfg, **overrides})
    return dataclasses.replace(name_or_cfg, **overrides)


def read_folder(folder: Path, cfg: DataConfig, given_tfidf: bool = False) -> Loaded:
    """The files of ``folder`` in the layout ``data.format`` names (``auto``: the one found)."""
    fmt = detect_format(folder) if cfg.format == "auto" else cfg.format
    if fmt is None:
        raise DataError(
            "no dataset files found: expected train_texts.txt + train_labels.txt (raw text), "
            "X.trn.txt + Y.trn.npz (xmc-base), train.txt (XC sparse format) or X.train.npz + Y.train.npz",
            folder,
        )
    if fmt == "xmc-base":
        return _load_xmc_base(folder, cfg, given_tfidf)
    loader = {"text": _load_text, "xc": _load_xc, "npz": _load_npz}.get(fmt)
    if loader is None:
        raise DataError(f"data.format must be auto, text, xc, npz or xmc-base, got {cfg.format!r}")
    if given_tfidf and fmt == "text":
        raise DataError("tfidf.source=given: raw texts have no TF-IDF rows (the xmc-base layout ships them)", folder)
    return loader(folder, cfg)


def _load_xmc_base(folder: Path, cfg: DataConfig, given: bool) -> Loaded:
    parts = read_xmc_base(folder, cfg.allow_empty_docs, given)
    vocab, names, missing = label_space(folder, parts["train"]["Y"].shape[1])
    splits = {}
    for s, part in parts.items():
        _check_rows(part["Y"], cfg, folder / LABELS[s])
        X = part.get("X")
        splits[s] = Split(
            name=s,
            Y=_limit_rows(part["Y"], cfg),
            texts=_limit(part["texts"], cfg),
            ids=_limit([str(i) for i in range(len(part["texts"]))], cfg),
            X=None if X is None else _limit_rows(X, cfg),
        )
    return Loaded(vocab, splits, names, missing, {s: (folder / TEXTS[s], len(p["texts"])) for s, p in parts.items()})


def _limit(items: list, cfg: DataConfig) -> list:
    return items if cfg.max_docs is None else items[: cfg.max_docs]


def _load_text(folder: Path, cfg: DataConfig) -> Loaded:
    present = [s for s in SPLITS if (folder / f"{s}_texts.txt").is_file() or (folder / f"{s}_labels.txt").is_file()]
    if "train" not in present:
        raise DataError("missing split 'train': no train_texts.txt / train_labels.txt", folder)
    texts, labels, ids = {}, {}, {}
    for s in present:
        tpath, lpath, ipath = (folder / f"{s}_{kind}.txt" for kind in ("texts", "labels", "ids"))
        for p in (tpath, lpath):
            if not p.is_file():
                raise DataError(f"split {s!r} is incomplete: missing {p.name}", p)
        texts[s] = read_texts(tpath, allow_empty=cfg.allow_empty_docs)
        if not texts[s]:  # else the first complaint would be about dev_fraction or the vocabulary
            raise DataError("no documents: the file is empty", tpath)
        labels[s] = read_label_lines(lpath, allow_empty=cfg.allow_empty_labels)
        if len(texts[s]) != len(labels[s]):
            raise DataError(
                f"{tpath.name} has {len(texts[s])} lines but {lpath.name} has {len(labels[s])}: "
                "texts and labels must align line by line",
                lpath,
            )
        if ipath.is_file():
            ids[s] = read_lines(ipath)
            if len(ids[s]) != len(texts[s]):
                raise DataError(f"{ipath.name} has {len(ids[s])} lines, expected {len(texts[s])}", ipath)
        else:
            ids[s] = [str(i) for i in range(len(texts[s]))]
    map_path = folder / "label_map.txt"
    vocab = (
        read_label_map(map_path)
        if map_path.is_file()
        else LabelVocab.from_labels(label for s in present for label in labels[s])
    )
    splits = {
        s: Split(
            name=s,
            Y=labels_to_csr(_limit(labels[s], cfg), vocab, folder / f"{s}_labels.txt"),
            texts=_limit(texts[s], cfg),
            ids=_limit(ids[s], cfg),
        )
        for s in present
    }
    text_path = folder / "label_text.txt"
    if text_path.is_file():
        label_text, missing = read_label_text(text_path, vocab)
    else:
        label_text, missing = list(vocab.ids), len(vocab)
    return Loaded(vocab, splits, label_text, missing, {s: (folder / f"{s}_texts.txt", len(texts[s])) for s in present})


def _feature_vocab(folder: Path, n_labels: int) -> tuple[LabelVocab, list[str], int]:
    map_path = folder / "label_map.txt"
    vocab = read_label_map(map_path) if map_path.is_file() else LabelVocab([str(i) for i in range(n_labels)])
    if len(vocab) != n_labels:
        raise DataError(f"has {len(vocab)} labels but the label matrices have {n_labels} columns", map_path)
    text_path = folder / "label_text.txt"
    if text_path.is_file():
        label_text, missing = read_label_text(text_path, vocab)
    else:
        label_text, missing = list(vocab.ids), len(vocab)
    return vocab, label_text, missing


def _check_rows(Y: sp.csr_matrix, cfg: DataConfig, path: Path) -> None:
    if not cfg.allow_empty_labels:
        empty = np.flatnonzero(np.diff(Y.indptr) == 0)
        if len(empty):
            raise DataError("document without labels (set data.allow_empty_labels=true)", path, int(empty[0]) + 1)


def _load_xc(folder: Path, cfg: DataConfig) -> Loaded:
    mats = {s: read_xc_sparse(folder / f"{s}.txt") for s in SPLITS if (folder / f"{s}.txt").is_file()}
    if "train" not in mats:
        raise DataError("missing split 'train': no train.txt", folder)
    shapes = {s: (X.shape[1], Y.shape[1]) for s, (X, Y) in mats.items()}
    if len(set(shapes.values())) != 1:
        raise DataError(f"splits disagree on (features, labels): {shapes}", folder)
    for s, (_, Y) in mats.items():
        _check_rows(Y, cfg, folder / f"{s}.txt")
    vocab, label_text, missing = _feature_vocab(folder, shapes["train"][1])
    splits = {s: Split(name=s, Y=_limit_rows(Y, cfg), X=_limit_rows(X, cfg)) for s, (X, Y) in mats.items()}
    docs = {s: (folder / f"{s}.txt", Y.shape[0]) for s, (_, Y) in mats.items()}
    return Loaded(vocab, splits, label_text, missing, docs)


def _load_npz(folder: Path, cfg: DataConfig) -> Loaded:
    splits, docs = {}, {}
    n_labels = None
    for s in SPLITS:
        xp, yp = folder / f"X.{s}.npz", folder / f"Y.{s}.npz"
        if not xp.is_file() and not yp.is_file():
            continue
        for p in (xp, yp):
            if not p.is_file():
                raise DataError(f"split {s!r} is incomplete: missing {p.name}", p)
        try:
            X, Y = load_csr(xp).astype(np.float32), load_csr(yp).astype(np.float32)
        except (OSError, ValueError) as err:
            raise DataError(f"cannot read CSR npz: {err}", folder / f"X.{s}.npz") from None
        if X.shape[0] != Y.shape[0]:
            raise DataError(f"X has {X.shape[0]} rows but Y has {Y.shape[0]}", yp)
        _check_rows(Y, cfg, yp)
        n_labels = Y.shape[1] if n_labels is None else n_labels
        if Y.shape[1] != n_labels:
            raise DataError(f"Y has {Y.shape[1]} labels, train has {n_labels}", yp)
        Y.data[:] = 1.0
        docs[s] = (yp, Y.shape[0])
        splits[s] = Split(name=s, Y=_limit_rows(Y, cfg), X=_limit_rows(X, cfg))
    if "train" not in splits:
        raise DataError("missing split 'train': no X.train.npz / Y.train.npz", folder)
    vocab, label_text, missing = _feature_vocab(folder, n_labels)
    return Loaded(vocab, splits, label_text, missing, docs)


def _limit_rows(M: sp.csr_matrix, cfg: DataConfig) -> sp.csr_matrix:
    return M if cfg.max_docs is None else M[: cfg.max_docs]


def held_out_rows(n: int, n_out: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Of ``n`` rows, those kept and the ``n_out`` drawn out by ``seed``, each sorted: the draw of
    ``data.holdout``, of a carved dev split and of the studies' held-out documents."""
    perm = np.random.default_rng(seed).permutation(n)
    return np.sort(perm[n_out:]), np.sort(perm[:n_out])


def _carve(splits: dict[str, Split], name: str, n_out: int, seed: int, setting: str) -> dict[str, Split]:
    """``n_out`` training documents, drawn by ``seed``, become split ``name`` and leave train: dev
    for a dataset without one (``dev_fraction``, the paper's protocol), or the ``holdout`` split.
    Rows are kept in file order (:func:`held_out_rows`). ``setting`` (``data.KEY=value``) is named when
    nothing would be left."""
    train = splits["train"]
    n = len(train)
    if n_out < 1 or n_out >= n:
        raise DataError(f"{setting} leaves no {name} or no train documents out of {n}")
    train_idx, out_idx = held_out_rows(n, n_out, seed)

    def take(idx: np.ndarray, split: str) -> Split:
        return Split(
            name=split,
            Y=train.Y[idx],
            texts=None if train.texts is None else [train.texts[i] for i in idx],
            ids=None if train.ids is None else [train.ids[i] for i in idx],
            X=None if train.X is None else train.X[idx],
        )

    out = dict(splits)
    out["train"], out[name] = take(train_idx, "train"), take(out_idx, name)
    return {s: out[s] for s in (*SPLITS, "holdout") if s in out}
