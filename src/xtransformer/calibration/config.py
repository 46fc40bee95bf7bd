"""The ``calibration`` config group's record and the decision settings.

:class:`DecisionSettings` is how a calibrated model turns probabilities into a label set: prediction
settings, the folder's defaults, overridable per call (``model.predict(texts, threshold=0.4)``,
``xmc-predict --threshold 0.4``, ``xmc-serve``'s request fields). :class:`CalibrationConfig` adds how
the calibrator is fitted and on which documents: ``holdout`` training documents (seeded) that no model
of the run trains on, scored once by each trained model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from xtransformer.settings import Settings, predict_field, run_field, train_field

if TYPE_CHECKING:
    from xtransformer.data.inputs import LabeledData

METHODS = ("none", "platt", "isotonic")
FEATURES = ("score", "score+rank")
DECISIONS = ("topk", "threshold", "per_label")
DECISION_KEYS = ("decision", "threshold", "min_labels", "max_labels")


@dataclass
class DecisionSettings(Settings):
    """``decision``: ``topk`` (the k best labels, as without a calibrator) | ``threshold`` (every
    label whose probability reaches ``threshold``) | ``per_label`` (each label's own threshold, tuned
    on the held-out documents; ``threshold`` for labels with too few of them). Then a document gets
    at least ``min_labels`` (its most probable ones) and at most ``max_labels`` (None: no cap)."""

    decision: str = predict_field("topk")  # topk | threshold | per_label
    # a probability in [0, 1]; None (configs only): the one that maximises micro-F1 on the held-out documents
    threshold: float | None = predict_field(None)
    min_labels: int = predict_field(0)  # a document's most probable labels it always gets
    max_labels: int | None = predict_field(None)  # at most this many labels a document; None: no cap but topk

    def check(self) -> None:
        if self.decision not in DECISIONS:
            raise self.bad("decision", f"expected one of {list(DECISIONS)}")
        if self.threshold is not None and not 0.0 <= self.threshold <= 1.0:
            raise self.bad("threshold", "must be a probability in [0, 1]")
        if self.min_labels < 0:
            raise self.bad("min_labels", "must be an int >= 0")
        if self.max_labels is not None and self.max_labels < 1:
            raise self.bad("max_labels", "must be null (no cap) or an int >= 1")
        if self.max_labels is not None and self.min_labels > self.max_labels:
            raise self.bad("min_labels", f"must not exceed max_labels={self.max_labels}")

    def decision_settings(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in DECISION_KEYS}


@dataclass
class CalibrationConfig(DecisionSettings):
    """The ``calibration`` group: a calibrator per method, fitted on ``holdout`` training documents no
    model of the run trains on (chosen with ``seed``); ``method`` ``none`` (the default: no
    calibrator, every training document trains), ``platt`` (logistic on ``features``) or
    ``isotonic`` (monotone steps on the score). Per-label thresholds are tuned for labels with at
    least ``min_positives`` held-out positives."""

    where = "calibration"

    method: str = "none"  # none | platt (logistic on features) | isotonic (monotone steps on the score)
    # training documents held out of every model of the run, to fit the calibrators on (each trained
    # model scores them once)
    holdout: int = 0
    seed: int = train_field(0, hydra="${seed}")  # which documents are held out (the run's seed)
    features: str = "score+rank"  # platt: the label's score, and its rank among the document's labels
    min_positives: int = 10  # a label with fewer held-out positives keeps the global threshold (per_label)
    bins: int = run_field(15)  # reliability diagram and expected calibration error (reported only)

    def check(self) -> None:
        super().check()
        for key, choices in (("method", METHODS), ("features", FEATURES)):
            if getattr(self, key) not in choices:
                raise self.bad(key, f"expected one of {list(choices)}")
        if self.holdout < 0:
            raise self.bad("holdout", "must be an int >= 0")
        if self.min_positives < 1:
            raise self.bad("min_positives", "must be an int >= 1")
        if self.bins < 2:
            raise self.bad("bins", "must be an int >= 2")
        self._check_documents()

    def _check_documents(self) -> None:
        """Decisions need a calibrator, and a calibrator needs held-out documents (never the eval split)."""
        if self.decision == "per_label" and self.holdout < 1:
            raise self.bad(
                "decision", "per-label thresholds are tuned on held-out documents: set calibration.holdout=N"
            )
        if self.method == "none":
            for key in ("decision", "threshold"):
                if getattr(self, key) not in ("topk", None):
                    raise self.bad(key, "decisions need a calibrator: set calibration.method=platt or isotonic")
            if self.holdout:
                raise self.bad(
                    "holdout", "held-out documents fit a calibrator: set calibration.method=platt or isotonic"
                )
        elif self.holdout < 1:
            raise self.bad(
                "holdout", f"method={self.method} is fitted on held-out training documents: set calibration.holdout=N"
            )

    @property
    def enabled(self) -> bool:
        return self.method != "none"

    def hold_out(self, train: LabeledData) -> tuple[LabeledData, LabeledData | None]:
        """``train`` without the ``holdout`` documents (drawn with ``seed``), and those documents
        (None without calibration). The models train on the first, so the training data's content
        key, and with it every stage key, says which documents were held out."""
        if not self.holdout:
            return train, None
        if self.holdout >= len(train):
            raise self.bad("holdout", f"the training split has {len(train)} documents; hold out fewer")
        perm = np.random.default_rng(self.seed).permutation(len(train))
        return train.take(np.sort(perm[self.holdout :])), train.take(np.sort(perm[: self.holdout]))

    def source(self, held: LabeledData) -> dict[str, Any]:
        """Where a run's calibration documents came from (the calibrator's record)."""
        return {"source": "training documents held out of every model of the run", "seed": self.seed, "key": held.key}
