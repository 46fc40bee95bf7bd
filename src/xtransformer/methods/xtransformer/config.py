"""X-Transformer's settings: the groups ``XTransformer.fit`` reads, each mirrored by ``configs/<group>``."""

from __future__ import annotations

from dataclasses import dataclass, field

from xtransformer.data.tfidf import TfidfConfig
from xtransformer.indexing import IndexingConfig
from xtransformer.matcher.config import MatcherConfig
from xtransformer.methods.xrlinear.config import XRLinearConfig
from xtransformer.ranker.config import RankerConfig
from xtransformer.settings import Settings


@dataclass
class XTransformerSettings(Settings):
    """Everything ``XTransformer.fit`` reads. ``xrlinear``: the linear model whose beam counts a
    disentangled leaf level (``indexing.n_copies`` > 1)."""

    tfidf: TfidfConfig = field(default_factory=TfidfConfig)
    indexing: IndexingConfig = field(default_factory=IndexingConfig)
    matcher: MatcherConfig = field(default_factory=MatcherConfig)
    ranker: RankerConfig = field(default_factory=RankerConfig)
    xrlinear: XRLinearConfig = field(default_factory=XRLinearConfig)
