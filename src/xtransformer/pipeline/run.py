"""One run from the Hydra config: settings -> data -> ``fit`` -> evaluate -> save -> ``metrics.json``.

Every method the run trains (XR-Linear beside a neural method when ``train_xrlinear``, then the
main one) goes through its class's ``fit`` with one :class:`~xtransformer.context.TrainContext`
(the stage cache, the trainer, the loggers), is scored on the eval split through the same
``predict`` a saved folder uses, and is saved as a portable model folder. The run folder holds
``metrics.json``, ``predictions/{split}.npz`` (and per method), ``truth/{split}.npz``,
``label_vocab.txt``, plots and ``model/`` (``models.json`` names the methods and the main one).
With ``calibration=platt`` (or ``isotonic``) the run first holds ``calibration.holdout`` training
documents out of every model, and each trained model (and the combination) is calibrated on its
scores of them before it is scored and saved.
"""

from __future__ import annotations

import logging
import resource
import time
from dataclasses import dataclass, field
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
from xtransformer.metrics import format_metrics_table, group_metrics, propensity
from xtransformer.pipeline.loggers import build_loggers, log_final
from xtransformer.pipeline.settings import RunSettings, run_settings
from xtransformer.suite.published import published_lines, published_section
from xtransformer.utils.io import save_csr, save_json

log = logging.getLogger(__name__)

REPORT_KEYS = ("P@1", "P@3", "P@5", "R@1", "R@3", "R@5", "RP@5", "nDCG@5", "PSP@5")
DECISION_REPORT_KEYS = ("ECE", "micro-F1", "micro-F1 per-label")
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


@dataclass
class RunData:
    """What a run's methods read: the dataset, its training documents (without the held-out ones),
    the eval split, the validation documents, the calibration documents and the label propensities."""

    ds: Any
    train: LabeledData
    evalset: LabeledData
    validation: LabeledData | None
    held: LabeledData | None  # held out of every model, to fit the calibrators on (calibration.holdout)
    inv_prop: Any

    @classmethod
    def load(cls, s: RunSettings, ctx: TrainContext) -> RunData:
        ds = load_dataset(s.data, cache_dir=ctx.cache.base, given_tfidf=s.given_tfidf)
        log.info("dataset %s: %s", ds.name, {name: len(v) for name, v in ds.splits.items()})
        train, held = s.calibration.hold_out(LabeledData.from_split(ds, "train"))
        if held is not None:
            log.info("%d training documents held out to calibrate every model (seed %d)", len(held), s.calibration.seed)
        validation = LabeledData.from_split(ds, "dev") if "dev" in ds.splits else None
        evalset = LabeledData.from_split(ds, ds.eval_split)
        return cls(ds, train, evalset, validation, held, propensity(train.Y))


@dataclass
class Outcome:
    """Per method: its metrics, eval predictions, fit report, held-out scores and calibration."""

    results: dict[str, Any] = field(default_factory=dict)
    predictions: dict[str, Any] = field(default_factory=dict)
    reports: dict[str, Any] = field(default_factory=dict)
    held_out: dict[str, Any] = field(default_factory=dict)
    calibrations: dict[str, Any] = field(default_factory=dict)


def _run(cfg: DictConfig, s: RunSettings, ctx: TrainContext) -> dict[str, Any]:
    clock, out_dir = Clock(), Path(s.output_dir)
    data = RunData.load(s, ctx)
    unseen = warn_unseen_labels(data.ds)
    for name, record in s.methods.items():  # every method's checks before any training
        method_class(name).plan(data.train, record, ctx)
    clock.lap("load_data")
    ctx.loggers = build_loggers(cfg, s.records()) if ctx.is_rank_zero else []
    out, main = Outcome(), None
    for name, record in s.methods.items():
        if not ctx.is_rank_zero:  # a DDP helper process: it only shares the fine-tuning
            method_class(name).share_fit(data.train, settings=record, validation=data.validation, context=ctx)
            continue
        model = method_class(name).fit(data.train, settings=record, validation=data.validation, context=ctx)
        clock.lap(f"{name}_train")
        model = score_method(model, data, s, out, clock)
        save_model(model, out_dir, data.ds, s)
        main, model = (model if name == s.method else main), None  # let go of a model the run no longer needs
    if not ctx.is_rank_zero:
        return {}
    if s.combined:
        both = combine_with_xrlinear(main, out_dir / "model", s, data.held, out.held_out)
        pred = both.combine([out.predictions[s.method], out.predictions["xrlinear"]])
        out.predictions[both.method] = pred
        out.results[both.method] = both.score(data.evalset.Y, pred, data.inv_prop)
        if both.calibration is not None:
            out.calibrations[both.method] = both.calibration
    save_json({"main": s.method, "methods": list(out.predictions)}, out_dir / "model" / INDEX)
    clock.lap("combine_and_save")
    metrics = run_metrics(cfg, s, data.ds, out, clock, ctx, unseen)
    metrics["label_groups"] = label_groups_section(data, out)
    log.info("%s by label group: %s", s.method, group_line(metrics["label_groups"][s.method]))
    write_run_outputs(out_dir, data.ds, out.predictions, s.method, data.ds.eval_split, metrics)
    plot_calibration(out, data, s, out_dir / "plots")
    for name, res in out.results.items():
        if isinstance(res, dict) and "P@1" in res:
            log.info("%s on %s: %s", name, data.ds.eval_split, format_metrics_table(res, report_keys(res)))
    for line in published_lines(metrics.get("published", {}), metrics["metrics"]):
        log.info("%s", line)
    log_final(ctx.loggers, metrics, out_dir)
    return metrics


def score_method(model: XMCModel, data: RunData, s: RunSettings, out: Outcome, clock: Clock) -> XMCModel:
    """Calibrate ``model`` on the held-out documents (when the run holds some out), then score the
    eval split through its own ``evaluate``: metrics, predictions, its fit report. Returns the
    model the run keeps (the calibrated one)."""
    name = model.method
    if data.held is not None:
        out.held_out[name] = predict_documents(model, data.held)
        model = model.calibrate_scores(out.held_out[name], data.held.Y, s.calibration, s.calibration.source(data.held))
        out.calibrations[name] = model.calibration
        clock.lap(f"{name}_calibrate")
    start = time.perf_counter()
    ev = model.evaluate(data.evalset, inv_propensity=data.inv_prop)
    clock.lap(f"{name}_predict")
    out.predictions[name], out.results[name] = ev.predictions, ev.metrics
    out.results |= ev.diagnostics
    seconds = max(time.perf_counter() - start, 1e-9)
    out.reports[name] = model.training_run.report | {"predict_docs_per_s": round(len(data.evalset) / seconds, 2)}
    return model


def predict_documents(model: XMCModel, docs: LabeledData) -> Any:
    """``model``'s scores of ``docs`` (texts, or feature rows for a model trained on them)."""
    if model.reads_texts(docs):
        return model.predict_csr(docs.texts)
    return model.predict_features_csr(docs.features)


def report_keys(res: dict[str, Any]) -> tuple[str, ...]:
    """The log's columns: the ranking metrics, and a calibrated model's ECE and micro-F1."""
    return REPORT_KEYS + tuple(k for k in DECISION_REPORT_KEYS if k in res)


def save_model(model: XMCModel, out_dir: Path, ds: Any, s: RunSettings) -> None:
    """The run's model folder of ``model`` (with the data it was trained on), and its tree's plots."""
    model.train_settings |= {"dataset": ds.name, "data": s.data.training_settings(), "seed": s.seed}
    if s.calibration.enabled:
        model.train_settings["calibration"] = s.calibration.training_settings()
    model.save(out_dir / "model" / model.method)
    chain = getattr(model, "chain", None)
    if chain is not None and model.method != "xrlinear":
        from xtransformer.indexing import save_quality_plots

        save_quality_plots(out_dir / "plots", ds.splits["train"].Y, chain, title=ds.name)


def combine_with_xrlinear(
    main: XMCModel, model_dir: Path, s: RunSettings, held: LabeledData | None = None, held_out: Any = None
) -> Combination:
    """``<main>+xrlinear``: the main model with XR-Linear read back from its folder (the run let
    go of it while the main method trained), calibrated on the two members' held-out scores
    combined (when the run holds documents out), saved beside them."""
    xrlinear = XMCModel.load(model_dir / "xrlinear", verify=False)
    both = Combination([main, xrlinear], method=s.combine_with_xrlinear, weights=s.combine_weights())
    if held is not None:
        scores = both.combine([held_out[s.method], held_out["xrlinear"]])
        both = both.calibrate_scores(scores, held.Y, s.calibration, s.calibration.source(held))
    both.save(model_dir / both.method)
    return both


def plot_calibration(out: Outcome, data: RunData, s: RunSettings, plots: Path) -> None:
    """``plots/reliability.png``: every calibrated model's reliability diagram on the eval split."""
    if not out.calibrations:
        return
    from xtransformer.calibration import plot_reliability, reliability

    tables = {
        name: reliability(cal.probabilities(out.predictions[name]), data.evalset.Y, s.calibration.bins)
        for name, cal in out.calibrations.items()
    }
    title = f"{data.ds.name} {data.ds.eval_split}: {s.calibration.method} on {len(data.held)} held-out documents"
    plot_reliability(tables, plots / "reliability.png", title)


def run_metrics(
    cfg: DictConfig,
    s: RunSettings,
    ds: Any,
    out: Outcome,
    clock: Clock,
    ctx: TrainContext,
    unseen: dict[str, Any],
) -> dict[str, Any]:
    """``metrics.json``: the results, what each fit did, timings, memory, settings and stages (and,
    with calibration, how each model's calibrator was fitted)."""
    results, reports = out.results, out.reports
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
        **({"calibration": calibration_section(s, out)} if out.calibrations else {}),
        **({"published": published_section(s.published)} if s.published else {}),  # the papers' rows beside
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


def label_groups_section(data: RunData, out: Outcome) -> dict[str, Any]:
    """Each model's metrics over the frequent, few-shot and zero-shot labels of the eval split."""
    counts = data.train.Y.getnnz(axis=0)
    return {name: group_metrics(data.evalset.Y, pred, counts) for name, pred in out.predictions.items()}


def group_line(groups: dict[str, dict]) -> str:
    """``frequent (n labels): RP@5 .. nDCG@5 .. | few ... | zero ...`` (the groups with documents)."""
    return " | ".join(
        f"{name} ({g['n_labels']} labels, {g['n_docs']} docs): RP@5 {g['RP@5']:.2f} nDCG@5 {g['nDCG@5']:.2f}"
        for name, g in groups.items()
        if g["n_docs"]
    )


def calibration_section(s: RunSettings, out: Outcome) -> dict[str, Any]:
    """``metrics.json``'s ``calibration``: the held-out documents and each model's calibrator record
    (its parameters, the tuned threshold, its held-out ECE and F1 scores)."""
    c = s.calibration
    return {
        "method": c.method,
        "holdout": c.holdout,
        "seed": c.seed,
        "models": {name: cal.record for name, cal in out.calibrations.items()},
    }


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
