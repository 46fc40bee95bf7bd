"""The CNN baselines as model classes: fit, predict, save, load.

A model is the network, its tokenizer and a record of both (``network/``: ``weights.safetensors``,
``cnn.json``, the tokenizer's files). Training is the stage ``cnn`` of the cache, checkpointed
every ``cnn.checkpoint_every_n_steps`` so that a killed run resumes where it stood.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from xtransformer.data.inputs import LabeledData
from xtransformer.methods.base import ModelRecords, XMCModel
from xtransformer.methods.cnn.config import KimCNNSettings, XMLCNNSettings
from xtransformer.methods.cnn.network import TextCNN, run_batches
from xtransformer.methods.cnn.weights import NETWORK_DIR, load_network, save_network
from xtransformer.utils.hardware import predict_device
from xtransformer.utils.io import load_json, settings_key


class CNNModel(XMCModel):
    """Texts -> tokens -> :class:`TextCNN` -> a sigmoid score per label, the top ``topk`` kept."""

    collective = True  # training is shared by the processes of a DDP run

    def __init__(self, records: ModelRecords, network: TextCNN, tokenizer: Any, meta: dict[str, Any]):
        super().__init__(records)
        self.network = network.eval()
        self.tokenizer = tokenizer
        self.meta = meta  # how texts become tokens, the network's shape, what training did

    # ------------------------------------------------------------------ training
    @classmethod
    def stage_keys(cls, s: Any, data_key: str, n_labels: int, trainer: Any) -> dict[str, str]:
        return {"cnn": settings_key("cnn", data_key, s.cnn.training_settings(), trainer.placement())}

    @classmethod
    def _check(cls, data: LabeledData, s: Any) -> None:
        from xtransformer.encoders import check_model_available

        data.require_texts(f"method={cls.kind}")
        check_model_available(s.cnn.encoder, s.cnn.cache_dir)

    @classmethod
    def _fit(
        cls, data: LabeledData, s: Any, ctx: Any, validation: LabeledData | None, keys: dict[str, str]
    ) -> CNNModel | None:
        from xtransformer.methods.cnn.train import train_cnn

        cfg = ctx.matcher_settings(s.cnn)  # its token cache in the context's folder unless set
        folder = train_cnn(ctx, keys["cnn"], data, cfg, validation)
        if not ctx.is_rank_zero:
            return None  # a DDP helper process: its share of the training is done
        predict = {
            "topk": cfg.topk,
            "eval_batch_size": cfg.eval_batch_size,
            "inference_precision": str(cfg.inference_precision or ctx.trainer.precision),
        }
        records = ModelRecords.of(data, predict, s.training_settings() | {"trainer": ctx.trainer.placement()})
        model = cls(records, *load_network(folder / NETWORK_DIR)).to(ctx.trainer.device)
        model.training_run.report = {"stage_keys": keys, "train": load_json(folder / "facts.json")}
        return model

    def to(self, device: str) -> CNNModel:
        """Predict on ``device`` (``cpu``, ``cuda``, ``cuda:N``, ``auto``)."""
        self.device = predict_device(device)
        self.network.to(self.device)
        return self

    # ------------------------------------------------------------------ prediction
    def _predict_texts(
        self, texts: list[str], settings: dict[str, Any], report: dict[str, Any] | None
    ) -> sp.csr_matrix:
        from xtransformer.encoders.tokens import tokenize_texts

        tokens = tokenize_texts(
            self.tokenizer, texts, self.meta["max_length"], self.meta["truncate_chars"], progress=False
        )
        return score_tokens(self.network, tokens, settings, self.meta["max_length"])

    # ------------------------------------------------------------------ folders
    def _save_components(self, tmp: Path, folder: Path) -> dict[str, Any]:
        save_network(tmp / NETWORK_DIR, self.network, self.tokenizer, self.meta)
        return {"kind": self.kind, "network": NETWORK_DIR}

    @classmethod
    def _load(cls, folder: Path, components: dict[str, Any], records: ModelRecords, verify: bool) -> CNNModel:
        return cls(records, *load_network(folder / components["network"]))


class KimCNN(CNNModel):
    """Kim-CNN: one max-pooled value per feature map, the output layer on the pooled features."""

    kind = "kimcnn"
    settings_class = KimCNNSettings


class XMLCNN(CNNModel):
    """XML-CNN (Liu et al., SIGIR 2017): dynamic max pooling, a bottleneck layer before the output."""

    kind = "xmlcnn"
    settings_class = XMLCNNSettings


def score_tokens(network: TextCNN, tokens: Any, settings: dict[str, Any], width: int) -> sp.csr_matrix:
    """csr ``N x L`` of each document's ``topk`` sigmoid scores (length-sorted batches, autocast)."""
    from xtransformer.matcher.inference import topb_csr

    n_labels = network.output.out_features
    n, k = len(tokens), min(int(settings["topk"]), n_labels)
    scores, labels = np.zeros((n, k), dtype=np.float32), np.zeros((n, k), dtype=np.int64)
    batch_size, precision = int(settings["eval_batch_size"]), settings["inference_precision"]
    for rows, _, logits in run_batches(network, tokens, batch_size, precision, width):
        top = torch.sigmoid(logits).topk(k, dim=1)
        scores[rows], labels[rows] = top.values.numpy(), top.indices.numpy()
    return topb_csr(scores, labels, n_labels)
