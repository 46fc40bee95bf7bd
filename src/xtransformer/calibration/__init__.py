"""Calibrated probabilities and label-set decisions for every method.

A model's label scores are ranks, not probabilities. A calibrator fitted on held-out documents
(never the evaluation split) maps each method's scores to probabilities (``calibrator.py``: Platt
or isotonic); decision rules turn them into a label set (``decide.py``: a global threshold,
per-label thresholds tuned on the same documents (``thresholds.py``), ``min_labels`` /
``max_labels``); ``reliability.py`` measures how well they match (ECE, the reliability diagram).
``component.py`` is what a model folder stores; ``config.py`` the ``calibration`` settings group.
"""

from xtransformer.calibration.component import Calibration, CalibrationError
from xtransformer.calibration.config import DECISION_KEYS, CalibrationConfig, DecisionSettings
from xtransformer.calibration.reliability import ReliabilityTable, plot_reliability, reliability

__all__ = [
    "DECISION_KEYS",
    "Calibration",
    "CalibrationConfig",
    "CalibrationError",
    "DecisionSettings",
    "ReliabilityTable",
    "plot_reliability",
    "reliability",
]
