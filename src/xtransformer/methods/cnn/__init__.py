"""The deep baselines of X-Transformer's Table 3: Kim-CNN and XML-CNN.

Convolutions of several widths over word embeddings along the sequence, max pooling (XML-CNN:
dynamic max pooling, several values per feature map, then a low-rank bottleneck), one output over
all labels trained with binary cross-entropy. The word embeddings start from a configured
encoder's input-embedding table (with its tokenizer) or at random. Names load on first use.
"""

from __future__ import annotations

from xtransformer.utils.lazy import lazy_exports

_EXPORTS = {
    "CNNConfig": "config",
    "CNNConfigError": "config",
    "KimCNNSettings": "config",
    "XMLCNNSettings": "config",
    "KimCNN": "model",
    "XMLCNN": "model",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
