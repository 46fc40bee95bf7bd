"""One run of a method (``xtransformer``, ``xrtransformer`` or ``xrlinear``), data to model folder.

data -> TF-IDF -> XR-Linear (always for ``xrlinear``; beside the neural methods when
``train_xrlinear``) -> label tree -> either the matcher and its ranker (X-Transformer) or the
level-by-level fine-tuning and the final linear model (XR-Transformer) -> metrics.

Each stage is a small function in ``stages.py`` whose artifacts are cached under a key of the
settings that influence them (``cache.py``). This module composes them from a Hydra config and
writes the run folder: ``metrics.json``, ``predictions/{split}.npz``, ``truth/{split}.npz``,
``label_vocab.txt``, plots and ``model/`` (every trained method as a portable model folder).
"""

from __future__ import annotations

import dataclasses
import logging
import resource
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from xtransformer.cache import StageCache
from xtransformer.data import load_dataset, warn_unseen_labels
from xtransformer.ensemble import ensemble_predictions
from xtransformer.indexing import check_copies_fit
from xtransformer.metrics import evaluate, format_metrics_table, propensity
from xtransformer.model.export import XRTransformerParts, XTransformerParts, save_run_models
from xtransformer.pipeline import stages
from xtransformer.pipeline.keys import stage_keys
from xtransformer.pipeline.loggers import build_loggers, log_final
from xtransformer.pipeline.settings import METHODS, RunSettings, run_settings
from xtransformer.utils.dist import is_rank_zero
from xtransformer.utils.io import save_csr, save_json

log = logging.getLogger(__name__)

REPORT_KEYS = ("P@1", "P@3", "P@5", "R@1", "R@3", "R@5", "nDCG@5", "PSP@5")
__all__ = ["METHODS", "run", "write_run_outputs"]


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def run(cfg: DictConfig) -> dict[str, Any]:
    s = run_settings(cfg)  # every setting checked here, before any data work: one line naming the key
    if s.combine_with_xrlinear and not s.train_xrlinear and s.method != "xrlinear":
        log.warning("combine_with_xrlinear=%s needs train_xrlinear=true; no combined result this run",
                    s.combine_with_xrlinear)
    if s.matcher is not None:
        stages.check_model(s.matcher)  # fail before any data work if the encoder is missing
    cache = StageCache(Path(s.cache_dir), enabled=s.cache)
    if not s.cache and s.matcher is not None and s.matcher.cache_dir is None:  # tokens too: nothing read or kept
        s.matcher = dataclasses.replace(s.matcher, cache_dir=str(cache.base / "matcher"))
    try:
        return _run(cfg, s, cache)
    finally:
        cache.close()


def _run(cfg: DictConfig, s: RunSettings, cache: StageCache) -> dict[str, Any]:
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    out_dir = Path(s.output_dir)
    method, neural = s.method, s.neural

    def lap(name: str, since: float) -> float:
        now = time.perf_counter()
        timings[name] = round(now - since, 3)
        return now

    t = time.perf_counter()
    ds = load_dataset(s.data, cache_dir=cache.base)
    log.info("dataset %s: %s", ds.name, {name: len(v) for name, v in ds.splits.items()})
    if neural:
        ds.require_texts(f"method={method}")
    unseen = warn_unseen_labels(ds)
    index_cfgs = {"xrlinear.indexing": s.xrlinear.indexing, **({"indexing": s.indexing} if neural else {})}
    if method == "xrtransformer" and s.xrtransformer.final.tree == "recluster":
        index_cfgs["xrtransformer.final.indexing"] = s.xrtransformer.final.indexing
    for where, icfg in index_cfgs.items():  # λ against K, known once the label count is
        check_copies_fit(icfg, ds.n_labels, where)
    xr_levels = None
    if method == "xrtransformer":  # the level plan needs only the label count: check it before TF-IDF
        xr_levels = stages.xr_plan(len(ds.vocab), s.indexing, s.xrtransformer, s.matcher)
        log.info("xrtransformer: fine-tuning %d levels of %s clusters, steps %s", len(xr_levels), xr_levels,
                 [sch["steps"] for sch in s.matcher.level_schedule(len(xr_levels))])
    keys = stage_keys(s, ds.source_key, list(ds.splits), xr_levels)
    t = lap("load_data", t)
    X, tfidf_dir = stages.tfidf(cache, ds, s, keys)
    t = lap("tfidf", t)
    loggers = build_loggers(cfg, s.records()) if is_rank_zero() else []
    eval_split = ds.eval_split
    inv_prop = propensity(ds.splits["train"].Y)
    results: dict[str, Any] = {}
    index: dict[str, Any] = {}  # n_copies and overlap of each method's leaf level (the main one at the top)
    predictions: dict[str, Any] = {}
    models: dict[str, Any] = {}  # what save_run_models writes into <run>/model/

    if method == "xrlinear" and not is_rank_zero():
        return {}  # nothing to help train (SLURM starts every task of a job from the top)
    if (s.train_xrlinear and is_rank_zero()) or method == "xrlinear":
        xrlinear_dir = stages.xrlinear(cache, ds, X, s, keys)
        base = stages.load_xrlinear(xrlinear_dir, s)
        t = lap("xrlinear_train", t)
        predictions["xrlinear"] = base.predict(X[eval_split])
        t = lap("xrlinear_predict", t)
        results["xrlinear"] = evaluate(ds.splits[eval_split].Y, predictions["xrlinear"], inv_propensity=inv_prop)
        index = {"xrlinear": stages.index_section(s.xrlinear.indexing.n_copies, base.chain[-1])}
        # a neural method trains next: let go of the linear model (a forest pruned at 0.01 holds
        # 1.3 GiB on EURLEX57K) and read it again from its stage folder for the model folder
        models["xrlinear"] = None if neural else base
        del base

    levels: list[dict[str, Any]] = []
    extra: dict[str, Any] = {}
    if neural:
        chain = stages.index(cache, ds, X, s, keys, stages.pretrained_embedder(s, ds))
        t = lap("indexing", t)

    if method == "xrtransformer":
        final, tuned = stages.xrtransformer(cache, ds, X, chain, s, keys, loggers)
        t = lap("xrtransformer_train", t)
        if final is None:
            return {}  # ranks > 0 only helped fine-tune
        predictions["xrtransformer"] = stages.predict_xrtransformer(final, s.xrtransformer, X, tuned, eval_split)
        t = lap("predict", t)
        results["xrtransformer"] = evaluate(ds.splits[eval_split].Y, predictions["xrtransformer"], inv_propensity=inv_prop)
        levels = tuned.levels
        models["xrtransformer"] = XRTransformerParts(final, tuned.model_dir, s.xrtransformer, s.matcher)
        index = {**stages.index_section(s.indexing.n_copies, chain.leaf_assignment), **index}
        extra["xrtransformer"] = {"finetune_s": round(sum(lv["seconds"] for lv in levels), 3),  # as trained
                                  "encode_docs_per_s": tuned.outputs.metrics.get("inference_docs_per_s", {})}
        stages.plots(out_dir / "plots", ds, chain)

    if method == "xtransformer":
        mout = stages.matcher(cache, ds, chain, s, keys, loggers)
        t = lap("matcher", t)
        if not is_rank_zero():
            return {}
        ranker = stages.ranker(cache, ds, X, mout, chain, s, keys)
        models["xtransformer"] = XTransformerParts(ranker, mout.model_dir, chain, s.matcher)
        t = lap("ranker_train", t)
        predictions["xtransformer"] = stages.predict(ranker, X, mout, eval_split)
        t = lap("predict", t)
        results["xtransformer"] = evaluate(ds.splits[eval_split].Y, predictions["xtransformer"], inv_propensity=inv_prop)
        results["matcher_cluster_recall"] = stages.cluster_recall(ds.splits[eval_split].Y, chain, mout.topb(eval_split))
        stages.plots(out_dir / "plots", ds, chain)
        index = {**stages.index_section(s.indexing.n_copies, chain.leaf_assignment), **index}

    main = method
    if neural and "xrlinear" in predictions and s.combine_with_xrlinear:
        both = f"{main}+xrlinear"
        predictions[both] = ensemble_predictions([predictions[main], predictions["xrlinear"]],
                                                 method=s.combine_with_xrlinear, weights=combine_weights(s))
        results[both] = evaluate(ds.splits[eval_split].Y, predictions[both], inv_propensity=inv_prop)
    timings["total"] = round(time.perf_counter() - t0, 3)
    # the model folder before metrics.json: a run folder with metrics.json is a finished run, and
    # the peak memory below counts reading XR-Linear's model back for it
    if "xrlinear" in models and models["xrlinear"] is None:
        models["xrlinear"] = stages.load_xrlinear(xrlinear_dir, s)
    save_run_models(out_dir / "model", cfg, ds, models, main, tfidf_dir, s.trainer_kwargs,
                    combine=s.combine_with_xrlinear if f"{main}+xrlinear" in predictions else None,
                    weights=combine_weights(s))
    metrics = {
        "method": method,
        "dataset": ds.name,
        "eval_split": eval_split,
        "seed": s.seed,
        "metrics": results[main],
        "results": results,
        "levels": levels,  # XR-Transformer: clusters, steps, seconds and eval cluster recall per level
        **extra,
        "index": index if neural else index["xrlinear"],
        "timings_s": timings,
        "peak_rss_gib": round(peak_rss_gib(), 3),
        "settings": s.records(),  # what the stage keys and the model folders were made of
        "stages": {"ran": cache.ran(), "reused": cache.reused(), "corrupt_rebuilt": cache.corrupt(),
                   "keys": keys.as_dict(), "cache": s.cache},
        "dataset_summary": ds.summary(),
        "unseen_eval_labels": unseen,  # eval labels no training document has: they cap P@k and R@k
        "config": OmegaConf.to_container(cfg, resolve=True),
    }
    write_run_outputs(out_dir, ds, predictions, main, eval_split, metrics)
    for name, res in results.items():
        if isinstance(res, dict) and "P@1" in res:
            log.info("%s on %s: %s", name, eval_split, format_metrics_table(res, REPORT_KEYS))
    log_final(loggers, metrics, out_dir)
    return metrics


def combine_weights(s: RunSettings) -> list[float]:
    """The weights of [main method, XR-Linear] in ``{method}+xrlinear`` (``combine_weight``)."""
    return [s.combine_weight, 1.0 - s.combine_weight]


def write_run_outputs(out_dir: Path, ds, predictions: dict[str, Any], main: str, split: str,
                      metrics: dict[str, Any]) -> None:
    """The files ``xtransformer.ensemble`` and the sweep aggregator read from a run folder:
    ``predictions/{split}.npz`` is the main method's, ``predictions/{method}/{split}.npz`` each one's."""
    out_dir.mkdir(parents=True, exist_ok=True)
    save_csr(predictions[main], out_dir / "predictions" / f"{split}.npz")
    for name, pred in predictions.items():
        save_csr(pred, out_dir / "predictions" / name / f"{split}.npz")
    save_csr(ds.splits[split].Y, out_dir / "truth" / f"{split}.npz")
    ds.vocab.save(out_dir / "label_vocab.txt")
    save_json(metrics, out_dir / "metrics.json")
