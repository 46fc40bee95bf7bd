"""Aggregate sweep results into a Table-5-style report: mean ± std over seeds per configuration.

Every run folder holds the ``metrics.json`` written by ``xtransformer.pipeline.run`` (method,
dataset, seed, ``metrics`` of the main method and the resolved Hydra ``config``); every ensemble
folder holds one written by ``xtransformer.ensemble`` (``"method": "ensemble"``, ``members``,
``ensemble_method``, ``metrics``). This module

1. finds them under one or more sweep folders (:func:`scan_runs`, :func:`collect_runs`) and turns
   each into a flat row: a configuration descriptor (dataset, method, indexing, matcher, ranker
   features, negatives, plus any other resolved-config leaf that differs between runs), the seed
   and the metrics;
2. groups rows by configuration and averages over seeds (:func:`aggregate`), numbering the
   configurations like the paper's Table 5 when they match its rows (:func:`table5_row`);
3. renders Markdown, CSV and a P@k bar chart (:func:`to_markdown`, :func:`to_csv`,
   :func:`plot_p_at_k`, :func:`write_report`).

It imports neither Lightning nor Hydra, so it runs in a second anywhere the results are::

    python -m xtransformer.suite.aggregate outputs/train/multiruns/2026-01-01_00-00-00 [--out DIR]
"""

from __future__ import annotations

import argparse
import csv
import fnmatch
import io
import json
import math
import os
import re
import sys
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from xtransformer.utils.io import atomic_path

METRICS_FILE = "metrics.json"
DEFAULT_METRICS = ("P@1", "P@3", "P@5", "R@1", "R@3", "R@5")
PLOT_METRICS = ("P@1", "P@3", "P@5")
REPORT_FILES = {"md": "results.md", "csv": "results.csv", "png": "results_p_at_k.png"}

# The fixed part of every row's configuration descriptor, in display order.
DESCRIPTOR_KEYS = (
    "dataset", "method", "eval_split", "indexing", "matcher", "ranker_features", "negatives",
    "ensemble_method",
)
# Row keys that are not configuration; aggregated rows add STAT_KEYS instead.
RUN_KEYS = ("seed", "run_dir", "metrics")
STAT_KEYS = ("config_id", "paper_row", "n_seeds", "seeds", "run_dirs", "mean", "std")

# Config leaves the fixed descriptor already carries: never reported again as "extra" keys.
MIRRORED_LEAVES = frozenset(
    {"method", "data.name", "indexing.name", "matcher.name", "ranker.features", "ranker.negatives"}
)
# Config leaves (fnmatch on the dotted path) that never define a configuration: the seed, where
# things are written or logged, cache switches, and the XR-Linear switches (they add the TF-IDF
# model next to the main one without changing the main method's numbers; old names too).
DEFAULT_IGNORE = (
    "seed", "*.seed", "paths.*", "hydra.*", "logger.*", "*_dir", "*timestamp*", "cache",
    "train_xrlinear", "combine_with_xrlinear", "baseline", "combine_with_baseline", "task_name",
)
# A leaf whose value looks like a time stamp (Hydra's ${now:...} folders) is not a setting either.
TIMESTAMP_RE = re.compile(r"\d{4}-\d{2}-\d{2}[_T ]\d{2}[-:]\d{2}")
# Separates the distinct member values of an ensemble's descriptor field ("+" is taken by
# "tfidf+neural" and "tfn+man"; "|" would break Markdown tables).
MEMBER_SEP = ","
# XR-Linear clusters PIFA over TF-IDF by definition; used when its config does not say otherwise.
XRLINEAR_INDEXING = "pifa_tfidf"
METHOD_ORDER = {"xtransformer": 0, "ensemble": 1, "xrlinear": 2}


class AggregateError(ValueError):
    """Nothing to aggregate or a bad argument; the message names the path, metric or key."""


class AggregateWarning(UserWarning):
    """Runs skipped while collecting, or a configuration seen twice with the same seed."""


# --------------------------------------------------------------------------- collecting runs


@dataclass
class RunScan:
    """What :func:`scan_runs` found: one row per readable run and the runs it had to skip."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[tuple[Path, str]] = field(default_factory=list)


def collect_runs(
    paths: Sequence[str | os.PathLike], ignore: Sequence[str] = DEFAULT_IGNORE
) -> list[dict[str, Any]]:
    """Rows for every run under ``paths``; warns about (and counts) incomplete ones.

    Each row is flat: the descriptor keys (:data:`DESCRIPTOR_KEYS` plus dotted config paths that
    vary between runs), ``seed``, ``run_dir`` and ``metrics`` (name -> float). Raises
    :class:`AggregateError` when no run is found.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    scan = scan_runs(paths, ignore=ignore)
    if scan.skipped:
        detail = "; ".join(f"{p}: {why}" for p, why in scan.skipped)
        warnings.warn(f"skipped {len(scan.skipped)} incomplete run(s): {detail}", AggregateWarning,
                      stacklevel=2)
    _require_runs(scan, paths)
    return scan.rows


def scan_runs(paths: Sequence[str | os.PathLike], ignore: Sequence[str] = DEFAULT_IGNORE) -> RunScan:
    """Like :func:`collect_runs` but silent: returns the rows and the skipped runs with reasons."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    files, incomplete = _find_metric_files([Path(p) for p in paths])
    scan = RunScan(skipped=[(d, f"no {METRICS_FILE}") for d in incomplete])
    docs: dict[Path, dict[str, Any]] = {}
    for f in files:
        try:
            docs[f.parent] = _read_run_doc(f)
        except (OSError, ValueError) as err:  # JSONDecodeError is a ValueError
            scan.skipped.append((f.parent, f"unreadable {METRICS_FILE}: {err}"))
    runs = {d: doc for d, doc in docs.items() if doc.get("method") != "ensemble"}
    base = {d: _run_descriptor(doc) for d, doc in runs.items()}
    leaves = {d: flatten_config(_as_dict(doc.get("config"))) for d, doc in runs.items()}
    extra = varying_keys([leaves[d] for d in runs], [base[d] for d in runs], ignore)
    known = {d: (base[d], _seed(doc)) for d, doc in runs.items()}
    for d, doc in docs.items():
        if d in runs:
            desc = {**base[d], **{_extra_name(k): leaves[d].get(k) for k in extra}}
            seed = _seed(doc)
        else:
            desc, seed = _ensemble_descriptor(d, doc, known)
            desc.update({_extra_name(k): None for k in extra})
        scan.rows.append({**desc, "seed": seed, "run_dir": str(d), "metrics": _numeric(doc["metrics"])})
    return scan


def _require_runs(scan: RunScan, paths: Sequence[str | os.PathLike]) -> None:
    if not scan.rows:
        where = ", ".join(str(p) for p in paths)
        extra = f" ({len(scan.skipped)} incomplete run(s) skipped)" if scan.skipped else ""
        raise AggregateError(f"no run found under {where}: no readable {METRICS_FILE}{extra}")


def _find_metric_files(paths: list[Path]) -> tuple[list[Path], list[Path]]:
    """``metrics.json`` files under ``paths``, and run folders that have none (incomplete runs).

    A folder is a run when it holds ``metrics.json``, a Hydra ``.hydra`` folder, or is a numbered
    job of a multirun (its parent holds ``multirun.yaml``). Hidden folders (``.hydra``, atomic
    temporaries) and the inside of run folders are not searched.
    """
    files: set[Path] = set()
    incomplete: set[Path] = set()
    for path in paths:
        if not path.exists():
            raise AggregateError(f"sweep folder {path} does not exist")
        if path.is_file():
            files.add(path.resolve())
            continue
        for root_str, dirs, names in os.walk(path):
            root = Path(root_str)
            if METRICS_FILE in names:
                files.add((root / METRICS_FILE).resolve())
                dirs[:] = []  # a run folder's insides (predictions, plots, wandb) hold no runs
                continue
            if ".hydra" in dirs or (root.name.isdigit() and (root.parent / "multirun.yaml").is_file()):
                incomplete.add(root.resolve())
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
    return sorted(files), sorted(incomplete)


def _read_run_doc(path: Path) -> dict[str, Any]:
    doc = json.loads(path.read_text())
    if not isinstance(doc, dict) or not isinstance(doc.get("metrics"), dict):
        raise ValueError("not a run's metrics file (no 'metrics' mapping)")
    return doc


def _as_dict(obj: Any) -> dict[str, Any]:
    return obj if isinstance(obj, dict) else {}


def _numeric(metrics: Mapping[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _seed(doc: Mapping[str, Any]) -> int | None:
    seed = doc.get("seed", _as_dict(doc.get("config")).get("seed"))
    return int(seed) if isinstance(seed, (int, float)) and not isinstance(seed, bool) else None


def _leaf(cfg: Mapping[str, Any], dotted: str) -> Any:
    """A scalar config value at a dotted path, or None when absent or not a scalar."""
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node if isinstance(node, (str, int, float, bool)) else None


def _run_descriptor(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The fixed descriptor of one (non-ensemble) run; missing config fields become None."""
    cfg = _as_dict(doc.get("config"))
    method = doc.get("method") or _leaf(cfg, "method")
    desc: dict[str, Any] = dict.fromkeys(DESCRIPTOR_KEYS)
    desc.update(
        dataset=doc.get("dataset") or _leaf(cfg, "data.name"),
        method=method,
        eval_split=doc.get("eval_split") or _leaf(cfg, "data.eval_split"),
    )
    if method == "xrlinear":  # no matcher; the ranker sees TF-IDF only
        desc.update(
            indexing=_leaf(cfg, "xrlinear.indexing") or XRLINEAR_INDEXING,
            ranker_features="tfidf",
            negatives=_leaf(cfg, "xrlinear.negatives"),
        )
    else:
        desc.update(
            indexing=_leaf(cfg, "indexing.name"),
            matcher=_leaf(cfg, "matcher.name"),
            ranker_features=_leaf(cfg, "ranker.features"),
            negatives=_leaf(cfg, "ranker.negatives"),
        )
    return desc


def _ensemble_descriptor(
    folder: Path, doc: Mapping[str, Any], known: Mapping[Path, tuple[dict[str, Any], int | None]]
) -> tuple[dict[str, Any], int | None]:
    """An ensemble's descriptor: each field is its members' distinct values joined by ``MEMBER_SEP``.

    Members are looked up among the runs already scanned, else read from their folders; a member
    that cannot be read contributes nothing (its fields stay unknown).
    """
    members = [m for m in (_member_info(folder, p, known) for p in doc.get("members") or []) if m]

    def joined(key: str) -> str | None:
        values = sorted({str(d[key]) for d, _ in members if d.get(key) is not None})
        return MEMBER_SEP.join(values) or None

    desc: dict[str, Any] = {k: joined(k) for k in DESCRIPTOR_KEYS}
    desc.update(
        dataset=doc.get("dataset") or desc["dataset"],
        eval_split=doc.get("eval_split") or desc["eval_split"],
        method="ensemble",
        ensemble_method=doc.get("ensemble_method"),
    )
    seed = _seed(doc)
    member_seeds = {s for _, s in members}
    if seed is None and len(member_seeds) == 1:  # an ensemble of one seed's runs has that seed
        seed = member_seeds.pop()
    return desc, seed


def _member_info(
    folder: Path, member: Any, known: Mapping[Path, tuple[dict[str, Any], int | None]]
) -> tuple[dict[str, Any], int | None] | None:
    path = Path(str(member))
    candidates = [path] if path.is_absolute() else [folder / path, Path.cwd() / path]
    for cand in candidates:
        cand = cand.resolve()
        if cand.is_file():  # a member given as its metrics.json
            cand = cand.parent
        if cand in known:
            return known[cand]
        try:
            doc = _read_run_doc(cand / METRICS_FILE)
        except (OSError, ValueError):
            continue
        return _run_descriptor(doc), _seed(doc)
    return None


# --------------------------------------------------------------------------- varying config keys


def flatten_config(cfg: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted-path leaves of a nested config; lists become JSON text so that values are hashable."""
    out: dict[str, Any] = {}
    for key, value in cfg.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten_config(value, prefix=f"{path}."))
        elif isinstance(value, (list, tuple)):
            out[path] = json.dumps(value, sort_keys=True, default=str)
        else:
            out[path] = value
    return out


def varying_keys(
    leaves: Sequence[Mapping[str, Any]],
    descriptors: Sequence[Mapping[str, Any]],
    ignore: Sequence[str] = DEFAULT_IGNORE,
) -> list[str]:
    """Config leaves that differ between runs and tell configurations apart.

    Skipped: leaves the descriptor mirrors, leaves matching an ``ignore`` pattern or holding a time
    stamp, and leaves fully determined by the fixed descriptor (``ranker.name`` follows from the
    ranker's features and negatives; ``matcher.model_name_or_path`` from ``matcher.name``): they
    would repeat a column without splitting any group.
    """
    base = [tuple(d.get(k) for k in DESCRIPTOR_KEYS) for d in descriptors]
    out = []
    for key in sorted(set().union(*leaves)) if leaves else []:
        if key in MIRRORED_LEAVES or any(fnmatch.fnmatchcase(key, pat) for pat in ignore):
            continue
        values = [leaf.get(key) for leaf in leaves]
        if len(set(values)) < 2 or any(isinstance(v, str) and TIMESTAMP_RE.search(v) for v in values):
            continue
        if not _is_function_of(base, values):
            out.append(key)
    return out


def _is_function_of(keys: Sequence[Any], values: Sequence[Any]) -> bool:
    seen: dict[Any, Any] = {}
    return all(seen.setdefault(k, v) == v for k, v in zip(keys, values))


def _extra_name(key: str) -> str:
    # a top-level config leaf may share a name with a descriptor or run key
    return f"config.{key}" if key in DESCRIPTOR_KEYS or key in RUN_KEYS or key in STAT_KEYS else key


# --------------------------------------------------------------------------- aggregation


def config_keys(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """Descriptor keys present in ``rows``: the fixed ones first, then extras in sorted order."""
    present = {k for r in rows for k in r if k not in RUN_KEYS}
    return [k for k in DESCRIPTOR_KEYS if k in present] + sorted(present - set(DESCRIPTOR_KEYS))


def aggregate(
    rows: Sequence[Mapping[str, Any]],
    metrics: Sequence[str] = DEFAULT_METRICS,
    group_by: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """One row per configuration (all descriptor keys, or ``group_by``): mean and std over seeds.

    Each output row holds the grouping keys, ``config_id`` (Table 5 numbering where the grid
    matches it, else sequential; per dataset), ``paper_row``, ``n_seeds`` (runs averaged),
    ``seeds``, ``run_dirs``, ``mean`` and ``std`` (metric -> value; std is the sample std, ddof=1,
    and None with a single run). Rows come sorted by dataset, then config id.
    """
    if not rows:
        raise AggregateError("aggregate: no runs to aggregate (rows is empty)")
    metrics = tuple(metrics)
    available = set().union(*(r["metrics"] for r in rows))
    missing = [m for m in metrics if m not in available]
    if missing:
        raise AggregateError(f"metrics {missing} are in no run; available: {sorted(available)}")
    keys = config_keys(rows)
    if group_by is not None:
        unknown = [k for k in group_by if k not in keys]
        if unknown:
            raise AggregateError(f"group_by keys {unknown} are not configuration keys; available: {keys}")
        keys = list(group_by)
    groups: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(row.get(k) for k in keys), []).append(row)
    out = []
    for key, members in groups.items():
        config = dict(zip(keys, key))
        seeds = [m.get("seed") for m in members]
        repeated = sorted({s for s in seeds if s is not None and seeds.count(s) > 1})
        if repeated and group_by is None:  # an explicit group_by merges configurations on purpose
            warnings.warn(f"configuration {config} has several runs with seed(s) {repeated}: all are averaged",
                          AggregateWarning, stacklevel=2)
        out.append(_summarise(config, members, metrics))
    return assign_config_ids(out)


def _summarise(config: dict[str, Any], members: Sequence[Mapping[str, Any]], metrics: Sequence[str]) -> dict[str, Any]:
    seeds = [m.get("seed") for m in members]
    stats = {m: mean_std([r["metrics"].get(m) for r in members]) for m in metrics}
    return {
        **config,
        "n_seeds": len(members),
        "seeds": sorted(seeds, key=_sort_value),
        "run_dirs": sorted(str(m.get("run_dir")) for m in members),
        "mean": {m: s[0] for m, s in stats.items()},
        "std": {m: s[1] for m, s in stats.items()},
    }


def mean_std(values: Iterable[float | None]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (ddof=1) of the finite values; None where undefined."""
    arr = np.array([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    mean = float(arr.mean()) if arr.size else None
    std = float(arr.std(ddof=1)) if arr.size > 1 else None
    return mean, std


# --------------------------------------------------------------------------- Table 5 numbering


ALL = "all"  # an ensemble row whose members span more than one value


@dataclass(frozen=True)
class Table5Row:
    """One row of the paper's Table 5 ablation, in normalised names."""

    id: int
    indexing: str
    matcher: str
    features: frozenset[str] = frozenset({"tfidf", "neural"})
    negatives: frozenset[str] = frozenset({"tfn", "man"})
    ensemble: bool = False


TABLE5 = (
    Table5Row(0, "pifa_tfidf", "BERT", features=frozenset({"tfidf"}), negatives=frozenset({"tfn"})),
    Table5Row(1, "pifa_tfidf", "BERT", negatives=frozenset({"tfn"})),
    Table5Row(2, "pifa_tfidf", "BERT"),
    Table5Row(3, "pifa_tfidf", "RoBERTa"),
    Table5Row(4, "pifa_tfidf", "XLNet"),
    Table5Row(5, "pifa_neural", "XLNet"),
    Table5Row(6, "text_emb", "XLNet"),
    Table5Row(7, ALL, "XLNet", ensemble=True),
    Table5Row(8, "pifa_neural", ALL, ensemble=True),
    Table5Row(9, ALL, ALL, ensemble=True),
)

# Substrings of our model names -> the paper's Transformer families (checked in order: "roberta"
# contains "bert"). all-MiniLM-L6-v2 is a BertModel, our offline stand-in for BERT.
MATCHER_FAMILIES = (("roberta", "RoBERTa"), ("xlnet", "XLNet"), ("bert", "BERT"), ("minilm", "BERT"))
INDEXING_ALIASES = {"pifa": "pifa_tfidf", "text_embedding": "text_emb", "label_text_emb": "text_emb"}


def matcher_family(name: Any) -> str:
    """``bert``, ``bert_base``, ``tiny_bert``, ``minilm`` -> ``BERT``; ``roberta*`` -> ``RoBERTa``; ..."""
    text = str(name).lower()
    return next((fam for needle, fam in MATCHER_FAMILIES if needle in text), text)


def normalise_indexing(name: Any) -> str:
    text = re.sub(r"[-\s]+", "_", str(name).lower())
    return INDEXING_ALIASES.get(text, text)


def _token_set(name: Any) -> frozenset[str]:
    """``tfidf+neural`` / ``tfidf_neural`` / ``TF-IDF + neural`` -> {tfidf, neural}."""
    return frozenset(t for t in re.split(r"[^a-z]+", str(name).lower().replace("tf-idf", "tfidf")) if t)


def _members(value: Any) -> list[str]:
    return [] if value is None else str(value).split(MEMBER_SEP)


def _matches(values: set[str], wanted: str) -> bool:
    return len(values) > 1 if wanted == ALL else values == {wanted}


def table5_row(desc: Mapping[str, Any]) -> int | None:
    """The paper's Table 5 config id this descriptor matches, or None.

    Model names match by family (see :data:`MATCHER_FAMILIES`); for ensembles "all" means the
    members span more than one indexing (or matcher family). Extra config keys are not compared.
    """
    method = desc.get("method")
    indexing = {normalise_indexing(v) for v in _members(desc.get("indexing"))}
    families = {matcher_family(v) for v in _members(desc.get("matcher"))}
    features = {_token_set(v) for v in _members(desc.get("ranker_features"))}
    negatives = {_token_set(v) for v in _members(desc.get("negatives"))}
    for row in TABLE5:
        if (
            method == ("ensemble" if row.ensemble else "xtransformer")
            and _matches(indexing, row.indexing)
            and _matches(families, row.matcher)
            and features == {row.features}
            and negatives == {row.negatives}
        ):
            return row.id
    return None


def assign_config_ids(agg: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Number configurations per dataset, like Table 5 where they match its rows.

    When at least one configuration matches a Table 5 row and no two match the same row, matched
    ones keep the paper's id and the others follow from 10 on; otherwise ids run 0, 1, ... (still
    in Table 5 order where rows match). Returns the rows sorted by dataset, then id.
    """
    blocks: dict[str, list[dict[str, Any]]] = {}
    for row in agg:
        row["paper_row"] = table5_row(row)
        blocks.setdefault(str(row.get("dataset")), []).append(row)
    out: list[dict[str, Any]] = []
    for name in sorted(blocks):
        block = sorted(blocks[name], key=_row_sort_key)
        matched = [r["paper_row"] for r in block if r["paper_row"] is not None]
        use_paper = bool(matched) and len(set(matched)) == len(matched)
        next_id = len(TABLE5) if use_paper else 0
        for row in block:
            if use_paper and row["paper_row"] is not None:
                row["config_id"] = row["paper_row"]
            else:
                row["config_id"], next_id = next_id, next_id + 1
        out.extend(sorted(block, key=lambda r: r["config_id"]))
    return out


def _sort_value(value: Any) -> tuple[int, Any]:
    # numbers numerically, then text, then unknown: a total order over mixed values
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, value)
    return (2, "") if value is None else (1, str(value))


def _row_sort_key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    paper = row.get("paper_row")
    rest = tuple(_sort_value(row[k]) for k in sorted(row) if k not in STAT_KEYS)
    return (paper is None, paper or 0, METHOD_ORDER.get(str(row.get("method")), len(METHOD_ORDER)), rest)


# --------------------------------------------------------------------------- rendering

# Table 5's columns: (row key, header).
TABLE_COLUMNS = (
    ("dataset", "Dataset"),
    ("config_id", "Config. ID"),
    ("indexing", "indexing"),
    ("matcher", "matching"),
    ("ranker_features", "ranker input"),
    ("negatives", "negative-sampling"),
)


def _aggregated_metrics(agg: Sequence[Mapping[str, Any]], metrics: Sequence[str] | None) -> list[str]:
    """``metrics``, or all those aggregated; a metric that was not aggregated is an error."""
    done = list(dict.fromkeys(m for r in agg for m in r["mean"]))
    if metrics is None:
        return done
    missing = [m for m in metrics if m not in done]
    if missing:
        raise AggregateError(f"metrics {missing} were not aggregated; pass them to aggregate() (have {done})")
    return list(metrics)


def _cell(key: str, value: Any) -> str:
    if value is None:
        return "—"
    text = str(value)
    return text.upper() if key == "negatives" else text


def format_mean_std(mean: float | None, std: float | None, digits: int = 2) -> str:
    if mean is None:
        return "—"
    return f"{mean:.{digits}f}" if std is None else f"{mean:.{digits}f} ± {std:.{digits}f}"


def extra_columns(agg: Sequence[Mapping[str, Any]]) -> list[str]:
    """Descriptor keys outside Table 5's columns whose values differ between configurations."""
    shown = {k for k, _ in TABLE_COLUMNS}
    keys = [k for k in config_keys(agg) if k not in shown and k not in STAT_KEYS]
    return [k for k in keys if len({_sort_value(r.get(k)) for r in agg}) > 1]


def to_markdown(agg: Sequence[Mapping[str, Any]], metrics: Sequence[str] | None = None, digits: int = 2) -> str:
    """A Markdown table laid out like the paper's Table 5, metrics as "mean ± std", plus seeds.

    ``metrics`` defaults to every metric that was aggregated.
    """
    metrics = _aggregated_metrics(agg, metrics)
    extras = extra_columns(agg)
    header = [h for _, h in TABLE_COLUMNS] + extras + list(metrics) + ["seeds"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for row in agg:
        cells = [_cell(k, row.get(k)) for k, _ in TABLE_COLUMNS] + [_cell(k, row.get(k)) for k in extras]
        cells += [format_mean_std(row["mean"].get(m), row["std"].get(m), digits) for m in metrics]
        cells.append(str(row["n_seeds"]))
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def to_csv(agg: Sequence[Mapping[str, Any]], metrics: Sequence[str] | None = None) -> str:
    """CSV: config columns, ``n_seeds``, ``seeds``, then ``<metric>_mean`` and ``<metric>_std``."""
    metrics = _aggregated_metrics(agg, metrics)
    keys = [k for k in config_keys(agg) if k not in STAT_KEYS and k != "dataset"]
    header = ["dataset", "config_id", "paper_row", *keys, "n_seeds", "seeds"]
    header += [f"{m}_{stat}" for m in metrics for stat in ("mean", "std")] + ["run_dirs"]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    for row in agg:
        values = [row.get(k) for k in ("dataset", "config_id", "paper_row", *keys, "n_seeds")]
        values.append(" ".join(str(s) for s in row["seeds"]))
        values += [row[stat].get(m) for m in metrics for stat in ("mean", "std")]
        values.append(";".join(row["run_dirs"]))
        writer.writerow(["" if v is None else v for v in values])
    return buf.getvalue()


def plot_p_at_k(
    agg: Sequence[Mapping[str, Any]], path: str | os.PathLike, metrics: Sequence[str] = PLOT_METRICS
) -> Path:
    """Grouped bar chart of ``metrics`` per configuration id with std error bars; one panel per dataset."""
    # Figure + Agg canvas, not pyplot: no global backend switch, safe next to other plotting code.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    metrics = [m for m in metrics if any(r["mean"].get(m) is not None for r in agg)]
    if not agg or not metrics:
        raise AggregateError(f"plot_p_at_k: nothing to plot (no configuration has any of {list(metrics)})")
    datasets = list(dict.fromkeys(str(r.get("dataset")) for r in agg))
    widest = max(sum(str(r.get("dataset")) == d for r in agg) for d in datasets)
    fig = Figure(figsize=(max(5.0, 0.2 * widest * len(metrics) + 2.5), 3.2 * len(datasets)))
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(datasets), 1, squeeze=False)[:, 0]
    width = 0.8 / len(metrics)
    for ax, dataset in zip(axes, datasets):
        block = [r for r in agg if str(r.get("dataset")) == dataset]
        x = np.arange(len(block))
        for j, metric in enumerate(metrics):
            means = [np.nan if r["mean"].get(metric) is None else r["mean"][metric] for r in block]
            errs = [r["std"].get(metric) or 0.0 for r in block]
            ax.bar(x + (j - (len(metrics) - 1) / 2) * width, means, width, yerr=errs, capsize=3, label=metric)
        ax.set_xticks(x, [str(r["config_id"]) for r in block])
        ax.set(xlabel="config id", ylabel="%", title=dataset)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")  # never over the bars
    fig.tight_layout()
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    return path


def _write_text(text: str, path: Path) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return path


def write_report(
    agg: Sequence[Mapping[str, Any]],
    out_dir: str | os.PathLike,
    metrics: Sequence[str] | None = None,
    plot_metrics: Sequence[str] = PLOT_METRICS,
) -> dict[str, Path]:
    """Write ``results.md``, ``results.csv`` and ``results_p_at_k.png`` into ``out_dir`` atomically."""
    out = Path(out_dir)
    return {
        "md": _write_text(to_markdown(agg, metrics), out / REPORT_FILES["md"]),
        "csv": _write_text(to_csv(agg, metrics), out / REPORT_FILES["csv"]),
        "png": plot_p_at_k(agg, out / REPORT_FILES["png"], plot_metrics),
    }


# --------------------------------------------------------------------------- command line


def _name_list(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m xtransformer.suite.aggregate",
        description="Aggregate sweep folders (metrics.json per run) into a Table-5-style report: "
        "mean ± std over seeds per configuration, as Markdown, CSV and a P@k bar chart.",
    )
    parser.add_argument("sweep_dirs", nargs="+", type=Path, metavar="SWEEP_DIR",
                        help="sweep or run folders, searched recursively for metrics.json")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for results.md, results.csv, results_p_at_k.png (default: the first SWEEP_DIR)")
    parser.add_argument("--metrics", type=_name_list, default=list(DEFAULT_METRICS),
                        help=f"comma-separated metrics for the tables (default: {','.join(DEFAULT_METRICS)})")
    parser.add_argument("--ignore", type=_name_list, default=[],
                        help="extra comma-separated config-leaf patterns (fnmatch on dotted paths) that do "
                        "not distinguish configurations, e.g. 'trainer.devices,matcher.num_workers'")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        scan = scan_runs(args.sweep_dirs, ignore=(*DEFAULT_IGNORE, *args.ignore))
        for path, why in scan.skipped:
            print(f"skipped incomplete run {path}: {why}", file=sys.stderr)
        _require_runs(scan, args.sweep_dirs)
        plot_metrics = [m for m in PLOT_METRICS if any(m in r["metrics"] for r in scan.rows)]
        agg = aggregate(scan.rows, metrics=tuple(dict.fromkeys([*args.metrics, *plot_metrics])))
        first = args.sweep_dirs[0]
        out = args.out or (first.parent if first.is_file() else first)
        written = write_report(agg, out, args.metrics, plot_metrics)
    except AggregateError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(to_markdown(agg, args.metrics), end="")
    print(f"{len(scan.rows)} run(s), {len(agg)} configuration(s), {len(scan.skipped)} skipped; wrote "
          + ", ".join(str(p) for p in written.values()), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
