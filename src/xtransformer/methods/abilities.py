"""What a method can do beyond fit / predict / evaluate / save / load: declared, never inherited as a failure.

Every model ranks labels for texts. The optional abilities are mixins a method class lists among
its bases, each with the one hook the method supplies:

============  ===================  ==================================================  =============================
ability       mixin                the method supplies                                 verbs
============  ===================  ==================================================  =============================
add_labels    ``AddsLabels``       ``_add_labels(plan) -> (model, report)``            ``add_labels``
zero_shot     ``ScoresZeroShot``   ``_label_rows(names)``, and its rows of the texts   ``fit_zero_shot``
                                   in ``report["zero_shot_rows"]`` when predicting
feature_rows  ``ReadsFeatureRows`` ``_predict_features(X, settings)``,                 ``predict_features``,
                                   ``_feature_rows(X)``                                ``predict_features_csr``
calibration   ``Calibrates``       nothing (every model has it)                        ``calibrate``,
                                                                                       ``calibrate_scores``
============  ===================  ==================================================  =============================

``model.abilities`` lists what a model can do (a combination: what every member can);
:func:`require` fails in one line naming the method and what it cannot do, before any work (the
CLIs and the server call it). One convention: a verb that produces a model returns a new one and
leaves the model it was called on, and its folder, as they were.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import scipy.sparse as sp

from xtransformer.data.inputs import LabeledData
from xtransformer.methods.records import ModelRecords, TrainingRun, text_fingerprints
from xtransformer.model.folder import ModelError

if TYPE_CHECKING:
    from xtransformer.calibration import CalibrationConfig
    from xtransformer.methods.base import XMCModel

log = logging.getLogger(__name__)


class Ability(str, Enum):
    ADD_LABELS = "add_labels"
    ZERO_SHOT = "zero_shot"
    FEATURE_ROWS = "feature_rows"
    CALIBRATION = "calibration"

    def __str__(self) -> str:
        return self.value


# what a model without the ability cannot do, as the one-line error says it
CANNOT = {
    Ability.ADD_LABELS: "add labels to a trained model",
    Ability.ZERO_SHOT: "score labels without training documents from their text",
    Ability.FEATURE_ROWS: "predict from feature rows (it reads texts: pass them instead)",
    Ability.CALIBRATION: "fit a calibrator",
}


class MissingAbility(ModelError):
    """A verb asked of a model whose method does not have the ability."""


def require(model: Any, ability: Ability, doing: str = "") -> None:
    """Nothing when ``model`` has ``ability``; else one line: what it cannot do, and what it can."""
    if ability in model.abilities:
        return
    has = ", ".join(sorted(a.value for a in model.abilities)) or "none"
    prefix = f"{doing}: " if doing else ""
    raise MissingAbility(f"{prefix}a {model.method} model cannot {CANNOT[ability]} (its abilities: {has})")


def declared_abilities(cls: type) -> frozenset[Ability]:
    """The abilities of the mixins among ``cls``'s bases."""
    return frozenset(c.__dict__["ability"] for c in cls.__mro__ if "ability" in c.__dict__)


# ---------------------------------------------------------------------------------------- add labels
class AddsLabels:
    """New labels placed in the trained tree and trained against the documents given, the old
    labels' weights and scores untouched (``methods/adding.py``, ``indexing/placement.py``)."""

    ability: ClassVar[Ability] = Ability.ADD_LABELS
    # where a new label goes unless told (chosen per method on held-out training documents); None:
    # each member's own (a combination)
    default_placement: ClassVar[str | None] = "centroid"
    default_leaves: ClassVar[int | None] = None  # leaves per new label unless told (None: placement.DEFAULT_LEAVES)

    def add_labels(
        self,
        inputs: Any,
        labels: Any = None,
        *,
        label_ids: Sequence[str] | None = None,
        label_names: Sequence[str] | None = None,
        new_labels: Sequence[str] | None = None,
        cache: Any = None,
        **placing: Any,
    ) -> XMCModel:
        """A new model: this one with the labels the documents carry that it lacks (or exactly
        ``new_labels``) placed in the tree and trained against the documents given, or those the
        model routes to their leaves. This model, its folder and every old label's scores stay as
        they are; ``save`` the new one to a new folder. ``inputs`` / ``labels`` / ``label_ids`` /
        ``label_names``: as ``fit`` takes them (names name the new labels). ``placing``:
        ``placement`` (``centroid``: the nearest leaves, ``routes``: those the model reaches from
        the label's documents; default the method's ``default_placement``), ``leaves`` (per new
        label; default the method's ``default_leaves``, else 2) and ``negatives`` (what new labels
        train against in a tree model: ``all`` documents given or their ``leaf``'s; default the
        model's ``added_negatives``). ``cache``: the training run's stage cache (a folder, e.g.
        ``train.py``'s ``paths.cache_dir``, or a ``StageCache``): the TF-IDF rows and embeddings
        of documents the run read are taken from there, not computed again (``methods/reuse.py``)."""
        from xtransformer.indexing.placement import Placing
        from xtransformer.methods.adding import plan_additions
        from xtransformer.methods.reuse import as_cache

        require(self, Ability.ADD_LABELS, "add_labels")
        how = _placing(Placing, placing)  # bad settings fail before any data work
        if self.default_placement is not None:  # a combination leaves the rule to each member
            how = how.resolved(self.default_placement, self.default_leaves)
        data = LabeledData.build(inputs, labels, label_ids, label_names)
        plan = plan_additions(self.label_ids, self.label_names, data, new_labels, how)
        plan.cache = as_cache(cache)
        start = time.perf_counter()
        log.info("adding %d labels to a %s model from %d documents", len(plan.new_ids), self.method, len(data))
        model, report = self._add_labels(plan)
        return self._grown(model, plan, report, time.perf_counter() - start)

    def _grown(self, model: XMCModel, plan: Any, report: dict[str, Any], seconds: float) -> XMCModel:
        """``model`` (grown by ``plan``) with this model's zero-shot part, its records and what adding did."""
        if self.zero_shot is not None:  # old indices stand; the label space grew
            model.zero_shot = dataclasses.replace(self.zero_shot, n_labels=model.n_labels)
        record = plan.record()
        if "negatives" in report:  # a tree model's, resolved from its added_negatives
            record["negatives"] = report["negatives"]
        history = [*self.train_settings.get("added_labels", []), record]
        model.train_settings = {**self.train_settings, "added_labels": history}
        model.training_run = TrainingRun(report={"added_labels": plan.summary() | report | {"seconds": seconds}})
        return model

    def grown_records(self, plan: Any) -> ModelRecords:
        """This model's records over the grown label space of ``plan`` (an ``Additions``)."""
        d = plan.data
        return ModelRecords(
            d.label_ids, d.label_names, dict(self.predict_settings), dict(self.train_settings), self.method
        )

    def _add_labels(self, plan: Any) -> tuple[XMCModel, dict[str, Any]]:
        """The grown model (``plan``: the ``Additions``) and what placing and training did."""
        raise NotImplementedError


def _placing(cls: type, given: Mapping[str, Any]) -> Any:
    known = ("placement", "leaves", "negatives")
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ModelError(f"add_labels: unknown setting(s) {unknown}; it takes {list(known)}")
    return cls(given.get("placement"), given.get("leaves"), negatives=given.get("negatives"))


# ---------------------------------------------------------------------------------------- zero-shot labels
class ScoresZeroShot:
    """Labels without training documents scored from their text (``methods/zeroshot.py``)."""

    ability: ClassVar[Ability] = Ability.ZERO_SHOT

    def fit_zero_shot(self, inputs: Any, labels: Any = None, sample: int = 2000, seed: int = 0) -> XMCModel:
        """A new model that also scores the labels no document of ``inputs`` / ``labels`` (the
        training documents, in this model's label space) carries, from their names, calibrated on
        a seeded ``sample`` of those documents; prediction setting ``zero_shot_labels`` (false by
        default) turns it on; ``zero_shot_per_doc`` and ``zero_shot_floor`` bound what a document
        gains. This model stays as it is."""
        from xtransformer.methods.zeroshot import SETTINGS, fit_zero_shot

        require(self, Ability.ZERO_SHOT, "fit_zero_shot")
        data = LabeledData.build(inputs, labels, self.label_ids, self.label_names)
        zero = np.flatnonzero(np.diff(sp.csc_matrix(data.Y).indptr) == 0)
        if not len(zero):
            raise ModelError("every label has training documents: there is no zero-shot label to score")
        out = self.derived()
        out.predict_settings = {**SETTINGS, **out.predict_settings}
        rows = np.sort(np.random.default_rng(seed).permutation(len(data))[:sample])
        pred, D = out._calibration_pass(data, rows)
        out.zero_shot = fit_zero_shot(D, out._label_rows(out.label_names), data.Y[rows], pred, zero)
        return out

    def _calibration_pass(self, data: LabeledData, rows: np.ndarray) -> tuple[sp.csr_matrix, Any]:
        """The model's scores of ``data``'s documents ``rows`` and the rows it read them into."""
        settings = self.settings({"zero_shot_labels": False})
        if not self.reads_texts(data):
            require(self, Ability.FEATURE_ROWS, "fit_zero_shot from feature rows")
            X = data.features[rows]
            return self._predict_features(X, settings), self._feature_rows(X)
        report: dict[str, Any] = {}
        pred = self._predict_texts([data.texts[i] for i in rows], settings, report)
        return pred, report["zero_shot_rows"]

    def _label_rows(self, names: list[str]) -> Any:
        """The label texts in the space of the documents' rows (unit rows)."""
        raise NotImplementedError


# ---------------------------------------------------------------------------------------- feature rows
class ReadsFeatureRows:
    """Prediction from TF-IDF / XC feature rows, no text needed."""

    ability: ClassVar[Ability] = Ability.FEATURE_ROWS

    def predict_features_csr(self, X: sp.spmatrix, **overrides: Any) -> sp.csr_matrix:
        """csr ``N x L`` of the top-``topk`` label scores of TF-IDF rows (``N x F``, as training
        computed them) or, for a model trained on given features, of those raw feature rows."""
        require(self, Ability.FEATURE_ROWS, "predict_features")
        settings = self.settings(overrides)
        pred = self._predict_features(X, settings)
        if self.zero_shot is not None and settings.get("zero_shot_labels"):
            pred = self.zero_shot.merge(pred, self._feature_rows(X), settings)
        return pred

    def predict_features(self, X: sp.spmatrix, k: int = 5, **overrides: Any) -> list[dict[str, Any]]:
        """As ``predict``, from feature rows."""
        settings = self.settings(overrides)
        return self.label_rows(self.predict_features_csr(X, **self.overrides_for_k(k, overrides)), k, settings)

    def _predict_features(self, X: sp.spmatrix, settings: dict[str, Any]) -> sp.csr_matrix:
        raise NotImplementedError

    def _feature_rows(self, X: sp.spmatrix) -> Any:
        """The rows the model reads ``X`` into (what zero-shot label texts are compared with)."""
        raise NotImplementedError


# ---------------------------------------------------------------------------------------- calibration
class Calibrates:
    """Scores to probabilities and decided label sets (``calibration/``): every model has it."""

    ability: ClassVar[Ability] = Ability.CALIBRATION

    def calibrate(
        self, inputs: Any, labels: Any = None, settings: CalibrationConfig | None = None, **fields: Any
    ) -> XMCModel:
        """A new model with a calibrator fitted on held-out documents (texts or feature rows, and
        their labels): never documents it was trained on, nor the ones it will be evaluated on.
        ``fields`` over ``settings`` (default: Platt on score and rank): ``method``, ``features``,
        ``min_positives``, ``threshold`` (None: tuned for micro-F1), ``min_labels``,
        ``max_labels``, ``decision``. The new model predicts probabilities and decides label sets;
        this one stays as it is."""
        from xtransformer.calibration import DECISION_KEYS, CalibrationConfig

        data = LabeledData.build(inputs, labels, self.label_ids, self.label_names)
        self._refuse_training_documents(data)
        base = (settings or CalibrationConfig(method="platt", holdout=1)).to_dict()
        config = CalibrationConfig.from_mapping({**base, **fields, "holdout": len(data)})
        plain = {k: v for k, v in self.predict_settings.items() if k not in DECISION_KEYS}
        if self.reads_texts(data):
            pred = self._predict_texts_kept(data.texts, plain, None)
        else:
            require(self, Ability.FEATURE_ROWS, "calibrate on feature rows")
            pred = self._predict_features(data.features, plain)
        return self.calibrate_scores(pred, data.Y, config, {"source": "documents given to calibrate()"})

    def calibrate_scores(
        self, pred: sp.csr_matrix, Y: sp.spmatrix, config: CalibrationConfig, source: Mapping[str, Any]
    ) -> XMCModel:
        """A new model with a calibrator fitted on held-out documents' scores ``pred`` (this model's
        predictions of them) and labels ``Y``; ``source``: where the documents came from, kept in
        its record. This model stays as it is."""
        from xtransformer.calibration import Calibration

        out = self.derived()
        out.calibration, decision = Calibration.fit(pred, sp.csr_matrix(Y), config, source)
        out.predict_settings |= decision
        return out

    def _refuse_training_documents(self, data: LabeledData) -> None:
        seen_before = self.training_run.documents
        if seen_before is None or data.texts is None:
            return  # a loaded folder keeps no training texts: the caller vouches for the documents
        seen = int(np.isin(text_fingerprints(data.texts), seen_before).sum())
        if seen:
            raise ModelError(
                f"calibrate: {seen} of the {len(data)} documents are documents this {self.method} model was "
                "trained on; its scores on them are optimistic. Calibrate on held-out documents"
            )
