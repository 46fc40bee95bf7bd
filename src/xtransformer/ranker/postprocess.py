"""Post-processors: how a child's raw linear score and its parent's score make the final score.

Same names and arithmetic as PECOS (``pecos.xmc.base.PostProcessor``):

=================  =========================================  =========================
name               transform t(s) of a raw score s            combined with parent p
=================  =========================================  =========================
``noop``           s                                          t(s) (parent ignored)
``sigmoid``        1 / (1 + exp(-s))                          t(s) * p
``log-sigmoid``    log(1 / (1 + exp(-s)))                     t(s) + p
``lP-hinge``       exp(-max(0, 1 - s)^P), P = 1..4            t(s) * p
``log-lP-hinge``   -max(0, 1 - s)^P                           t(s) + p
=================  =========================================  =========================

Parent scores are already in the combined space (products of transformed scores down a beam).
A raw matcher shortlist is first passed through the same transform, so ``sigmoid`` gives
sigma(ranker) * sigma(matcher) and ``l3-hinge`` (PECOS's default) gives h3(ranker) * h3(matcher).
The ``log-`` variants rank exactly like their products but give non-positive scores.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from xtransformer.ranker.errors import RankerError

Transform = Callable[[np.ndarray], np.ndarray]


def _identity(s: np.ndarray) -> np.ndarray:
    return np.asarray(s, dtype=np.float32)


def _sigmoid(s: np.ndarray) -> np.ndarray:
    s = np.asarray(s, dtype=np.float32)
    return (0.5 * (1.0 + np.tanh(0.5 * s))).astype(np.float32)  # tanh form: no overflow warnings


def _log_sigmoid(s: np.ndarray) -> np.ndarray:
    s = np.asarray(s, dtype=np.float32)
    return (-np.logaddexp(0.0, -s)).astype(np.float32)


def _log_lp_hinge(p: int) -> Transform:
    def f(s: np.ndarray) -> np.ndarray:
        m = np.maximum(1.0 - np.asarray(s, dtype=np.float32), 0.0, dtype=np.float32)
        return -(m**p)

    return f


def _lp_hinge(p: int) -> Transform:
    log_f = _log_lp_hinge(p)

    def f(s: np.ndarray) -> np.ndarray:
        return np.exp(log_f(s))

    return f


@dataclass(frozen=True)
class PostProcessor:
    """A transform of raw scores and the rule (``mul``, ``add`` or ``child``) joining it to the parent."""

    name: str
    transform: Transform
    rule: str

    @property
    def root_score(self) -> float:
        """The neutral parent score: what the root of a tree contributes."""
        return 1.0 if self.rule == "mul" else 0.0

    def weight_parent(self, parent: np.ndarray, weight: float) -> np.ndarray:
        """Parent scores (already transformed) weighted by ``weight``: ``p ** w`` for products, ``w * p`` for sums."""
        parent = np.asarray(parent, dtype=np.float32)
        if weight == 1.0 or self.rule == "child":
            return parent
        if self.rule == "mul":
            return np.power(parent, np.float32(weight), dtype=np.float32)
        return parent * np.float32(weight)

    def combine(self, child_raw: np.ndarray, parent: np.ndarray) -> np.ndarray:
        """Final score of children with raw scores ``child_raw`` under parents scored ``parent``."""
        child = self.transform(child_raw)
        if self.rule == "mul":
            return (child * parent).astype(np.float32, copy=False)
        if self.rule == "add":
            return (child + parent).astype(np.float32, copy=False)
        return np.broadcast_to(child, np.broadcast_shapes(np.shape(child), np.shape(parent))).astype(np.float32)


def _registry() -> dict[str, PostProcessor]:
    table = {
        "noop": PostProcessor("noop", _identity, "child"),
        "sigmoid": PostProcessor("sigmoid", _sigmoid, "mul"),
        "log-sigmoid": PostProcessor("log-sigmoid", _log_sigmoid, "add"),
    }
    for p in range(1, 5):
        table[f"l{p}-hinge"] = PostProcessor(f"l{p}-hinge", _lp_hinge(p), "mul")
        table[f"log-l{p}-hinge"] = PostProcessor(f"log-l{p}-hinge", _log_lp_hinge(p), "add")
    return table


_REGISTRY = _registry()
POST_PROCESSORS: tuple[str, ...] = tuple(_REGISTRY)


def get_post_processor(name: str | PostProcessor) -> PostProcessor:
    if isinstance(name, PostProcessor):
        return name
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise RankerError(f"post_processor must be one of {list(POST_PROCESSORS)}, got {name!r}") from None
