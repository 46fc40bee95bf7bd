"""``XMCModel``: the one door in and out of every method.

Every method is a subclass with the same four verbs, as PECOS's model classes and Hugging Face's
``from_pretrained`` / ``save_pretrained``::

    model = XRLinear.fit(texts, labels)             # typed settings, a stage cache when given one
    model.predict(["oil prices rose ..."], k=5)     # [{"labels": [...], "names": [...], "scores": [...]}]
    model = model.calibrate(held_out_texts, held_out_labels)  # a new model: probabilities, decisions
    model.predict(["oil prices rose ..."], decision="per_label")  # the decided labels, with probabilities
    model.save("models/reuters-xrlinear")           # a portable, checksummed folder, no pickles
    model = XMCModel.load("models/reuters-xrlinear")  # the class the folder's manifest names

A subclass supplies ``_fit`` (settings + data -> a model), ``_predict_texts``, ``_save_components``
and ``_load``; the rest — input checks, per-call prediction settings, blank texts, top-k label
lists, evaluation, the folder's records and manifest — lives here once. What a method can do
beyond that (add labels, zero-shot labels, feature rows, calibration) it declares by its bases
(``methods/abilities.py``). The model is what its folder holds; what fitting it left beside it
(stage keys, timings, the training texts' fingerprints) is its ``training_run``, never saved.
Prediction settings (beam, top-k, ...) are the folder's ``predict_settings.json``, overridable per
call; the components are not. A calibrated
model (``calibrate``, or a run with ``calibration=platt``) holds a ``calibration/`` component and
the decision settings (``decision``, ``threshold``, ``min_labels``, ``max_labels``) among them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp

from xtransformer.calibration import DECISION_KEYS, Calibration, DecisionSettings
from xtransformer.calibration.calibrator import row_ranks
from xtransformer.data.inputs import LabeledData
from xtransformer.methods.abilities import Ability, Calibrates, declared_abilities, require
from xtransformer.methods.records import ModelRecords, TrainingRun
from xtransformer.methods.reuse import documents_stage, stage_record
from xtransformer.methods.zeroshot import SETTINGS as ZERO_SHOT_SETTINGS
from xtransformer.methods.zeroshot import ZERO_SHOT_DIR, ZeroShot, zero_shot_bounds
from xtransformer.model.folder import (
    INDEX,
    LABELS,
    PREDICT_SETTINGS,
    TRAIN_SETTINGS,
    ModelError,
    index_folder,
    load_record,
    read_manifest,
    scrub,
    write_manifest,
)
from xtransformer.settings import Settings
from xtransformer.utils.hardware import check_device
from xtransformer.utils.io import atomic_dir, save_json, text_digests

log = logging.getLogger(__name__)

CALIBRATION_DIR = "calibration"


@dataclass
class Evaluation:
    """A model's label scores on evaluation data, their metrics, and method-specific diagnostics."""

    predictions: sp.csr_matrix
    metrics: dict[str, float]
    diagnostics: dict[str, Any] = field(default_factory=dict)


class XMCModel(Calibrates):
    """Base of every method; ``XMCModel.load`` returns the class a folder's manifest names."""

    kind: ClassVar[str] = ""  # the registry's name of the method, and the manifest's components.kind
    settings_class: ClassVar[type[Settings] | None] = None  # the typed record fit takes
    collective: ClassVar[bool] = False  # fit shares work across the processes of a DDP run

    def __init__(self, records: ModelRecords):
        self.label_ids: list[str] = records.label_ids
        self.label_names: list[str] = records.label_names
        self.predict_settings: dict[str, Any] = dict(records.predict)
        self.train_settings: dict[str, Any] = dict(records.train)
        self.method: str = records.method or self.kind
        self.folder: Path | None = None  # where it was saved or loaded from; None once it differs from that folder
        self.manifest: dict[str, Any] = {}
        self.zero_shot: Any = None  # a ZeroShot (methods/zeroshot.py): labels without documents scored from text
        self.calibration: Calibration | None = None  # scores -> probabilities, per-label thresholds
        self.training_run = TrainingRun()
        self.device = "cpu"  # where its networks predict (to); a model without one predicts on the CPU

    @property
    def abilities(self) -> frozenset[Ability]:
        """What this model can do beyond ranking labels for texts (``methods/abilities.py``)."""
        return declared_abilities(type(self))

    @property
    def takes_texts(self) -> bool:
        """Whether it reads documents as texts; False for a model trained on given feature rows."""
        return True

    def reads_texts(self, data: LabeledData) -> bool:
        """Whether it reads ``data``'s documents as texts, else as their feature rows (data with both:
        a dataset's own TF-IDF rows beside its texts, ``tfidf=given``)."""
        return data.texts is not None and (data.features is None or self.takes_texts)

    def derived(self) -> XMCModel:
        """A copy to change (a verb's new model): its records copied, its components shared (no verb
        changes a component in place), no folder (it is not what its folder holds)."""
        import copy

        out = copy.copy(self)
        out.predict_settings, out.train_settings = dict(self.predict_settings), dict(self.train_settings)
        out.folder, out.manifest = None, {}
        return out

    # ------------------------------------------------------------------ training
    @classmethod
    def fit(
        cls,
        inputs: Any,
        labels: Any = None,
        settings: Settings | None = None,
        *,
        label_ids: Sequence[str] | None = None,
        label_names: Sequence[str] | None = None,
        validation: Any = None,
        context: Any = None,
        **groups: Any,
    ) -> XMCModel:
        """Train on ``inputs`` (texts, or sparse feature rows where the method reads TF-IDF only)
        and ``labels`` (one list of label ids per document, or a sparse ``N x L`` matrix with
        ``label_ids``). ``settings``: the method's record (``cls.settings_class``); ``groups``:
        its sections as records or mappings (``matcher={"max_steps": 100}``) over it.
        ``validation``: ``(inputs, labels)`` reported on while training, never chosen on.
        ``context``: a :class:`~xtransformer.context.TrainContext` (cache, trainer, loggers);
        default: a scratch cache and one CPU. In a DDP run this is rank 0's call; the other ranks
        call :meth:`share_fit` with the same arguments."""
        from xtransformer.context import TrainContext

        ctx = context if context is not None else TrainContext()
        if not ctx.is_rank_zero:
            raise ModelError(
                f"{cls.__name__}.fit runs on rank 0 of a DDP run; the other ranks call "
                f"{cls.__name__}.share_fit with the same arguments"
            )
        try:
            options = {"label_ids": label_ids, "label_names": label_names, "validation": validation, **groups}
            data, record, val = cls._fit_inputs(inputs, labels, settings, options)
            keys = cls.plan(data, record, ctx)
            digests = text_digests(data.texts) if data.texts is not None else None
            if digests is not None:  # what lets add_labels find these rows again
                documents_stage(ctx.cache, digests, data.key)
            model = cls._fit(data, record, ctx, val, keys)
            model.train_settings["stages"] = stage_record(data.key, keys)
            if digests is not None:
                model.training_run.documents = np.sort(digests)  # text_fingerprints, from the digests at hand
            return model
        finally:
            if context is None:
                ctx.close()

    @classmethod
    def share_fit(cls, inputs: Any, labels: Any = None, settings: Settings | None = None, **options: Any) -> None:
        """On a helper process of a DDP run (rank > 0): take part in the collective stages (the
        fine-tuning) of the :meth:`fit` rank 0 runs with the same arguments (``options``: fit's
        keywords, ``context`` among them); the model is rank 0's. Nothing to do for a method
        without collective stages."""
        if not cls.collective:
            return
        ctx = options.pop("context")
        data, record, val = cls._fit_inputs(inputs, labels, settings, options)
        cls._fit(data, record, ctx, val, cls.plan(data, record, ctx))

    @classmethod
    def _fit_inputs(
        cls, inputs: Any, labels: Any, settings: Settings | None, options: dict[str, Any]
    ) -> tuple[LabeledData, Settings, LabeledData | None]:
        """What ``fit`` trains on: the data, the settings record, the validation data (``options``:
        ``label_ids``, ``label_names``, ``validation`` and the settings groups)."""
        data = LabeledData.build(inputs, labels, options.pop("label_ids", None), options.pop("label_names", None))
        validation = options.pop("validation", None)
        val = None if validation is None else data.like(*_pair(validation))
        return data, cls.make_settings(settings, options), val

    @classmethod
    def make_settings(cls, settings: Settings | None = None, groups: Mapping[str, Any] | None = None) -> Settings:
        """The method's settings record: ``settings`` (default: the defaults) with ``groups`` over it."""
        base = settings if settings is not None else cls.settings_class()
        if not isinstance(base, cls.settings_class):
            raise ModelError(
                f"{cls.__name__}.fit takes {cls.settings_class.__name__} settings, got {type(base).__name__}"
            )
        if not groups:
            return base
        plain = {name: _plain(getattr(base, name)) for name in _field_names(base)}
        for name, value in groups.items():
            if name not in plain:
                raise ModelError(f"{cls.__name__}.fit: unknown settings group {name!r}; it takes {sorted(plain)}")
            # a record replaces the section; a mapping changes only the keys it names
            plain[name] = value.to_dict() if isinstance(value, Settings) else _merged(plain[name], value)
        return cls.settings_class.from_mapping(plain)

    @classmethod
    def plan(cls, data: LabeledData, settings: Settings, ctx: Any) -> dict[str, Any]:
        """Check what can be checked before any training (texts present, the encoder found, the
        tree's shape against the label count) and return every stage's cache key."""
        cls._check(data, settings)
        return cls.stage_keys(settings, data.key, data.n_labels, ctx.trainer)

    @classmethod
    def stage_keys(cls, settings: Settings, data_key: str, n_labels: int, trainer: Any) -> dict[str, Any]:
        """Every stage's cache key, from the settings, the training data's content key, the label
        count and the trainer (placement and precision); a training setting changes its stage's key
        and every key downstream, a prediction or run setting none (``tests/methods/test_keys.py``)."""
        raise NotImplementedError

    @classmethod
    def _check(cls, data: LabeledData, settings: Settings) -> None:
        """Method-specific checks of the data against the settings; none by default."""

    @classmethod
    def _fit(
        cls, data: LabeledData, settings: Settings, ctx: Any, validation: LabeledData | None, keys: dict[str, Any]
    ) -> XMCModel | None:
        """The fitted model (its ``training_run.report``: what fitting did); None on a DDP helper rank."""
        raise NotImplementedError

    # ------------------------------------------------------------------ prediction
    @property
    def n_labels(self) -> int:
        return len(self.label_ids)

    def settings(self, overrides: Mapping[str, Any]) -> dict[str, Any]:
        """This call's prediction settings: the model's, with ``overrides`` (None: keep) over them.
        ``threshold`` alone asks for decisions by that threshold; decision values are checked here."""
        asked = [k for k in DECISION_KEYS if overrides.get(k) is not None]
        if asked and self.calibration is None:
            raise ModelError(
                f"{asked[0]}: a {self.method} model without a calibrator ranks labels only; fit one on held-out "
                "documents with model.calibrate(texts, labels), or train with calibration=platt"
            )
        unknown = sorted(set(overrides) - set(self.predict_settings))
        if unknown:
            raise ModelError(
                f"unknown prediction setting(s) {unknown} for a {self.method} model; "
                f"it takes {sorted(self.predict_settings)}"
            )
        out = {**self.predict_settings, **{k: v for k, v in overrides.items() if v is not None}}
        if "zero_shot_labels" in out:
            zero_shot_bounds(out)  # one line naming a bad bound, whether or not this call asks for zero-shot labels
        if self.calibration is not None:
            if "threshold" in asked and "decision" not in asked and out["decision"] == "topk":
                out["decision"] = "threshold"
            DecisionSettings.from_mapping({k: out[k] for k in DECISION_KEYS}, where="")  # one line naming the key
        return out

    @property
    def decides(self) -> bool:
        """Whether the model holds a calibrator (probabilities, decisions)."""
        return self.calibration is not None

    def predict_csr(self, texts: Sequence[str], **overrides: Any) -> sp.csr_matrix:
        """csr ``N x L`` of the top-``topk`` label scores of every text. Empty or blank texts get an
        empty row: there is nothing to classify."""
        return self._predict_texts_kept(texts, self.settings(overrides), None)

    def predict(self, texts: Sequence[str], k: int = 5, **overrides: Any) -> list[dict[str, Any]]:
        """For each text, its ``k`` best labels: ``{"labels": ids, "names": names, "scores": floats}``
        (and ``"probabilities"`` when calibrated); with ``decision="threshold"`` / ``"per_label"`` (or
        ``threshold=p``) the decided labels instead, however many there are (``k`` is not used)."""
        settings = self.settings(overrides)
        return self.label_rows(self.predict_csr(texts, **self.overrides_for_k(k, overrides)), k, settings)

    def evaluate(
        self, inputs: Any, labels: Any = None, inv_propensity: np.ndarray | None = None, **overrides: Any
    ) -> Evaluation:
        """Predict ``inputs`` (texts, or feature rows) and score against ``labels``: P@k, R@k, RP@k,
        nDCG@k (PSP@k with ``inv_propensity``), a calibrated model's ECE and decided-set F1 scores,
        plus the method's own diagnostics."""
        data = LabeledData.build(inputs, labels, self.label_ids, self.label_names)
        settings, report = self.settings(overrides), {}
        if self.reads_texts(data):
            pred = self._predict_texts_kept(data.texts, settings, report)
        else:
            require(self, Ability.FEATURE_ROWS, "evaluate on feature rows")
            pred = self.predict_features_csr(data.features, **overrides)
        metrics = self.score(data.Y, pred, inv_propensity, settings)
        return Evaluation(pred, metrics, self._diagnose(data, report))

    def score(
        self,
        Y: sp.spmatrix,
        pred: sp.csr_matrix,
        inv_propensity: np.ndarray | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> dict[str, float]:
        """The metrics of this model's predictions ``pred`` against ``Y``: ranking metrics and, when
        calibrated, ECE and the F1 scores of both decision rules (the folder's threshold and limits)."""
        from xtransformer.metrics import evaluate

        out = evaluate(Y, pred, inv_propensity=inv_propensity)
        if self.calibration is not None:
            out |= self.calibration.report(pred, Y, settings or self.predict_settings)
        return out

    def overrides_for_k(self, k: int, overrides: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
            raise ModelError(f"k must be an int >= 1, got {k!r}")
        topk = overrides.get("topk") or self.predict_settings["topk"]
        return {**overrides, "topk": max(int(k), int(topk))}

    def label_rows(self, pred: sp.csr_matrix, k: int, settings: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The rows ``predict`` returns for the score matrix ``pred``: the ``k`` best labels, or with a
        calibrator and a ``decision`` rule in ``settings`` the decided ones (among the model's ``topk``)."""
        if self.calibration is None:
            return self.top_labels(pred, k)
        pred = sp.csr_matrix(pred)
        pred.sum_duplicates()
        rank = row_ranks(pred)
        prob = self.calibration.probabilities(pred)
        if settings["decision"] == "topk":
            keep = rank < k
        else:
            keep = (rank < int(settings["topk"])) & self.calibration_mask(prob, settings)
        return self._rows(pred, prob.data, keep)

    def calibration_mask(self, prob: sp.csr_matrix, settings: Mapping[str, Any]) -> np.ndarray:
        from xtransformer.calibration.decide import decided_mask

        return decided_mask(prob, settings, self.calibration.label_thresholds)

    def _rows(self, pred: sp.csr_matrix, prob: np.ndarray, keep: np.ndarray) -> list[dict[str, Any]]:
        """The ``keep`` entries of every row of ``pred``, best score first, with their probabilities."""
        rows = np.repeat(np.arange(pred.shape[0]), np.diff(pred.indptr))
        order = np.lexsort((pred.indices, -pred.data, rows))
        order = order[keep[order]]
        bounds = np.searchsorted(rows[order], np.arange(pred.shape[0] + 1))
        ids, names = self.label_ids, self.label_names
        out = []
        for a, b in zip(bounds[:-1], bounds[1:]):
            at = order[a:b]
            items = pred.indices[at].tolist()
            out.append(
                {
                    "labels": [ids[i] for i in items],
                    "names": [names[i] for i in items],
                    "scores": [float(v) for v in pred.data[at]],
                    "probabilities": [float(v) for v in prob[at]],
                }
            )
        return out

    def top_labels(self, pred: sp.csr_matrix, k: int) -> list[dict[str, Any]]:
        """Rows of a score matrix as sorted (best first; ties by label index) label lists."""
        from xtransformer.topk import Candidates, topk

        c = topk(Candidates.from_csr(pred), int(k))
        bounds = np.searchsorted(c.doc, np.arange(pred.shape[0] + 1))
        ids, names = self.label_ids, self.label_names
        out = []
        for a, b in zip(bounds[:-1], bounds[1:]):
            items = c.item[a:b].tolist()
            out.append(
                {
                    "labels": [ids[i] for i in items],
                    "names": [names[i] for i in items],
                    "scores": [float(s) for s in c.score[a:b]],
                }
            )
        return out

    def _predict_texts_kept(
        self, texts: Sequence[str], settings: dict[str, Any], report: dict[str, Any] | None
    ) -> sp.csr_matrix:
        if isinstance(texts, str):
            raise ModelError("predict takes a list of texts, not one string")
        texts = list(texts)
        keep = np.fromiter((bool(t and not t.isspace()) for t in texts), bool, len(texts))
        if report is not None:
            report["kept"] = keep
        if not keep.any():
            return sp.csr_matrix((len(texts), self.n_labels), dtype=np.float32)
        some = texts if keep.all() else [t for t, k in zip(texts, keep) if k]
        zero_shot = self.zero_shot if settings.get("zero_shot_labels") else None
        report = report if report is not None or zero_shot is None else {}
        pred = self._predict_texts(some, settings, report)
        if zero_shot is not None:  # the rows the method read the texts into: TF-IDF or embeddings
            pred = zero_shot.merge(pred, report["zero_shot_rows"], settings)
        return pred if keep.all() else empty_rows_csr(pred, keep)

    def _predict_texts(
        self, texts: list[str], settings: dict[str, Any], report: dict[str, Any] | None
    ) -> sp.csr_matrix:
        """Scores of non-blank texts; ``report``: where diagnostics may leave what they need."""
        raise NotImplementedError

    def _diagnose(self, data: LabeledData, report: dict[str, Any]) -> dict[str, Any]:
        """Method-specific evaluation facts (the matcher's cluster recall, ...); none by default."""
        return {}

    # ------------------------------------------------------------------ folders
    def save(self, folder: str | os.PathLike) -> Path:
        """Write the model as a portable folder (atomic): its components, the two settings records,
        the labels with names, and a manifest with the sha256 of every file."""
        folder = Path(folder)
        with atomic_dir(folder) as tmp:
            components = self._save_components(tmp, folder)
            if self.zero_shot is not None:
                self.zero_shot.save(tmp / ZERO_SHOT_DIR)
                components["zero_shot"] = ZERO_SHOT_DIR
            if self.calibration is not None:
                self.calibration.save(tmp / CALIBRATION_DIR)
                components["calibration"] = CALIBRATION_DIR
            save_json(scrub(self.train_settings), tmp / TRAIN_SETTINGS)
            save_json(self.predict_settings, tmp / PREDICT_SETTINGS)
            save_json({"ids": self.label_ids, "names": self.label_names}, tmp / LABELS)
            self.manifest = write_manifest(tmp, self.method, components)
        self.folder = folder
        return folder

    def _save_components(self, tmp: Path, folder: Path) -> dict[str, Any]:
        """Write the components into ``tmp`` (to become ``folder``); return the manifest's record."""
        raise NotImplementedError

    def to(self, device: str) -> XMCModel:
        """Predict on ``device`` (``cpu``, ``cuda``, ``cuda:N``, ``auto``: a GPU when one is visible);
        this model, moved. Only networks move (an encoder, a CNN): a model without one predicts on the
        CPU whatever is asked, and imports no torch for it."""
        check_device(device)
        return self

    def push_to_hub(
        self,
        repo_id: str,
        private: bool | None = None,
        revision: str | None = None,
        commit_message: str | None = None,
        token: str | None = None,
        license: str | None = None,
    ) -> str:
        """Upload the model to the Hugging Face Hub repository ``repo_id`` (created when missing) with
        a generated model card; returns the commit's URL. Its own folder when it is what that folder
        holds (its run's metrics then come along), else a fresh save. ``XMCModel.load("hf://repo_id")``
        reads it back (``model/hub.py``)."""
        from xtransformer.model.hub import PushOptions, push_model

        return push_model(self, repo_id, PushOptions(private, revision, commit_message, token, license))

    @classmethod
    def load(
        cls, path: str | os.PathLike, method: str | None = None, verify: bool = True, device: str | None = None
    ) -> XMCModel:
        """Load a method folder, or the ``method`` (default: the main one) of a run's ``model/``
        folder (or of the run folder itself). ``verify`` checks every file's sha256 first; ``device``
        (None: the CPU) is where its networks predict (:meth:`to`).
        ``hf://owner/name[@revision][/subfolder]``: a Hugging Face Hub repository, read through the
        Hub's cache and checked the same way (``model/hub.py``)."""
        from xtransformer.methods import method_class
        from xtransformer.model.hub import local_folder

        folder = resolve_folder(local_folder(path), method)
        manifest = read_manifest(folder, verify=verify)
        kind = manifest["components"]["kind"]
        target = method_class(kind, where=folder)
        if not issubclass(target, cls):
            raise ModelError(f"{folder}: holds a {kind} model, not a {cls.__name__}; load it with XMCModel.load")
        labels = load_record(folder, LABELS)
        records = ModelRecords(
            labels["ids"],
            labels["names"],
            load_record(folder, PREDICT_SETTINGS),
            load_record(folder, TRAIN_SETTINGS),
            manifest["method"],
        )
        model = target._load(folder, manifest["components"], records, verify)
        if "zero_shot" in manifest["components"]:
            model.zero_shot = ZeroShot.load(folder / manifest["components"]["zero_shot"])
        if "zero_shot_labels" in model.predict_settings:  # folders saved before the two bounds were settings
            model.predict_settings = {**ZERO_SHOT_SETTINGS, **model.predict_settings}
        if "calibration" in manifest["components"]:
            model.calibration = Calibration.load(folder / manifest["components"]["calibration"])
        model.folder, model.manifest = folder, manifest
        return model if device is None else model.to(device)

    @classmethod
    def _load(cls, folder: Path, components: dict[str, Any], records: ModelRecords, verify: bool) -> XMCModel:
        raise NotImplementedError

    def __repr__(self) -> str:
        where = f", {self.folder}" if self.folder else ""
        return f"{type(self).__name__}({self.method}, {self.n_labels} labels{where})"


def resolve_folder(path: Path, method: str | None) -> Path:
    """A method folder from a method folder, a run's model/ folder or a run folder."""
    models = index_folder(path)
    if models is not None:
        index = load_record(models, INDEX)
        name = method or index["main"]
        if name not in index["methods"]:
            raise ModelError(f"{models}: no {name!r} model; it holds {index['methods']}")
        return models / name
    if method is not None and (path / method).is_dir():
        return path / method
    return path


def empty_rows_csr(pred: sp.csr_matrix, keep: np.ndarray) -> sp.csr_matrix:
    """``pred`` (rows of the ``keep`` documents) spread to ``len(keep)`` rows, the others empty."""
    rows = np.flatnonzero(keep)
    counts = np.zeros(len(keep), dtype=np.int64)
    counts[rows] = np.diff(pred.indptr)
    indptr = np.r_[0, np.cumsum(counts)]
    return sp.csr_matrix((pred.data, pred.indices, indptr), shape=(len(keep), pred.shape[1]))


def with_settings(model: Any, settings: Mapping[str, Any]) -> Any:
    """A shallow copy of a linear model (weights shared) whose config carries this call's prediction
    settings: concurrent calls with different overrides never see each other's. The model itself
    when the call asks for what its config holds (no copy, no second check of the record)."""
    import copy
    import dataclasses

    base = model.config
    names = {f.name for f in dataclasses.fields(base)}
    # a decision's `threshold` is a probability, not the ranker's weight-pruning `threshold`
    chosen = {k: v for k, v in settings.items() if k in names and k not in DECISION_KEYS}
    if all(getattr(base, k) == v for k, v in chosen.items()):
        return model
    out = copy.copy(model)
    out.config = dataclasses.replace(base, **chosen)
    return out


def _pair(validation: Any) -> tuple[Any, Any]:
    if isinstance(validation, LabeledData):
        return validation, None
    if isinstance(validation, tuple) and len(validation) == 2:
        return validation
    raise ModelError("validation must be (inputs, labels) or LabeledData")


def _plain(value: Any) -> Any:
    return value.to_dict() if isinstance(value, Settings) else value


def _merged(base: Any, over: Any) -> Any:
    """``over`` on ``base``, nested mappings key by key (anything else replaces)."""
    if not (isinstance(base, Mapping) and isinstance(over, Mapping)):
        return over
    return {**base, **{k: _merged(base.get(k), v) for k, v in over.items()}}


def _field_names(record: Settings) -> list[str]:
    import dataclasses

    return [f.name for f in dataclasses.fields(record)]
