"""The stable surface for scripts and studies: ``from xtransformer.api import NAME``.

The benchmarks (``benchmarks/``), the tuning studies (``experiments/``) and any script of a user's
import from here and from ``xtransformer`` alone, never from the modules behind these names: the
package may move a name from one module to another, and this table is the one place that follows
it. Names load on first use (as ``xtransformer``'s own do), so importing this module imports
neither torch nor Lightning; a name of the matcher or the encoders brings them when it is used.

The groups:

- **data and features**: datasets, the documents and labels ``fit`` reads, TF-IDF, held-out rows;
- **indexing**: label representations, hierarchical balanced k-means, the indexing stage and its
  quality figures;
- **matcher and encoders**: encoder folders, tokenisation, the matcher's LightningModule, data and
  training stage, encoding, the CNN network, the learning-rate schedule every fine-tuning uses;
- **rankers**: the hierarchical linear model (one tree, or a forest) and the solver beneath it;
- **methods and model folders**: the method classes (``fit`` / ``predict`` / ``save`` /
  ``XMCModel.load``), the training context, the final model's feature rows, a run's rows, a model
  folder (or a run's models) pushed to the Hugging Face Hub;
- **writing a method**: what a method of another package builds on (``examples/plugin_method``):
  the records, the settings fields, the abilities a method declares by its bases;
- **metrics, calibration and ensembles**: P@k and its kin, per-document hits, label groups,
  calibrators, combined predictions;
- **stage cache and I/O helpers**: the content-keyed stage cache and its stage names, atomic
  writes, JSON and sparse-matrix files, content keys;
- **settings composition**: the settings (or the config) ``python train.py OVERRIDES`` runs with,
  and the run itself;
- **hardware**: the precision a device runs at.
"""

from __future__ import annotations

import importlib
from typing import Any

_GROUPS: dict[str, dict[str, str]] = {  # group -> {name: module, or "module:attribute" where they differ}
    "data and features": {
        "DataConfig": "xtransformer.data.dataset",
        "LabeledData": "xtransformer.data.inputs",
        "LeadTfidf": "xtransformer.data.tfidf",
        "TfidfConfig": "xtransformer.data.tfidf",
        "TfidfFeatures": "xtransformer.data.tfidf",
        "held_out_rows": "xtransformer.data.dataset",
        "load_dataset": "xtransformer.data.dataset",
        "read_folder": "xtransformer.data.dataset",
        "resolve_dataset_dir": "xtransformer.data.dataset",
        "tfidf_features": "xtransformer.data.tfidf",
        "unit_rows": "xtransformer.utils.rows",
        "write_xc_sparse": "xtransformer.data.readers",
        "write_xmc_base": "xtransformer.data.xmcbase",
    },
    "indexing": {
        "IndexingConfig": "xtransformer.indexing.config",
        "build_index": "xtransformer.indexing.build",
        "centroid_cosine": "xtransformer.indexing.quality",
        "cluster_counts": "xtransformer.indexing.disentangle",
        "cooccurrence_purity": "xtransformer.indexing.quality",
        "default_n_clusters": "xtransformer.indexing.kmeans",
        "hierarchical_kmeans": "xtransformer.indexing.kmeans",
        "label_representation": "xtransformer.indexing.representations",
        "overlap_summary": "xtransformer.indexing.quality",
        "planted_label_features": "xtransformer.indexing.synthetic",
        "random_balanced_codes": "xtransformer.indexing.quality",
        "reassign": "xtransformer.indexing.disentangle",
    },
    "matcher and encoders": {
        "CNNConfig": "xtransformer.methods.cnn.config",
        "CNNModule": "xtransformer.methods.cnn.module",
        "EncodeOptions": "xtransformer.matcher.inference",
        "LinearWarmupDecay": "xtransformer.training",
        "LoadedMatcher": "xtransformer.matcher.inference",
        "MatcherConfig": "xtransformer.matcher.config",
        "MatcherDataModule": "xtransformer.matcher.datamodule",
        "MatcherModule": "xtransformer.matcher.module",
        "TokenizedTexts": "xtransformer.encoders.tokens",
        "TrainOptions": "xtransformer.matcher.module",
        "autocast_context": "xtransformer.encoders.embed",
        "fine_tune_matcher": "xtransformer.matcher.train",
        "instance_cluster_targets": "xtransformer.matcher.datamodule",
        "predict_tokens": "xtransformer.matcher.inference",
        "pretrained_encoder": "xtransformer.encoders.embed",
        "resolve_model": "xtransformer.encoders.lookup",
        "set_dropout": "xtransformer.encoders.embed",
        "squared_hinge_loss": "xtransformer.matcher.loss",
        "tokenize_texts": "xtransformer.encoders.tokens",
        "topb_csr": "xtransformer.matcher.inference",
        "topb_recall": "xtransformer.matcher.train",
    },
    "rankers": {
        "ADDED_REACH": "xtransformer.ranker.config",
        "HierarchicalLinear": "xtransformer.ranker.hierarchical",
        "HierarchicalLinearConfig": "xtransformer.ranker.config",
        "LevelSpec": "xtransformer.ranker.fit",
        "LinearForest": "xtransformer.ranker.forest",
        "added_labels_solver": "xtransformer.ranker.extend",
        "solver_params": "xtransformer.ranker.fit",
        "train_level": "xtransformer.ranker.fit",
        "train_one_vs_all": "xtransformer.ranker.extend",
    },
    "methods and model folders": {
        "Combination": "xtransformer.methods.combination",
        "FinalModelConfig": "xtransformer.methods.xrtransformer.config",
        "KimCNN": "xtransformer.methods.cnn.model",
        "PushOptions": "xtransformer.model.hub",
        "RunRows": "xtransformer.methods.reuse",
        "TrainContext": "xtransformer.context",
        "TrainerConfig": "xtransformer.context",
        "XMCModel": "xtransformer.methods.base",
        "XMLCNN": "xtransformer.methods.cnn.model",
        "XRLinear": "xtransformer.methods.xrlinear.model",
        "XRTransformer": "xtransformer.methods.xrtransformer.model",
        "XTransformer": "xtransformer.methods.xtransformer",
        "final_features": "xtransformer.methods.xrtransformer.features",
        "method_class": "xtransformer.methods",
        "push_folder": "xtransformer.model.hub",
        "tfidf_rows": "xtransformer.methods.reuse",
    },
    "writing a method": {
        "Ability": "xtransformer.methods.abilities",
        "AddsLabels": "xtransformer.methods.abilities",
        "MissingAbility": "xtransformer.methods.abilities",
        "ModelRecords": "xtransformer.methods.records",
        "ReadsFeatureRows": "xtransformer.methods.abilities",
        "ScoresZeroShot": "xtransformer.methods.abilities",
        "Settings": "xtransformer.settings",
        "TrainingRun": "xtransformer.methods.records",
        "predict_field": "xtransformer.settings",
        "require": "xtransformer.methods.abilities",
        "run_field": "xtransformer.settings",
        "train_field": "xtransformer.settings",
    },
    "metrics, calibration and ensembles": {
        "Calibration": "xtransformer.calibration.component",
        "CalibrationConfig": "xtransformer.calibration.config",
        "document_hits": "xtransformer.metrics",
        "ensemble_predictions": "xtransformer.ensemble",
        "entry_targets": "xtransformer.calibration.calibrator",
        "evaluate": "xtransformer.metrics",
        "group_metrics": "xtransformer.metrics",
        "per_document_from_hits": "xtransformer.metrics",
        "propensity": "xtransformer.metrics",
        "topk_csr": "xtransformer.topk",
    },
    "stage cache and I/O helpers": {
        "EMBED_STAGE": "xtransformer.methods.xrtransformer.levels",
        "LEVEL_STAGE": "xtransformer.methods.xrtransformer.levels",
        "StageCache": "xtransformer.cache",
        "atomic_dir": "xtransformer.utils.io",
        "atomic_path": "xtransformer.utils.io",
        "is_complete": "xtransformer.utils.io",
        "load_csr": "xtransformer.utils.io",
        "load_json": "xtransformer.utils.io",
        "save_csr": "xtransformer.utils.io",
        "save_json": "xtransformer.utils.io",
        "settings_key": "xtransformer.utils.io",
        "texts_fingerprint": "xtransformer.utils.io",
    },
    "settings composition": {
        "compose_config": "xtransformer.pipeline.settings",
        "compose_settings": "xtransformer.pipeline.settings",
        "run_pipeline": "xtransformer.pipeline.run:run",
        "run_settings": "xtransformer.pipeline.settings",
    },
    "hardware": {
        "native_bf16": "xtransformer.utils.hardware",
        "resolve_precision": "xtransformer.utils.hardware",
    },
}
_EXPORTS = {name: home for group in _GROUPS.values() for name, home in group.items()}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        module, _, attribute = _EXPORTS[name].partition(":")
        return getattr(importlib.import_module(module), attribute or name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
