"""Train a text CNN as a stage of the cache: the tokens and targets of the matcher's DataModule
(as a method, stage ``cnn``, the label-to-cluster matrix is the identity: one output per label; as
X-Transformer's matcher, stage ``matcher``, it is the label tree's leaf level: one output per
cluster), the resumable Lightning loop every fine-tuning here shares, the network folder written
by rank 0."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import scipy.sparse as sp
import torch

from xtransformer.methods.cnn.config import CNNConfig
from xtransformer.utils.io import save_json

TRAIN_SPLIT, VAL_SPLIT = "train", "dev"


def train_cnn(
    ctx: Any,
    key: str,
    data: Any,
    cfg: CNNConfig,
    validation: Any = None,
    C: sp.spmatrix | None = None,
    stage: str = "cnn",
) -> Path:
    """The folder of stage (``stage``, ``key``): ``network/`` and ``facts.json`` (steps, seconds,
    the last validation scores). ``C``: the ``L x K`` label-to-cluster matrix of the outputs (None:
    one output per label). ``validation`` is scored while training, never chosen on."""
    from xtransformer.matcher.train import check_inputs, check_trainer_kwargs

    texts, Y = {TRAIN_SPLIT: data.require_texts("the CNN")}, {TRAIN_SPLIT: data.Y}
    if validation is not None and validation.texts is not None:
        texts[VAL_SPLIT], Y[VAL_SPLIT] = validation.texts, validation.Y
    C = sp.identity(data.n_labels, dtype="float32", format="csr") if C is None else C
    check_inputs(texts, Y, C)
    check_trainer_kwargs(ctx.trainer_kwargs)
    work = ctx.cache.work_dir(stage, key)

    def build(tmp: Path) -> None:
        import lightning.pytorch as pl

        from xtransformer.encoders import resolve_model
        from xtransformer.matcher.datamodule import MatcherDataModule
        from xtransformer.matcher.train import fit_resumable
        from xtransformer.methods.cnn.module import CNNModule
        from xtransformer.methods.cnn.weights import network_meta, save_network

        corpus = texts[TRAIN_SPLIT] if cfg.encoder.lower().startswith("tiny:") else None
        base = resolve_model(cfg.encoder, cfg.cache_dir, corpus=corpus)
        dm = MatcherDataModule(base, texts, Y, C, cfg, TRAIN_SPLIT, VAL_SPLIT if VAL_SPLIT in texts else None)
        dm.prepare_data()
        dm.setup("fit")
        pl.seed_everything(cfg.seed, workers=True, verbose=False)
        module = CNNModule(initial_embedding(base, cfg, len(dm.load_tokenizer())), dm.num_clusters, cfg)
        facts = fit_resumable(ctx, cfg, module, dm, work, cfg.max_steps)
        if facts["trainer"].is_global_zero:
            record = {
                "global_step": facts["global_step"],
                "train_seconds": round(facts["train_seconds"], 3),
                "val": {k: round(v, 6) for k, v in facts["callback_metrics"].items() if k.startswith("val/")},
            }
            save_network(tmp / "network", module.network, dm.load_tokenizer(), network_meta(cfg, module.network))
            save_json(record, tmp / "facts.json")

    folder = ctx.cache.run(stage, key, build, settings=cfg.training_settings(), collective=True)
    if not cfg.keep_checkpoints and ctx.is_rank_zero:  # the committed folder is the resume point now
        shutil.rmtree(work / "checkpoints", ignore_errors=True)
    return folder


def initial_embedding(base: Path, cfg: CNNConfig, vocab: int) -> torch.Tensor | tuple[int, int]:
    """The encoder's input-embedding table (``embeddings: encoder``) or the shape of a random one;
    rows beyond the encoder's table (a tokenizer with added tokens) start random."""
    if cfg.embeddings == "random":
        return (vocab, cfg.embed_dim)
    from xtransformer.encoders import pretrained_encoder

    table = pretrained_encoder(base).get_input_embeddings().weight.detach().clone()
    if table.shape[0] < vocab:
        table = torch.cat([table, torch.randn(vocab - table.shape[0], table.shape[1]) * table.std()])
    return table
