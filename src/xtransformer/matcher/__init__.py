"""Neural matcher: a pretrained encoder fine-tuned to score the K label clusters of a document.

``fine_tune_matcher`` fine-tunes it as a stage of the cache; ``LoadedMatcher`` encodes texts into
embeddings and top-b clusters. Names load on first use: the settings record alone imports neither
torch nor Lightning.
"""

from __future__ import annotations

from xtransformer.utils.lazy import lazy_exports

_EXPORTS = {
    "MatcherConfig": "config",
    "MatcherConfigError": "config",
    "EncodeOptions": "inference",
    "LoadedMatcher": "inference",
    "MatcherPrediction": "inference",
    "MatcherInputError": "train",
    "fine_tune_matcher": "train",
    "topb_recall": "train",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
