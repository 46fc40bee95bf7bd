"""The Combination model class: members' top-k label scores combined by ``xtransformer.ensemble``.

A combination folder holds no weights of its own: its manifest names its members' folders by
relative path (``../xrlinear`` beside the run's other models; ``members/<name>`` when saved alone),
and its prediction settings are the combination rule, the members' weights and the top-k.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from xtransformer.ensemble import METHODS as RULES
from xtransformer.ensemble import ensemble_predictions
from xtransformer.methods.abilities import Ability, AddsLabels, ReadsFeatureRows, ScoresZeroShot, declared_abilities
from xtransformer.methods.base import ModelRecords, XMCModel
from xtransformer.methods.zeroshot import BOUNDS as ZERO_SHOT_BOUNDS
from xtransformer.methods.zeroshot import SETTINGS as ZERO_SHOT_SETTINGS
from xtransformer.model.folder import ModelError
from xtransformer.settings import Settings

DEFAULT_TOPK = 20


@dataclass
class CombinationSettings(Settings):
    """How ``Combination.fit`` trains and combines its members: each member method's name and its
    settings (a record or a mapping of its groups; None: the method's defaults)."""

    where = "combination"

    members: dict[str, Any] = field(default_factory=lambda: {"xrtransformer": None, "xrlinear": None})
    method: str = "average"  # average | rank-average | softmax-average (xtransformer.ensemble)
    weights: list[float] | None = None  # one per member, normalised; None: equal
    topk: int = DEFAULT_TOPK

    def check(self) -> None:
        if self.method not in RULES:
            raise self.bad("method", f"expected one of {list(RULES)}")
        if not self.members:
            raise self.bad("members", "needs at least one member method")
        if self.weights is not None and len(self.weights) != len(self.members):
            raise self.bad("weights", f"needs one weight per member ({len(self.members)})")
        if self.topk < 1:
            raise self.bad("topk", "must be an int >= 1")


class Combination(AddsLabels, ScoresZeroShot, ReadsFeatureRows, XMCModel):
    """Members' label scores combined: ``average`` (weighted mean of raw scores), ``rank-average``
    or ``softmax-average``; prediction settings ``method``, ``weights``, ``topk``. It can do what
    every member can (``abilities``)."""

    kind = "ensemble"
    default_placement = None  # every member places new labels by its own rule
    settings_class = CombinationSettings

    def __init__(
        self,
        members: Sequence[XMCModel],
        method: str = "average",
        weights: Sequence[float] | None = None,
        topk: int = DEFAULT_TOPK,
        name: str | None = None,
    ):
        if not members:
            raise ModelError("a combination needs at least one member model")
        first = members[0]
        if any(m.label_ids != first.label_ids for m in members[1:]):
            raise ModelError("the members of a combination must share one label space")
        predict = {"method": method, "topk": int(topk), "weights": None if weights is None else list(weights)}
        names = [m.method for m in members]
        records = ModelRecords(
            first.label_ids, first.label_names, predict, {"members": names, "combine": method}, name or "+".join(names)
        )
        super().__init__(records)
        self.members = list(members)
        self.device = networks_device(self.members)
        known = [m.training_run.documents for m in self.members if m.training_run.documents is not None]
        self.training_run.documents = np.unique(np.concatenate(known)) if known else None

    @property
    def abilities(self) -> frozenset[Ability]:
        """What every member can do (a feature row is read by all of them or by none)."""
        return frozenset.intersection(declared_abilities(type(self)), *(m.abilities for m in self.members))

    @property
    def takes_texts(self) -> bool:
        return all(m.takes_texts for m in self.members)

    # ------------------------------------------------------------------ training
    @classmethod
    def stage_keys(cls, settings: CombinationSettings, data_key: str, n_labels: int, trainer: Any) -> dict[str, Any]:
        return {}  # the members' stages are the members' own

    @classmethod
    def _fit(
        cls, data: Any, s: CombinationSettings, ctx: Any, validation: Any, keys: dict[str, Any]
    ) -> Combination | None:
        from xtransformer.methods import method_class

        members = []
        for name, settings in s.members.items():
            member_cls = method_class(name)
            record = settings if isinstance(settings, Settings) else member_cls.make_settings(None, settings or {})
            if not ctx.is_rank_zero:  # a DDP helper process: it shares each member's collective stages
                member_cls.share_fit(data, settings=record, validation=validation, context=ctx)
                continue
            members.append(member_cls.fit(data, settings=record, validation=validation, context=ctx))
        return cls(members, s.method, s.weights, s.topk) if members else None

    # ------------------------------------------------------------------ prediction
    def to(self, device: str) -> Combination:
        """Every member on ``device``, each as it can (a linear member stays on the CPU)."""
        for member in self.members:
            member.to(device)
        self.device = networks_device(self.members)
        return self

    def combine(self, predictions: Sequence[sp.csr_matrix], **overrides: Any) -> sp.csr_matrix:
        """The members' score matrices (in member order) combined as this model predicts."""
        settings = self.settings(overrides)
        return ensemble_predictions(
            predictions, method=settings["method"], topk=int(settings["topk"]), weights=settings.get("weights")
        )  # older folders: none, equal

    def _predict_texts(
        self, texts: list[str], settings: dict[str, Any], report: dict[str, Any] | None
    ) -> sp.csr_matrix:
        return self.combine(
            [m.predict_csr(texts, **self._member_settings(m, settings)) for m in self.members], **settings
        )

    def _predict_features(self, X: sp.spmatrix, settings: dict[str, Any]) -> sp.csr_matrix:
        return self.combine(
            [m.predict_features_csr(X, **self._member_settings(m, settings)) for m in self.members], **settings
        )

    @staticmethod
    def _member_settings(member: XMCModel, settings: Mapping[str, Any]) -> dict[str, Any]:
        """What a member's call gets: a top-k as wide as either's, and the zero-shot settings if it has them."""
        out = {"topk": max(int(settings["topk"]), int(member.predict_settings["topk"]))}
        if "zero_shot_labels" in member.predict_settings:
            out["zero_shot_labels"] = bool(settings.get("zero_shot_labels"))
            out |= {k: settings[k] for k in ZERO_SHOT_BOUNDS if k in settings}
        return out

    def fit_zero_shot(self, inputs: Any, labels: Any = None, sample: int = 2000, seed: int = 0) -> Combination:
        """A new combination whose every member also scores the labels without documents from
        their text, combined as before; this one stays as it is."""
        from xtransformer.methods.abilities import require

        require(self, Ability.ZERO_SHOT, "fit_zero_shot")
        out = self._with_members([m.fit_zero_shot(inputs, labels, sample, seed) for m in self.members])
        out.predict_settings = {**ZERO_SHOT_SETTINGS, **out.predict_settings}
        out.calibration = self.calibration  # the same label space: its calibrator still applies
        return out

    # ------------------------------------------------------------------ growing
    def _add_labels(self, plan: Any) -> tuple[Combination, dict[str, Any]]:
        """Every member grown by the same labels (from the same run cache), combined as before."""
        p = plan.placing
        how = {"new_labels": plan.new_ids, "placement": p.by, "leaves": p.leaves, "negatives": p.negatives}
        members = [m.add_labels(plan.data, cache=plan.cache, **how) for m in self.members]
        return self._with_members(members), {m.method: m.training_run.report["added_labels"] for m in members}

    def _with_members(self, members: list[XMCModel]) -> Combination:
        """This combination (its rule, weights and records) over new ``members``."""
        p = self.predict_settings
        out = Combination(members, p["method"], p.get("weights"), p["topk"], name=self.method)
        out.train_settings, out.predict_settings = dict(self.train_settings), dict(p)
        return out

    # ------------------------------------------------------------------ folders
    def _save_components(self, tmp: Path, folder: Path) -> dict[str, Any]:
        refs: list[str] = []
        for i, member in enumerate(self.members):
            if member.folder is None:  # not saved yet: it goes inside the combination's folder
                name = f"members/{member.method}"
                name = f"{name}-{i}" if name in refs else name  # two members of one method: two folders
                member.save(tmp / name)
                member.folder = folder / name
            refs.append(Path(os.path.relpath(member.folder, folder)).as_posix())
        return {"kind": self.kind, "members": refs}

    @classmethod
    def _load(cls, folder: Path, components: dict[str, Any], records: ModelRecords, verify: bool) -> Combination:
        members = [XMCModel.load((folder / rel).resolve(), verify=verify) for rel in components["members"]]
        p = records.predict
        out = cls(members, p["method"], p.get("weights"), p["topk"], name=records.method)
        out.train_settings = records.train
        out.predict_settings = {**out.predict_settings, **p}  # and a calibrated one's decision settings
        return out


def networks_device(members: Sequence[XMCModel]) -> str:
    """Where a combination's networks predict: its first member's off the CPU, else the CPU."""
    return next((m.device for m in members if m.device != "cpu"), "cpu")
