"""The label tree as XR-Transformer fine-tunes it: levels, count targets, shortlists, head bootstrap.

Notation (the paper's): level ``t`` has ``K_t`` nodes, ``C_t`` (``K_t x K_{t-1}``) marks each node's
parent, and the last level is the labels themselves. Level-``t`` targets keep counts,
``R_t = Y · A_t`` with ``A_t`` the ``L x K_t`` label-to-level-``t`` map (eq. 6): a document with
three labels in one cluster weighs that cluster three times. The shortlist of level ``t`` is the
children of the true parents (teacher forcing) and of the predicted parents (matcher-aware), eq. 8.
Everything here is sparse; nothing is ``N x K`` dense.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from xtransformer.ranker.negatives import binarize

# cache stage names of the level loop and of the fine-tuned embeddings (XRTransformer.stage_keys)
LEVEL_STAGE, EMBED_STAGE = "xrlevel", "xrembed"


@dataclass(frozen=True)
class Level:
    """One level of the tree: its node count, parent matrix and label-to-node map."""

    index: int  # 0-based from the top
    parents: sp.csr_matrix  # C_t: K_t x K_{t-1} (K_0 = 1: the root)
    label_map: sp.csr_matrix  # A_t: L x K_t (identity at the label level)

    @property
    def n_nodes(self) -> int:
        return self.parents.shape[0]


def tree_levels(chain: Sequence[sp.spmatrix]) -> list[Level]:
    """Every level of a chain ``[K_1 x 1, K_2 x K_1, ..., L x K_D]``, the label level last."""
    mats = [binarize(sp.csr_matrix(m)) for m in chain]
    maps = [sp.identity(mats[-1].shape[0], dtype=np.float32, format="csr")]
    for C in reversed(mats[1:]):
        maps.append(binarize(maps[-1] @ C))
    maps.reverse()
    return [Level(t, C, A) for t, (C, A) in enumerate(zip(mats, maps))]


def n_matched(sizes: Sequence[int], max_match_clusters: int) -> int:
    """How many levels (node counts ``sizes``, top first) are fine-tuned: from the top, every level
    with at most ``max_match_clusters`` nodes."""
    n = 0
    while n < len(sizes) and sizes[n] <= max_match_clusters:
        n += 1
    return n


def matched_levels(levels: Sequence[Level], max_match_clusters: int) -> list[Level]:
    """The levels to fine-tune (see :func:`n_matched`)."""
    return list(levels[: n_matched([lv.n_nodes for lv in levels], max_match_clusters)])


def count_targets(Y: sp.spmatrix, level: Level) -> sp.csr_matrix:
    """``R_t = binarize(Y) · A_t``: how many of a document's labels sit under each node (float32)."""
    R = sp.csr_matrix(binarize(sp.csr_matrix(Y)) @ level.label_map, dtype=np.float32)
    R.eliminate_zeros()
    R.sort_indices()
    return R


def teacher_shortlist(Y: sp.spmatrix, parent: Level | None, level: Level) -> sp.csr_matrix:
    """Children of each document's true parents (eq. 8, second term), binary ``N x K_t``.

    At the top level (no parent) every node is a child of the root: the whole level.
    """
    n = Y.shape[0]
    if parent is None:
        return sp.csr_matrix(np.ones((n, level.n_nodes), dtype=np.float32))
    return binarize(binarize(count_targets(Y, parent)) @ level.parents.T.tocsr())


def children_table(level: Level) -> np.ndarray:
    """``K_{t-1} x max_children`` int64 table of each parent's children, padded with -1."""
    C = level.parents.tocsc()
    counts = np.diff(C.indptr)
    width = int(counts.max(initial=0))
    table = np.full((C.shape[1], max(width, 1)), -1, dtype=np.int64)
    within = np.arange(C.nnz) - np.repeat(C.indptr[:-1], counts)
    table[np.repeat(np.arange(C.shape[1]), counts), within] = C.indices
    return table


def inherit_head(W_prev: np.ndarray, b_prev: np.ndarray, level: Level) -> tuple[np.ndarray, np.ndarray]:
    """``W_t = C_t W_{t-1}``: every node starts as its parent, so the new level's first scores
    reproduce the parent level's (a child scores exactly what its parent scored). A node with
    several parents (label disentanglement) starts as their mean."""
    C = level.parents.tocsr().astype(np.float32)
    counts = np.diff(C.indptr)
    if counts.max(initial=1) > 1:
        C = sp.diags(1.0 / np.maximum(counts, 1)).astype(np.float32) @ C
    return np.asarray(C @ W_prev, dtype=np.float32), np.asarray(C @ b_prev, dtype=np.float32).ravel()
