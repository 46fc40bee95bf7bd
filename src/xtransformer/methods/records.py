"""What every model holds beside its components (``ModelRecords``) and what fitting it left beside it
(``TrainingRun``): the records ``XMCModel`` and its abilities share."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from xtransformer.data.inputs import LabeledData
from xtransformer.utils.io import text_digests


@dataclass
class ModelRecords:
    """What every model holds beside its components: the label space and the two settings records."""

    label_ids: list[str]
    label_names: list[str]
    predict: dict[str, Any]  # prediction settings: the defaults a call may override
    train: dict[str, Any] = field(default_factory=dict)  # how it was trained (provenance, not read back)
    method: str = ""  # the name it is known by: its kind, or e.g. "xrtransformer+xrlinear"

    @classmethod
    def of(cls, data: LabeledData, predict: dict[str, Any], train: dict[str, Any]) -> ModelRecords:
        return cls(list(data.label_ids), list(data.label_names), predict, train)


@dataclass
class TrainingRun:
    """What fitting (or growing) a model in this process left beside it: not part of the model,
    never saved; a loaded model's is empty."""

    report: dict[str, Any] = field(default_factory=dict)  # what fit did: stage keys, index facts, levels, timings
    # sorted fingerprints of the training texts: calibrate() refuses them
    documents: np.ndarray | None = None


def text_fingerprints(texts: Sequence[str]) -> np.ndarray:
    """A sorted 64-bit fingerprint of every text (what ``calibrate`` compares with the training texts)."""
    return np.sort(text_digests(texts))
