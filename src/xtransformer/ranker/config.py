"""Ranker settings: ``RankerConfig`` (mirrors ``configs/ranker/*.yaml``) and ``HierarchicalLinearConfig``.

Solver defaults follow PECOS/LIBLINEAR (squared hinge by dual coordinate descent, Cp = Cn = 1,
bias 1, eps 0.1, at most 100 passes, prune |w| < 0.1). With ``loss="logistic"`` the solver is a
batched primal Newton-CG, and ``eps``/``max_iter`` mean its stopping rule (relative gradient norm,
Newton iterations; ``max_cg_iter`` CG steps each).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

from xtransformer.ranker.errors import RankerError
from xtransformer.ranker.postprocess import POST_PROCESSORS

FEATURES = ("tfidf", "tfidf+neural")
NEGATIVES = ("tfn", "man", "tfn+man")
LOSSES = ("squared_hinge", "logistic")


@dataclass
class RankerConfig:
    """One level of one-vs-all linear rankers (the neural path's ranker)."""

    name: str = "tfidf_neural_tfn_man"  # label of the setting (the YAML file's name)
    features: str = "tfidf+neural"  # tfidf | tfidf+neural (concat_features)
    neural_weight: float = 1.0  # scale of the row-normalised neural block in concat_features
    negatives: str = "tfn+man"  # tfn | man | tfn+man (the paper's best)
    loss: str = "squared_hinge"  # squared_hinge | logistic
    Cp: float = 1.0  # cost of a positive instance
    Cn: float = 1.0  # cost of a negative instance
    bias: float = 1.0  # value of the appended bias feature; <= 0 disables it
    threshold: float = 0.1  # prune weights with |w| < threshold
    max_iter: int = 100  # squared hinge: dual CD passes per problem; logistic: Newton iterations
    eps: float = 0.1  # squared hinge: stop at max - min projected gradient <= eps; logistic: ||g|| <= eps ||g_0||
    max_cg_iter: int = 20  # logistic: conjugate-gradient steps per Newton iteration
    post_processor: str = "l3-hinge"  # noop | sigmoid | l1..l4-hinge | log-sigmoid | log-l1..l4-hinge
    # weight w of the matcher's score: t(ranker) * t(matcher)^w (w * t(matcher) for log- post-processors);
    # 1 = the paper, 0 = the ranker alone over the matcher's shortlist (prediction only, not trained)
    matcher_weight: float = 1.0
    beam_size: int = 10  # clusters kept per level during beam search (PECOS default 10)
    topk: int = 20  # labels kept per document in the final predictions
    threads: int = 2  # worker threads for training and prediction; <= 0 means all cores
    batch_nnz: int = 500_000  # clusters with fewer nonzeros of X are solved together in one block

    def __post_init__(self) -> None:
        _check_choice(self, "features", FEATURES)
        _check_choice(self, "negatives", NEGATIVES)
        _check_choice(self, "loss", LOSSES)
        _check_choice(self, "post_processor", POST_PROCESSORS)
        for key in ("Cp", "Cn", "eps"):
            if not float(getattr(self, key)) > 0:
                raise RankerError(f"ranker config: `{key}` must be > 0, got {getattr(self, key)!r}")
        for key in ("threshold", "neural_weight", "matcher_weight"):
            if not float(getattr(self, key)) >= 0:
                raise RankerError(f"ranker config: `{key}` must be >= 0, got {getattr(self, key)!r}")
        for key in ("max_iter", "max_cg_iter", "beam_size", "topk", "batch_nnz"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise RankerError(f"ranker config: `{key}` must be an int >= 1, got {value!r}")

    @property
    def n_threads(self) -> int:
        return self.threads if self.threads > 0 else (os.cpu_count() or 1)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class HierarchicalLinearConfig(RankerConfig):
    """XR-Linear, the TF-IDF-only hierarchical model: PECOS ``XLinearModel``'s defaults.

    Same fields as :class:`RankerConfig` (the label tree comes from the indexing stage);
    ``negatives`` applies at every level below the root, ``man`` meaning the model's own
    beam at the parent level. ``features`` records what the model reads: ``tfidf`` (XR-Linear) or
    ``tfidf+neural`` (XR-Transformer's final model: TF-IDF ⊕ fine-tuned embeddings, built by the
    caller with ``concat_features`` and ``neural_weight``).
    """

    name: str = "xrlinear"
    features: str = "tfidf"
    negatives: str = "tfn"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.matcher_weight != 1.0:
            raise RankerError("hierarchical linear config: `matcher_weight` applies to the matcher's shortlist only; "
                              f"leave it at 1.0, got {self.matcher_weight!r}")


def _check_choice(cfg: Any, key: str, choices: tuple[str, ...]) -> None:
    value = getattr(cfg, key)
    if value not in choices:
        raise RankerError(f"ranker config: `{key}` must be one of {list(choices)}, got {value!r}")
