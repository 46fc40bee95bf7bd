"""The XR-Linear model class: fit, predict, save, load."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import scipy.sparse as sp

from xtransformer.data.inputs import LabeledData
from xtransformer.data.tfidf import TfidfFeatures, check_source, tfidf_key, tfidf_stage
from xtransformer.indexing import IndexingConfig, build_index, check_copies_fit, learn_overlap, overlap_summary
from xtransformer.methods.abilities import AddsLabels, ReadsFeatureRows, ScoresZeroShot
from xtransformer.methods.base import ModelRecords, XMCModel, with_settings
from xtransformer.methods.xrlinear.config import XRLinearSettings
from xtransformer.model.folder import ModelError
from xtransformer.ranker import HierarchicalLinear, HierarchicalLinearConfig, LinearForest, load_tree_model
from xtransformer.utils.io import save_json, settings_key

log = logging.getLogger(__name__)

TFIDF_DIR, RANKER_DIR = "tfidf", "ranker"


class XRLinear(AddsLabels, ScoresZeroShot, ReadsFeatureRows, XMCModel):
    """TF-IDF -> :class:`~xtransformer.ranker.HierarchicalLinear` (or a forest of them), beam search."""

    kind = "xrlinear"
    # one leaf by routes, each new label trained against every document and scored alone (its tree
    # model's `added_negatives: all`, `added_reach: alone`): the fewest leaves within 0.3 of retraining
    # on held-out training documents (experiments/label_growth)
    default_placement = "routes"
    default_leaves = 1
    settings_class = XRLinearSettings

    def __init__(self, records: ModelRecords, tfidf: TfidfFeatures, model: HierarchicalLinear | LinearForest):
        super().__init__(records)
        self.tfidf = tfidf
        self.model = model

    # ------------------------------------------------------------------ training
    @classmethod
    def stage_keys(cls, s: XRLinearSettings, data_key: str, n_labels: int, trainer: Any = None) -> dict[str, str]:
        tfidf = tfidf_key(data_key, s.tfidf)
        x = s.xrlinear
        return {
            "tfidf": tfidf,
            "xrlinear": settings_key("xrlinear", tfidf, x.training_settings(), *x.overlap_source(x.indexing.n_copies)),
        }

    @classmethod
    def _check(cls, data: LabeledData, settings: XRLinearSettings) -> None:
        check_copies_fit(settings.xrlinear.indexing, data.n_labels, "xrlinear.indexing")
        check_source(data, settings.tfidf, "method=xrlinear")

    @property
    def takes_texts(self) -> bool:
        return self.tfidf.takes_text

    @classmethod
    def _fit(
        cls,
        data: LabeledData,
        settings: XRLinearSettings,
        ctx: Any,
        validation: LabeledData | None,
        keys: dict[str, str],
    ) -> XRLinear:
        x = settings.xrlinear
        tfidf, X = tfidf_stage(ctx.cache, data, settings.tfidf, keys["tfidf"])

        def build(tmp: Path) -> None:
            model, report = fit_tree_model(x.indexing, x.nr_splits, x.model, X, data.Y, data.label_ids, x.n_trees)
            save_json(report, tmp / "index_report.json")
            model.save(tmp / "model")

        folder = ctx.cache.run("xrlinear", keys["xrlinear"], build, settings=x.training_settings())
        model = load_tree_model(folder / "model")
        model.config = x.model  # prediction settings (beam, top-k, post-processor) come from these settings
        out = cls(ModelRecords.of(data, ranker_predict_settings(x.model), settings.training_settings()), tfidf, model)
        out.training_run.report = {"stage_keys": keys, "index": index_section(x.indexing.n_copies, model.chain[-1])}
        return out

    @classmethod
    def from_tree_model(
        cls,
        model: HierarchicalLinear | LinearForest,
        tfidf: TfidfFeatures,
        label_ids: list[str],
        label_names: list[str] | None = None,
    ) -> XRLinear:
        """An XR-Linear around a tree model trained elsewhere (e.g. an XR-Transformer's final model,
        over its own feature rows), reading documents through ``tfidf``; it predicts with the tree
        model's own settings. ``label_ids`` / ``label_names`` (default the ids) name its columns."""
        if len(label_ids) != model.n_labels:
            raise ModelError(f"{len(label_ids)} label ids for a tree model of {model.n_labels} labels")
        names = list(label_names) if label_names is not None else list(label_ids)
        return cls(ModelRecords(list(label_ids), names, ranker_predict_settings(model.config)), tfidf, model)

    # ------------------------------------------------------------------ prediction
    def _predict_texts(
        self, texts: list[str], settings: dict[str, Any], report: dict[str, Any] | None
    ) -> sp.csr_matrix:
        X = self.tfidf.from_texts(texts)
        if report is not None:
            report["zero_shot_rows"] = X
        return with_settings(self.model, settings).predict(X)

    def _predict_features(self, X: sp.spmatrix, settings: dict[str, Any]) -> sp.csr_matrix:
        return with_settings(self.model, settings).predict(self.tfidf.from_features(X))

    def _feature_rows(self, X: sp.spmatrix) -> sp.csr_matrix:
        return self.tfidf.from_features(X)

    def _label_rows(self, names: list[str]) -> sp.csr_matrix:
        """TF-IDF of the label texts (name and alternative names), as a document's."""
        return self.tfidf.from_texts(names)

    # ------------------------------------------------------------------ growing
    def _add_labels(self, plan: Any) -> tuple[XRLinear, dict[str, Any]]:
        """New labels at the leaves nearest their PIFA-TF-IDF rows (the representation it indexed with)."""
        from xtransformer.methods.adding import grown_reach, grown_report
        from xtransformer.methods.reuse import tfidf_rows

        d = plan.data
        if not self.reads_texts(d):
            X = self.tfidf.from_features(d.features)
        else:
            X = tfidf_rows(plan.run_rows(self.train_settings.get("stages"), ["tfidf"]), self.tfidf, d.texts)
        model, report = self.model.add_labels(X, d.Y, placing=plan.placing)
        model.config = self.model.config
        out = XRLinear(self.grown_records(plan), self.tfidf, model)
        out.predict_settings["added_reach"] = grown_reach(
            out.predict_settings, model.config.added_reach, report["negatives"]
        )
        return out, grown_report(report, plan.new_ids)

    # ------------------------------------------------------------------ folders
    def _save_components(self, tmp: Path, folder: Path) -> dict[str, Any]:
        self.tfidf.save(tmp / TFIDF_DIR)
        self.model.save(tmp / RANKER_DIR)
        return {"kind": self.kind, "tfidf": TFIDF_DIR, "ranker": RANKER_DIR}

    @classmethod
    def _load(cls, folder: Path, components: dict[str, Any], records: ModelRecords, verify: bool) -> XRLinear:
        return cls(records, TfidfFeatures.load(folder / TFIDF_DIR), load_tree_model(folder / RANKER_DIR))


def ranker_predict_settings(config: Any) -> dict[str, Any]:
    """A linear model's prediction record, plus its thread count (a run setting prediction still needs)."""
    return config.prediction_settings() | {"threads": config.threads}


def index_section(n_copies: int, C: sp.spmatrix) -> dict[str, Any]:
    """``metrics.json``'s ``index``: λ and how much the leaf level a model uses overlaps."""
    return {"n_copies": n_copies, **overlap_summary(C)}


def fit_tree_model(
    icfg: IndexingConfig,
    nr_splits: int,
    mcfg: HierarchicalLinearConfig,
    feats: sp.csr_matrix,
    Y: sp.csr_matrix,
    label_ids: Any,
    n_trees: int = 1,
) -> tuple[HierarchicalLinear | LinearForest, dict[str, Any]]:
    """PIFA tree on ``feats`` (seen ``nr_splits``-way) and the hierarchical linear model over it; with
    ``icfg.n_copies > 1`` the tree's overlap is learned first (train on the partition, count where its
    search sends each label, retrain). ``n_trees > 1``: as many trees, k-means seeded ``icfg.seed + i``,
    one model each, averaged (a :class:`LinearForest`). Returns the model and the indexing report."""
    models, reports = [], []
    for i in range(n_trees):
        tcfg = dataclasses.replace(icfg, seed=icfg.seed + i) if i else icfg
        # the tree's shape and overlap are reported; its quality figures (build_index's) are left out: nothing
        # reads them for XR-Linear's own tree, and on EURLEX57K they doubled the fit's peak memory
        chain, report = build_index(tcfg, Y, X_train_tfidf=feats, label_ids=label_ids, quality=False)
        chain = chain.subsample(nr_splits)
        if tcfg.n_copies > 1:
            chain, report["disentangle"] = learn_overlap(chain, feats, Y, tcfg, mcfg)
        models.append(HierarchicalLinear.train(feats, Y, list(chain), mcfg, merge=tcfg.merge))
        reports.append(report)
        if n_trees > 1:
            log.info("tree %d of %d trained", i + 1, n_trees)
    if n_trees == 1:
        return models[0], reports[0]
    return LinearForest(models), {**reports[0], "trees": reports}
