"""Small saved models for the model-folder, API and server tests (no pipeline, no Hydra)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.sparse as sp
from tiny_models import toy_xmc

from xtransformer.data.tfidf import TfidfConfig, TfidfFeatures
from xtransformer.methods.base import ModelRecords
from xtransformer.methods.xrlinear import XRLinear
from xtransformer.methods.xrlinear.model import ranker_predict_settings
from xtransformer.ranker import HierarchicalLinear, HierarchicalLinearConfig


def with_bias(X: sp.csr_matrix, bias: float) -> sp.csr_matrix:
    """``[X | bias]`` (csr float32); ``X`` itself when ``bias <= 0``: the input a level's ``W``
    (``(F + 1) x L``) is written for, the reference the ranker tests score against."""
    if bias <= 0:
        return X
    n = X.shape[0]
    col = sp.csr_matrix(
        (np.full(n, bias, dtype=np.float32), np.zeros(n, dtype=np.int32), np.arange(n + 1, dtype=np.int64)),
        shape=(n, 1),
    )
    out = sp.hstack([X, col], format="csr", dtype=np.float32)
    out.has_sorted_indices = True  # the bias column comes last in every row
    return out


def toy_tree(C: sp.csr_matrix) -> list[sp.csr_matrix]:
    """Root -> K clusters -> L labels."""
    return [sp.csr_matrix(np.ones((C.shape[1], 1), np.float32)), C]


def labels_record(n: int) -> dict[str, list[str]]:
    return {"ids": [f"L{i}" for i in range(n)], "names": [f"label number {i}" for i in range(n)]}


def save_toy_xrlinear(folder: Path) -> tuple[Path, dict]:
    """An XR-Linear model folder on the toy task; returns it and the task's texts."""
    texts, Y, C = toy_xmc()
    tfidf, X = TfidfFeatures.fit(texts["train"], TfidfConfig(min_df=1))
    model = HierarchicalLinear.train(X, Y["train"], toy_tree(C), HierarchicalLinearConfig(threads=1))
    labels = labels_record(C.shape[0])
    records = ModelRecords(labels["ids"], labels["names"], ranker_predict_settings(model.config), {"dataset": "toy"})
    XRLinear(records, tfidf, model).save(folder)
    return folder, texts


def dense_weights(kept, n_cols: int, n_slots: int) -> np.ndarray:
    """A solver's kept weights (``solver.SolvedWeights``) as ``n_cols x n_slots`` (zeros elsewhere)."""
    W = np.zeros((n_cols, n_slots), np.float32)
    W[kept.col, kept.slot] = kept.val
    return W


def save_toy_kimcnn(folder: Path) -> Path:
    """A Kim-CNN folder with random weights over the toy task's labels (the tiny BERT's tokenizer):
    a model with a network, for what only such a model does (``--device``)."""
    import torch
    from tiny_models import tiny_model_dir
    from transformers import AutoTokenizer

    from xtransformer.methods.cnn import CNNConfig, KimCNN
    from xtransformer.methods.cnn.network import TextCNN
    from xtransformer.methods.cnn.weights import network_meta

    torch.manual_seed(0)
    cfg = CNNConfig(filter_widths=[2, 3], feature_maps=8, max_length=32)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir("bert"))
    labels = labels_record(toy_xmc()[2].shape[0])
    network = TextCNN((len(tokenizer), 16), len(labels["ids"]), cfg)
    predict = {"topk": 5, "eval_batch_size": 8, "inference_precision": "32-true"}
    records = ModelRecords(labels["ids"], labels["names"], predict, {"dataset": "toy"})
    return KimCNN(records, network, tokenizer, network_meta(cfg, network)).save(folder)
