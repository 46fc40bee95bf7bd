"""One level of one-vs-all linear rankers: training under a negative mask, and shortlist scoring.

``LinearLevel`` is the shared core (a weight matrix ``W``, ``(F + 1) x L`` with the bias weights
in the last row, and the label-to-cluster matrix ``C``); ``LinearRanker`` is the neural path's
public single-level model (features and shortlist come from outside).

Scoring a shortlist runs one compiled loop per chunk of documents (``kernels.pair_scores``) over
a feature-major copy of ``W`` (see ``_Scorer``): each document's nonzeros meet the weight rows of
the clusters in its beam, written straight into a dense ``pairs x labels-per-cluster`` block, with
no Python loop over clusters or documents and no sparse intermediate.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from xtransformer.ranker.blocks import BlockData, build_block, make_groups, plan_batches, ranges
from xtransformer.ranker.config import RankerConfig
from xtransformer.ranker.copies import COPIES_DIR, LabelCopies
from xtransformer.ranker.errors import RankerError
from xtransformer.ranker.features import as_features
from xtransformer.ranker.negatives import binarize
from xtransformer.ranker.postprocess import PostProcessor, get_post_processor
from xtransformer.ranker.topk import Candidates, concat, dedupe_max, topk, topk_pairs
from xtransformer.utils.io import atomic_dir, is_complete, load_csr, load_json, save_csr, save_json

from xtransformer.ranker.solver import Block, SolverParams, SolveStats, solve_block

log = logging.getLogger(__name__)

MAX_SLOTS = 16  # labels solved together: keeps the F_task x slots weight tensors cache-sized
DENSE_BYTES = 64 << 20  # a level's W at most this big is also kept dense (see _Scorer.pair_scores)
SCORE_CHUNK_COST = 4_000_000  # document nonzeros per pair plus (pair, slot) cells per scoring chunk


def solver_params(cfg: RankerConfig) -> SolverParams:
    return SolverParams(loss=cfg.loss, Cp=cfg.Cp, Cn=cfg.Cn, eps=cfg.eps, max_iter=cfg.max_iter, max_cg_iter=cfg.max_cg_iter)


# ---------------------------------------------------------------------------------------------- level
@dataclass(eq=False)
class LinearLevel:
    """OVA weights of one level: ``W`` (``(F + has_bias) x L``) and clusters ``C`` (``L x K``)."""

    W: sp.csc_matrix
    C: sp.csr_matrix
    bias: float
    _scorer: "_Scorer | None" = field(default=None, repr=False)

    @property
    def n_features(self) -> int:
        return self.W.shape[0] - (1 if self.bias > 0 else 0)

    @property
    def n_labels(self) -> int:
        return self.W.shape[1]

    @property
    def n_clusters(self) -> int:
        return self.C.shape[1]

    # ------------------------------------------------------------------ training
    @classmethod
    def train(
        cls,
        X: sp.csr_matrix,
        Y: sp.csr_matrix,
        C: sp.csr_matrix,
        mask: sp.csr_matrix,
        params: SolverParams,
        bias: float,
        threshold: float,
        batch_nnz: int,
        threads: int,
    ) -> tuple["LinearLevel", dict]:
        """Train every label of ``C`` on the rows its cluster selects in ``mask``."""
        return train_levels(X, [LevelSpec(Y, C, mask)], params, bias, threshold, batch_nnz, threads)[0]

    # ------------------------------------------------------------------ scoring
    def _get_scorer(self) -> "_Scorer":
        if self._scorer is None:
            self._scorer = _Scorer(self.W, self.C, self.bias)
        return self._scorer

    def prepare(self) -> "LinearLevel":
        """Build the scoring layout and load the compiled loop now (a loaded model's first
        prediction is then as fast as the next)."""
        self._get_scorer().warm_up()
        return self

    def score(
        self, X: sp.csr_matrix, parents: Candidates, post: PostProcessor, keep: int, threads: int = 1
    ) -> Candidates:
        """Score the labels of every (document, cluster) pair in ``parents``; keep ``keep`` per doc.

        ``parents.score`` must already be in the post-processor's combined space.
        """
        if X.shape[1] != self.n_features:
            raise RankerError(f"ranker: `X` has {X.shape[1]} features but the model was trained on {self.n_features}")
        if len(parents.item) and (parents.item.max() >= self.n_clusters or parents.item.min() < 0):
            raise RankerError(f"ranker: shortlist cluster ids must lie in [0, {self.n_clusters})")
        scorer = self._get_scorer()
        chunks = _chunks(parents, np.diff(X.indptr), scorer.n_max)
        hard = bool(np.all(np.diff(self.C.indptr) == 1))

        def run(sel: slice) -> Candidates:
            doc, node, parent = parents.doc[sel], parents.item[sel], parents.score[sel]
            raw = scorer.pair_scores(X, doc, node)
            labels = scorer.slot_label[node]
            final = post.combine(raw, parent[:, None])
            if hard:
                return topk_pairs(doc, final, labels, parents.n_docs, keep)
            valid = labels >= 0  # a label under several kept clusters: keep its best score once
            c = Candidates(np.broadcast_to(doc[:, None], labels.shape)[valid], labels[valid], final[valid], parents.n_docs)
            return topk(dedupe_max(c), keep)

        if threads > 1 and len(chunks) > 1:
            with ThreadPoolExecutor(threads) as pool:  # scipy's sparse products release the GIL
                parts = list(pool.map(run, chunks))
        else:
            parts = [run(s) for s in chunks]
        return concat(parts, parents.n_docs)


class _Scorer:
    """Raw scores of (document, cluster) pairs for every label slot of the cluster.

    The level's weights in the feature-major layout of :func:`kernels.pair_scores`: one row per
    (feature, cluster) that holds a weight, listing the (weight, slot) entries of the cluster's
    labels (slot ``j`` of cluster ``k`` is label ``slot_label[k, j]``). Row and entry fields are
    interleaved so that one cache line serves both. Built in linear time by scipy (a column gather
    and a csc -> csr conversion); about the size of ``W`` itself.
    """

    def __init__(self, W: sp.csc_matrix, C: sp.csr_matrix, bias: float):
        Cc = C.tocsc()
        Cc.sort_indices()
        self.K, self.F1, self.bias = C.shape[1], W.shape[0], float(bias)
        sizes = np.diff(Cc.indptr)
        self.n_max = max(int(sizes.max(initial=0)), 1)
        k_of = np.repeat(np.arange(self.K, dtype=np.int64), sizes)  # per (cluster, label) entry
        j_of = ranges(np.zeros(self.K), sizes)
        l_of = Cc.indices.astype(np.int64)
        self.slot_label = np.full((self.K, self.n_max), -1, dtype=np.int64)
        self.slot_label[k_of, j_of] = l_of
        # columns in (cluster, slot) order, then feature-major: each feature's entries come grouped by cluster
        Wf = sp.csc_matrix(W)[:, l_of].tocsr()
        Wf.sort_indices()
        feat = np.repeat(np.arange(self.F1, dtype=np.int64), np.diff(Wf.indptr))
        clus = k_of[Wf.indices]
        starts = np.flatnonzero(np.r_[True, (feat[1:] != feat[:-1]) | (clus[1:] != clus[:-1])]) if Wf.nnz else np.zeros(0, np.int64)
        idx = np.int32 if Wf.nnz < 2**31 - 1 else np.int64
        self.rows = np.empty((len(starts) + 1, 2), dtype=idx)
        self.rows[:-1, 0], self.rows[:-1, 1] = clus[starts], starts
        self.rows[-1] = (-1, Wf.nnz)
        self.feat_ptr = np.searchsorted(feat[starts], np.arange(self.F1 + 1)).astype(idx)
        self.entries = np.empty((Wf.nnz, 2), dtype=np.float32)  # (weight, slot): slots < 2^24 are exact
        self.entries[:, 0], self.entries[:, 1] = Wf.data, j_of[Wf.indices]
        # a small level (few labels, e.g. the top of the tree) is also kept as a dense F x L array:
        # when the beams cover most of its clusters, one csr @ dense product scores them fastest
        # (C order: scipy's csr @ dense copies a Fortran-ordered operand on every call)
        self.W_dense = np.ascontiguousarray(W.toarray()) if self.F1 * W.shape[1] * 4 <= DENSE_BYTES else None

    def warm_up(self) -> None:
        empty = np.zeros(0, np.int64)
        self.pair_scores(sp.csr_matrix((1, self.F1 - (1 if self.bias > 0 else 0)), dtype=np.float32), empty, empty)

    def pair_scores(self, X: sp.csr_matrix, doc: np.ndarray, node: np.ndarray) -> np.ndarray:
        """Raw scores ``P x n_max`` of the label slots of clusters ``node`` for documents ``doc`` (grouped)."""
        from xtransformer.ranker.kernels import pair_scores  # numba loads with the first scoring only

        starts = np.flatnonzero(np.r_[True, doc[1:] != doc[:-1]]) if len(doc) else np.zeros(0, np.int64)
        if self.W_dense is not None and 2 * len(doc) >= self.K * len(starts):  # beams hold most clusters
            F = self.F1 - (1 if self.bias > 0 else 0)
            docs = doc[starts]
            every = len(docs) == X.shape[0] and docs[-1] == len(docs) - 1  # sorted unique: all rows in order
            full = (X if every else X[docs]) @ self.W_dense[:F]
            if self.bias > 0:
                full += np.float32(self.bias) * self.W_dense[F]
            slots = self.slot_label[node]
            out = full[np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(doc)]))[:, None], np.maximum(slots, 0)]
            out[slots < 0] = 0.0
            return out
        out = np.zeros((len(doc), self.n_max), dtype=np.float32)
        pair_scores(X.indptr.astype(np.int64, copy=False), X.indices.astype(np.int32, copy=False), X.data,
                    doc.astype(np.int64, copy=False), node.astype(np.int64, copy=False), self.feat_ptr, self.rows,
                    self.entries, self.F1 - 1, np.float32(self.bias), self.K, out)
        return out


def _chunks(parents: Candidates, row_nnz: np.ndarray, n_max: int) -> list[slice]:
    """Split the (doc-grouped) pairs into slices of about ``SCORE_CHUNK_COST`` work, cut between documents."""
    P = len(parents.doc)
    if P == 0:
        return []
    cum = np.cumsum(row_nnz[parents.doc].astype(np.int64) + n_max)
    starts = np.flatnonzero(np.r_[True, parents.doc[1:] != parents.doc[:-1]])
    chunk_of_doc = (cum[starts] - cum[starts[0]]) // SCORE_CHUNK_COST
    cuts = starts[np.r_[True, chunk_of_doc[1:] != chunk_of_doc[:-1]]]
    bounds = np.r_[cuts, P]
    return [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


@dataclass
class LevelSpec:
    """One level to train: targets ``Y`` (``N x L``), clusters ``C`` (``L x K``), negative mask (``N x K``)."""

    Y: sp.csr_matrix
    C: sp.csr_matrix
    mask: sp.csr_matrix


def train_levels(
    X: sp.csr_matrix,
    specs: list[LevelSpec],
    params: SolverParams,
    bias: float,
    threshold: float,
    batch_nnz: int,
    threads: int,
) -> list[tuple[LinearLevel, dict]]:
    """Train independent levels together: their blocks share one pool of worker threads.

    Sharing the pool balances the load: a level with one huge cluster (the root) runs on one
    thread while the others work through the many clusters of the lower levels.
    """
    t0 = time.perf_counter()
    F1 = X.shape[1] + (1 if bias > 0 else 0)
    row_nnz = np.diff(X.indptr)
    groups = [make_groups(spec.C, spec.mask) for spec in specs]
    batches = [plan_batches(g, row_nnz, F1, batch_nnz) for g in groups]
    n_blocks = sum(len(b) for b in batches)
    most_labels = max(int(g.n_labels.max(initial=1)) for g in groups)
    # with fewer blocks than threads, split each block's labels so that every thread works
    slots = MAX_SLOTS if n_blocks >= threads else max(1, min(MAX_SLOTS, -(-most_labels // threads)))
    trainer = _BlockTrainer(params, threshold, threads, slots, n_tags=len(specs))
    try:
        for d, (spec, g, bs) in enumerate(zip(specs, groups, batches)):
            for batch in bs:
                trainer.submit(build_block(X, spec.Y, g, batch, params.Cp, params.Cn, bias), tag=d)
    finally:
        parts = trainer.finish()
    out = []
    for d, spec in enumerate(specs):
        feats, labs, vals = parts[d]
        W = sp.csc_matrix((vals, (feats, labs)), shape=(F1, spec.C.shape[0]), dtype=np.float32)
        W.sort_indices()
        info = vars(trainer.stats[d]) | {
            "blocks": len(batches[d]),
            "tasks": int(sum(len(b) for b in batches[d])),
            "weights_nnz": int(W.nnz),
            "mask_nnz": int(spec.mask.nnz),
            "total_s": round(time.perf_counter() - t0, 3),
        }
        log.info("trained level %d: %d labels in %d clusters: %s", d, spec.C.shape[0], spec.C.shape[1], info)
        out.append((LinearLevel(W, binarize(spec.C), float(bias)), info))
    return out


class _BlockTrainer:
    """Solves blocks in ``threads`` worker threads, a chunk of at most ``slots`` labels at a time.

    Parallelism is coarse (one chunk per thread; scipy's sparse products and numpy's large
    elementwise ops release the GIL): fine-grained intra-op threading collapses when other
    processes share the cores, coarse chunks do not.
    The caller builds the next block while the workers solve; at most ``threads`` chunks wait
    in the queue, which bounds how many blocks are alive (memory).
    """

    def __init__(self, params: SolverParams, threshold: float, threads: int, slots: int, n_tags: int = 1):
        self.params = params
        self.threshold = threshold
        self.slots = slots
        self.threads = max(1, threads)
        self.pool = ThreadPoolExecutor(self.threads)
        self.pending: dict[Future, int] = {}  # chunk -> tag
        self.stats = [SolveStats() for _ in range(n_tags)]
        self.parts: list[list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = [[] for _ in range(n_tags)]

    def submit(self, bd: BlockData, tag: int = 0) -> None:
        block = Block.from_scipy(bd.X, bd.row_len, bd.col_len, bd.Y, bd.cost)
        n = bd.Y.shape[1]
        bounds = np.linspace(0, n, -(-n // self.slots) + 1).round().astype(int)  # even chunks
        for j0, j1 in zip(bounds[:-1], bounds[1:]):  # loop over label chunks of one block (a few per cluster)
            cols = slice(int(j0), int(j1))
            self.pending[self.pool.submit(self._solve, bd, block.columns(cols), cols)] = tag
            if len(self.pending) > self.threads:  # wait for any chunk: no head-of-line blocking
                done, _ = wait(list(self.pending), return_when=FIRST_COMPLETED)
                for fut in done:
                    self._collect(self.pending.pop(fut), fut)

    def _solve(self, bd: BlockData, block: Block, cols: slice) -> tuple[np.ndarray, np.ndarray, np.ndarray, SolveStats]:
        W = solve_block(block, self.params)
        slot_label = bd.slot_label[:, cols]
        col_task = bd.col_task
        f, j = np.nonzero((np.abs(W) >= self.threshold) & (slot_label[col_task] >= 0))
        return bd.col_feature[f], slot_label[col_task[f], j], W[f, j], block.stats

    def _collect(self, tag: int, fut) -> None:
        feats, labs, vals, stats = fut.result()
        self.parts[tag].append((feats, labs, vals))
        self.stats[tag].add(stats)

    def finish(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Wait for every chunk; the (feature, label, weight) triplets of each tag."""
        try:
            for fut in list(self.pending):
                self._collect(self.pending.pop(fut), fut)
        finally:
            self.pool.shutdown(wait=True, cancel_futures=True)
        empty = (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32))
        return [
            tuple(np.concatenate([p[i] for p in parts]) for i in range(3)) if parts else empty  # type: ignore[misc]
            for parts in self.parts
        ]


# ---------------------------------------------------------------------------------------------- ranker
class LinearRanker:
    """Single-level OVA rankers over an external shortlist (the neural matcher's top-b clusters)."""

    def __init__(self, level: LinearLevel, config: RankerConfig, train_stats: dict | None = None,
                 copies: LabelCopies | None = None):
        self.level = level
        self.config = config
        self.train_stats = train_stats or {}
        self.copies = copies  # None: ``C`` is a partition (one column per label)

    @classmethod
    def train(
        cls, X: sp.spmatrix | np.ndarray, Y: sp.spmatrix, C: sp.spmatrix, negatives: sp.spmatrix, cfg: RankerConfig,
        merge: str = "max",
    ) -> "LinearRanker":
        """Train a weight vector per label of ``C`` (``L x K``) on the rows of ``negatives`` (``N x K`` mask).

        A label in several clusters of ``C`` trains one copy per cluster, on that cluster's rows;
        ``merge`` (``max`` | ``mean``) combines the copies' scores at prediction.
        """
        X, Y, C, mask = check_training_inputs(X, Y, C, negatives)
        copies, C = LabelCopies.of(C, merge)
        level, info = LinearLevel.train(
            X, Y if copies is None else copies.expand(Y), C, mask, solver_params(cfg), cfg.bias, cfg.threshold,
            cfg.batch_nnz, cfg.n_threads,
        )
        return cls(level, cfg, info, copies)

    @property
    def n_labels(self) -> int:
        return self.copies.n_labels if self.copies is not None else self.level.n_labels

    @property
    def W(self) -> sp.csr_matrix:
        """Weights ``(F + 1) x L`` (csr; one column per copy when labels have copies); the last row
        holds the bias weights when ``bias > 0``."""
        return self.level.W.tocsr()

    @property
    def n_weights(self) -> int:
        return int(self.level.W.nnz)

    def predict(
        self,
        X: sp.spmatrix | np.ndarray,
        shortlist: sp.spmatrix,
        topk: int | None = None,
        post_processor: str | None = None,
        shortlist_transformed: bool = False,
    ) -> sp.csr_matrix:
        """Top-``topk`` label scores (csr ``N x L``) for the labels of each document's shortlisted clusters.

        ``shortlist`` (csr ``N x K``) holds the matcher's raw scores for its top-b clusters (set
        ``shortlist_transformed`` when they are already post-processed probabilities).
        """
        X = as_features(X)
        if not sp.issparse(shortlist) or shortlist.shape != (X.shape[0], self.level.n_clusters):
            raise RankerError(
                f"ranker: `shortlist` must be a sparse {(X.shape[0], self.level.n_clusters)} matrix, got "
                f"{getattr(shortlist, 'shape', type(shortlist).__name__)}"
            )
        post = get_post_processor(post_processor or self.config.post_processor)
        parents = Candidates.from_csr(shortlist)
        if not shortlist_transformed and post.rule != "child":
            parents.score = post.transform(parents.score)
        parents.score = post.weight_parent(parents.score, self.config.matcher_weight)
        k = topk or self.config.topk
        if self.copies is None:
            return self.level.score(X, parents, post, k, self.config.n_threads).to_csr(self.n_labels)
        out = self.level.score(X, parents, post, self.copies.search_width(k), self.config.n_threads)
        return self.copies.merge_topk(out, k).to_csr(self.n_labels)

    def save(self, path: str | Path) -> None:
        with atomic_dir(path) as tmp:
            save_level(self.level, tmp)
            if self.copies is not None:
                self.copies.save(tmp / COPIES_DIR)
            save_json({"model": "LinearRanker", "config": self.config.to_dict(), "train_stats": self.train_stats}, tmp / "ranker.json")

    @classmethod
    def load(cls, path: str | Path) -> "LinearRanker":
        path = Path(path)
        meta = load_model_meta(path, "ranker.json", "LinearRanker")
        return cls(load_level(path), RankerConfig(**meta["config"]), meta.get("train_stats"), LabelCopies.load(path / COPIES_DIR))


# ---------------------------------------------------------------------------------------------- helpers
def check_training_inputs(
    X: sp.spmatrix | np.ndarray, Y: sp.spmatrix, C: sp.spmatrix, mask: sp.spmatrix
) -> tuple[sp.csr_matrix, sp.csr_matrix, sp.csr_matrix, sp.csr_matrix]:
    X = as_features(X)
    for name, M in (("Y", Y), ("C", C), ("negatives", mask)):
        if not sp.issparse(M) or M.ndim != 2:
            raise RankerError(f"ranker: `{name}` must be a 2-D scipy sparse matrix, got {type(M).__name__}")
    if Y.shape[0] != X.shape[0]:
        raise RankerError(f"ranker: `Y` has {Y.shape[0]} rows but `X` has {X.shape[0]}")
    if C.shape[0] != Y.shape[1]:
        raise RankerError(f"ranker: `C` has {C.shape[0]} rows but `Y` has {Y.shape[1]} labels")
    if mask.shape != (X.shape[0], C.shape[1]):
        raise RankerError(f"ranker: `negatives` must be {(X.shape[0], C.shape[1])} (N x K), got {mask.shape}")
    return X, binarize(Y), binarize(C), binarize(mask)


def save_level(level: LinearLevel, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    save_csr(level.W.tocsr(), folder / "W.npz")
    save_csr(level.C, folder / "C.npz")
    save_json({"bias": level.bias, "n_features": level.n_features}, folder / "level.json")


def load_level(folder: Path) -> LinearLevel:
    for name in ("W.npz", "C.npz", "level.json"):
        if not (folder / name).is_file():
            raise RankerError(f"{folder}: missing {name}; not a saved ranker level")
    meta = load_json(folder / "level.json")
    level = LinearLevel(load_csr(folder / "W.npz").tocsc(), load_csr(folder / "C.npz"), float(meta["bias"]))
    if level.n_features != int(meta["n_features"]) or level.C.shape[0] != level.n_labels:
        raise RankerError(f"{folder}: W {level.W.shape} and C {level.C.shape} do not match level.json {meta}")
    return level.prepare()  # a loaded level is there to predict


def load_model_meta(path: Path, name: str, model: str) -> dict:
    if not is_complete(path):
        raise RankerError(f"{path}: not a complete saved {model} folder (missing or half-written)")
    meta = load_json(path / name)
    if meta.get("model") != model:
        raise RankerError(f"{path}/{name}: holds a {meta.get('model')!r}, expected {model!r}")
    return meta
