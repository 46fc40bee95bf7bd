"""Sweep folders -> one row per run: its configuration descriptor, seed and metrics.

Every run folder holds the ``metrics.json`` written by ``xtransformer.pipeline.run`` (method,
dataset, seed, ``metrics`` of the main method and the resolved Hydra ``config``); every ensemble
folder holds one written by ``xtransformer.ensemble`` (``"method": "ensemble"``, ``members``,
``ensemble_method``, ``metrics``). :func:`scan_runs` finds them and turns each into a flat row:
a configuration descriptor (dataset, method, indexing, matcher, ranker features, negatives, plus
any other resolved-config leaf that differs between runs, :func:`varying_keys`), the seed and
the metrics.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.json"
CNN_METHODS = ("kimcnn", "xmlcnn")  # the deep baselines: their descriptor's matcher is the network

# The fixed part of every row's configuration descriptor, in display order.
DESCRIPTOR_KEYS = (
    "dataset",
    "method",
    "eval_split",
    "indexing",
    "matcher",
    "ranker_features",
    "negatives",
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
    "seed",
    "*.seed",
    "paths.*",
    "hydra.*",
    "logger.*",
    "*_dir",
    "*timestamp*",
    "cache",
    "train_xrlinear",
    "combine_with_xrlinear",
    "combine_weight",
    "baseline",
    "combine_with_baseline",
    "task_name",
    "published",  # the papers' rows a run is set beside: shown as rows of their own, not a setting
)
# A leaf whose value looks like a time stamp (Hydra's ${now:...} folders) is not a setting either.
TIMESTAMP_RE = re.compile(r"\d{4}-\d{2}-\d{2}[_T ]\d{2}[-:]\d{2}")
# Separates the distinct member values of an ensemble's descriptor field ("+" is taken by
# "tfidf+neural" and "tfn+man"; "|" would break Markdown tables).
MEMBER_SEP = ","
# XR-Linear clusters PIFA over TF-IDF by definition; used when its config does not say otherwise.
XRLINEAR_INDEXING = "pifa_tfidf"


class AggregateError(ValueError):
    """Nothing to aggregate or a bad argument; the message names the path, metric or key."""


class AggregateWarning(UserWarning):
    """Runs skipped while collecting, or a configuration seen twice with the same seed."""


# --------------------------------------------------------------------------- collecting runs


@dataclass
class RunScan:
    """What :func:`scan_runs` found: one row per readable run, the runs it had to skip, and the
    papers' published rows the runs name (``metrics.json``'s ``published``: id -> record)."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    published: dict[str, dict[str, Any]] = field(default_factory=dict)


def collect_runs(paths: Sequence[str | os.PathLike], ignore: Sequence[str] = DEFAULT_IGNORE) -> list[dict[str, Any]]:
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
        warnings.warn(f"skipped {len(scan.skipped)} incomplete run(s): {detail}", AggregateWarning, stacklevel=2)
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
        scan.published |= {k: v for k, v in _as_dict(doc.get("published")).items() if isinstance(v, dict)}
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
    elif method in CNN_METHODS:  # no tree, no rankers: the network is the whole model
        desc.update(matcher=_leaf(cfg, "cnn.name"))
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


def config_keys(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """Descriptor keys present in ``rows``: the fixed ones first, then extras in sorted order."""
    present = {k for r in rows for k in r if k not in RUN_KEYS}
    return [k for k in DESCRIPTOR_KEYS if k in present] + sorted(present - set(DESCRIPTOR_KEYS))
