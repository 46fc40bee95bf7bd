"""The score combination: several trained models' label scores combined (X-Transformer's ensemble
ranking; the run's ``<method>+xrlinear``)."""

from xtransformer.methods.combination.model import Combination, CombinationSettings

__all__ = ["Combination", "CombinationSettings"]
