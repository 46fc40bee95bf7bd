"""X-Transformer's settings: the groups ``XTransformer.fit`` reads, each one a config group's record."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from xtransformer.data.tfidf import TfidfConfig
from xtransformer.indexing import IndexingConfig
from xtransformer.matcher.config import MatcherConfig
from xtransformer.methods.cnn.config import CNNConfig
from xtransformer.methods.xrlinear.config import XRLinearConfig
from xtransformer.ranker.config import RankerConfig
from xtransformer.settings import Settings


@dataclass
class XTransformerSettings(Settings):
    """Everything ``XTransformer.fit`` reads. ``xrlinear``: the linear model whose beam counts a
    disentangled leaf level (``indexing.n_copies`` > 1); ``cnn``: the network of a CNN matcher
    (``matcher.architecture: cnn``), unused otherwise."""

    tfidf: TfidfConfig = field(default_factory=TfidfConfig)
    indexing: IndexingConfig = field(default_factory=IndexingConfig)
    matcher: MatcherConfig = field(default_factory=MatcherConfig)
    ranker: RankerConfig = field(default_factory=RankerConfig)
    xrlinear: XRLinearConfig = field(default_factory=XRLinearConfig)
    cnn: CNNConfig = field(default_factory=CNNConfig)

    @property
    def cnn_matcher(self) -> bool:
        return self.matcher.architecture == "cnn"

    def matcher_recipe(self) -> list[dict[str, Any]]:
        """What trains the matcher: its group's training settings, and for a CNN matcher the ``cnn`` group's."""
        return [self.matcher.key_settings(), *([self.cnn.training_settings()] if self.cnn_matcher else [])]

    def training_settings(self) -> dict[str, Any]:
        """Every group's training settings; ``cnn``'s only when it is the matcher."""
        out = super().training_settings()
        return out if self.cnn_matcher else {k: v for k, v in out.items() if k != "cnn"}
