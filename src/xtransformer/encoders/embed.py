"""Loading an encoder and running it: pooling, autocast, length-sorted batches, text embeddings."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from xtransformer.encoders.lookup import resolve_model
from xtransformer.encoders.names import POOLINGS
from xtransformer.encoders.tokens import tokenize_texts
from xtransformer.utils.hardware import warn_emulated_bf16


def pretrained_encoder(path: str | os.PathLike) -> nn.Module:
    """``AutoModel`` from a local folder, always in fp32: transformers 5 loads a checkpoint in the
    dtype it was stored in, so an fp16 folder would train and embed in fp16 (on CPU its layer norms
    refuse the mixed dtypes); reduced precision is the Trainer's / the embedder's autocast."""
    from transformers import AutoModel

    return AutoModel.from_pretrained(path, dtype=torch.float32)


def set_dropout(model: nn.Module, p: float) -> None:
    """Every dropout of ``model`` (hidden and attention, any family) set to ``p``.

    Hugging Face encoders keep their rates in ``nn.Dropout`` layers (BERT's SDPA attention reads its
    layer's ``p``) or, in some families' attention, in a float attribute (``attention_dropout``,
    ``dropout_prob``); the config is updated too, so a saved folder records the rate it trained at.
    """
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = float(p)
        for attr in ("attention_dropout", "dropout_prob"):
            if isinstance(getattr(module, attr, None), float):
                setattr(module, attr, float(p))
    for key in ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout", "attention_dropout"):
        if isinstance(getattr(model.config, key, None), float):
            setattr(model.config, key, float(p))


def load_encoder(
    name_or_path: str | os.PathLike,
    cache_dir: str | os.PathLike | None = None,
    corpus: Sequence[str] | None = None,
    device: str | torch.device | None = None,
) -> tuple[nn.Module, Any]:
    """``(AutoModel, AutoTokenizer)`` from the local folder :func:`resolve_model` finds for ``name_or_path``."""
    from transformers import AutoTokenizer

    path = resolve_model(name_or_path, cache_dir=cache_dir, corpus=corpus)
    model = pretrained_encoder(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        raise ValueError(f"the tokenizer of model {str(name_or_path)!r} has no pad token; batching needs one")
    if device is not None:
        model.to(device)
    return model, tokenizer


# sentence-transformers' pooling file (1_Pooling/config.json): the key that declares each pooling
POOLING_MODES = {"mean": "pooling_mode_mean_tokens", "cls": "pooling_mode_cls_token", "last": "pooling_mode_lasttoken"}


def declare_pooling(model_dir: str | os.PathLike, pooling: str, hidden_size: int) -> None:
    """Write ``pooling`` into ``model_dir`` as sentence-transformers do, so that ``auto`` resolves to
    it on this folder (a fine-tuned encoder used as the next model's starting point)."""
    if pooling not in POOLING_MODES:
        raise ValueError(f"pooling must be one of {tuple(POOLING_MODES)}, got {pooling!r}")
    folder = Path(model_dir) / "1_Pooling"
    folder.mkdir(parents=True, exist_ok=True)
    modes = {key: name == pooling for name, key in POOLING_MODES.items()}
    (folder / "config.json").write_text(json.dumps({"word_embedding_dimension": int(hidden_size), **modes}, indent=2))


def default_pooling(model_type: str, model_dir: str | os.PathLike | None = None) -> str:
    """Pooling a model was trained for: sentence-transformers folders declare it (MiniLM, MPNet:
    mean); otherwise the "[CLS]-like" token of its family (XLNet: last; BERT/RoBERTa: first)."""
    if model_dir is not None:
        pooling_cfg = Path(model_dir) / "1_Pooling" / "config.json"
        if pooling_cfg.is_file():
            modes = json.loads(pooling_cfg.read_text())
            for name, key in POOLING_MODES.items():
                if modes.get(key):
                    return name
    return "last" if model_type in ("xlnet", "gpt2", "llama", "mistral", "qwen2") else "cls"


def resolve_pooling(pooling: str | None, model: nn.Module) -> str:
    """``auto``/``None`` → :func:`default_pooling` of ``model``; otherwise validate the name."""
    if pooling in (None, "auto"):
        model_dir = getattr(model, "name_or_path", None) or getattr(model.config, "_name_or_path", None)
        folder = Path(model_dir) if model_dir and Path(model_dir).is_dir() else None
        return default_pooling(getattr(model.config, "model_type", ""), folder)
    if pooling not in POOLINGS:
        raise ValueError(f"matcher.pooling must be one of {('auto',) + POOLINGS}, got {pooling!r}")
    return pooling


def pool_hidden(hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """Sequence embedding from token states; left- and right-padding safe.

    ``cls``: first real token (BERT/RoBERTa [CLS]/<s>); ``last``: last real token (XLNet's <cls>);
    ``mean``: average of real tokens.
    """
    mask = attention_mask.long()
    if pooling == "mean":
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)
    if pooling == "cls":
        idx = mask.argmax(1)  # argmax returns the first maximal index: first real token
    elif pooling == "last":
        positions = torch.arange(mask.shape[1], device=mask.device)
        idx = (mask * positions).argmax(1)
    else:
        raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), idx]


def encoder_forward(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Last hidden states ``B x T x H`` for a batch with input_ids / attention_mask (/ token_type_ids)."""
    kwargs: dict[str, Any] = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    if batch.get("token_type_ids") is not None:
        kwargs["token_type_ids"] = batch["token_type_ids"]
    if getattr(model.config, "model_type", "") == "xlnet":
        kwargs["use_mems"] = False  # no recurrence memory: independent documents
    return model(**kwargs).last_hidden_state


def autocast_context(precision: str | int | None, device: torch.device) -> contextlib.AbstractContextManager:
    """Autocast matching a Lightning precision string (``32``, ``bf16-mixed``, ``16-mixed``...)."""
    p = str(precision if precision is not None else "32").lower()
    if p.startswith("bf16"):
        if device.type == "cpu":
            warn_emulated_bf16(p, "inference_precision")
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    if p.startswith("16"):
        return torch.autocast(device_type=device.type, dtype=torch.float16)
    if p.split("-")[0] in ("32", "64", "transformer"):
        return contextlib.nullcontext()
    raise ValueError(f"unknown precision {precision!r}: expected 32, 32-true, bf16-mixed, 16-mixed, ...")


def encode_batches(
    model: nn.Module,
    batches: Iterable[tuple[np.ndarray, Mapping[str, torch.Tensor]]],
    pooling: str,
    precision: str | int | None = "32",
    head: nn.Module | None = None,
    progress: bool = True,
    total: int | None = None,
    desc: str = "encoding",
) -> Iterator[tuple[np.ndarray, torch.Tensor, torch.Tensor | None]]:
    """Run ``model`` over ``(row_ids, batch)`` pairs; yield ``(row_ids, embeddings, head logits)``.

    Each batch runs under ``torch.inference_mode()`` and the autocast of ``precision``; outputs come
    back as float32 CPU tensors. ``head`` (e.g. the matcher's linear layer) is optional.
    """
    from tqdm.auto import tqdm

    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with tqdm(total=total, desc=desc, unit="doc", disable=not progress, leave=False) as bar:
            for rows, batch in batches:
                batch = {k: v.to(device, non_blocking=True) for k, v in batch.items() if v is not None}
                with torch.inference_mode(), autocast_context(precision, device):
                    emb = pool_hidden(encoder_forward(model, batch), batch["attention_mask"], pooling)
                    logits = head(emb) if head is not None else None
                yield rows, emb.float().cpu(), (logits.float().cpu() if logits is not None else None)
                bar.update(len(rows))
    finally:
        model.train(was_training)


def length_sorted_batches(lengths: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """Row ids grouped in batches of similar length, longest first (less padding; OOM shows early)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = np.argsort(-np.asarray(lengths), kind="stable")
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


@dataclass(frozen=True)
class EmbedOptions:
    """How :func:`embed_texts` reads and pools texts."""

    max_length: int = 128
    batch_size: int = 64
    pooling: str | None = "auto"
    precision: str | int | None = "32"
    normalize: bool = False
    truncate_chars: int | None = None
    progress: bool = True


def embed_texts(
    model: nn.Module, tokenizer: Any, texts: Sequence[str], options: EmbedOptions | None = None, **overrides: Any
) -> np.ndarray:
    """Dense ``N x H`` float32 embeddings of ``texts`` (e.g. ``text_emb`` / ``pifa_neural`` features);
    ``overrides``: fields of :class:`EmbedOptions` over ``options``."""
    opt = dataclasses.replace(options or EmbedOptions(), **overrides)
    pooling = resolve_pooling(opt.pooling, model)
    tokens = tokenize_texts(tokenizer, texts, opt.max_length, opt.truncate_chars, progress=False)
    out = np.zeros((len(tokens), model.config.hidden_size), dtype=np.float32)
    batches = ((rows, tokens.batch(rows)) for rows in length_sorted_batches(tokens.lengths, opt.batch_size))
    for rows, emb, _ in encode_batches(
        model, batches, pooling, opt.precision, progress=opt.progress, total=len(tokens), desc="embedding"
    ):
        out[rows] = emb.numpy()
    return l2_normalize(out) if opt.normalize else out


def default_truncate_chars(max_length: int) -> int:
    """Characters of each training text a ``tiny:*`` tokenizer learns its vocabulary from: 16 per
    token, far more than the tokens a document is cut to."""
    return 16 * int(max_length)


def l2_normalize(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)
