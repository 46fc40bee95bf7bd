"""Multi-resolution fine-tuning: the encoder trained level by level, coarse to fine, warm-started.

Level ``t`` is one stage of the cache (``xrlevel/<key_t>``: the matcher folder of the encoder and
the level's head, with the level's facts), keyed by level ``t - 1``'s key plus level ``t``'s own
schedule, so changing the last level's steps retrains that level only. Each level checkpoints while
it trains (the stage's work folder): a killed run resumes at the level it was on, at the step it
had reached.

Distributed: under ``strategy=ddp`` every rank runs this loop; each level's stage is collective,
rank 0 writes the level folder, and the other ranks wait for it and read the next level's encoder
from it, so all ranks start every level from the same weights.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from xtransformer.encoders import resolve_model
from xtransformer.matcher.config import MatcherConfig
from xtransformer.matcher.datamodule import MatcherDataModule
from xtransformer.matcher.inference import EncodeOptions, LoadedMatcher, predict_tokens
from xtransformer.matcher.train import (
    TRAIN_SPLIT,
    VAL_SPLIT,
    check_trainer_kwargs,
    fit_resumable,
    inference_precision,
    matcher_meta,
    tiny_corpus,
    topb_recall,
)
from xtransformer.methods.xrtransformer.config import XRTransformerConfig
from xtransformer.methods.xrtransformer.levels import (
    LEVEL_STAGE,
    Level,
    children_table,
    count_targets,
    inherit_head,
    matched_levels,
    teacher_shortlist,
    tree_levels,
)
from xtransformer.ranker.negatives import binarize

log = logging.getLogger(__name__)


@dataclass
class FineTuned:
    """The encoder after the last level and the per-level facts."""

    model_dir: Path  # the last level's matcher folder: encoder/ + head.safetensors + matcher_config.json
    levels: list[dict[str, Any]]


@dataclass
class FineTuning:
    """What every level of one run shares: the context, the settings and the tokenised documents."""

    ctx: Any
    mcfg: MatcherConfig
    xcfg: XRTransformerConfig
    dm: MatcherDataModule
    Y_train: sp.csr_matrix


@dataclass
class LevelJob:
    """One level to train: the tree level, its schedule and key, and where it starts from."""

    level: Level
    schedule: dict[str, Any]
    key: str
    encoder_path: Path
    pooling: str
    prev: Trained | None
    step_offset: int  # the steps of the levels before it (loggers see one growing step count)


@dataclass
class Trained:
    """A finished level: its tree level, matcher folder and head."""

    level: Level
    folder: Path
    W: np.ndarray
    b: np.ndarray


def fine_tuned_levels(chain: Sequence[sp.spmatrix], xcfg: XRTransformerConfig) -> list[Level]:
    """The levels XR-Transformer fine-tunes on, from the indexing chain and its settings."""
    levels = matched_levels(tree_levels(list(chain)), xcfg.max_match_clusters)
    return levels[-1:] if xcfg.levels == "last" else levels


def fine_tune(
    ctx: Any,
    data: Any,
    chain: Sequence[sp.spmatrix],
    mcfg: MatcherConfig,
    xcfg: XRTransformerConfig,
    level_keys: Sequence[str],
    validation: Any = None,
) -> FineTuned:
    """Fine-tune the encoder on every matched level of ``chain`` (coarse to fine); ``data``,
    ``validation``: :class:`~xtransformer.data.inputs.LabeledData` (each level's cluster recall is
    reported on ``validation``)."""
    check_trainer_kwargs(ctx.trainer_kwargs)
    levels = fine_tuned_levels(chain, xcfg)
    if len(levels) != len(level_keys):  # the plan (stage keys) and the tree must agree
        raise RuntimeError(
            f"xrtransformer: {len(levels)} levels to fine-tune ({[lv.n_nodes for lv in levels]} "
            f"clusters) but {len(level_keys)} level keys were planned"
        )
    texts, Y = {TRAIN_SPLIT: data.texts}, {TRAIN_SPLIT: data.Y}
    if validation is not None and validation.texts is not None:
        texts[VAL_SPLIT], Y[VAL_SPLIT] = validation.texts, validation.Y
    base = resolve_model(mcfg.model_name_or_path, mcfg.cache_dir, corpus=tiny_corpus(mcfg, data.texts))
    dm = MatcherDataModule(base, texts, Y, levels[0].label_map, mcfg, TRAIN_SPLIT, None)
    dm.prepare_data()
    dm.setup("fit")
    run = FineTuning(ctx, mcfg, xcfg, dm, data.Y)
    # `auto` resolves on the pretrained folder (sentence-transformers declare mean pooling there);
    # later levels pool as level 0 resolved
    encoder_path, pooling, prev, reports, offset = Path(base), mcfg.pooling, None, [], 0
    for level, sched, key in zip(levels, mcfg.level_schedule(len(levels)), level_keys):
        job = LevelJob(level, sched, key, encoder_path, pooling, prev, offset)
        folder = (
            ctx.cache.run(
                LEVEL_STAGE,
                key,
                lambda tmp, job=job: train_level(run, job, tmp),
                settings={"clusters": level.n_nodes, **sched},
                collective=True,
            )
            / "matcher"
        )
        if not mcfg.keep_checkpoints and ctx.is_rank_zero:  # the level folder is the resume point from here on
            shutil.rmtree(ctx.cache.work_dir(LEVEL_STAGE, key) / "checkpoints", ignore_errors=True)
        loaded = LoadedMatcher.load(folder)
        reports.append(loaded.meta["level"])
        W, b = loaded.head.weight.detach().numpy(), loaded.head.bias.detach().numpy()
        prev = Trained(level, folder, W, b)
        encoder_path, pooling = folder / "encoder", loaded.pooling
        offset += int(sched["steps"])
    return FineTuned(model_dir=prev.folder, levels=reports)


def train_level(run: FineTuning, job: LevelJob, tmp: Path) -> None:
    """Fine-tune one level from the previous level's encoder; rank 0 writes its matcher to ``tmp``."""
    t0 = time.perf_counter()
    level, sched = job.level, job.schedule
    log.info(
        "xrtransformer level %d: %d clusters, %d steps, lr %g (encoder from %s)",
        level.index,
        level.n_nodes,
        sched["steps"],
        sched["lr"],
        job.encoder_path,
    )
    module = level_module(run, job)
    facts = fit_resumable(
        run.ctx,
        run.mcfg,
        module,
        run.dm,
        run.ctx.cache.work_dir(LEVEL_STAGE, job.key),
        int(sched["steps"]),
        loggers=level_loggers(run.ctx.loggers, job.step_offset),
        resume=run.ctx.cache.enabled,
    )
    if not facts["trainer"].is_global_zero:
        return
    recall = eval_recall(run, module, level)
    report = {
        "level": level.index,
        "clusters": level.n_nodes,
        "steps": int(sched["steps"]),
        "lr": sched["lr"],
        "seconds": round(time.perf_counter() - t0, 1),
        "train_seconds": round(facts["train_seconds"], 1),
        "bootstrap": run.xcfg.bootstrap if job.prev is not None else "fresh",
        **recall,
    }
    log.info("xrtransformer level %d done: %s", level.index, report)
    for lg in run.ctx.loggers:
        lg.log_metrics({f"level{level.index}/{k}": v for k, v in recall.items()}, step=int(sched["steps"]))
    meta = matcher_meta(run.mcfg, run.ctx, module, job.key, facts["global_step"]) | {"level": report}
    LoadedMatcher(module.encoder, module.head, run.dm.load_tokenizer(), meta).save(tmp / "matcher")


def level_module(run: FineTuning, job: LevelJob) -> Any:
    """The level's module (its head bootstrapped, its shortlist set) and the data module's targets,
    shortlist masks and batch order for it, seeded as the level's index says."""
    import lightning.pytorch as pl

    from xtransformer.matcher.module import TrainOptions
    from xtransformer.methods.xrtransformer.module import XRLevelModule

    mcfg, xcfg, dm, level, sched = run.mcfg, run.xcfg, run.dm, job.level, job.schedule
    parent = job.prev.level if job.prev is not None else None
    dm.C = level.label_map
    dm.targets = {TRAIN_SPLIT: count_targets(run.Y_train, level)}
    shortlisted = xcfg.shortlist and parent is not None  # the top level's shortlist is the whole level
    tfn = shortlisted and "tfn" in xcfg.negatives
    dm.masks = {TRAIN_SPLIT: {"tfn": teacher_shortlist(run.Y_train, parent, level)}} if tfn else {}
    dm.seed = mcfg.seed + 1000 * level.index  # each level its own batch order
    pl.seed_everything(mcfg.seed + level.index, workers=True, verbose=False)
    options = TrainOptions.of(mcfg, pooling=job.pooling, lr=sched["lr"], warmup_ratio=sched["warmup_ratio"])
    module = XRLevelModule(
        str(job.encoder_path), level.n_nodes, options, with_token_types=dm.tokens[TRAIN_SPLIT].type_ids is not None
    )
    return module.setup_level(
        level.index,
        children=children_table(level) if shortlisted else None,
        prev_head=(job.prev.W, job.prev.b) if shortlisted else None,
        init_head=bootstrap_head(run, job),
        loss=xcfg,
    )


def level_loggers(loggers: Sequence[Any], offset: int) -> list[Any]:
    """The run's loggers seen by one level's Trainer: its steps restart at 0, so they are shifted
    by the steps of the levels before it (W&B drops a step lower than one it has seen)."""
    if not loggers:
        return []
    from lightning.pytorch.loggers import Logger

    class LevelLogger(Logger):
        def __init__(self, inner: Logger) -> None:
            super().__init__()
            self.inner = inner

        name = property(lambda self: self.inner.name)
        version = property(lambda self: self.inner.version)
        experiment = property(lambda self: self.inner.experiment)
        save_dir = property(lambda self: self.inner.save_dir)
        log_dir = property(lambda self: getattr(self.inner, "log_dir", None))

        def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
            self.inner.log_metrics(metrics, None if step is None else step + offset)

        def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
            self.inner.log_hyperparams(params, *args, **kwargs)

        def save(self) -> None:
            self.inner.save()

        def finalize(self, status: str) -> None:
            self.inner.save()  # the run goes on after this level: only flush

    return [LevelLogger(lg) for lg in loggers]


def bootstrap_head(run: FineTuning, job: LevelJob) -> tuple[np.ndarray, np.ndarray] | None:
    """The new level's head: inherited from its parents, solved on the previous embeddings, or random."""
    if job.prev is None or run.xcfg.bootstrap == "fresh":
        return None
    if run.xcfg.bootstrap == "inherit":
        return inherit_head(job.prev.W, job.prev.b, job.level)
    return weighted_linear_head(run, job.prev, job.level)


def weighted_linear_head(run: FineTuning, prev: Trained, level: Level) -> tuple[np.ndarray, np.ndarray]:
    """The paper's eq. 11: one-vs-all linear models of level ``t`` on the embeddings of the encoder
    after level ``t - 1``, each trained on the documents of its parent (teacher-forcing negatives).

    Solved with the ranker's solver (squared hinge, dual coordinate descent) on (a sample of) the
    training documents, with weak regularisation (C = 100, as PECOS) and no pruning: the head is
    dense anyway.
    """
    from xtransformer.ranker.fit import LevelSpec
    from xtransformer.ranker.fit import train_level as train_linear_level
    from xtransformer.ranker.solver import SolverParams

    mcfg, xcfg = run.mcfg, run.xcfg
    tokens = run.dm.tokens[TRAIN_SPLIT]
    n = len(tokens)
    rows = (
        np.arange(n)
        if not xcfg.bootstrap_docs or xcfg.bootstrap_docs >= n
        else np.sort(np.random.default_rng(mcfg.seed).choice(n, xcfg.bootstrap_docs, replace=False))
    )
    options = EncodeOptions(
        batch_size=mcfg.eval_batch_size,
        topb=1,
        progress=mcfg.progress,
        precision=inference_precision(mcfg, run.ctx.trainer.precision),
        desc=f"bootstrap level {level.index}",
    )
    emb = predict_tokens(LoadedMatcher.load(prev.folder), tokens.take(rows), options).embeddings
    Y_sub = sp.csr_matrix(run.Y_train)[rows]
    spec = LevelSpec(binarize(count_targets(Y_sub, level)), level.parents, binarize(count_targets(Y_sub, prev.level)))
    lin, _ = train_linear_level(
        sp.csr_matrix(emb),
        spec,
        SolverParams(Cp=100.0, Cn=100.0),
        bias=1.0,
        threshold=0.0,
        batch_nnz=500_000,
        threads=2,
    )
    W = lin.W.toarray()  # (H + 1) x K_t, bias weights last: dense by construction (no pruning)
    return np.ascontiguousarray(W[:-1].T, dtype=np.float32), W[-1].astype(np.float32) * np.float32(lin.bias)


def eval_recall(run: FineTuning, module: Any, level: Level) -> dict[str, float]:
    """This level's cluster recall@only_topk on (a fixed sample of) the validation documents."""
    dm, xcfg = run.dm, run.xcfg
    if VAL_SPLIT not in dm.tokens or VAL_SPLIT not in dm.Y:
        return {}
    tokens = dm.tokens[VAL_SPLIT]
    n = len(tokens)
    rows = (
        np.arange(n)
        if xcfg.eval_docs is None or xcfg.eval_docs >= n
        else np.sort(np.random.default_rng(0).choice(n, xcfg.eval_docs, replace=False))
    )
    k = min(xcfg.only_topk, level.n_nodes)
    options = EncodeOptions(
        batch_size=run.mcfg.eval_batch_size,
        topb=k,
        progress=False,
        precision=inference_precision(run.mcfg, run.ctx.trainer.precision),
    )
    pred = predict_tokens(module, tokens.take(rows), options)
    truth = binarize(count_targets(sp.csr_matrix(dm.Y[VAL_SPLIT])[rows], level))
    return {f"eval_recall@{k}": round(100 * topb_recall(pred.topb, truth), 3), "eval_docs": int(len(rows))}
