"""X-Transformer (Chang et al., KDD 2020): semantic label indexing -> a transformer matcher
fine-tuned over the K label clusters -> one-vs-all linear rankers on TF-IDF ⊕ the matcher's
embeddings, over the matcher's top-b clusters (teacher-forced and matcher-aware negatives)."""

from __future__ import annotations

from xtransformer.utils.lazy import lazy_exports

_EXPORTS = {"XTransformer": "model", "XTransformerSettings": "config"}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
