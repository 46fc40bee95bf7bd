"""Fine-tune the matcher and write the artifacts the later stages need.

Output folder::

    checkpoints/<train_key>/last.ckpt   resume point (Lightning), every matcher.checkpoint_every_n_steps
    model/                              encoder/ + head.pt + matcher_config.json (atomic)
    embeddings/<split>.npy              N x H, float32 or float16
    topb/<split>.npz                    N x K csr, top-b cluster scores per document
    metrics.json                        cluster recall@b per split, training facts
    outputs.json                        written last: marks the folder complete for its settings key

Distributed: under ``strategy=ddp`` Lightning re-runs the calling script once per extra rank, so
this function runs on every rank; only global rank 0 writes, the others wait for ``outputs.json``.
Under ``ddp_spawn`` everything handed to the Trainer is pickled; the main process gets rank 0's
weights back and writes. A second call with the same settings returns at once; a killed run resumes
from its last checkpoint.
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
import torch

from xtransformer.encoders import (
    check_model_available,
    default_truncate_chars,
    l2_normalize,
    resolve_model,
    texts_fingerprint,
)
from xtransformer.cache import failpoint
from xtransformer.matcher.config import MatcherConfig
from xtransformer.matcher.datamodule import MatcherDataModule, instance_cluster_targets
from xtransformer.matcher.inference import (
    LoadedMatcher,
    load_matcher_model,
    predict_tokens,
    save_matcher_model,
)
from xtransformer.utils.dist import is_rank_zero, rank_label
from xtransformer.utils.io import (
    checksums, first_mismatch, is_complete, load_csr, load_json, mismatch, save_csr, save_json, save_npy, settings_key,
)

log = logging.getLogger(__name__)

OUTPUTS_FILE = "outputs.json"
TRAIN_SPLIT = "train"
# Trainer kwargs the matcher config owns; a trainer config that sets them is ambiguous.
_OWNED_TRAINER_KEYS = {
    "max_steps": "max_steps", "max_epochs": "max_epochs", "gradient_clip_val": "grad_clip",
    "accumulate_grad_batches": "accumulate_grad_batches", "limit_val_batches": "limit_val_batches",
    "val_check_interval": "val_every_n_steps", "callbacks": "callbacks argument",
    "logger": "logger argument", "use_distributed_sampler": "(always False: the matcher shards itself)",
}
_KEY_TRAINER_FIELDS = ("accelerator", "devices", "num_nodes", "strategy", "precision")


class MatcherInputError(ValueError):
    """Inconsistent texts / Y / C handed to :func:`train_matcher`."""


@dataclass
class MatcherOutputs:
    """Paths of the matcher artifacts, with loaders."""

    out_dir: Path
    splits: tuple[str, ...]

    @property
    def model_dir(self) -> Path:
        return self.out_dir / "model"

    def embeddings_path(self, split: str) -> Path:
        return self.out_dir / "embeddings" / f"{split}.npy"

    def topb_path(self, split: str) -> Path:
        return self.out_dir / "topb" / f"{split}.npz"

    def embeddings(self, split: str, mmap: bool = False) -> np.ndarray:
        """``N x H`` embeddings as saved (float32 or float16)."""
        self._check(split)
        return np.load(self.embeddings_path(split), mmap_mode="r" if mmap else None)

    def topb(self, split: str) -> sp.csr_matrix:
        """``N x K`` csr of the top-b cluster scores (the shortlist / matcher-aware negatives)."""
        self._check(split)
        return load_csr(self.topb_path(split))

    @property
    def metrics(self) -> dict[str, Any]:
        return load_json(self.out_dir / "metrics.json")

    def _check(self, split: str) -> None:
        if split not in self.splits:
            raise KeyError(f"matcher outputs have no split {split!r}; available: {list(self.splits)}")

    @classmethod
    def load(cls, out_dir: str | os.PathLike) -> "MatcherOutputs":
        info = load_json(Path(out_dir) / OUTPUTS_FILE)
        return cls(out_dir=Path(out_dir), splits=tuple(info["splits"]))


def train_matcher(
    cfg: MatcherConfig | Mapping[str, Any],
    trainer_cfg: Mapping[str, Any] | None,
    texts: Mapping[str, Sequence[str]],
    Y: Mapping[str, sp.spmatrix],
    C: sp.spmatrix,
    out_dir: str | os.PathLike,
    val_split: str | None = "dev",
    logger: Any = None,
    callbacks: Sequence[Any] = (),
) -> MatcherOutputs:
    """Fine-tune encoder + head on ``M = binarize(Y[train] · C)``, then embed and match every split.

    ``texts`` must hold ``"train"``; every split in ``texts`` gets embeddings and top-b clusters;
    ``val_split`` (if present in both ``texts`` and ``Y``) is validated during training. ``trainer_cfg``
    holds Lightning ``Trainer`` kwargs (accelerator, devices, strategy, precision, ...).
    """
    cfg = cfg if isinstance(cfg, MatcherConfig) else MatcherConfig.from_dict(dict(cfg))
    trainer_cfg = dict(trainer_cfg or {})
    check_model_available(cfg.model_name_or_path, cfg.cache_dir)  # first: fail before any data work
    check_trainer_cfg(trainer_cfg)
    _check_inputs(texts, Y, C)
    out = Path(out_dir)
    val = val_split if val_split and val_split in texts and val_split in Y else None
    fingerprints = {split: texts_fingerprint(t) for split, t in texts.items()}
    train_key, infer_key = _settings_keys(cfg, trainer_cfg, fingerprints, Y, C, val)

    if outputs_finished(out, infer_key):
        return MatcherOutputs.load(out)
    if is_rank_zero():
        (out / OUTPUTS_FILE).unlink(missing_ok=True)  # stale outputs of other settings

    base = resolve_model(cfg.model_name_or_path, cfg.cache_dir, corpus=tiny_corpus(cfg, texts))
    dm = MatcherDataModule(base, texts, Y, C, cfg, TRAIN_SPLIT, val)
    dm.prepare_data()
    dm.setup("fit")

    facts: dict[str, Any] = {}
    model_dir = out / "model"
    if _model_matches(model_dir, train_key):
        loaded = load_matcher_model(model_dir)
        facts = {"global_step": loaded.meta["global_step"], "reused_model": str(model_dir)}
    else:
        trainer, module, facts = _fit(cfg, trainer_cfg, dm, base, out, train_key, logger, callbacks)
        if not trainer.is_global_zero:
            return _wait_for_outputs(out, infer_key)
        meta = matcher_meta(cfg, trainer_cfg, module, base, train_key, facts["global_step"])
        failpoint("matcher")
        save_matcher_model(module.encoder, module.head, dm.load_tokenizer(), meta, model_dir)
        loaded = load_matcher_model(model_dir)
        if not cfg.keep_checkpoints:
            shutil.rmtree(out / "checkpoints" / train_key, ignore_errors=True)
    if not is_rank_zero():
        return _wait_for_outputs(out, infer_key)
    return write_matcher_outputs(cfg, trainer_cfg, loaded, dm, out, infer_key, facts)


# --------------------------------------------------------------------------- training


def _fit(cfg: MatcherConfig, trainer_cfg: dict[str, Any], dm: MatcherDataModule, base: Path, out: Path,
         train_key: str, logger: Any, callbacks: Sequence[Any]) -> tuple[Any, Any, dict[str, Any]]:
    import lightning.pytorch as pl

    from xtransformer.matcher.module import MatcherModule

    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    module = MatcherModule(str(base), dm.num_clusters, pooling=cfg.pooling, lr=cfg.lr, head_lr=cfg.head_lr,
                           weight_decay=cfg.weight_decay, adam_eps=cfg.adam_eps, warmup_ratio=cfg.warmup_ratio,
                           topb=cfg.topb, with_token_types=dm.tokens[TRAIN_SPLIT].type_ids is not None,
                           dropout=cfg.dropout)
    facts = fit_resumable(cfg, trainer_cfg, module, dm, out, out / "checkpoints" / train_key, cfg.max_steps,
                          logger, callbacks)
    return facts.pop("trainer"), module, facts


def fit_resumable(cfg: MatcherConfig, trainer_cfg: Mapping[str, Any], module: Any, dm: Any, out: Path,
                  ckpt_dir: Path, max_steps: int, logger: Any = None, callbacks: Sequence[Any] = (),
                  resume: bool = True) -> dict[str, Any]:
    """``trainer.fit`` with the matcher's Trainer settings, checkpointing to ``ckpt_dir`` every
    ``cfg.checkpoint_every_n_steps`` and resuming from its ``last.ckpt`` (the single-level matcher
    and every XR-Transformer level train through here)."""
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger

    from xtransformer.matcher.progress import ProgressLog

    checkpoint = ModelCheckpoint(dirpath=ckpt_dir, save_last=True, save_top_k=0, enable_version_counter=False,
                                 every_n_train_steps=cfg.checkpoint_every_n_steps)
    kwargs = dict(trainer_cfg)
    kwargs.update(
        max_steps=max_steps, max_epochs=cfg.max_epochs, gradient_clip_val=cfg.grad_clip,
        accumulate_grad_batches=cfg.accumulate_grad_batches, limit_val_batches=cfg.limit_val_batches,
        use_distributed_sampler=False, default_root_dir=str(out), callbacks=[checkpoint, ProgressLog(), *callbacks],
        logger=logger if logger is not None else CSVLogger(str(out), name="logs"),
    )
    if cfg.val_every_n_steps is not None:
        kwargs.update(val_check_interval=cfg.val_every_n_steps * cfg.accumulate_grad_batches,
                      check_val_every_n_epoch=None)
    trainer = pl.Trainer(**kwargs)
    last = ckpt_dir / "last.ckpt"
    ckpt_path = str(last) if resume and last.is_file() else None
    start = time.perf_counter()
    trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    if trainer.interrupted:
        raise RuntimeError(f"matcher training was interrupted; call again to resume from {last}")
    return {"trainer": trainer, "train_seconds": time.perf_counter() - start, "global_step": int(module.trained_steps),
            "resumed_from": ckpt_path,
            "callback_metrics": {k: float(v) for k, v in trainer.callback_metrics.items()}}


def matcher_meta(cfg: MatcherConfig, trainer_cfg: dict[str, Any], module: Any, base: Path, train_key: str,
                global_step: int) -> dict[str, Any]:
    return {**cfg.to_dict(), "pooling_resolved": module.pooling, "num_clusters": module.head.out_features,
            "hidden_size": module.head.in_features, "model_type": module.encoder.config.model_type,
            "base_model": str(base), "train_key": train_key, "global_step": int(global_step),
            "inference_precision_resolved": inference_precision(cfg, trainer_cfg)}


# --------------------------------------------------------------------------- inference and artifacts


def write_matcher_outputs(cfg: MatcherConfig, trainer_cfg: dict[str, Any], loaded: LoadedMatcher,
                       dm: MatcherDataModule, out: Path, infer_key: str, facts: dict[str, Any]) -> MatcherOutputs:
    device = _inference_device(trainer_cfg)
    encoder, head = loaded.encoder.to(device), loaded.head.to(device)
    precision = inference_precision(cfg, trainer_cfg)
    outputs = MatcherOutputs(out_dir=out, splits=tuple(dm.tokens))
    recall: dict[str, float] = {}
    speed: dict[str, float] = {}
    for split in dm.tokens:
        tokens = dm.tokens_at(split, cfg.embed_length)  # embed_max_length: may read more than fine-tuning did
        start = time.perf_counter()
        pred = predict_tokens(encoder, head, loaded.meta["pooling_resolved"], tokens, cfg.eval_batch_size,
                              cfg.topb, precision, progress=cfg.progress, desc=f"matcher {split}")
        speed[split] = len(tokens) / max(time.perf_counter() - start, 1e-9)
        emb = l2_normalize(pred.embeddings) if cfg.normalize_embeddings else pred.embeddings
        save_npy(emb.astype(cfg.save_embeddings_dtype), outputs.embeddings_path(split))
        save_csr(pred.topb, outputs.topb_path(split))
        if split in dm.targets:
            recall[split] = topb_recall(pred.topb, dm.targets[split])
    metrics = {f"recall@{cfg.topb}": recall, "inference_docs_per_s": speed, "inference_device": str(device),
               "inference_precision": str(precision), "embed_max_length": cfg.embed_length, **facts}
    save_json(metrics, out / "metrics.json")
    files = [str(p.relative_to(out)) for s in outputs.splits for p in (outputs.embeddings_path(s), outputs.topb_path(s))]
    save_json({"key": infer_key, "splits": list(outputs.splits), "checksums": checksums(out, files)},
              out / OUTPUTS_FILE)  # completion marker, written last
    return outputs


def topb_recall(topb: sp.csr_matrix, targets: sp.csr_matrix) -> float:
    """Mean over documents with a true cluster of |top-b ∩ true| / |true| (sparse, vectorised)."""
    predicted = topb.copy()
    predicted.data[:] = 1.0  # scores may be exactly 0: count the stored pattern, not the values
    hits = np.asarray(predicted.multiply(targets).sum(axis=1)).ravel()
    positives = np.diff(targets.indptr)
    has = positives > 0
    return float((hits[has] / positives[has]).mean()) if has.any() else float("nan")


def inference_precision(cfg: MatcherConfig, trainer_cfg: Mapping[str, Any]) -> str:
    return str(cfg.inference_precision or trainer_cfg.get("precision") or "32")


def _inference_device(trainer_cfg: Mapping[str, Any]) -> torch.device:
    accelerator = str(trainer_cfg.get("accelerator", "auto")).lower()
    if torch.cuda.is_available() and accelerator in ("auto", "gpu", "cuda"):
        return torch.device("cuda")
    return torch.device("cpu")


# --------------------------------------------------------------------------- bookkeeping


def check_trainer_cfg(trainer_cfg: Mapping[str, Any]) -> None:
    clash = sorted(set(trainer_cfg) & set(_OWNED_TRAINER_KEYS))
    if clash:
        where = ", ".join(f"trainer.{k} (set by matcher.{_OWNED_TRAINER_KEYS[k]})" for k in clash)
        raise MatcherInputError(f"remove {where} from the trainer config: the matcher config owns them")


def _check_inputs(texts: Mapping[str, Sequence[str]], Y: Mapping[str, sp.spmatrix], C: sp.spmatrix) -> None:
    if TRAIN_SPLIT not in texts or TRAIN_SPLIT not in Y:
        raise MatcherInputError(f"texts and Y need a {TRAIN_SPLIT!r} split (texts: {sorted(texts)}, Y: {sorted(Y)})")
    if not sp.issparse(C) or C.ndim != 2:
        raise MatcherInputError("C must be a scipy.sparse L x K label-to-cluster matrix")
    for split, y in Y.items():
        if not sp.issparse(y):
            raise MatcherInputError(f"Y[{split!r}] must be a scipy.sparse matrix (never densify N x L)")
        if y.shape[1] != C.shape[0]:
            raise MatcherInputError(f"Y[{split!r}] has {y.shape[1]} labels but C has {C.shape[0]} rows")
        if split in texts and len(texts[split]) != y.shape[0]:
            raise MatcherInputError(f"split {split!r}: {len(texts[split])} texts but Y has {y.shape[0]} rows")
    if instance_cluster_targets(Y[TRAIN_SPLIT], C).nnz == 0:
        raise MatcherInputError("no training document has a label assigned to any cluster (Y[train] · C is empty)")


def csr_fingerprint(mat: sp.spmatrix) -> str:
    """sha256 of a sparse matrix's canonical csr form."""
    import hashlib

    m = sp.csr_matrix(mat, copy=True)
    m.sum_duplicates()
    m.sort_indices()
    h = hashlib.sha256(repr((m.shape, str(m.dtype))).encode())
    for arr in (m.indptr, m.indices, m.data):
        h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()


def _settings_keys(cfg: MatcherConfig, trainer_cfg: Mapping[str, Any], fingerprints: Mapping[str, str],
                   Y: Mapping[str, sp.spmatrix], C: sp.spmatrix, val: str | None) -> tuple[str, str]:
    """(training key: what determines the weights; inference key: what determines every artifact)."""
    dist = {k: str(trainer_cfg.get(k)) for k in _KEY_TRAINER_FIELDS}
    train_key = settings_key(cfg.training_settings(), dist, fingerprints[TRAIN_SPLIT], csr_fingerprint(Y[TRAIN_SPLIT]),
                             csr_fingerprint(C))
    infer_key = settings_key(train_key, cfg.prediction_settings(), inference_precision(cfg, trainer_cfg), dict(fingerprints),
                             {s: csr_fingerprint(y) for s, y in Y.items() if s in fingerprints}, val)
    return train_key, infer_key


def outputs_finished(out: Path, infer_key: str, verify: bool = True) -> bool:
    """True when ``out`` holds the outputs of ``infer_key`` and (``verify``) they match their checksums."""
    marker = out / OUTPUTS_FILE
    if not marker.is_file():
        return False
    done = load_json(marker)
    if done.get("key") != infer_key:
        return False
    bad = mismatch(out, done.get("checksums") or {OUTPUTS_FILE: {"size": -1}}) if verify else None
    if bad is not None:
        log.warning("matcher outputs %s are corrupt or incomplete (checksum mismatch); recomputing them", out / bad)
        marker.unlink(missing_ok=True)
        return False
    return True


def _model_matches(model_dir: Path, train_key: str) -> bool:
    meta = model_dir / "matcher_config.json"
    if not (is_complete(model_dir) and meta.is_file() and load_json(meta).get("train_key") == train_key):
        return False
    bad = first_mismatch(model_dir)
    if bad is not None:
        log.warning("matcher model %s is corrupt (checksum mismatch); training it again", model_dir / bad)
        shutil.rmtree(model_dir, ignore_errors=True)
    return bad is None


def _wait_for_outputs(out: Path, infer_key: str, poll_s: float = 1.0) -> MatcherOutputs:
    """Non-zero ranks: wait for rank 0 to finish writing (no collective: inference may be long)."""
    parent = os.getppid()
    log.info("rank (%s) waits for matcher outputs in %s", rank_label(), out)
    while not outputs_finished(out, infer_key, verify=False):
        if os.getppid() != parent:
            raise RuntimeError(f"rank 0 exited before writing the matcher outputs to {out}")
        time.sleep(poll_s)
    return MatcherOutputs.load(out)


def tiny_corpus(cfg: MatcherConfig, texts: Mapping[str, Sequence[str]]) -> list[str] | None:
    """Training texts for the tokenizer of a ``tiny:*`` model (None for pretrained models)."""
    if not str(cfg.model_name_or_path).lower().startswith("tiny:"):
        return None
    limit = cfg.truncate_chars or default_truncate_chars(cfg.max_length)
    return [t[:limit] for t in texts[TRAIN_SPLIT]]
