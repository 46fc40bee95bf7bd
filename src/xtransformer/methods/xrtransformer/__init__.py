"""XR-Transformer (Zhang et al., NeurIPS 2021): the encoder fine-tuned level by level over the label
tree, coarse to fine, then a linear tree model on TF-IDF ⊕ the fine-tuned embeddings.

``config`` holds the settings, ``levels`` the tree / target / shortlist algebra (numpy, scipy),
``module`` one level's LightningModule, ``finetune`` the level loop, ``features`` the final linear
model's input, ``model`` the :class:`XRTransformer` class. Names load on first use: the settings
records alone import neither torch nor Lightning.
"""

from __future__ import annotations

from xtransformer.utils.lazy import lazy_exports

_EXPORTS = {
    "FinalModelConfig": "config",
    "XRTransformerConfig": "config",
    "XRTransformerConfigError": "config",
    "XRTransformer": "model",
    "XRTransformerSettings": "config",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
