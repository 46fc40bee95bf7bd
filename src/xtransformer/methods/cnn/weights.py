"""A trained text CNN as a folder: ``weights.safetensors`` (no pickle), ``cnn.json`` (the network's
shape, how texts become tokens, the settings it trained with) and the tokenizer's files. Written by
training, read by the model classes and by X-Transformer's CNN matcher."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from xtransformer.methods.cnn.config import CNNConfig
from xtransformer.methods.cnn.network import NETWORK_KEYS, TextCNN
from xtransformer.model.folder import scrub
from xtransformer.utils.io import atomic_dir, load_json, save_json

NETWORK_DIR = "network"


def network_meta(cfg: CNNConfig, network: TextCNN) -> dict[str, Any]:
    """``cnn.json``: the network's shape, how texts become tokens, the settings it trained with."""
    return scrub(
        {
            **{k: getattr(cfg, k) for k in NETWORK_KEYS},
            "vocab": list(network.embedding.weight.shape),
            "n_labels": network.output.out_features,
            "max_length": cfg.max_length,
            "truncate_chars": cfg.truncate_chars,
            "settings": cfg.training_settings(),
        }
    )


def save_network(path: Path, network: TextCNN, tokenizer: Any, meta: dict[str, Any]) -> Path:
    """``network/`` (atomic): ``weights.safetensors`` (no pickle), ``cnn.json``, the tokenizer."""
    from safetensors.torch import save_file

    with atomic_dir(path) as tmp:
        weights = {k: v.detach().cpu().contiguous() for k, v in network.state_dict().items()}
        save_file(weights, tmp / "weights.safetensors")
        tokenizer.save_pretrained(tmp)
        save_json(meta, tmp / "cnn.json")
    return path


def load_network(path: Path) -> tuple[TextCNN, Any, dict[str, Any]]:
    """``(network, tokenizer, meta)`` of a folder :func:`save_network` wrote."""
    from types import SimpleNamespace

    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    meta = load_json(path / "cnn.json")
    shape = SimpleNamespace(**{k: meta[k] for k in NETWORK_KEYS})
    network = TextCNN(tuple(meta["vocab"]), int(meta["n_labels"]), shape)
    network.load_state_dict(load_file(path / "weights.safetensors"))
    return network.eval(), AutoTokenizer.from_pretrained(path), meta
