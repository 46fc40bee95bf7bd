"""Write a run's trained models as portable model folders (``<run>/model/<method>/``).

The pipeline calls :func:`save_run_models` once at the end of a run. Each method gets a folder
built from its components (see ``methods.py``) with the training and the prediction settings as
two records, the label vocabulary with names, and a manifest with the sha256 of every file.
Everything is copied out of the stage cache (the matcher's torch-pickled head is rewritten as
safetensors), so the folder can be moved anywhere and the cache deleted.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from xtransformer.model.api import INDEX
from xtransformer.model.folder import LABELS, PREDICT_SETTINGS, TRAIN_SETTINGS, write_manifest
from xtransformer.model.methods import MATCHER_DIR, RANKER_DIR, TFIDF_DIR, TREE_DIR
from xtransformer.model.tfidf_io import save_tfidf
from xtransformer.utils.io import atomic_dir, load_json, save_json

log = logging.getLogger(__name__)

# Settings that would point into this machine's cache or checkout: meaningless in a portable folder
_LOCAL_KEYS = {"cache_dir", "base_model", "output_dir", "log_dir", "root_dir"}


@dataclass
class XTransformerParts:
    """What the neural path trained: ranker, matcher model folder (in the cache), label tree."""

    ranker: Any  # LinearRanker
    matcher_dir: Path
    chain: Any  # ClusterChain
    matcher_cfg: Any  # MatcherConfig


@dataclass
class XRTransformerParts:
    """What XR-Transformer trained: the final linear model and the last level's matcher folder."""

    model: Any  # HierarchicalLinear on final_features(tfidf, embeddings)
    matcher_dir: Path  # the last fine-tuned level (encoder/ + head + matcher_config.json)
    xcfg: Any  # XRTransformerConfig
    matcher_cfg: Any  # MatcherConfig


def scrub(obj: Any) -> Any:
    """Drop machine-local paths (cache, output folders) from a settings record."""
    if isinstance(obj, dict):
        return {k: scrub(v) for k, v in obj.items() if k not in _LOCAL_KEYS}
    if isinstance(obj, list):
        return [scrub(v) for v in obj]
    return obj


def write_method(folder: Path, method: str, components: dict[str, Any], train_settings: dict[str, Any],
                 predict_settings: dict[str, Any], labels: dict[str, list[str]],
                 fill: Callable[[Path], None] | None = None) -> None:
    """One method folder (atomic): its components (``fill``), the three records, then the manifest."""
    with atomic_dir(folder) as tmp:
        if fill is not None:
            fill(tmp)
        save_json(scrub(train_settings), tmp / TRAIN_SETTINGS)
        save_json(predict_settings, tmp / PREDICT_SETTINGS)
        save_json(labels, tmp / LABELS)
        write_manifest(tmp, method, components)


def _ranker_predict(config: Any) -> dict[str, Any]:
    """A ranker's prediction record, plus its thread count (a run setting the predictor still needs)."""
    return config.prediction_settings() | {"threads": config.threads}


def _embedding_record(mcfg: Any) -> dict[str, Any]:
    """How the encoder's embeddings the ranker was trained on were made: part of the model (the
    ranker's weights fit them), not a prediction setting a call may override."""
    return {"normalize_embeddings": mcfg.normalize_embeddings, "embeddings_dtype": mcfg.save_embeddings_dtype,
            "max_length": mcfg.embed_length}


# ---------------------------------------------------------------------------------------- per kind
def write_xrlinear(folder: Path, method: str, vectorizer: Any, n_features: int, model: Any,
                   train_settings: dict[str, Any], labels: dict[str, list[str]]) -> None:
    def fill(f: Path) -> None:
        save_tfidf(vectorizer, f / TFIDF_DIR, n_features)
        model.save(f / RANKER_DIR)

    write_method(folder, method, {"kind": "xrlinear", "tfidf": TFIDF_DIR, "ranker": RANKER_DIR},
                 train_settings | {"model": model.config.training_settings()},
                 _ranker_predict(model.config), labels, fill)


def write_xtransformer(folder: Path, method: str, vectorizer: Any, n_features: int, parts: XTransformerParts,
                       inference_precision: str, train_settings: dict[str, Any], labels: dict[str, list[str]]) -> None:
    rcfg, mcfg = parts.ranker.config, parts.matcher_cfg

    def fill(f: Path) -> None:
        save_tfidf(vectorizer, f / TFIDF_DIR, n_features)
        parts.ranker.save(f / RANKER_DIR)
        copy_matcher(parts.matcher_dir, f / MATCHER_DIR)
        parts.chain.save(f / TREE_DIR, labels["ids"])

    components = {
        "kind": "xtransformer", "tfidf": TFIDF_DIR, "matcher": MATCHER_DIR, "ranker": RANKER_DIR, "label_tree": TREE_DIR,
        # how the ranker's input was built: part of the model, not a prediction setting
        "features": {"kind": rcfg.features, "neural_weight": rcfg.neural_weight, **_embedding_record(mcfg)},
    }
    predict = {"topb": mcfg.topb, "eval_batch_size": mcfg.eval_batch_size, "inference_precision": inference_precision,
               **{k: v for k, v in _ranker_predict(rcfg).items() if k != "beam_size"}}  # one level: no beam
    write_method(folder, method, components,
                 train_settings | {"matcher": mcfg.training_settings(), "ranker": rcfg.training_settings()},
                 predict, labels, fill)


def write_xrtransformer(folder: Path, method: str, vectorizer: Any, n_features: int, parts: XRTransformerParts,
                        inference_precision: str, train_settings: dict[str, Any], labels: dict[str, list[str]]) -> None:
    mcfg, final = parts.matcher_cfg, parts.xcfg.final

    def fill(f: Path) -> None:
        save_tfidf(vectorizer, f / TFIDF_DIR, n_features)
        copy_matcher(parts.matcher_dir, f / MATCHER_DIR)  # the encoder, and the head for combine_head
        parts.model.save(f / RANKER_DIR)

    components = {
        "kind": "xrtransformer", "tfidf": TFIDF_DIR, "matcher": MATCHER_DIR, "ranker": RANKER_DIR,
        "features": {"kind": final.features, "neural_weight": parts.model.config.neural_weight,
                     **_embedding_record(mcfg)},
    }
    predict = {"topb": mcfg.topb, "eval_batch_size": mcfg.eval_batch_size, "inference_precision": inference_precision,
               "combine_head": final.combine_head, **_ranker_predict(parts.model.config)}
    write_method(folder, method, components,
                 train_settings | {"matcher": mcfg.training_settings(levels=True),
                                   "xrtransformer": parts.xcfg.training_settings()},
                 predict, labels, fill)


def write_ensemble(folder: Path, method: str, members: list[str], combine: str, topk: int,
                   labels: dict[str, list[str]], weights: list[float] | None = None) -> None:
    """A combination of sibling method folders, referenced by relative path (moved together);
    ``weights``: one per member (None: equal), a prediction setting like the method."""
    write_method(folder, method, {"kind": "ensemble", "members": [f"../{m}" for m in members]},
                 {"members": members, "combine": combine},
                 {"method": combine, "topk": int(topk), "weights": None if weights is None else list(weights)}, labels)


def copy_matcher(src: Path, dst: Path) -> None:
    """The matcher model folder without pickles: encoder/ (save_pretrained) + head as safetensors."""
    import torch
    from safetensors.torch import save_file

    with atomic_dir(dst) as tmp:
        shutil.copytree(src / "encoder", tmp / "encoder")
        head = torch.load(src / "head.pt", map_location="cpu", weights_only=True)
        save_file({k: v.contiguous() for k, v in head.items()}, tmp / "head.safetensors")
        save_json(scrub(load_json(src / "matcher_config.json")), tmp / "matcher_config.json")


# ---------------------------------------------------------------------------------------- the run
def save_run_models(model_dir: str | Path, cfg: Any, ds: Any, models: dict[str, Any], main: str,
                    tfidf_dir: Path | None, trainer: dict[str, Any], combine: str | None = None,
                    weights: list[float] | None = None) -> Path:
    """Write ``model_dir/<method>/`` for every trained method in ``models`` (``"xrlinear"``:
    HierarchicalLinear, ``"xtransformer"``: :class:`XTransformerParts`, ``"xrtransformer"``:
    :class:`XRTransformerParts`) and, with ``combine``, ``<main>+xrlinear`` (``weights``: of [main,
    xrlinear]) (atomic).
    ``tfidf_dir``: the TF-IDF stage folder (its fitted vectoriser), None for given features.
    ``trainer``: the Trainer group as the run resolved it (``RunSettings.trainer_kwargs``: a concrete
    precision where the config said ``auto``)."""
    from omegaconf import OmegaConf

    from xtransformer.data.tfidf import load_vectorizer, n_features as vectorizer_features

    plain = OmegaConf.to_container(cfg, resolve=True) | {"trainer": dict(trainer)}
    vectorizer = load_vectorizer(tfidf_dir) if ds.has_texts else None
    n_features = vectorizer_features(vectorizer) if vectorizer is not None else int(ds.splits["train"].X.shape[1])
    labels = {"ids": list(ds.vocab.ids), "names": list(ds.label_text)}
    common = {"dataset": ds.name, "data": plain["data"], "seed": plain["seed"], "tfidf": plain["tfidf"]}
    written = []
    with atomic_dir(model_dir) as tmp:
        for name, parts in models.items():
            if name == "xrlinear":
                write_xrlinear(tmp / name, name, vectorizer, n_features, parts, common | {
                    "indexing": plain["xrlinear"]["indexing"], "nr_splits": plain["xrlinear"]["nr_splits"]}, labels)
            elif isinstance(parts, XTransformerParts):
                from xtransformer.matcher.train import inference_precision  # the run's own resolution

                write_xtransformer(tmp / name, name, vectorizer, n_features, parts,
                                   inference_precision(parts.matcher_cfg, plain["trainer"]),
                                   common | {"indexing": plain["indexing"], "trainer": plain["trainer"]}, labels)
            elif isinstance(parts, XRTransformerParts):
                from xtransformer.matcher.train import inference_precision

                write_xrtransformer(tmp / name, name, vectorizer, n_features, parts,
                                    inference_precision(parts.matcher_cfg, plain["trainer"]),
                                    common | {"indexing": plain["indexing"], "trainer": plain["trainer"]}, labels)
            else:
                raise TypeError(f"save_run_models: no writer for {name!r} ({type(parts).__name__})")
            written.append(name)
        if combine and main != "xrlinear" and {main, "xrlinear"} <= set(models):
            from xtransformer.ensemble import ensemble_predictions

            topk = _default_topk(ensemble_predictions)  # the run combined with the default top-k
            both = f"{main}+xrlinear"
            write_ensemble(tmp / both, both, [main, "xrlinear"], combine, topk, labels, weights)
            written.append(both)
        save_json({"main": main, "methods": written}, tmp / INDEX)
    log.info("model folders: %s in %s", written, model_dir)
    return Path(model_dir)


def _default_topk(fn: Callable[..., Any]) -> int:
    import inspect

    return int(inspect.signature(fn).parameters["topk"].default)
