"""Label representations for semantic label indexing, selectable by name.

* ``pifa_tfidf``: Positive Instance Feature Aggregation over TF-IDF, ``v_l = sum_{i: y_il = 1} w_i x_i``
  then ``v_l / ||v_l||`` (csr ``L x F``).
* ``pifa_neural``: the same over dense document embeddings ``N x H`` (from an encoder or the
  fine-tuned matcher), dense ``L x H``.
* ``text_emb``: ``embed_fn(label texts)``, the mean-pooled encoder token states of each label's
  text (``embed_fn`` does the pooling); a label without text is embedded from its id string.
* combinations ``a+b`` (``pifa_concat`` = ``pifa_tfidf+pifa_neural``): the unit-norm blocks
  concatenated and scaled by ``1/sqrt(#blocks)``, so rows stay unit and every block weighs the same.

Document weights ``w_i``: with ``normalize_y_rows`` (default, as PECOS does) ``w_i = 1/sqrt(|y_i|)``,
so a document tagged with many labels -- weaker evidence about any one of them -- pulls each of
its labels less than a document about that label alone; without it ``w_i = 1`` (the paper's formula).

Labels with no positive training document have an all-zero PIFA. They still need a cluster, and
a cluster of only such labels would have no training instance for the matcher, so they borrow a
PIFA row (``orphan_fallback``): ``text_neighbour`` copies the row of the label with positives whose
text embedding is closest (needs ``label_texts`` and ``embed_fn``); ``random_label`` copies a
random label's row (seeded), spreading them over clusters like the labels themselves; ``none``
leaves zero rows (hierarchical k-means then puts them wherever room is left). ``auto`` picks
``text_neighbour`` when it can, else ``random_label``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from xtransformer.indexing.errors import IndexingError
from xtransformer.indexing.kmeans import resolve_threads
from xtransformer.indexing.sparse_sums import label_sums
from xtransformer.utils.rows import unit_rows

EmbedFn = Callable[[list[str]], np.ndarray]

BASE_REPRESENTATIONS = ("pifa_tfidf", "pifa_neural", "text_emb")
ALIASES = {"pifa_concat": "pifa_tfidf+pifa_neural"}
ORPHAN_FALLBACKS = ("auto", "text_neighbour", "random_label", "none")
_PIFA = ("pifa_tfidf", "pifa_neural")
_EMBED_BATCH = 4096  # label texts per embed_fn call
_SIM_CELLS = 1 << 24  # orphans x labels similarity block size in the neighbour search


def parse_representation(name: str) -> list[str]:
    """Blocks of a representation name, e.g. ``"pifa_concat"`` -> ``["pifa_tfidf", "pifa_neural"]``."""
    if not isinstance(name, str) or not name:
        raise IndexingError(f"representation name must be a non-empty string, got {name!r}")
    blocks = [b.strip() for b in ALIASES.get(name, name).split("+")]
    bad = [b for b in blocks if b not in BASE_REPRESENTATIONS]
    if bad:
        raise IndexingError(
            f"unknown label representation {bad[0]!r} in {name!r}; choose from {list(BASE_REPRESENTATIONS)}, "
            f"{list(ALIASES)} or '+'-joined combinations"
        )
    if len(set(blocks)) != len(blocks):
        raise IndexingError(f"label representation {name!r} repeats a block")
    return blocks


@dataclass
class LabelSources:
    """What labels can be represented from: TF-IDF rows (``pifa_tfidf``), document embeddings
    (``pifa_neural``), label texts and the function that embeds them (``text_emb``, the
    ``text_neighbour`` fallback), and the label ids (embedded in place of missing texts)."""

    X_tfidf: sp.spmatrix | None = None
    doc_embeddings: np.ndarray | None = None
    label_texts: Sequence[str | None] | None = None
    embed_fn: EmbedFn | None = None
    label_ids: Sequence[str] | None = None


@dataclass(frozen=True)
class RepresentationOptions:
    """``normalize_y_rows``: weight documents by ``1/sqrt(#labels)`` in PIFA; ``orphan_fallback``:
    what labels without positives get (module doc); ``seed``: for ``random_label``; ``threads``:
    of the sparse PIFA product (None: the CPUs available)."""

    normalize_y_rows: bool = True
    orphan_fallback: str = "auto"
    seed: int = 0
    threads: int | None = 1


def label_representation(
    name: str,
    Y: sp.spmatrix,
    sources: LabelSources | None = None,
    options: RepresentationOptions | None = None,
    **fields: Any,
) -> tuple[sp.csr_matrix | np.ndarray, dict[str, Any]]:
    """Label features ``L x D`` with unit rows, and a report of what was done.

    ``name``: ``pifa_tfidf``, ``pifa_neural``, ``text_emb``, ``pifa_concat`` or a ``+`` combination;
    ``Y``: training labels ``N x L`` (csr); ``fields``: fields of :class:`LabelSources` or
    :class:`RepresentationOptions` over ``sources`` / ``options``.
    """
    if not isinstance(sources, (LabelSources, type(None))) or not isinstance(
        options, (RepresentationOptions, type(None))
    ):
        raise IndexingError(
            "label_representation(name, Y, sources, options): pass inputs by name (X_tfidf=..., "
            "doc_embeddings=...) or as LabelSources / RepresentationOptions"
        )
    src_names = {f.name for f in dataclasses.fields(LabelSources)}
    src = dataclasses.replace(sources or LabelSources(), **{k: v for k, v in fields.items() if k in src_names})
    opt = dataclasses.replace(
        options or RepresentationOptions(), **{k: v for k, v in fields.items() if k not in src_names}
    )
    blocks = parse_representation(name)
    if opt.orphan_fallback not in ORPHAN_FALLBACKS:
        raise IndexingError(f"`orphan_fallback` must be one of {ORPHAN_FALLBACKS}, got {opt.orphan_fallback!r}")
    Y = _check_Y(Y)
    # Validate every input before any expensive step.
    inputs = {
        "pifa_tfidf": lambda: _check_X(src.X_tfidf, Y.shape[0], "X_tfidf", sparse=True),
        "pifa_neural": lambda: _check_X(src.doc_embeddings, Y.shape[0], "doc_embeddings", sparse=False),
    }
    doc_feats = {b: inputs[b]() for b in blocks if b in _PIFA}
    report: dict[str, Any] = {
        "name": name,
        "blocks": blocks,
        "n_labels": Y.shape[1],
        "normalize_y_rows": opt.normalize_y_rows,
    }
    feats = _blocks(Y, blocks, doc_feats, src, opt, report)
    report["dims"] = {b: int(feats[b].shape[1]) for b in blocks}
    return concat_blocks([feats[b] for b in blocks]), report


def _blocks(
    Y: sp.csr_matrix,
    blocks: list[str],
    doc_feats: dict[str, Any],
    src: LabelSources,
    opt: RepresentationOptions,
    report: dict[str, Any],
) -> dict[str, sp.csr_matrix | np.ndarray]:
    """Each block's label rows (PIFA rows of labels without positives from their fallback donors)."""
    n_labels = Y.shape[1]
    orphans = np.flatnonzero(np.diff(Y.tocsc().indptr) == 0)
    if doc_feats and len(orphans) == n_labels:
        raise IndexingError("`Y` has no positive label at all: PIFA is empty")
    fallback = (
        _resolve_fallback(opt.orphan_fallback, src.label_texts, src.embed_fn) if doc_feats and len(orphans) else "none"
    )
    text_feats: np.ndarray | None = None
    if "text_emb" in blocks or fallback == "text_neighbour":
        text_feats, text_report = text_embedding(n_labels, src.label_texts, src.embed_fn, src.label_ids)
        report.update(text_report)
    feats: dict[str, sp.csr_matrix | np.ndarray] = {"text_emb": text_feats} if "text_emb" in blocks else {}
    if doc_feats:
        Yw = _weighted_Y(Y, opt.normalize_y_rows)
        donors = _orphan_donors(orphans, n_labels, fallback, text_feats, opt.seed)
        for b, X in doc_feats.items():
            feats[b] = _copy_rows(pifa(Yw, X, resolve_threads(opt.threads)), orphans, donors)
    report.update(n_orphans=len(orphans) if doc_feats else 0, orphan_fallback=fallback)
    return feats


def pifa(Yw: sp.csr_matrix, X: sp.spmatrix | np.ndarray, threads: int = 1) -> sp.csr_matrix | np.ndarray:
    """Row-normalised ``Yw.T @ X`` (csr for sparse ``X``, dense for dense ``X``); zero rows stay zero."""
    if sp.issparse(X):  # a fresh product (scipy's, to the bit, faster): scaled in place (PIFA is as big as X)
        return unit_rows(label_sums(Yw.T.tocsr(), sp.csr_matrix(X), threads), inplace=True)
    return unit_rows(np.asarray(Yw.T.tocsr() @ X, dtype=np.float32))


def text_embedding(
    n_labels: int,
    label_texts: Sequence[str | None] | None,
    embed_fn: EmbedFn | None,
    label_ids: Sequence[str] | None = None,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Unit-row embeddings of the label texts (label id where a text is missing) and a report."""
    if embed_fn is None:
        raise IndexingError("`embed_fn` is required for text embeddings (text_emb / text_neighbour)")
    if label_texts is not None and len(label_texts) != n_labels:
        raise IndexingError(f"`label_texts` has {len(label_texts)} entries but `Y` has {n_labels} labels")
    if label_ids is not None and len(label_ids) != n_labels:
        raise IndexingError(f"`label_ids` has {len(label_ids)} entries but `Y` has {n_labels} labels")
    ids = [str(i) for i in label_ids] if label_ids is not None else [str(i) for i in range(n_labels)]
    texts = list(label_texts) if label_texts is not None else [None] * n_labels
    missing = [i for i, t in enumerate(texts) if t is None or not str(t).strip()]
    for i in missing:
        texts[i] = ids[i]
    parts = []
    for start in range(0, n_labels, _EMBED_BATCH):
        batch = [str(t) for t in texts[start : start + _EMBED_BATCH]]
        out = np.asarray(embed_fn(batch), dtype=np.float32)
        if out.ndim != 2 or out.shape[0] != len(batch):
            raise IndexingError(
                f"`embed_fn` returned shape {out.shape} for {len(batch)} texts; expected ({len(batch)}, H)"
            )
        parts.append(out)
    E = np.concatenate(parts, axis=0)
    if not np.all(np.isfinite(E)):
        raise IndexingError("`embed_fn` returned NaN or infinite values")
    report = {
        "n_text_missing": len(missing),
        "text_missing_used": "label id" if label_ids is not None else "label index",
    }
    return unit_rows(E), report


def concat_blocks(blocks: list[sp.csr_matrix | np.ndarray]) -> sp.csr_matrix | np.ndarray:
    """Concatenate unit-row blocks with weight ``1/sqrt(#blocks)`` (csr if any block is sparse)."""
    if len(blocks) == 1:
        return blocks[0]
    w = np.float32(1.0 / np.sqrt(len(blocks)))
    if any(sp.issparse(b) for b in blocks):
        return sp.hstack([sp.csr_matrix(b) * w for b in blocks], format="csr", dtype=np.float32)
    return np.hstack([b * w for b in blocks]).astype(np.float32)


def _resolve_fallback(choice: str, label_texts: Sequence[str | None] | None, embed_fn: EmbedFn | None) -> str:
    if choice == "auto":
        return "text_neighbour" if (label_texts is not None and embed_fn is not None) else "random_label"
    if choice == "text_neighbour" and embed_fn is None:
        raise IndexingError("orphan_fallback='text_neighbour' needs `embed_fn` (and preferably `label_texts`)")
    return choice


def _orphan_donors(
    orphans: np.ndarray, n_labels: int, fallback: str, text_feats: np.ndarray | None, seed: int
) -> np.ndarray | None:
    """For each orphan label, the label with positives whose PIFA row it copies (None: keep zero rows)."""
    if len(orphans) == 0 or fallback == "none":
        return None
    has_pos = np.setdiff1d(np.arange(n_labels), orphans)
    if fallback == "random_label":
        return np.random.default_rng(seed).choice(has_pos, size=len(orphans))
    assert text_feats is not None
    cand = text_feats[has_pos]
    chunk = max(1, _SIM_CELLS // max(len(has_pos), 1))
    best = [np.argmax(text_feats[orphans[i : i + chunk]] @ cand.T, axis=1) for i in range(0, len(orphans), chunk)]
    return has_pos[np.concatenate(best)]


def _copy_rows(
    F: sp.csr_matrix | np.ndarray, rows: np.ndarray, donors: np.ndarray | None
) -> sp.csr_matrix | np.ndarray:
    """``F`` with rows ``rows`` replaced by rows ``donors`` (one row gather)."""
    if donors is None or len(rows) == 0:
        return F
    src = np.arange(F.shape[0])
    src[rows] = donors
    return F[src]


def _weighted_Y(Y: sp.csr_matrix, normalize_rows: bool) -> sp.csr_matrix:
    Yw = Y.astype(np.float32)
    if normalize_rows:
        Yw = unit_rows(Yw)
    return Yw


def _check_Y(Y: Any) -> sp.csr_matrix:
    if not sp.issparse(Y) or Y.ndim != 2:
        raise IndexingError(f"`Y` must be a scipy sparse N x L matrix, got {type(Y).__name__}")
    if Y.shape[0] == 0 or Y.shape[1] == 0:
        raise IndexingError(f"`Y` is empty (shape {Y.shape})")
    return sp.csr_matrix(Y, dtype=np.float32)


def _check_X(X: Any, n_docs: int, arg: str, sparse: bool) -> sp.csr_matrix | np.ndarray:
    if X is None:
        raise IndexingError(f"`{arg}` is required for this label representation")
    if sparse and not sp.issparse(X):
        raise IndexingError(f"`{arg}` must be a scipy sparse N x F matrix, got {type(X).__name__}")
    if not sparse and not isinstance(X, np.ndarray):
        raise IndexingError(f"`{arg}` must be a dense numpy N x H array, got {type(X).__name__}")
    if X.ndim != 2 or X.shape[0] != n_docs:
        raise IndexingError(f"`{arg}` has shape {X.shape} but `Y` has {n_docs} documents")
    data = X.data if sparse else X
    if not np.all(np.isfinite(data)):
        raise IndexingError(f"`{arg}` has NaN or infinite values")
    return sp.csr_matrix(X, dtype=np.float32) if sparse else np.asarray(X, dtype=np.float32)
