"""Combine the label-score matrices of several finished runs (X-Transformer's ensemble ranking).

Every input is a csr ``N x L`` holding each run's top-k label scores per document; the output is
the same, top-``topk`` per row. Entries a run did not store count as 0 in every method.

* ``average``: mean of the raw scores.
* ``rank-average``: mean reciprocal rank -- in each run, the entry ranked ``r`` within its row
  (1 = highest score; ties broken by the lower label id) contributes ``1 / r``. Robust to runs
  whose scores live on different scales.
* ``softmax-average``: each run's stored entries of a row go through a softmax, then the mean.

Command line (each run folder holds ``predictions/{split}.npz`` and ``label_vocab.txt``;
``RUN_DIR:METHOD`` takes that run's ``predictions/METHOD/{split}.npz``, e.g. ``RUN_DIR:xrlinear``)::

    python -m xtransformer.ensemble RUN_DIR [RUN_DIR[:METHOD] ...] --method average --out DIR \\
        [--weights W1 W2 ...] [--split dev] [--topk 20] [--truth Y.npz]

writes ``DIR/predictions/{split}.npz``, ``DIR/label_vocab.txt``, ``DIR/ensemble.json`` and, with
ground truth (``--truth`` or the first run's ``truth/{split}.npz``), ``DIR/metrics/{split}.json``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from xtransformer.data.vocab import vocab_difference
from xtransformer.topk import Candidates, topk, topk_csr
from xtransformer.utils.io import atomic_dir, atomic_path, load_csr, save_csr, save_json

log = logging.getLogger(__name__)

METHODS = ("average", "rank-average", "softmax-average")


class EnsembleError(ValueError):
    """Bad ensemble input: the message names the run folder, file or argument at fault."""


def ensemble_predictions(
    preds: Sequence[sp.spmatrix], method: str = "average", topk: int = 20, weights: Sequence[float] | None = None
) -> sp.csr_matrix:
    """Combine ``N x L`` score matrices by ``method``; keep the ``topk`` best labels per row.
    ``weights``: one per matrix, the mean becomes ``sum_i w_i m_i / sum_i w_i`` (None: equal)."""
    if method not in METHODS:
        raise EnsembleError(f"ensemble: `method` must be one of {list(METHODS)}, got {method!r}")
    if not isinstance(topk, (int, np.integer)) or topk < 1:
        raise EnsembleError(f"ensemble: `topk` must be an int >= 1, got {topk!r}")
    mats = _check_matrices(preds)
    share = _shares(weights, len(mats))
    transform = {"average": lambda m: m, "rank-average": _reciprocal_ranks, "softmax-average": _row_softmax}[method]
    total = transform(mats[0]) * share[0]
    for m, w in zip(mats[1:], share[1:]):
        total = total + transform(m) * w
    return topk_csr(sp.csr_matrix(total, dtype=np.float32), int(topk))


def _shares(weights: Sequence[float] | None, n: int) -> np.ndarray:
    """``weights`` normalised to sum 1 (float32), checked: one per matrix, >= 0, not all 0;
    None: 1 / n each."""
    if weights is None:
        return np.full(n, 1.0 / n, dtype=np.float32)
    try:
        w = np.array([float(v) for v in weights]) if not isinstance(weights, (str, bytes)) else np.array([])
    except (TypeError, ValueError):
        w = np.array([np.nan])
    if len(w) != n or not np.all(np.isfinite(w)) or (w < 0).any() or w.sum() <= 0:
        raise EnsembleError(
            f"ensemble: `weights` must be {n} numbers >= 0 (one per member, not all 0), got {weights!r}"
        )
    return (w / w.sum()).astype(np.float32)


def _check_matrices(preds: Sequence[sp.spmatrix]) -> list[sp.csr_matrix]:
    if len(preds) == 0:
        raise EnsembleError("ensemble: `preds` is empty; need at least one score matrix")
    mats = []
    for i, m in enumerate(preds):
        if not sp.issparse(m) or m.ndim != 2:
            raise EnsembleError(f"ensemble: preds[{i}] must be a scipy sparse N x L matrix, got {type(m).__name__}")
        if m.shape != preds[0].shape:
            raise EnsembleError(f"ensemble: preds[{i}] has shape {m.shape}, preds[0] has {preds[0].shape}")
        m = sp.csr_matrix(m, dtype=np.float32, copy=True)
        m.sum_duplicates()
        mats.append(m)
    return mats


def _reciprocal_ranks(m: sp.csr_matrix) -> sp.csr_matrix:
    """Same pattern as ``m``; value ``1 / rank`` of the entry within its row."""
    c = topk(Candidates.from_csr(m), max(int(np.diff(m.indptr).max(initial=0)), 1))  # sorted, all kept
    rank = np.arange(len(c.doc)) - np.searchsorted(c.doc, c.doc, side="left") + 1
    return Candidates(c.doc, c.item, (1.0 / rank).astype(np.float32), c.n_docs).to_csr(m.shape[1])


def _row_softmax(m: sp.csr_matrix) -> sp.csr_matrix:
    """Softmax over the stored entries of each row (rows without entries stay empty)."""
    out = m.copy()
    if out.nnz == 0:
        return out
    rows = np.repeat(np.arange(m.shape[0]), np.diff(m.indptr))
    nonempty = np.diff(m.indptr) > 0
    row_max = np.zeros(m.shape[0], dtype=np.float32)
    row_max[nonempty] = np.maximum.reduceat(m.data, m.indptr[:-1][nonempty])
    e = np.exp(m.data - row_max[rows])
    denom = np.bincount(rows, weights=e, minlength=m.shape[0])
    out.data = (e / denom[rows]).astype(np.float32)
    return out


# ---------------------------------------------------------------------------------------------- runs
def read_vocab(run: Path) -> list[str]:
    path = run / "label_vocab.txt"
    if not path.is_file():
        raise EnsembleError(f"{path}: missing; every run folder needs its label vocabulary")
    return path.read_text().splitlines()


def parse_member(spec: str | Path) -> tuple[Path, str | None]:
    """``RUN_DIR`` (the run's main predictions) or ``RUN_DIR:METHOD`` (``predictions/METHOD/``, e.g.
    ``xrlinear``, the TF-IDF-only model every run also trains)."""
    text = str(spec)
    if ":" in text and not Path(text).is_dir():
        run, method = text.rsplit(":", 1)
        return Path(run), method
    return Path(text), None


def predictions_dir(run: Path, method: str | None = None) -> Path:
    return run / "predictions" / method if method else run / "predictions"


def read_predictions(run: Path, split: str, method: str | None = None) -> sp.csr_matrix:
    path = predictions_dir(run, method) / f"{split}.npz"
    if not path.is_file():
        raise EnsembleError(
            f"{path}: missing; run {run} has no predictions for split {split!r}"
            + (f" from method {method!r}" if method else "")
        )
    return load_csr(path)


def common_splits(runs: Sequence[Path], methods: Sequence[str | None] | None = None) -> list[str]:
    methods = list(methods) if methods is not None else [None] * len(runs)
    sets = [{p.stem for p in predictions_dir(r, m).glob("*.npz")} for r, m in zip(runs, methods)]
    common = sorted(set.intersection(*sets)) if sets else []
    if not common:
        raise EnsembleError(f"ensemble: no split has predictions/<split>.npz in every run of {[str(r) for r in runs]}")
    return common


def check_vocabs(runs: Sequence[Path]) -> list[str]:
    """The shared label vocabulary; raise naming the first run and index that differ."""
    first = read_vocab(runs[0])
    for run in runs[1:]:
        detail = vocab_difference(read_vocab(run), first)
        if detail is not None:
            raise EnsembleError(
                f"{run / 'label_vocab.txt'}: label vocabulary differs from {runs[0] / 'label_vocab.txt'} ({detail})"
            )
    return first


def load_truth(runs: Sequence[Path], split: str, truth: Path | None) -> sp.csr_matrix | None:
    path = truth if truth is not None else runs[0] / "truth" / f"{split}.npz"
    if not path.is_file():
        if truth is not None:
            raise EnsembleError(f"{path}: --truth file not found")
        return None
    return load_csr(path)


def ensemble_runs(
    runs: Sequence[str | Path],
    out: Path,
    method: str,
    topk: int = 20,
    splits: Sequence[str] | None = None,
    truth: Path | None = None,
    weights: Sequence[float] | None = None,
) -> dict[str, dict[str, float]]:
    """Ensemble the predictions of run folders into ``out`` (``weights``: one per run, None: equal);
    return the metrics per split."""
    from xtransformer.metrics import evaluate  # imports torch(metrics): only needed here

    members = [parse_member(r) for r in runs]
    runs, methods = [m[0] for m in members], [m[1] for m in members]
    for r in runs:
        if not r.is_dir():
            raise EnsembleError(f"{r}: run folder not found")
    _shares(weights, len(runs))  # before any work
    vocab = check_vocabs(runs)
    splits = list(splits) if splits else common_splits(runs, methods)
    if truth is not None and len(splits) != 1:
        raise EnsembleError(
            f"--truth gives one ground truth but {len(splits)} splits are selected ({splits}); pass --split"
        )
    results: dict[str, dict[str, float]] = {}
    with atomic_dir(out) as tmp:
        for split in splits:
            preds = [read_predictions(r, split, m) for r, m in zip(runs, methods)]
            for r, m, p in zip(runs, methods, preds):
                if p.shape[1] != len(vocab):
                    raise EnsembleError(
                        f"{predictions_dir(r, m) / f'{split}.npz'}: {p.shape[1]} label columns but "
                        f"{len(vocab)} labels in label_vocab.txt"
                    )
            combined = ensemble_predictions(preds, method, topk, weights)
            save_csr(combined, tmp / "predictions" / f"{split}.npz")
            Y = load_truth(runs, split, truth)
            if Y is not None:
                if Y.shape != combined.shape:
                    raise EnsembleError(f"ground truth for {split!r} has shape {Y.shape}, predictions {combined.shape}")
                results[split] = evaluate(Y, combined)
                save_json(results[split], tmp / "metrics" / f"{split}.json")
            else:
                log.warning("ensemble: no ground truth for split %r (pass --truth); metrics skipped", split)
        with atomic_path(tmp / "label_vocab.txt") as p:
            p.write_text("\n".join(vocab) + "\n")
        save_json(
            {
                "runs": [str(r) for r in runs],
                "members": [str(r) for r in members_spec(members)],
                "method": method,
                "topk": topk,
                "weights": None if weights is None else list(weights),
                "splits": splits,
            },
            tmp / "ensemble.json",
        )
    return results


def members_spec(members: Sequence[tuple[Path, str | None]]) -> list[str]:
    return [f"{r}:{m}" if m else str(r) for r, m in members]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m xtransformer.ensemble", description="Ensemble the predictions of several runs."
    )
    ap.add_argument(
        "runs",
        nargs="+",
        help="run folders holding predictions/{split}.npz and label_vocab.txt; "
        "RUN_DIR:METHOD takes predictions/METHOD/{split}.npz instead (e.g. RUN_DIR:xrlinear)",
    )
    ap.add_argument("--method", choices=METHODS, default="average")
    ap.add_argument("--out", type=Path, required=True, help="output folder")
    ap.add_argument("--topk", type=int, default=20)
    ap.add_argument(
        "--weights",
        type=float,
        nargs="+",
        default=None,
        help="one weight per run, in order (default: equal); normalised to sum 1",
    )
    ap.add_argument(
        "--split", action="append", default=None, help="split(s) to combine (default: all present in every run)"
    )
    ap.add_argument("--truth", type=Path, default=None, help="ground truth Y (npz csr) for metrics of a single split")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    try:
        results = ensemble_runs(args.runs, args.out, args.method, args.topk, args.split, args.truth, args.weights)
    except EnsembleError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for split, m in results.items():
        print(split, " ".join(f"{k}={m[k]:.2f}" for k in ("P@1", "P@3", "P@5") if k in m))
    return 0


if __name__ == "__main__":
    sys.exit(main())
