"""Multi-resolution fine-tuning: the encoder trained level by level, coarse to fine, warm-started.

Level ``t`` is one cached artifact (``cache/stages/xrlevel/<key_t>``: the HF encoder, the level's
head and its facts), keyed by level ``t - 1``'s key plus level ``t``'s own schedule, so changing
the last level's steps retrains that level only. Each level checkpoints while it trains
(``xrlevel/_work/<key_t>/checkpoints/last.ckpt``): a killed run resumes at the level it was on,
at the step it had reached. After the last level, every split is embedded once (``xrembed``), the
features of the final linear model.

Distributed: under ``strategy=ddp`` every rank runs this loop; each level's ``fit`` is collective,
rank 0 writes the level folder, and the other ranks wait for it and read the next level's encoder
from it, so all ranks start every level from the same weights.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import scipy.sparse as sp

from xtransformer.encoders import check_model_available, resolve_model
from xtransformer.matcher.config import MatcherConfig
from xtransformer.matcher.datamodule import MatcherDataModule
from xtransformer.matcher.inference import load_matcher_model, predict_tokens, save_matcher_model
from xtransformer.matcher.train import (
    TRAIN_SPLIT,
    MatcherOutputs,
    check_trainer_cfg,
    fit_resumable,
    inference_precision,
    matcher_meta,
    outputs_finished,
    tiny_corpus,
    topb_recall,
    write_matcher_outputs,
)
from xtransformer.cache import StageCache, failpoint
from xtransformer.ranker.negatives import binarize
from xtransformer.utils.dist import is_rank_zero
from xtransformer.utils.io import is_complete
from xtransformer.xrtransformer.config import XRTransformerConfig
from xtransformer.xrtransformer.levels import (
    Level,
    children_table,
    count_targets,
    inherit_head,
    matched_levels,
    EMBED_STAGE,
    LEVEL_STAGE,
    teacher_shortlist,
    tree_levels,
)

log = logging.getLogger(__name__)


@dataclass
class FineTuned:
    """The encoder after the last level, its per-level facts, and every split embedded by it."""

    model_dir: Path  # the last level's folder: encoder/ (HF) + head.pt + matcher_config.json
    levels: list[dict[str, Any]]
    outputs: MatcherOutputs  # embeddings/<split>.npy and the last head's top-b per split
    key: str  # key of the embeddings (what the final model's cache key builds on)


def fine_tuned_levels(chain: Sequence[sp.spmatrix], xcfg: XRTransformerConfig) -> list[Level]:
    """The levels XR-Transformer fine-tunes on, from the indexing chain and its settings."""
    levels = matched_levels(tree_levels(list(chain)), xcfg.max_match_clusters)
    return levels[-1:] if xcfg.levels == "last" else levels


def fine_tune(
    mcfg: MatcherConfig,
    xcfg: XRTransformerConfig,
    trainer_cfg: Mapping[str, Any],
    texts: Mapping[str, Sequence[str]],
    Y: Mapping[str, sp.spmatrix],
    chain: Sequence[sp.spmatrix],
    cache: StageCache,
    level_keys: Sequence[str],
    embed_key: str,
    eval_split: str | None = None,
    logger: Any = None,
    callbacks: Sequence[Any] = (),
) -> FineTuned:
    """Fine-tune the encoder on every matched level of ``chain`` (coarse to fine), then embed all splits."""
    trainer_cfg = dict(trainer_cfg)
    check_model_available(mcfg.model_name_or_path, mcfg.cache_dir)
    check_trainer_cfg(trainer_cfg)
    levels = fine_tuned_levels(chain, xcfg)
    if len(levels) != len(level_keys):  # the plan (pipeline/keys.py) and the tree must agree
        raise RuntimeError(f"xrtransformer: {len(levels)} levels to fine-tune ({[lv.n_nodes for lv in levels]} "
                           f"clusters) but {len(level_keys)} level keys were planned")
    schedule = mcfg.level_schedule(len(levels))
    base = resolve_model(mcfg.model_name_or_path, mcfg.cache_dir, corpus=tiny_corpus(mcfg, texts))
    dm = MatcherDataModule(base, texts, Y, levels[0].label_map, mcfg, TRAIN_SPLIT, None)
    dm.prepare_data()
    dm.setup("fit")

    encoder_path, prev, reports, offset = base, None, [], 0
    # `auto` resolves on the pretrained folder (sentence-transformers declare mean pooling there);
    # later levels pool as level 0 resolved (level folders cached before they declared it too say nothing)
    pooling = mcfg.pooling
    for level, sched, key in zip(levels, schedule, level_keys):
        folder = cache.path(LEVEL_STAGE, key)
        if cache.trusted(LEVEL_STAGE, key, folder):
            cache.events.append((LEVEL_STAGE, key, "reused"))
            log.info("xrtransformer level %d (%d clusters): reusing %s", level.index, level.n_nodes, folder)
        else:
            _train_level(mcfg, xcfg, trainer_cfg, dm, Y, level, prev, sched, encoder_path, pooling, folder, cache,
                         key, eval_split, level_loggers(logger, offset), callbacks)
            cache.events.append((LEVEL_STAGE, key, "ran"))
        loaded = load_matcher_model(folder)
        reports.append(loaded.meta["level"])
        prev = (level, folder, loaded.head.weight.detach().numpy(), loaded.head.bias.detach().numpy())
        encoder_path, pooling = folder / "encoder", loaded.meta["pooling_resolved"]
        offset += int(sched["steps"])

    # every split embedded once by the final encoder: the final model's features
    dm.targets = {s: binarize(count_targets(y, levels[-1])) for s, y in Y.items() if s in texts}
    out = cache.path(EMBED_STAGE, embed_key)
    if cache.enabled and outputs_finished(out, embed_key):
        cache.events.append((EMBED_STAGE, embed_key, "reused"))
        outputs = MatcherOutputs.load(out)
    elif is_rank_zero():
        (out / "outputs.json").unlink(missing_ok=True)
        outputs = write_matcher_outputs(mcfg, trainer_cfg, load_matcher_model(prev[1]), dm, out, embed_key,
                                        {"levels": reports})
        cache.events.append((EMBED_STAGE, embed_key, "ran"))
    else:
        outputs = MatcherOutputs(out_dir=out, splits=tuple(texts))  # the ranks > 0 stop after fine-tuning
    return FineTuned(model_dir=prev[1], levels=reports, outputs=outputs, key=embed_key)


def _train_level(mcfg: MatcherConfig, xcfg: XRTransformerConfig, trainer_cfg: dict[str, Any],
                 dm: MatcherDataModule, Y: Mapping[str, sp.spmatrix], level: Level,
                 prev: tuple[Level, Path, np.ndarray, np.ndarray] | None, sched: Mapping[str, Any],
                 encoder_path: Path, pooling: str, folder: Path, cache: StageCache, key: str, eval_split: str | None,
                 logger: Any, callbacks: Sequence[Any] = ()) -> None:
    import lightning.pytorch as pl

    from xtransformer.xrtransformer.module import XRLevelModule

    t0 = time.perf_counter()
    log.info("xrtransformer level %d: %d clusters, %d steps, lr %g (encoder from %s)", level.index, level.n_nodes,
             sched["steps"], sched["lr"], encoder_path)
    Y_train = Y[TRAIN_SPLIT]
    parent = prev[0] if prev is not None else None
    dm.C = level.label_map
    dm.targets = {TRAIN_SPLIT: count_targets(Y_train, level)}
    shortlisted = xcfg.shortlist and parent is not None  # the top level's shortlist is the whole level
    dm.masks = {TRAIN_SPLIT: {"tfn": teacher_shortlist(Y_train, parent, level)}} if shortlisted and "tfn" in xcfg.negatives else {}
    dm.seed = mcfg.seed + 1000 * level.index  # each level its own batch order

    pl.seed_everything(mcfg.seed + level.index, workers=True, verbose=False)
    module = XRLevelModule(str(encoder_path), level.n_nodes, pooling=pooling, lr=sched["lr"],
                           head_lr=mcfg.head_lr, weight_decay=mcfg.weight_decay, adam_eps=mcfg.adam_eps,
                           warmup_ratio=sched["warmup_ratio"], topb=mcfg.topb,
                           with_token_types=dm.tokens[TRAIN_SPLIT].type_ids is not None, dropout=mcfg.dropout)
    init = _bootstrap(xcfg, mcfg, trainer_cfg, dm, Y_train, level, prev)
    module.setup_level(level.index, children=children_table(level) if shortlisted else None,
                       prev_head=(prev[2], prev[3]) if shortlisted else None, init_head=init,
                       shortlist=shortlisted, negatives=xcfg.negatives, only_topk=xcfg.only_topk,
                       importance=xcfg.importance, neg_weight=xcfg.neg_weight)
    work = folder.parent / "_work" / key
    facts = fit_resumable(mcfg, trainer_cfg, module, dm, work, work / "checkpoints", int(sched["steps"]), logger,
                          callbacks, resume=cache.enabled)
    trainer = facts.pop("trainer")
    if not trainer.is_global_zero:
        _wait_complete(folder)
        return
    recall = _eval_recall(mcfg, xcfg, trainer_cfg, module, dm, Y, level, eval_split)
    report = {"level": level.index, "clusters": level.n_nodes, "steps": int(sched["steps"]), "lr": sched["lr"],
              "seconds": round(time.perf_counter() - t0, 1), "train_seconds": round(facts["train_seconds"], 1),
              "bootstrap": xcfg.bootstrap if prev is not None else "fresh", **recall}
    log.info("xrtransformer level %d done: %s", level.index, report)
    for lg in logger or []:
        lg.log_metrics({f"level{level.index}/{k}": v for k, v in recall.items()}, step=int(sched["steps"]))
    meta = matcher_meta(mcfg, trainer_cfg, module, encoder_path, key, facts["global_step"]) | {"level": report}
    failpoint(LEVEL_STAGE)
    save_matcher_model(module.encoder, module.head, dm.load_tokenizer(), meta, folder)
    if not mcfg.keep_checkpoints:  # the level folder is the resume point from here on
        shutil.rmtree(work / "checkpoints", ignore_errors=True)


def level_loggers(logger: Any, offset: int) -> list[Any] | None:
    """The run's loggers seen by one level's Trainer: its steps restart at 0, so they are shifted
    by the steps of the levels before it (W&B drops a step lower than one it has seen)."""
    if logger is None:
        return None
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

    return [LevelLogger(lg) for lg in (logger if isinstance(logger, (list, tuple)) else [logger])]


def _bootstrap(xcfg: XRTransformerConfig, mcfg: MatcherConfig, trainer_cfg: Mapping[str, Any],
               dm: MatcherDataModule, Y_train: sp.spmatrix, level: Level,
               prev: tuple[Level, Path, np.ndarray, np.ndarray] | None) -> tuple[np.ndarray, np.ndarray] | None:
    """The new level's head: inherited from its parents, solved on the previous embeddings, or random."""
    if prev is None or xcfg.bootstrap == "fresh":
        return None
    parent, parent_dir, W_prev, b_prev = prev
    if xcfg.bootstrap == "inherit":
        return inherit_head(W_prev, b_prev, level)
    return _weighted_linear_head(xcfg, mcfg, trainer_cfg, dm, Y_train, parent, level, parent_dir)


def _weighted_linear_head(xcfg: XRTransformerConfig, mcfg: MatcherConfig, trainer_cfg: Mapping[str, Any],
                          dm: MatcherDataModule, Y_train: sp.spmatrix, parent: Level, level: Level,
                          parent_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """The paper's eq. 11: one-vs-all linear models of level ``t`` on the embeddings of the encoder
    after level ``t - 1``, each trained on the documents of its parent (teacher-forcing negatives).

    Solved with the ranker's solver (squared hinge, dual coordinate descent) on (a sample of) the
    training documents, with weak regularisation (C = 100, as PECOS) and no pruning: the head is
    dense anyway.
    """
    from xtransformer.ranker.fit import train_level
    from xtransformer.ranker.solver import SolverParams

    tokens = dm.tokens[TRAIN_SPLIT]
    n = len(tokens)
    rows = np.arange(n) if not xcfg.bootstrap_docs or xcfg.bootstrap_docs >= n else \
        np.sort(np.random.default_rng(mcfg.seed).choice(n, xcfg.bootstrap_docs, replace=False))
    loaded = load_matcher_model(parent_dir)
    emb = predict_tokens(loaded.encoder, loaded.head, loaded.meta["pooling_resolved"], tokens.take(rows),
                         mcfg.eval_batch_size, 1, inference_precision(mcfg, trainer_cfg), progress=mcfg.progress,
                         desc=f"bootstrap level {level.index}").embeddings
    Y_sub = sp.csr_matrix(Y_train)[rows]
    targets = binarize(count_targets(Y_sub, level))
    mask = binarize(count_targets(Y_sub, parent))
    lin, _ = train_level(sp.csr_matrix(emb), targets, level.parents, mask,
                        SolverParams(Cp=100.0, Cn=100.0), bias=1.0, threshold=0.0, batch_nnz=500_000, threads=2)
    W = lin.W.toarray()  # (H + 1) x K_t, bias weights last: dense by construction (no pruning)
    return np.ascontiguousarray(W[:-1].T, dtype=np.float32), W[-1].astype(np.float32) * np.float32(lin.bias)


def _eval_recall(mcfg: MatcherConfig, xcfg: XRTransformerConfig, trainer_cfg: Mapping[str, Any], module: Any,
                 dm: MatcherDataModule, Y: Mapping[str, sp.spmatrix], level: Level,
                 eval_split: str | None) -> dict[str, float]:
    """This level's cluster recall@only_topk on (a fixed sample of) the eval split."""
    if not eval_split or eval_split not in dm.tokens or eval_split not in Y:
        return {}
    tokens = dm.tokens[eval_split]
    n = len(tokens)
    rows = np.arange(n) if xcfg.eval_docs is None or xcfg.eval_docs >= n else \
        np.sort(np.random.default_rng(0).choice(n, xcfg.eval_docs, replace=False))
    k = min(xcfg.only_topk, level.n_nodes)
    pred = predict_tokens(module.encoder, module.head, module.pooling, tokens.take(rows), mcfg.eval_batch_size, k,
                          inference_precision(mcfg, trainer_cfg), progress=False)
    truth = binarize(count_targets(sp.csr_matrix(Y[eval_split])[rows], level))
    return {f"eval_recall@{k}": round(100 * topb_recall(pred.topb, truth), 3), "eval_docs": int(len(rows))}


def _wait_complete(folder: Path, poll_s: float = 1.0) -> None:
    """Ranks > 0: wait until rank 0 has written the level folder (the next level reads it)."""
    parent = os.getppid()
    while not is_complete(folder):
        if os.getppid() != parent:
            raise RuntimeError(f"rank 0 exited before writing {folder}")
        time.sleep(poll_s)
