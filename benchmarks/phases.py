"""Subprocess side of the benchmark: time one system's phases and write its top-k predictions.

Every system (a peer library in its own virtual environment, or ours in the main one) runs as a
module that subclasses :class:`System` and calls :func:`main`. This module must import nothing
beyond the standard library, numpy and scipy, because it runs inside the peers' environments
(numpy 1.26 / scipy 1.13 for libpecos).

Protocol with the parent (``benchmarks.run``):
  inputs   ``<data>/X.<split>.npz``, ``<data>/Y.<split>.npz`` (CSR, float32), and for systems that
           read texts (``reads_texts``) ``<data>/texts.<split>.jsonl`` (one JSON string a line,
           row for row with the matrices)
  outputs  ``<out>/preds.<variant>.npz`` (CSR ``N x L`` holding the top-k scores per row),
           ``<out>/model/`` (the saved model, measured on disk by the parent),
           ``<out>/timings.json`` (seconds per phase, self-reported RSS high-water marks).
The parent also polls the child's peak RSS (for runs that crash) and computes the metrics.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

TIMINGS_FILE = "timings.json"
MODEL_DIR = "model"
PROBLEM_FILE = "problem.json"
STAGES = ("index", "train", "predict")
SINGLE_DOCS = 200  # eval documents predicted one per call for the single-document latency


class PhaseError(ValueError):
    """A system's script was called with bad arguments or produced a malformed output."""


def preds_file(variant: str) -> str:
    return f"preds.{variant}.npz"


def load_problem(data_dir: Path) -> dict[str, Any]:
    """The ``problem.json`` the parent wrote next to the matrices (name, splits, source)."""
    return json.loads((data_dir / PROBLEM_FILE).read_text())


def texts_file(split: str) -> str:
    """Name of a split's documents, one JSON string a line (for systems that read texts)."""
    return f"texts.{split}.jsonl"


def load_texts(data_dir: Path, split: str, n_rows: int | None = None) -> list[str]:
    """The documents of ``split`` written by the parent; ``n_rows``: the row count they must have."""
    path = data_dir / texts_file(split)
    if not path.is_file():
        raise PhaseError(f"--data: missing {path} (the parent writes it for systems that read texts)")
    with open(path, encoding="utf-8") as fh:
        texts = [json.loads(line) for line in fh]
    if n_rows is not None and len(texts) != n_rows:
        raise PhaseError(f"--data: {path} has {len(texts)} documents, the matrices {n_rows} rows")
    return texts


def head_words(texts: list[str], n_words: int) -> list[str]:
    """Each text cut to its first ``n_words`` whitespace-separated words (whitespace collapsed). For
    a library that tokenizes every document whole before truncating to N tokens: with ``n_words`` >= N
    (a word gives at least one token) its encoder reads the same tokens, and its tokenizer's memory
    stays bounded by the cut, not by the longest documents."""
    if n_words < 1:
        raise PhaseError(f"head_words: n_words must be >= 1, got {n_words}")
    return [" ".join(t.split(maxsplit=n_words)[:n_words]) for t in texts]


def xc_text_file(split: str) -> str:
    """Name of a split in the XC-repository text format, for libraries that only read files."""
    return f"{split}.xc.txt"


def vm_hwm_mb(pid: int | str = "self") -> float | None:
    """Peak resident set (``VmHWM``) of one live process in MiB; None if it cannot be read.

    Unlike ``ru_maxrss``, ``VmHWM`` belongs to the process's own address space: Linux carries
    the parent's high-water mark across fork+exec into ``ru_maxrss``, which would charge the
    benchmark runner's memory to every system it launches.
    """
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except (OSError, ValueError):
        return None
    return None


def max_rss_mb() -> float:
    """This process's peak resident set so far in MiB (``ru_maxrss`` where /proc is missing)."""
    hwm = vm_hwm_mb()
    return hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def load_split(data_dir: Path, split: str) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """Read ``X.<split>.npz`` and ``Y.<split>.npz`` as float32 CSR with sorted indices."""
    out = []
    for kind in ("X", "Y"):
        path = data_dir / f"{kind}.{split}.npz"
        if not path.is_file():
            raise PhaseError(f"--data: missing {path}")
        mat = sp.csr_matrix(sp.load_npz(path), dtype=np.float32)
        mat.sort_indices()
        out.append(mat)
    X, Y = out
    if X.shape[0] != Y.shape[0]:
        raise PhaseError(f"--data: X.{split} has {X.shape[0]} rows but Y.{split} has {Y.shape[0]}")
    return X, Y


def topk_csr(indices: np.ndarray, scores: np.ndarray, indptr: np.ndarray, n_labels: int) -> sp.csr_matrix:
    """Build the ``N x L`` prediction matrix from flat (label, score) lists and row pointers."""
    return sp.csr_matrix(
        (scores.astype(np.float32), indices.astype(np.int64), indptr.astype(np.int64)),
        shape=(len(indptr) - 1, n_labels),
    )


def dir_bytes(path: Path) -> int:
    """Total size of the regular files under ``path`` (the model's footprint on disk)."""
    if not path.exists():
        return 0
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def save_csr_atomic(mat: sp.csr_matrix, path: Path) -> None:
    """Write to a temporary sibling then rename, so the parent never reads a partial file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as fh:
        sp.save_npz(fh, sp.csr_matrix(mat), compressed=False)
    os.replace(tmp, path)


def save_json_atomic(obj: Any, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


class System:
    """One benchmarked system: override the phases it has.

    ``index`` builds the label tree (skip it when the library builds its tree inside ``train``);
    ``train`` fits the model from the training split; ``save``/``load`` round-trip it through
    ``model_dir`` so that prediction runs from disk as a user would; ``predict`` returns the
    ``N x L`` CSR top-k scores for one prediction ``variant`` (e.g. exact vs beam search).
    A system that reads texts (``reads_texts``) loads the training documents in ``prepare``
    (:func:`load_texts`) and predicts with ``predict_texts``, which gets the documents and their
    TF-IDF rows together.
    """

    variants: Sequence[str] = ("default",)
    has_index: bool = False
    has_train: bool = True
    reads_texts: bool = False  # True: predict_texts(texts, X, ...) instead of predict(X, ...)
    single_docs: int = SINGLE_DOCS  # eval documents predicted one per call (the 1-doc latency)
    times_prediction: bool = True  # False: predict() only reads outputs made inside train()
    model_in_dir: bool = True  # False: the model lives elsewhere, so its size is not reported

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.threads: int = args.threads
        self.seed: int = args.seed

    def prepare(self, data_dir: Path, X: sp.csr_matrix, Y: sp.csr_matrix) -> None:
        """Untimed conversion of the inputs into the library's format (e.g. a text file)."""

    def index(self, X: sp.csr_matrix, Y: sp.csr_matrix) -> None:
        raise NotImplementedError

    def train(self, X: sp.csr_matrix, Y: sp.csr_matrix, model_dir: Path) -> None:
        raise NotImplementedError

    def save(self, model_dir: Path) -> None:
        """Write the trained model under ``model_dir`` (a library may already have done so)."""

    def load(self, model_dir: Path, variant: str) -> None:
        """Load the model for prediction with ``variant``; default keeps the in-memory one."""

    def predict(self, X: sp.csr_matrix, k: int, variant: str) -> sp.csr_matrix:
        raise NotImplementedError

    def predict_texts(self, texts: list[str], X: sp.csr_matrix, k: int, variant: str) -> sp.csr_matrix:
        """``predict`` for a system that reads texts: ``texts[i]`` is the document of row ``X[i]``."""
        raise NotImplementedError

    def extra_info(self) -> dict[str, Any]:
        """Library version and settings actually used, recorded in the timings JSON."""
        return {}

    def reported_seconds(self) -> dict[str, float]:
        """Phase times measured inside ``train`` (e.g. a whole pipeline), replacing the driver's;
        ``finetune``: the seconds spent fine-tuning an encoder, where there is one."""
        return {}

    def variant_seconds(self, variant: str) -> dict[str, float]:
        """Fit seconds (``index``, ``train``, ``finetune``) that belong to one variant alone, where
        the variants are different models trained in one ``train`` (none: the run's apply)."""
        return {}


class _Clock:
    """Collects named wall times and RSS marks for the timings JSON."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.rss_mb: dict[str, float] = {}

    def phase(self, name: str) -> _Phase:
        return _Phase(self, name)


class _Phase:
    def __init__(self, clock: _Clock, name: str) -> None:
        self.clock, self.name = clock, name

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.clock.seconds[self.name] = time.perf_counter() - self.t0
        self.clock.rss_mb[self.name] = max_rss_mb()


def parse_args(
    argv: Sequence[str] | None = None, extra: Sequence[tuple[str, dict[str, Any]]] = ()
) -> argparse.Namespace:
    """The arguments every system script takes, plus ``extra`` (flag, argparse kwargs) pairs."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="folder with X/Y.<split>.npz")
    p.add_argument("--out", type=Path, required=True, help="run folder for preds, model, timings")
    p.add_argument("--train-split", default="train")
    p.add_argument("--eval-split", default="test")
    p.add_argument("--topk", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--stop-after", choices=STAGES, default="predict", help="last phase to run (each needs the ones before it)"
    )
    for flag, kwargs in extra:
        p.add_argument(flag, **kwargs)
    args = p.parse_args(argv)
    if args.topk < 1:
        raise PhaseError(f"--topk must be >= 1, got {args.topk}")
    if args.threads < 1:
        raise PhaseError(f"--threads must be >= 1, got {args.threads}")
    return args


def run(system: System, args: argparse.Namespace) -> dict[str, Any]:
    """Run the requested phases of ``system`` and write the outputs described in the module doc."""
    last = STAGES.index(args.stop_after)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    model_dir = out / MODEL_DIR
    model_dir.mkdir(exist_ok=True)
    clock = _Clock()

    with clock.phase("load_data"):
        X_tr, Y_tr = load_split(args.data, args.train_split)
    with clock.phase("prepare"):
        system.prepare(args.data, X_tr, Y_tr)
    if system.has_index:
        with clock.phase("index"):
            system.index(X_tr, Y_tr)
    if last >= STAGES.index("train") and system.has_train:
        with clock.phase("train"):
            system.train(X_tr, Y_tr, model_dir)
        with clock.phase("save"):
            system.save(model_dir)
        clock.seconds.update(system.reported_seconds())
    del X_tr, Y_tr

    predictions: dict[str, dict[str, Any]] = {}
    if last >= STAGES.index("predict") and system.has_train:
        X_ev, _ = load_split(args.data, args.eval_split)
        texts = load_texts(args.data, args.eval_split, X_ev.shape[0]) if system.reads_texts else None
        n_labels = sp.load_npz(args.data / f"Y.{args.train_split}.npz").shape[1]
        for variant in system.variants:
            with clock.phase(f"load.{variant}"):
                system.load(model_dir, variant)
            with clock.phase(f"predict.{variant}"):
                pred = predict_rows(system, X_ev, texts, args.topk, variant)
            pred = sp.csr_matrix(pred)
            if pred.shape != (X_ev.shape[0], n_labels):
                raise PhaseError(
                    f"{type(system).__name__}.predict({variant!r}) returned shape {pred.shape}, "
                    f"expected {(X_ev.shape[0], n_labels)}"
                )
            save_csr_atomic(pred, out / preds_file(variant))
            timed = system.times_prediction
            predictions[variant] = {
                "load_s": clock.seconds[f"load.{variant}"],
                "predict_s": clock.seconds[f"predict.{variant}"] if timed else None,
                "single_ms_p50": single_doc_ms(system, X_ev, texts, args.topk, variant, system.single_docs)
                if timed
                else None,
                "n_docs": int(X_ev.shape[0]),
                "fit_seconds": system.variant_seconds(variant),
            }

    record = {
        "system": type(system).__name__,
        "seconds": clock.seconds,
        "rss_mb_after": clock.rss_mb,
        "peak_rss_mb": max_rss_mb(),
        "predictions": predictions,
        "variants": list(predictions),  # the JSON sorts keys; keep the system's own order
        "model_bytes": dir_bytes(model_dir) if system.model_in_dir else None,
        "threads": args.threads,
        "topk": args.topk,
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "info": system.extra_info(),
    }
    save_json_atomic(record, out / TIMINGS_FILE)
    return record


def predict_rows(system: System, X: sp.csr_matrix, texts: list[str] | None, k: int, variant: str) -> sp.csr_matrix:
    """The system's predictions for rows ``X`` (and their ``texts`` for a system that reads texts)."""
    if system.reads_texts:
        return system.predict_texts(texts or [], X, k, variant)
    return system.predict(X, k, variant)


def single_doc_ms(
    system: System, X: sp.csr_matrix, texts: list[str] | None, k: int, variant: str, n: int = SINGLE_DOCS
) -> float:
    """Median wall milliseconds of ``predict`` on one document (the first ``n`` of the eval split,
    one call each, after one untimed call): the latency a server answering one request would see."""
    rows = [(X[i : i + 1], texts[i : i + 1] if texts is not None else None) for i in range(min(n, X.shape[0]))]
    if not rows:
        return float("nan")
    predict_rows(system, *rows[0], k, variant)
    times = []
    for row, text in rows:
        t0 = time.perf_counter()
        predict_rows(system, row, text, k, variant)
        times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times))


def main(
    system_cls: type[System], argv: Sequence[str] | None = None, extra: Sequence[tuple[str, dict[str, Any]]] = ()
) -> None:
    args = parse_args(argv, extra)
    run(system_cls(args), args)
