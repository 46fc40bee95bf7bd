"""OmegaConf resolvers used by the configs (registered by ``configuration.register`` before composing)."""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf


def _by_scale(full: Any, small: Any, *, _root_: Any) -> Any:
    """``${by_scale:full,small}``: the paper's setting, or the stand-in of ``model_scale=small``.

    One switch (``experiment=table5_small``) turns the grid's BERT/RoBERTa/XLNet into tiny random
    models of the same families, so the same sweep runs here and at full scale on GPUs.
    """
    scale = _root_.get("model_scale", "full")
    if scale not in ("full", "small"):
        raise ValueError(f"model_scale must be 'full' or 'small', got {scale!r}")
    return small if scale == "small" else full


def register() -> None:
    if not OmegaConf.has_resolver("by_scale"):
        OmegaConf.register_new_resolver("by_scale", _by_scale)
