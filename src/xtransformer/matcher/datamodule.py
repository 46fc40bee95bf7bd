"""Tokenised texts with their instance-to-cluster targets, served by a LightningDataModule.

Texts are tokenised once (``encoders.tokens``: batched, in Rust, cached on disk) and kept ragged
(flat ids + offsets), padded per batch.
Targets ``M = binarize(Y · C)`` stay sparse; the collate function densifies only the batch rows.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import scipy.sparse as sp
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from xtransformer.encoders import default_cache_dir
from xtransformer.encoders.tokens import TokenizedTexts, tokenize_texts
from xtransformer.matcher.config import MatcherConfig

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- targets


def instance_cluster_targets(Y: sp.spmatrix, C: sp.spmatrix) -> sp.csr_matrix:
    """``M = binarize(Y · C)``: ``N x K`` csr float32, 1 where a document has a label in cluster k."""
    if Y.shape[1] != C.shape[0]:
        raise ValueError(f"Y has {Y.shape[1]} label columns but C has {C.shape[0]} label rows")
    M = (sp.csr_matrix(Y) != 0).astype(np.float32) @ (sp.csr_matrix(C) != 0).astype(np.float32)
    M = sp.csr_matrix(M)
    M.eliminate_zeros()
    M.data[:] = 1.0
    return M


# --------------------------------------------------------------------------- batches


class _IndexDataset(Dataset):
    """Item ``i`` is ``i``: the collate function gathers a whole batch at once (vectorised)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


class Collator:
    """Rows → padded tokens + dense target rows (only the batch is densified). Picklable.

    ``masks`` are further sparse row-aligned matrices served as dense boolean rows under their
    names (XR-Transformer's teacher-forcing shortlist).
    """

    def __init__(
        self, tokens: TokenizedTexts, targets: sp.csr_matrix | None, masks: Mapping[str, sp.csr_matrix] | None = None
    ) -> None:
        self.tokens = tokens
        self.targets = targets
        self.masks = dict(masks or {})

    def __call__(self, rows: list[int]) -> dict[str, torch.Tensor]:
        idx = np.asarray(rows, dtype=np.int64)
        batch = self.tokens.batch(idx)
        batch["rows"] = torch.from_numpy(idx)
        if self.targets is not None:
            batch["targets"] = torch.from_numpy(self.targets[idx].toarray())
        for name, mat in self.masks.items():
            batch[name] = torch.from_numpy(mat[idx].toarray() != 0)
        return batch


class EpochSampler(Sampler[int]):
    """Per-epoch permutation from ``(seed, epoch)``, sharded over ranks, resumable mid-epoch.

    Replaces Lightning's DistributedSampler so a resumed run sees exactly the batches an
    uninterrupted one would: ``skip`` rows of ``skip_epoch`` are dropped once.
    Training shards are padded (wrapping around) to equal length on every rank; evaluation ones not.
    """

    def __init__(self, n: int, shuffle: bool, seed: int, rank: int = 0, world_size: int = 1, pad: bool = True) -> None:
        self.n, self.shuffle, self.seed = n, shuffle, seed
        self.rank, self.world_size, self.pad = rank, world_size, pad
        self.epoch = 0
        self.skip_epoch: int | None = None
        self.skip = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def resume(self, epoch: int, skip_rows: int) -> None:
        self.skip_epoch, self.skip = epoch, skip_rows

    def _shard(self) -> np.ndarray:
        order = (
            np.random.default_rng([self.seed, self.epoch]).permutation(self.n) if self.shuffle else np.arange(self.n)
        )
        if self.pad and self.world_size > 1:
            total = -(-self.n // self.world_size) * self.world_size
            order = np.resize(order, total)  # repeats from the start, like DistributedSampler
        return order[self.rank :: self.world_size]

    def __len__(self) -> int:
        if self.pad:
            return -(-self.n // self.world_size)
        return len(range(self.rank, self.n, self.world_size))

    def __iter__(self) -> Iterator[int]:
        shard = self._shard()
        if self.skip_epoch == self.epoch and 0 < self.skip < len(shard):
            shard = shard[self.skip :]
        self.skip_epoch, self.skip = None, 0
        return iter(shard.tolist())


# --------------------------------------------------------------------------- datamodule


class MatcherDataModule(pl.LightningDataModule):
    """Serves ``{input_ids, attention_mask, targets, rows}`` batches for the matcher.

    ``texts`` / ``Y`` map split names to documents and ``N x L`` label matrices; ``C`` is the
    ``L x K`` label-to-cluster assignment. ``val_split`` may be ``None`` (no validation).
    """

    def __init__(
        self,
        tokenizer_path: str | os.PathLike,
        texts: Mapping[str, Sequence[str]],
        Y: Mapping[str, sp.spmatrix],
        C: sp.spmatrix,
        cfg: MatcherConfig,
        train_split: str = "train",
        val_split: str | None = "dev",
    ) -> None:
        super().__init__()
        for split in [train_split] + ([val_split] if val_split else []):
            if split not in texts or split not in Y:
                raise ValueError(
                    f"split {split!r} needs both texts and Y (have texts: {sorted(texts)}, Y: {sorted(Y)})"
                )
            if len(texts[split]) != Y[split].shape[0]:
                raise ValueError(f"split {split!r}: {len(texts[split])} texts but Y has {Y[split].shape[0]} rows")
        self.tokenizer_path = str(tokenizer_path)
        self.texts = {k: list(v) for k, v in texts.items()}
        self.Y = {k: sp.csr_matrix(v) for k, v in Y.items()}
        self.C = sp.csr_matrix(C)
        self.cfg = cfg
        self.train_split, self.val_split = train_split, val_split
        self.cache_dir = Path(cfg.cache_dir) if cfg.cache_dir else default_cache_dir()
        self.tokens: dict[str, TokenizedTexts] = {}
        self.targets: dict[str, sp.csr_matrix] = {}
        self.masks: dict[str, dict[str, sp.csr_matrix]] = {}  # per split: extra row masks for the collator
        self.seed = cfg.seed  # of the batch order (XR-Transformer gives every level its own)
        self._train_sampler: EpochSampler | None = None
        self._resume: dict[str, int] | None = None

    @property
    def num_clusters(self) -> int:
        return self.C.shape[1]

    def load_tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.tokenizer_path)

    def prepare_data(self) -> None:
        """Tokenise every split into the on-disk cache (Lightning runs this on one process)."""
        if self.tokens:
            return
        tokenizer = self.load_tokenizer()
        for texts in self.texts.values():
            tokenize_texts(
                tokenizer,
                texts,
                self.cfg.max_length,
                self.cfg.truncate_chars,
                self.cache_dir,
                progress=self.cfg.progress,
            )

    def setup(self, stage: str | None = None) -> None:
        if self.tokens:
            return
        tokenizer = self.load_tokenizer()
        for split, texts in self.texts.items():
            self.tokens[split] = tokenize_texts(
                tokenizer,
                texts,
                self.cfg.max_length,
                self.cfg.truncate_chars,
                self.cache_dir,
                progress=self.cfg.progress,
            )
        self.targets = {split: instance_cluster_targets(Y, self.C) for split, Y in self.Y.items()}

    def tokens_at(self, split: str, max_length: int) -> TokenizedTexts:
        """``split`` tokenised at ``max_length`` tokens: the training tokens when that is the
        training length, else tokenised again (cached on disk like them)."""
        if max_length == self.cfg.max_length and split in self.tokens:
            return self.tokens[split]
        return tokenize_texts(
            self.load_tokenizer(),
            self.texts[split],
            max_length,
            self.cfg.truncate_chars,
            self.cache_dir,
            progress=self.cfg.progress,
        )

    def _rank_world(self) -> tuple[int, int]:
        trainer = getattr(self, "trainer", None)
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def _loader(self, split: str, sampler: EpochSampler, batch_size: int) -> DataLoader:
        # A private generator: creating a loader iterator otherwise draws from the global torch RNG,
        # and a resumed run (which creates one more iterator) would get other dropout masks.
        generator = torch.Generator()
        generator.manual_seed(self.seed)
        return DataLoader(
            _IndexDataset(len(self.tokens[split])),
            batch_size=batch_size,
            sampler=sampler,
            collate_fn=Collator(self.tokens[split], self.targets.get(split), self.masks.get(split)),
            generator=generator,
            num_workers=self.cfg.num_workers,
            persistent_workers=self.cfg.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        rank, world = self._rank_world()
        sampler = EpochSampler(
            len(self.tokens[self.train_split]), shuffle=True, seed=self.seed, rank=rank, world_size=world, pad=True
        )
        if self._resume is not None:
            sampler.resume(self._resume["epoch"], self._resume["batches_done"] * self.cfg.batch_size)
            self._resume = None
        self._train_sampler = sampler
        return self._loader(self.train_split, sampler, self.cfg.batch_size)

    def val_dataloader(self) -> DataLoader | list:
        if not self.val_split:
            return []
        rank, world = self._rank_world()
        sampler = EpochSampler(
            len(self.tokens[self.val_split]), shuffle=False, seed=self.seed, rank=rank, world_size=world, pad=False
        )
        return self._loader(self.val_split, sampler, self.cfg.eval_batch_size)

    # Lightning stores this in every checkpoint: where in the epoch training stood.
    def state_dict(self) -> dict[str, Any]:
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            return {}
        return {
            "epoch": int(trainer.current_epoch),
            "batches_done": int(trainer.fit_loop.epoch_loop.batch_progress.current.processed),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._resume = dict(state_dict) if state_dict else None
