"""Helpers the tests share: where the project lies, the tiny pipeline run, hand-written data sets
and run folders (imported by name: ``tests/`` is on ``sys.path`` through its conftest)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from xtransformer.configuration import compose

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
FIXTURES = Path(__file__).resolve().parent / "fixtures"

# the whole pipeline on a slice of Reuters with a tiny random encoder: seconds, not minutes
TINY = [
    "data.max_docs=400",
    "matcher=tiny_bert",
    "matcher.max_steps=4",
    "matcher.batch_size=16",
    "matcher.max_length=32",
    "matcher.checkpoint_every_n_steps=2",
    "matcher.progress=false",
    "indexing.n_clusters=8",
    "tfidf.max_features=5000",
    "logger=csv",
]


def compose_run(overrides: list[str], tmp_path: Path):
    """The config of ``python train.py OVERRIDES`` with its cache and output under ``tmp_path``."""
    return compose([*overrides, f"paths.cache_dir={tmp_path / 'cache'}", f"paths.output_dir={tmp_path / 'run'}"])


def write_text_dataset(folder: Path, splits: dict[str, tuple[list[str], list[str]]], label_map=None, label_text=None):
    folder.mkdir(parents=True, exist_ok=True)
    for s, (texts, labels) in splits.items():
        (folder / f"{s}_texts.txt").write_text("".join(t + "\n" for t in texts))
        (folder / f"{s}_labels.txt").write_text("".join(y + "\n" for y in labels))
    if label_map is not None:
        (folder / "label_map.txt").write_text("".join(x + "\n" for x in label_map))
    if label_text is not None:
        (folder / "label_text.txt").write_text("".join(x + "\n" for x in label_text))
    return folder


def make_metrics(p1: float) -> dict[str, Any]:
    """Every metric derived from P@1 so that tests know each number: metric@k = p1 - k + 1 (+ offset)."""
    offset = {"P": 0.0, "R": -50.0, "nDCG": 1.0, "PSP": -10.0}
    out: dict[str, Any] = {f"{m}@{k}": p1 - (k - 1) + offset[m] for m in offset for k in range(1, 6)}
    out["n_docs"] = 300
    return out


def write_run(
    folder: Path,
    *,
    seed: int,
    p1: float,
    indexing: str = "pifa_tfidf",
    matcher: str = "bert",
    features: str = "tfidf+neural",
    negatives: str = "tfn+man",
    dataset: str = "eurlex57k",
    method: str = "xtransformer",
    lr: float = 5e-5,
) -> Path:
    """A run folder shaped like xtransformer.pipeline.run's: .hydra/ plus metrics.json."""
    (folder / ".hydra").mkdir(parents=True, exist_ok=True)
    metrics = make_metrics(p1)
    ranker_name = f"{features.replace('+', '_')}_{negatives.replace('+', '_')}"
    config = {
        "task_name": "train",
        "seed": seed,
        "method": method,
        "baseline": True,
        "cache": True,
        "data": {"name": dataset, "eval_split": "test", "dev_fraction": 0.1, "data_dir": f"/data/{seed}"},
        "tfidf": {"ngram_range": [1, 2], "max_features": 1000},
        "indexing": {"name": indexing, "nr_splits": 16},
        "matcher": {"name": matcher, "model_name_or_path": f"hub/{matcher}", "learning_rate": lr, "seed": seed},
        "ranker": {"name": ranker_name, "features": features, "negatives": negatives, "C": 1.0},
        "trainer": {"max_epochs": 1, "default_root_dir": str(folder)},
        "logger": {"name": "wandb", "run_name": f"{matcher}-{seed}"},
        "paths": {"output_dir": str(folder), "cache_dir": "/cache", "log_dir": "/logs"},
        "stamp": f"2026-01-0{seed + 1}_10-00-00",
    }
    doc = {
        "method": method,
        "dataset": dataset,
        "eval_split": "test",
        "seed": seed,
        "metrics": metrics,
        "results": {method: metrics, "xrlinear": make_metrics(p1 - 5), "matcher_cluster_recall": 0.9},
        "timings_s": {"total": 12.5},
        "peak_rss_gib": 1.2,
        "config": config,
    }
    (folder / "metrics.json").write_text(json.dumps(doc))
    return folder


def write_ensemble(folder: Path, members: list[Path], p1: float, relative: bool = False, **extra: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    names = [os.path.relpath(m, folder) if relative else str(m) for m in members]
    doc = {"method": "ensemble", "ensemble_method": "rank_average", "members": names, "metrics": make_metrics(p1)}
    doc.update(extra)
    (folder / "metrics.json").write_text(json.dumps(doc))
    return folder


TOY_LABEL_NAMES = [f"label {j}" for j in range(12)]


def write_xmc_base_toy(folder: Path, names: bool = True) -> Path:
    """The toy task (``tiny_models.toy_xmc``) in the xmc-base layout: its train + dev documents as
    train (128), its test (32), 12 labels, and the suite's TF-IDF as the given rows."""
    import scipy.sparse as sp
    from tiny_models import toy_xmc

    from xtransformer.data.tfidf import TfidfConfig, TfidfFeatures
    from xtransformer.data.xmcbase import write_xmc_base

    texts, Y, _ = toy_xmc()
    train_texts, train_Y = texts["train"] + texts["dev"], sp.vstack([Y["train"], Y["dev"]], format="csr")
    features, X = TfidfFeatures.fit(train_texts, TfidfConfig(min_df=1))
    return write_xmc_base(
        folder,
        texts={"train": train_texts, "test": texts["test"]},
        Y={"train": train_Y, "test": Y["test"]},
        label_names=TOY_LABEL_NAMES if names else None,
        tfidf={"train": X, "test": features.from_texts(texts["test"])},
    )
