"""Training levels of one-vs-all rankers: blocks of clusters solved in a pool of worker threads."""

from __future__ import annotations

import logging
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from xtransformer.ranker.blocks import BlockData, batch_costs, build_block, make_groups, plan_batches
from xtransformer.ranker.config import RankerConfig
from xtransformer.ranker.level import LinearLevel
from xtransformer.ranker.negatives import binarize
from xtransformer.ranker.solver import Block, SolverParams, SolveStats, solve_block
from xtransformer.topk import run_starts
from xtransformer.utils.memory import release_free_memory

log = logging.getLogger(__name__)

# labels solved in lockstep; one row visit serves them all (EURLEX57K training, same hour: 16 slots 74 s,
# 48: 52 s, 64: 44 s)
MAX_SLOTS = 64


def solver_params(cfg: RankerConfig, max_iter: int | None = None) -> SolverParams:
    """The solver's settings in ``cfg``; ``max_iter``: a tighter cap on its passes (labels added later)."""
    passes = cfg.max_iter if max_iter is None else min(cfg.max_iter, max_iter)
    return SolverParams(loss=cfg.loss, Cp=cfg.Cp, Cn=cfg.Cn, eps=cfg.eps, max_iter=passes, max_cg_iter=cfg.max_cg_iter)


@dataclass
class LevelSpec:
    """One level to train: targets ``Y`` (``N x L``), clusters ``C`` (``L x K``), negative mask (``N x K``;
    a value other than 1 multiplies that row's cost in that cluster: instance weights)."""

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
    batches = [plan_batches(g, row_nnz, batch_nnz) for g in groups]
    n_blocks = sum(len(b) for b in batches)
    most_labels = max(int(g.n_labels.max(initial=1)) for g in groups)
    # with fewer blocks than threads, split each block's labels so that every thread works
    slots = MAX_SLOTS if n_blocks >= threads else max(1, min(MAX_SLOTS, -(-most_labels // threads)))
    trainer = BlockTrainer(params, threshold, threads, slots, n_tags=len(specs))
    # largest blocks first, across levels: the pool ends on small ones, so no thread waits
    # long on another's last block (the order changes no weight: a block is solved alone)
    jobs = [(d, b) for d, bs in enumerate(batches) for b in bs]
    costs = np.array([c for g, bs in zip(groups, batches) for c in batch_costs(g, bs, row_nnz)], dtype=np.int64)
    try:
        for j in np.argsort(-costs, kind="stable"):
            d, batch = jobs[j]
            trainer.submit(X, build_block(X, specs[d].Y, groups[d], batch, bias), bias, tag=d)
    finally:
        parts = trainer.finish()
        release_free_memory()  # the workers' scratch, before the levels' matrices are built
    out = []
    for d, spec in enumerate(specs):
        W = _weights_csc(parts[d], F1, spec.C.shape[0])  # empties parts[d]
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


class BlockTrainer:
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
        self.parts: list[list[Kept]] = [[] for _ in range(n_tags)]

    def submit(self, X: sp.csr_matrix, bd: BlockData, bias: float, tag: int = 0) -> None:
        block = Block.from_rows(
            X, bd, bias, self.params.Cp, self.params.Cn, materialise=self.params.loss != "squared_hinge"
        )
        n = bd.Y.shape[1]
        bounds = np.linspace(0, n, -(-n // self.slots) + 1).round().astype(int)  # even chunks
        for j0, j1 in zip(bounds[:-1], bounds[1:]):  # loop over label chunks of one block (a few per cluster)
            cols = slice(int(j0), int(j1))
            self.pending[self.pool.submit(self._solve, bd, block.columns(cols), cols)] = tag
            if len(self.pending) > self.threads:  # wait for any chunk: no head-of-line blocking
                done, _ = wait(list(self.pending), return_when=FIRST_COMPLETED)
                for fut in done:
                    self._collect(self.pending.pop(fut), fut)

    def _solve(self, bd: BlockData, block: Block, cols: slice) -> tuple[Kept, SolveStats]:
        kept = solve_block(block, self.params, self.threshold)  # each label's weights: one run, no padding slot
        labels = bd.slot_label[:, cols][bd.col_task[kept.col], kept.slot]  # per kept weight only: no Fb x n table
        starts = run_starts(labels)
        # held until the level's matrix is built: features int32 (F < 2^31), labels as runs
        return Kept(
            bd.col_feature[kept.col].astype(np.int32),
            labels[starts].astype(np.int32),
            np.diff(starts, append=len(labels)),
            kept.val,
        ), block.stats

    def _collect(self, tag: int, fut) -> None:
        kept, stats = fut.result()
        self.parts[tag].append(kept)
        self.stats[tag].add(stats)

    def finish(self) -> list[list[Kept]]:
        """Wait for every chunk; the kept weights of each chunk, by tag."""
        try:
            for fut in list(self.pending):
                self._collect(self.pending.pop(fut), fut)
        finally:
            self.pool.shutdown(wait=True, cancel_futures=True)
        return self.parts


@dataclass
class Kept:
    """A chunk's kept weights: label ``label[r]`` owns the next ``run[r]`` (feature, value) pairs,
    features increasing (8 bytes a weight: a level's weights are all held until its matrix is built)."""

    feature: np.ndarray  # int32
    label: np.ndarray  # int32, one per run
    run: np.ndarray  # int64, weights per run
    value: np.ndarray  # float32


def _weights_csc(parts: list[Kept], n_rows: int, n_labels: int) -> sp.csc_matrix:
    """A level's ``W`` (csc, ``n_rows x n_labels``) from its chunks' kept weights (``parts``, emptied),
    written in place.

    A label is solved in exactly one chunk, which lists it as one run in increasing feature id;
    so each run is copied to its column's slot, with no COO intermediate and no sort (the memory
    peak of a level is its kept weights plus the matrix).
    """
    counts = np.zeros(n_labels, np.int64)
    for part in parts:
        np.add.at(counts, part.label, part.run)
    indptr = np.zeros(n_labels + 1, np.int64)
    np.cumsum(counts, out=indptr[1:])
    idx = np.int32 if indptr[-1] < 2**31 else np.int64
    indices = np.empty(int(indptr[-1]), idx)
    data = np.empty(int(indptr[-1]), np.float32)
    while parts:  # each part is let go once copied: the level's weights are not held twice
        part = parts.pop()
        if len(part.label) == 0:
            continue
        first = np.cumsum(part.run) - part.run  # each run's first position in the part
        dest = np.repeat(indptr[part.label] - first, part.run) + np.arange(len(part.feature))
        indices[dest] = part.feature
        data[dest] = part.value
    W = sp.csc_matrix((data, indices, indptr), shape=(n_rows, n_labels))
    W.has_sorted_indices = True
    return W


def train_level(
    X: sp.csr_matrix, spec: LevelSpec, params: SolverParams, bias: float, threshold: float, batch_nnz: int, threads: int
) -> tuple[LinearLevel, dict]:
    """Train every label of ``spec.C`` on the rows its cluster selects in ``spec.mask``."""
    return train_levels(X, [spec], params, bias, threshold, batch_nnz, threads)[0]
