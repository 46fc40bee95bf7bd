"""XR-Linear: a level of OVA linear rankers at every level of a label tree, searched with a beam.

Given a chain (``chain[0]`` ``K_1 x 1``, ..., ``chain[-1]`` ``L x K_D``; any sequence of sparse
matrices, e.g. an ``xtransformer.indexing.ClusterChain``), level ``d`` learns one classifier per
node of level ``d + 1`` with targets ``binarize(Y @ C_D @ ... @ C_{d+2})`` and negatives from its
parent level: ``tfn`` = the instances whose true parent is the node's parent, ``man`` = those
whose beam (the model's own prediction at the parent level) reaches it, ``tfn+man`` = both
(PECOS's schemes). Prediction walks the levels keeping ``beam_size`` nodes per document, the
scores combined by the post-processor (PECOS's default ``l3-hinge``: product of
``exp(-max(0, 1 - s)^3)`` down the path).

A leaf level where a label sits in several clusters (label disentanglement) trains one
pseudo-label per (label, cluster) and merges their scores at prediction (``ranker/copies.py``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp

from xtransformer.ranker.config import HierarchicalLinearConfig
from xtransformer.ranker.copies import COPIES_DIR, LabelCopies
from xtransformer.ranker.errors import RankerError
from xtransformer.ranker.extend import extend_level, train_added
from xtransformer.ranker.features import as_features
from xtransformer.ranker.fit import LevelSpec, solver_params, train_levels
from xtransformer.ranker.level import LinearLevel, best_labels, load_level, save_level
from xtransformer.ranker.linear import load_model_meta
from xtransformer.ranker.negatives import binarize
from xtransformer.ranker.postprocess import get_post_processor
from xtransformer.topk import Candidates, concat, dedupe_max
from xtransformer.topk import topk as top_candidates
from xtransformer.utils.io import atomic_dir, save_json

if TYPE_CHECKING:  # indexing imports the ranker
    from xtransformer.indexing.placement import Placing

log = logging.getLogger(__name__)

ADDED_CELLS = 1 << 22  # (document, added label) cells a block when added labels are scored on every document


class HierarchicalLinear:
    """The TF-IDF-only hierarchical linear model (the project's linear baseline)."""

    def __init__(
        self,
        levels: list[LinearLevel],
        config: HierarchicalLinearConfig,
        train_stats: list[dict] | None = None,
        copies: LabelCopies | None = None,
        added_from: int | None = None,
    ):
        self.levels = levels
        self.config = config
        self.train_stats = train_stats or []
        self.copies = copies  # None: the leaf level is a partition (one column per label)
        self.added_from = added_from  # the leaf level's first column added after training (None: none)
        # the added columns alone (added_level), shared by the per-call copies of this model
        self._added: dict[str, tuple[LinearLevel, np.ndarray]] = {}

    @property
    def n_labels(self) -> int:
        return self.copies.n_labels if self.copies is not None else self.levels[-1].n_labels

    @property
    def n_features(self) -> int:
        return self.levels[0].n_features

    @property
    def n_weights(self) -> int:
        return int(sum(lv.n_weights for lv in self.levels))

    @property
    def chain(self) -> list[sp.csr_matrix]:
        """The label tree, its leaf level label x cluster (overlapping when labels have copies)."""
        out = [lv.C for lv in self.levels]
        if self.copies is not None:
            out[-1] = self.copies.collapse(out[-1])
        return out

    # ------------------------------------------------------------------ training
    @classmethod
    def train(
        cls,
        X: sp.spmatrix | np.ndarray,
        Y: sp.spmatrix,
        chain: Sequence[sp.spmatrix],
        cfg: HierarchicalLinearConfig | None = None,
        merge: str = "max",
    ) -> HierarchicalLinear:
        """Train every level of ``chain`` on ``X`` (``N x F``) and labels ``Y`` (``N x L``).

        A label in several leaf clusters trains one copy per cluster; ``merge`` (``max`` | ``mean``)
        combines their scores at prediction.
        """
        cfg = cfg or HierarchicalLinearConfig()
        X = as_features(X)
        chain = _check_chain(chain, Y, X)
        copies, chain[-1] = LabelCopies.of(chain[-1], merge)
        targets = level_targets(binarize(Y if copies is None else copies.expand(Y)), chain)
        params = solver_params(cfg)
        post = get_post_processor(cfg.post_processor)
        train = functools.partial(
            train_levels,
            X,
            params=params,
            bias=cfg.bias,
            threshold=cfg.threshold,
            batch_nnz=cfg.batch_nnz,
            threads=cfg.n_threads,
        )
        root = Candidates.root(X.shape[0], post.root_score)
        if "man" not in cfg.negatives:
            # teacher forcing: every level's rows are known upfront, so all levels train at once
            masks = [_level_mask(cfg.negatives, d, targets, root, X.shape[0], C.shape[1]) for d, C in enumerate(chain)]
            trained = train([LevelSpec(targets[d], C, m) for d, (C, m) in enumerate(zip(chain, masks))])
        else:
            # matcher-aware: a level's negatives come from the beam of the levels above it
            trained, beam = [], root
            for d, C in enumerate(chain):
                mask = _level_mask(cfg.negatives, d, targets, beam, X.shape[0], C.shape[1])
                trained += train([LevelSpec(targets[d], C, mask)])
                if d + 1 < len(chain):
                    beam = trained[-1][0].score(X, beam, post, cfg.beam_size, cfg.n_threads)
        model = cls([lv for lv, _ in trained], cfg, [info for _, info in trained], copies)
        log.info("XR-Linear trained: level sizes %s, %d weights", [C.shape[0] for C in chain], model.n_weights)
        return model

    # ------------------------------------------------------------------ prediction
    def predict(
        self,
        X: sp.spmatrix | np.ndarray,
        beam_size: int | None = None,
        topk: int | None = None,
        post_processor: str | None = None,
        matcher_weight: float | None = None,
    ) -> sp.csr_matrix:
        """Top-``topk`` label scores (csr ``N x L``) by beam search down the tree; a label's score
        is its ranker's times the path score of its leaf cluster raised to ``matcher_weight``."""
        X = as_features(X)
        if X.shape[1] != self.n_features:
            raise RankerError(f"hierarchical linear: `X` has {X.shape[1]} features, the model {self.n_features}")
        topk = topk or self.config.topk
        post = get_post_processor(post_processor or self.config.post_processor)
        beam = self._search(X, self.levels[:-1], post, beam_size)
        w = self.config.matcher_weight if matcher_weight is None else matcher_weight
        if w < 0:
            raise RankerError(f"hierarchical linear: matcher_weight must be >= 0, got {w}")
        beam.score = post.weight_parent(beam.score, w)
        width = topk if self.copies is None else self.copies.search_width(topk)
        found = self.levels[-1].score(X, beam, post, width, self.config.n_threads)
        if self.config.added_reach != "beam" and self.added_from is not None:
            path_weight = None if self.config.added_reach == "alone" else w
            found = top_candidates(
                dedupe_max(concat([found, self._added_everywhere(X, post, path_weight, width)], X.shape[0])), width
            )
        if self.copies is None:
            return found.to_csr(self.n_labels)
        return self.copies.merge_topk(found, topk).to_csr(self.n_labels)

    def predict_clusters(
        self, X: sp.spmatrix | np.ndarray, beam_size: int | None = None, post_processor: str | None = None
    ) -> sp.csr_matrix:
        """The leaf clusters the beam search reaches (csr ``N x K``, path scores): the matching
        matrix label disentanglement counts from."""
        X = as_features(X)
        post = get_post_processor(post_processor or self.config.post_processor)
        return self._search(X, self.levels[:-1], post, beam_size).to_csr(self.levels[-1].n_clusters)

    def _added_everywhere(self, X: sp.csr_matrix, post, w: float | None, keep: int) -> Candidates:
        """The added columns of the leaf level scored on every document (``keep`` best a document):
        their weights times the path score of their leaf (weighted by ``w``), as the beam would
        score them where it reaches that leaf; ``w`` None: their weights alone (no path)."""
        added, leaf_of = self.added_level()
        scorer = added._get_scorer()  # one cluster holds every added column: one pass over a document's features
        labels = scorer.slot_label[0]
        leaves, col = np.unique(leaf_of, return_inverse=True)
        n, threads = X.shape[0], self.config.n_threads

        def block(start: int) -> Candidates:  # a block of documents, on one thread
            Xc = X[start : start + size]
            doc = np.arange(Xc.shape[0], dtype=np.int64)
            raw = scorer.pair_scores(Xc, doc, np.zeros_like(doc))
            if w is None:
                final = post.combine(raw, np.float32(post.root_score))
            else:
                final = post.combine(raw, post.weight_parent(self._paths(Xc, leaves, post, 1), w)[:, col[labels]])
            slots = np.ascontiguousarray(np.broadcast_to(labels, final.shape))
            return best_labels(doc + start, final, slots, n, keep)

        size = max(1, min(ADDED_CELLS // len(labels), -(-n // threads)))  # dense blocks of bounded size
        starts = list(range(0, n, size))
        if threads > 1 and len(starts) > 1:
            with ThreadPoolExecutor(threads) as pool:  # the compiled scoring releases the GIL
                parts = list(pool.map(block, starts))
        else:
            parts = [block(start) for start in starts]
        found = concat(parts, X.shape[0])
        found.item = found.item + self.added_from
        return found

    def added_level(self, columns: LinearLevel | None = None) -> tuple[LinearLevel, np.ndarray]:
        """The leaf level's added columns as one cluster (their weights alone) and the leaf of each,
        built once and shared by the per-call copies of this model; ``columns``: those columns as
        just appended (not sliced out of the whole level again)."""
        if "level" not in self._added:
            leaf, first = self.levels[-1], self.added_from
            W = leaf.columns(first) if columns is None else sp.csr_matrix(columns.W)
            one = sp.csr_matrix(np.ones((W.shape[1], 1), np.float32))
            self._added["level"] = (LinearLevel(W, one, leaf.bias).prepare(), leaf.C[first:].indices.copy())
        return self._added["level"]

    def _paths(self, X: sp.csr_matrix, leaves: np.ndarray, post, threads: int) -> np.ndarray:
        """Path scores (``N x len(leaves)``, the post-processor's combined space) of these leaf
        clusters (sorted, unique) for every document: the levels above scored only along their
        ancestors, every child of an ancestor kept, so no pair is missing."""
        n, upper = X.shape[0], self.levels[:-1]
        if not upper:
            return np.full((n, len(leaves)), post.root_score, dtype=np.float32)
        need = [leaves]
        for level in reversed(upper[1:]):  # a level's C maps its nodes to their parents
            need.append(np.unique(level.C[need[-1]].indices))
        beam = Candidates.root(n, post.root_score)
        for level, nodes in zip(upper, reversed(need)):
            c = level.score(X, beam, post, level.n_labels, threads)
            on_path = np.isin(c.item, nodes)
            beam = Candidates(c.doc[on_path], c.item[on_path], c.score[on_path], n)
        out = np.zeros((n, len(leaves)), dtype=np.float32)
        out[beam.doc, np.searchsorted(leaves, beam.item)] = beam.score
        return out

    def _search(self, X: sp.csr_matrix, levels: list[LinearLevel], post, beam_size: int | None) -> Candidates:
        """Beam search down ``levels``, ``beam_size`` nodes kept per level."""
        if X.shape[1] != self.n_features:
            raise RankerError(f"hierarchical linear: `X` has {X.shape[1]} features, the model {self.n_features}")
        beam = Candidates.root(X.shape[0], post.root_score)
        for level in levels:
            beam = level.score(X, beam, post, beam_size or self.config.beam_size, self.config.n_threads)
        return beam

    # ------------------------------------------------------------------ growing
    def add_labels(
        self,
        X: sp.spmatrix | np.ndarray,
        Y: sp.spmatrix,
        X_index: sp.spmatrix | np.ndarray | None = None,
        placing: Placing | None = None,
        one_vs_all: tuple[LinearLevel, dict] | None = None,
    ) -> tuple[HierarchicalLinear, dict]:
        """This model with the labels of ``Y``'s columns after its own (``Y``: ``N x L_all``, its
        labels first) placed in its leaves as ``placing`` says (default: the two nearest centroids;
        ``X_index``: the documents in the tree's representation, default ``X``) and trained on ``X``
        against every document or each leaf's (``placing.negatives``, else ``added_negatives``;
        ``one_vs_all``: the former, already trained); the upper levels and every old label's weights
        are shared, unchanged. Returns it and a report."""
        from xtransformer.indexing.placement import Placing, place_labels  # here: indexing imports the ranker

        placing = (placing or Placing()).resolved("centroid")
        X, Y = as_features(X), sp.csr_matrix(Y)
        Y_new, every = sp.csr_matrix(Y[:, self.n_labels :]), self.trains_added_on_every_document(placing)
        # placing reads only the routes of documents with a new label; `leaf` negatives read every document's
        routes = self._routes_of(X, np.flatnonzero(np.diff(Y_new.indptr)) if every else None)
        C = self.chain[-1]
        X_index = X if X_index is None else X_index
        placed = place_labels(Y, X_index, C, placing.n_leaves(C), routes, by=placing.by, threads=self.config.n_threads)
        if one_vs_all is None and every:
            one_vs_all = train_added(X, Y_new, self.config)
        ext = extend_level(self.levels[-1], self.copies, self.config, X, Y, placed.leaves, routes, one_vs_all)
        first = self.added_from if self.added_from is not None else self.levels[-1].n_labels
        model = HierarchicalLinear([*self.levels[:-1], ext.level], self.config, self.train_stats, ext.copies, first)
        model.added_level(ext.added if self.added_from is None else None)  # ready before the first prediction
        report = {"placement": placed.summary(), "leaves": placed.leaves, "training": ext.info}
        return model, report | {"negatives": "all" if every else "leaf"}

    def _routes_of(self, X: sp.csr_matrix, docs: np.ndarray | None) -> sp.csr_matrix:
        """The leaf clusters the beam reaches (``predict_clusters``) from documents ``docs`` (None:
        all), as rows of ``N x K`` (the other rows empty)."""
        if docs is None:
            return self.predict_clusters(X)
        found = self.predict_clusters(X[docs])
        indptr = np.zeros(X.shape[0] + 1, np.int64)
        indptr[docs + 1] = np.diff(found.indptr)
        return sp.csr_matrix((found.data, found.indices, np.cumsum(indptr)), shape=(X.shape[0], found.shape[1]))

    def trains_added_on_every_document(self, placing: Placing) -> bool:
        """Whether new labels train one-vs-all (``placing.negatives``, else ``added_negatives``)."""
        return (placing.negatives or self.config.added_negatives) == "all"

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | Path) -> None:
        with atomic_dir(path) as tmp:
            for d, level in enumerate(self.levels):
                save_level(level, tmp / f"level_{d}")
            if self.copies is not None:
                self.copies.save(tmp / COPIES_DIR)
            save_json(
                {
                    "model": "HierarchicalLinear",
                    "depth": len(self.levels),
                    "config": self.config.to_dict(),
                    "train_stats": self.train_stats,
                    "added_from": self.added_from,
                },
                tmp / "model.json",
            )

    @classmethod
    def load(cls, path: str | Path) -> HierarchicalLinear:
        path = Path(path)
        meta = load_model_meta(path, "model.json", "HierarchicalLinear")
        levels = [load_level(path / f"level_{d}") for d in range(int(meta["depth"]))]
        model = cls(
            levels,
            HierarchicalLinearConfig(**meta["config"]),
            meta.get("train_stats"),
            LabelCopies.load(path / COPIES_DIR),
            meta.get("added_from"),
        )
        if model.added_from is not None:
            model.added_level()  # now, not on the first request
        return model


def level_targets(Y: sp.csr_matrix, chain: Sequence[sp.csr_matrix]) -> list[sp.csr_matrix]:
    """Targets of every level: ``targets[-1] = Y``, ``targets[d] = binarize(targets[d + 1] @ chain[d + 1])``."""
    out = [Y]
    for C in reversed(chain[1:]):
        out.append(binarize(out[-1] @ C))
    return out[::-1]


def _level_mask(
    scheme: str, d: int, targets: list[sp.csr_matrix], beam: Candidates, n_docs: int, n_parents: int
) -> sp.csr_matrix:
    """Rows of each parent node that train its children: all rows at the root, else tfn/man."""
    if d == 0:
        return sp.csr_matrix(np.ones((n_docs, 1), dtype=np.float32))
    mask = sp.csr_matrix((n_docs, n_parents), dtype=np.float32)
    if "tfn" in scheme:
        mask = mask + targets[d - 1]
    if "man" in scheme:
        mask = mask + beam.to_csr(n_parents)
    return binarize(mask)


def _check_chain(chain: Sequence[sp.spmatrix], Y: sp.spmatrix, X: sp.csr_matrix) -> list[sp.csr_matrix]:
    """The tree's levels, checked by ``ClusterChain`` (one set of tree rules), binarised."""
    from xtransformer.indexing.chain import ClusterChain  # here: indexing imports the ranker
    from xtransformer.indexing.errors import IndexingError

    if not sp.issparse(Y) or Y.shape[0] != X.shape[0]:
        raise RankerError(f"hierarchical linear: `Y` must be sparse with {X.shape[0]} rows (as X)")
    try:
        mats = list(chain) if isinstance(chain, ClusterChain) else list(ClusterChain(list(chain)))
    except IndexingError as err:
        raise RankerError(f"hierarchical linear: {err}") from None
    if mats[-1].shape[0] != Y.shape[1]:
        raise RankerError(
            f"hierarchical linear: chain[-1] has {mats[-1].shape[0]} rows but `Y` has {Y.shape[1]} labels"
        )
    return [binarize(C) for C in mats]
