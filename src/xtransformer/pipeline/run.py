"""One run from the Hydra config: settings -> data -> ``fit`` -> evaluate -> save -> ``metrics.json``.

Every method the run trains (XR-Linear beside a neural method when ``train_xrlinear``, then the
main one) goes through its class's ``fit`` with one :class:`~xtransformer.context.TrainContext`
(the stage cache, the trainer, the loggers), is scored on the eval split through the same
``predict`` a saved folder uses, and is saved as a portable model folder. The run folder holds
``metrics.json``, ``predictions/{split}.npz`` (and per method), ``truth/{split}.npz``,
``label_vocab.txt``, plots and ``model/`` (``models.json`` names the methods and the main one).
"""

from __future__ import annotations

import logging
import resource
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from xtransformer.cache import StageCache
from xtransformer.context import TrainContext
from xtransformer.data import load_dataset, warn_unseen_labels
from xtransformer.data.inputs import LabeledData
from xtransformer.methods import method_class
from xtransformer.methods.base import INDEX, XMCModel
from xtransformer.methods.combination import Combination
from xtransformer.metrics import evaluate, format_metrics_table, group_metrics, propensity
from xtransformer.pipeline.loggers import build_loggers, log_final
from xtransformer.pipeline.settings import RunSettings, run_settings
from xtransformer.utils.io import save_csr, save_json

log = logging.getLogger(__name__)

REPORT_KEYS = ("P@1", "P@3", "P@5", "R@1", "R@3", "R@5", "nDCG@5", "PSP@5")
__all__ = ["run", "write_run_outputs"]


class Clock:
    """Seconds between laps, by name (``metrics.json``'s ``timings_s``)."""

    def __init__(self) -> None:
        self.start = self.last = time.perf_counter()
        self.laps: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = round(now - self.last, 3)
        self.last = now


def run(cfg: DictConfig) -> dict[str, Any]:
    s = run_settings(cfg)  # every setting checked here, before any data work: one line naming the key
    if s.combine_with_xrlinear and not s.train_xrlinear and s.method != "xrlinear":
        log.warning(
            "combine_with_xrlinear=%s needs train_xrlinear=true; no combined result this run", s.combine_with_xrlinear
        )
    cache = StageCache(Path(s.cache_dir), enabled=s.cache)
    try:
        return _run(cfg, s, TrainContext(cache=cache, trainer=s.trainer, lightning=s.lightning))
    finally:
        cache.close()


def _run(cfg: DictConfig, s: RunSettings, ctx: TrainContext) -> dict[str, Any]:
    clock, out_dir = Clock(), Path(s.output_dir)
    ds = load_dataset(s.data, cache_dir=ctx.cache.base)
    log.info("dataset %s: %s", ds.name, {name: len(v) for name, v in ds.splits.items()})
    train, evalset = LabeledData.from_split(ds, "train"), LabeledData.from_split(ds, ds.eval_split)
    validation = LabeledData.from_split(ds, "dev") if "dev" in ds.splits else None
    unseen = warn_unseen_labels(ds)
    for name, record in s.methods.items():  # every method's checks before any training
        method_class(name).plan(train, record, ctx)
    clock.lap("load_data")
    ctx.loggers = build_loggers(cfg, s.records()) if ctx.is_rank_zero else []
    inv_prop = propensity(train.Y)
    results, predictions, reports, main = {}, {}, {}, None
    for name, record in s.methods.items():
        model = method_class(name).fit(train, settings=record, validation=validation, context=ctx)
        clock.lap(f"{name}_train")
        if model is None:
            continue  # a DDP helper process: it only shares the fine-tuning
        start = time.perf_counter()
        ev = model.evaluate(evalset, inv_propensity=inv_prop)
        clock.lap(f"{name}_predict")
        predictions[name], results[name] = ev.predictions, ev.metrics
        results |= ev.diagnostics
        reports[name] = model.report | {
            "predict_docs_per_s": round(len(evalset) / max(time.perf_counter() - start, 1e-9), 2)
        }
        save_model(model, out_dir, ds, s)
        main, model = (model if name == s.method else main), None  # let go of a model the run no longer needs
    if not ctx.is_rank_zero:
        return {}
    if s.combined:
        both = combine_with_xrlinear(main, out_dir / "model", s)
        predictions[both.method] = both.combine([predictions[s.method], predictions["xrlinear"]])
        results[both.method] = evaluate(evalset.Y, predictions[both.method], inv_propensity=inv_prop)
    save_json({"main": s.method, "methods": list(predictions)}, out_dir / "model" / INDEX)
    clock.lap("combine_and_save")
    metrics = run_metrics(cfg, s, ds, results, reports, clock, ctx, unseen)
    metrics["label_groups"] = {
        name: group_metrics(evalset.Y, p, train.Y.getnnz(axis=0)) for name, p in predictions.items()
    }
    log.info("%s by label group: %s", s.method, group_line(metrics["label_groups"][s.method]))
    write_run_outputs(out_dir, ds, predictions, s.method, ds.eval_split, metrics)
    for name, res in results.items():
        if isinstance(res, dict) and "P@1" in res:
            log.info("%s on %s: %s", name, ds.eval_split, format_metrics_table(res, REPORT_KEYS))
    log_final(ctx.loggers, metrics, out_dir)
    return metrics


def save_model(model: XMCModel, out_dir: Path, ds: Any, s: RunSettings) -> None:
    """The run's model folder of ``model`` (with the data it was trained on), and its tree's plots."""
    model.train_settings |= {"dataset": ds.name, "data": s.data.training_settings(), "seed": s.seed}
    model.save(out_dir / "model" / model.method)
    chain = getattr(model, "chain", None)
    if chain is not None and model.method != "xrlinear":
        from xtransformer.indexing import save_quality_plots

        save_quality_plots(out_dir / "plots", ds.splits["train"].Y, chain, title=ds.name)


def combine_with_xrlinear(main: XMCModel, model_dir: Path, s: RunSettings) -> Combination:
    """``<main>+xrlinear``: the main model with XR-Linear read back from its folder (the run let
    go of it while the main method trained), saved beside them."""
    xrlinear = XMCModel.load(model_dir / "xrlinear", verify=False)
    both = Combination([main, xrlinear], method=s.combine_with_xrlinear, weights=s.combine_weights())
    both.save(model_dir / both.method)
    return both


def run_metrics(
    cfg: DictConfig,
    s: RunSettings,
    ds: Any,
    results: dict[str, Any],
    reports: dict[str, Any],
    clock: Clock,
    ctx: TrainContext,
    unseen: dict[str, Any],
) -> dict[str, Any]:
    """``metrics.json``: the results, what each fit did, timings, memory, settings and stages."""
    main = reports[s.method]
    index = main.get("index", {}) | (
        {"xrlinear": reports["xrlinear"]["index"]} if s.method != "xrlinear" and "xrlinear" in reports else {}
    )
    timings = clock.laps | {f"stage/{k}": v for k, v in ctx.cache.seconds.items()}
    return {
        "method": s.method,
        "dataset": ds.name,
        "eval_split": ds.eval_split,
        "seed": s.seed,
        "metrics": results[s.method],
        "results": results,
        "levels": main.get("levels", []),  # XR-Transformer: clusters, steps, seconds and cluster recall per level
        "reports": {
            name: {k: v for k, v in r.items() if k not in ("stage_keys", "levels")} for name, r in reports.items()
        },
        "index": index,
        "timings_s": timings | {"total": round(time.perf_counter() - clock.start, 3)},
        "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3),
        "settings": s.records(),  # what the stage keys and the model folders were made of
        "stages": {
            "ran": ctx.cache.ran(),
            "reused": ctx.cache.reused(),
            "corrupt_rebuilt": ctx.cache.corrupt(),
            "keys": {name: r.get("stage_keys", {}) for name, r in reports.items()},
            "cache": s.cache,
        },
        "dataset_summary": ds.summary(),
        "unseen_eval_labels": unseen,  # eval labels no training document has: they cap P@k and R@k
        "config": OmegaConf.to_container(cfg, resolve=True),
    }


def group_line(groups: dict[str, dict]) -> str:
    """``frequent (n labels): RP@5 .. nDCG@5 .. | few ... | zero ...`` (the groups with documents)."""
    return " | ".join(
        f"{name} ({g['n_labels']} labels, {g['n_docs']} docs): RP@5 {g['RP@5']:.2f} nDCG@5 {g['nDCG@5']:.2f}"
        for name, g in groups.items()
        if g["n_docs"]
    )


def write_run_outputs(
    out_dir: Path, ds: Any, predictions: dict[str, Any], main: str, split: str, metrics: dict[str, Any]
) -> None:
    """The files ``xtransformer.ensemble`` and the sweep aggregator read from a run folder:
    ``predictions/{split}.npz`` is the main method's, ``predictions/{method}/{split}.npz`` each one's."""
    out_dir.mkdir(parents=True, exist_ok=True)
    save_csr(predictions[main], out_dir / "predictions" / f"{split}.npz")
    for name, pred in predictions.items():
        save_csr(pred, out_dir / "predictions" / name / f"{split}.npz")
    save_csr(ds.splits[split].Y, out_dir / "truth" / f"{split}.npz")
    ds.vocab.save(out_dir / "label_vocab.txt")
    save_json(metrics, out_dir / "metrics.json")
