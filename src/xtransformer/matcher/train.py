"""Fine-tune a matcher (encoder + K-way head, squared hinge on instance-to-cluster targets) as a
stage of the cache.

:func:`fine_tune_matcher` builds the stage ``matcher`` under the key its caller planned: the
matcher folder (``LoadedMatcher.save``: ``encoder/``, ``head.safetensors``,
``matcher_config.json``). Lightning checkpoints every ``matcher.checkpoint_every_n_steps`` into
the stage's work folder, so a killed run resumes at the step it had reached.
:func:`fit_resumable` is that training loop; every XR-Transformer level trains through it too.

Distributed: the stage is collective. Under ``strategy=ddp`` Lightning re-runs the calling script
once per extra rank, every rank fits, rank 0 alone writes the folder. Under ``ddp_spawn`` the
module is pickled to the workers and the main process gets rank 0's weights back.
"""

from __future__ import annotations

import logging
import shutil
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from xtransformer.encoders import check_model_available, default_truncate_chars, resolve_model
from xtransformer.errors import UserError
from xtransformer.matcher.config import MatcherConfig
from xtransformer.matcher.datamodule import MatcherDataModule, instance_cluster_targets
from xtransformer.matcher.inference import LoadedMatcher
from xtransformer.model.folder import scrub

log = logging.getLogger(__name__)

TRAIN_SPLIT, VAL_SPLIT = "train", "dev"
# Trainer kwargs the matcher config owns; a trainer config that sets them is ambiguous.
_OWNED_TRAINER_KEYS = {
    "max_steps": "max_steps",
    "max_epochs": "max_epochs",
    "gradient_clip_val": "grad_clip",
    "accumulate_grad_batches": "accumulate_grad_batches",
    "limit_val_batches": "limit_val_batches",
    "val_check_interval": "val_every_n_steps",
    "callbacks": "callbacks argument",
    "logger": "logger argument",
    "use_distributed_sampler": "(always False: the matcher shards itself)",
}


class MatcherInputError(UserError):
    """Inconsistent texts / Y / C handed to the matcher."""


def fine_tune_matcher(
    ctx: Any, key: str, data: Any, C: sp.spmatrix, cfg: MatcherConfig, validation: Any = None
) -> Path:
    """The matcher folder of stage (``matcher``, ``key``): encoder + head fine-tuned on
    ``binarize(data.Y · C)`` (``data``, ``validation``: :class:`~xtransformer.data.inputs.LabeledData`;
    ``validation`` is scored while training, never chosen on)."""
    texts, Y = {TRAIN_SPLIT: data.require_texts("the matcher")}, {TRAIN_SPLIT: data.Y}
    if validation is not None and validation.texts is not None:
        texts[VAL_SPLIT], Y[VAL_SPLIT] = validation.texts, validation.Y
    check_inputs(texts, Y, C)
    check_trainer_kwargs(ctx.trainer_kwargs)
    work = ctx.cache.work_dir("matcher", key)

    def build(tmp: Path) -> None:
        import lightning.pytorch as pl

        from xtransformer.matcher.module import MatcherModule, TrainOptions

        base = resolve_model(cfg.model_name_or_path, cfg.cache_dir, corpus=tiny_corpus(cfg, texts[TRAIN_SPLIT]))
        dm = MatcherDataModule(base, texts, Y, C, cfg, TRAIN_SPLIT, VAL_SPLIT if VAL_SPLIT in texts else None)
        dm.prepare_data()
        dm.setup("fit")
        pl.seed_everything(cfg.seed, workers=True, verbose=False)
        module = MatcherModule(
            str(base),
            dm.num_clusters,
            TrainOptions.of(cfg),
            with_token_types=dm.tokens[TRAIN_SPLIT].type_ids is not None,
        )
        facts = fit_resumable(ctx, cfg, module, dm, work, cfg.max_steps)
        if facts["trainer"].is_global_zero:
            meta = matcher_meta(cfg, ctx, module, key, facts["global_step"])
            LoadedMatcher(module.encoder, module.head, dm.load_tokenizer(), meta).save(tmp / "matcher")

    folder = ctx.cache.run("matcher", key, build, settings=cfg.training_settings(), collective=True)
    if not cfg.keep_checkpoints and ctx.is_rank_zero:  # the committed folder is the resume point now
        shutil.rmtree(work / "checkpoints", ignore_errors=True)
    return folder / "matcher"


def fit_resumable(
    ctx: Any,
    cfg: MatcherConfig,
    module: Any,
    dm: Any,
    work: Path,
    max_steps: int,
    loggers: Sequence[Any] | None = None,
    resume: bool = True,
) -> dict[str, Any]:
    """``trainer.fit`` with the matcher's Trainer settings (``ctx``: placement, precision, further
    kwargs, callbacks, loggers), checkpointing to ``work/checkpoints`` every
    ``cfg.checkpoint_every_n_steps`` and resuming from its ``last.ckpt``."""
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger

    from xtransformer.matcher.progress import ProgressLog

    ckpt_dir = work / "checkpoints"
    checkpoint = ModelCheckpoint(
        dirpath=ckpt_dir,
        save_last=True,
        save_top_k=0,
        enable_version_counter=False,
        every_n_train_steps=cfg.checkpoint_every_n_steps,
    )
    loggers = list(ctx.loggers) if loggers is None else list(loggers)
    kwargs = dict(ctx.trainer_kwargs)
    kwargs.update(
        max_steps=max_steps,
        max_epochs=cfg.max_epochs,
        gradient_clip_val=cfg.grad_clip,
        accumulate_grad_batches=cfg.accumulate_grad_batches,
        limit_val_batches=cfg.limit_val_batches if dm.val_split else 0,  # no split: no validation loop at all
        use_distributed_sampler=False,
        default_root_dir=str(work),
        callbacks=[checkpoint, ProgressLog(), *ctx.callbacks],
        logger=loggers or CSVLogger(str(work), name="logs"),
    )
    if cfg.val_every_n_steps is not None:
        kwargs.update(
            val_check_interval=cfg.val_every_n_steps * cfg.accumulate_grad_batches, check_val_every_n_epoch=None
        )
    trainer = pl.Trainer(**kwargs)
    last = ckpt_dir / "last.ckpt"
    ckpt_path = str(last) if resume and last.is_file() else None
    start = time.perf_counter()
    _fit(trainer, module, dm, ckpt_path)
    if trainer.interrupted:
        raise RuntimeError(f"matcher training was interrupted; call again to resume from {last}")
    return {
        "trainer": trainer,
        "train_seconds": time.perf_counter() - start,
        "global_step": int(module.trained_steps),
        "resumed_from": ckpt_path,
        "callback_metrics": {k: float(v) for k, v in trainer.callback_metrics.items()},
    }


def _fit(trainer: Any, module: Any, dm: Any, ckpt_path: str | None) -> None:
    """``trainer.fit`` (resuming from ``ckpt_path`` if given), without two warning lines of
    Lightning's that do not apply to this training."""
    with warnings.catch_warnings():
        # Lightning calls a mid-epoch resume unreliable unless the loader keeps state; the datamodule
        # does (state_dict): a resumed run sees exactly the batches left (tests/matcher/test_matcher_resume.py)
        warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before the epoch")
        # Lightning 2.6's own pytree helper on torch 2.13: a deprecation inside Lightning, nothing a run can change
        warnings.filterwarnings(
            "ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning
        )
        trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)


def matcher_meta(cfg: MatcherConfig, ctx: Any, module: Any, key: str, global_step: int) -> dict[str, Any]:
    """The matcher folder's record: its settings, what it resolved, what it is (no local paths)."""
    return scrub(
        {
            **cfg.to_dict(),
            "pooling_resolved": module.pooling,
            "num_clusters": module.head.out_features,
            "hidden_size": module.head.in_features,
            "model_type": module.encoder.config.model_type,
            "train_key": key,
            "global_step": int(global_step),
            "inference_precision_resolved": inference_precision(cfg, ctx.trainer.precision),
        }
    )


def inference_precision(cfg: MatcherConfig, trainer_precision: Any) -> str:
    """The autocast a matcher encodes with: its own setting, else the precision it trained at."""
    return str(cfg.inference_precision or trainer_precision or "32")


def topb_recall(topb: sp.csr_matrix, targets: sp.csr_matrix) -> float:
    """Mean over documents with a true cluster of |top-b ∩ true| / |true| (sparse, vectorised)."""
    predicted = topb.copy()
    predicted.data[:] = 1.0  # scores may be exactly 0: count the stored pattern, not the values
    hits = np.asarray(predicted.multiply(targets).sum(axis=1)).ravel()
    positives = np.diff(targets.indptr)
    has = positives > 0
    return float((hits[has] / positives[has]).mean()) if has.any() else float("nan")


def check_model(cfg: MatcherConfig) -> None:
    """Fail before any data work when the encoder cannot be found or fetched."""
    check_model_available(cfg.model_name_or_path, cfg.cache_dir)


def check_trainer_kwargs(trainer_kwargs: Mapping[str, Any]) -> None:
    clash = sorted(set(trainer_kwargs) & set(_OWNED_TRAINER_KEYS))
    if clash:
        where = ", ".join(f"trainer.{k} (set by matcher.{_OWNED_TRAINER_KEYS[k]})" for k in clash)
        raise MatcherInputError(f"remove {where} from the trainer config: the matcher config owns them")


def check_inputs(texts: Mapping[str, Sequence[str]], Y: Mapping[str, sp.spmatrix], C: sp.spmatrix) -> None:
    if not sp.issparse(C) or C.ndim != 2:
        raise MatcherInputError("C must be a scipy.sparse L x K label-to-cluster matrix")
    for split, y in Y.items():
        if y.shape[1] != C.shape[0]:
            raise MatcherInputError(f"Y[{split!r}] has {y.shape[1]} labels but C has {C.shape[0]} rows")
        if len(texts[split]) != y.shape[0]:
            raise MatcherInputError(f"split {split!r}: {len(texts[split])} texts but Y has {y.shape[0]} rows")
    if instance_cluster_targets(Y[TRAIN_SPLIT], C).nnz == 0:
        raise MatcherInputError("no training document has a label assigned to any cluster (Y[train] · C is empty)")


def tiny_corpus(cfg: MatcherConfig, train_texts: Sequence[str]) -> list[str] | None:
    """Training texts for the tokenizer of a ``tiny:*`` model (None for pretrained models)."""
    if not str(cfg.model_name_or_path).lower().startswith("tiny:"):
        return None
    limit = cfg.truncate_chars or default_truncate_chars(cfg.max_length)
    return [t[:limit] for t in train_texts]
