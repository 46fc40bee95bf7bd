"""Neural matcher: a pretrained encoder fine-tuned to score the K label clusters of a document.

``train_matcher`` fine-tunes and writes embeddings + top-b clusters for every split;
``predict_matcher`` applies a saved matcher to new texts. Importing this package imports Lightning.
"""

from xtransformer.matcher.config import MatcherConfig, MatcherConfigError
from xtransformer.matcher.inference import MatcherPrediction, load_matcher_model, predict_matcher
from xtransformer.matcher.train import MatcherInputError, MatcherOutputs, topb_recall, train_matcher

__all__ = [
    "MatcherConfig",
    "MatcherConfigError",
    "MatcherInputError",
    "MatcherOutputs",
    "MatcherPrediction",
    "load_matcher_model",
    "predict_matcher",
    "topb_recall",
    "train_matcher",
]
