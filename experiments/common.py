"""What the tuning studies share: settings, a finished run's models, held-out splits and result files.

A study runs as ``python -m experiments.<study>.bench_<name>`` from the repository root and imports
this module (``from ..common import ...``); the studies never import each other. Everything here goes
through ``xtransformer.api``, the package's surface for scripts: settings composed as ``train.py``
composes them (or read back from a run's ``metrics.json``), a run's model folders loaded with
``XMCModel.load``, models trained with ``fit`` and scored with ``predict_features_csr``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"  # the committed tables
WORK = ROOT / "benchmarks" / "work"  # scratch: kept embeddings, fold predictions (git-ignored)
METRICS = ("P@1", "P@3", "P@5", "nDCG@5")
EXPERIMENT = "eurlex57k_xr"  # the experiment whose settings a study's overrides amend, unless told otherwise
HYDRA_RUN = ["logger=none", "paths.output_dir=/tmp/xtransformer-experiments"]


# ---------------------------------------------------------------------------------------- settings
def compose_settings(overrides: Sequence[str] = (), experiment: str | None = EXPERIMENT) -> Any:
    """The run settings (``xtransformer.api.compose_settings``'s) of ``experiment`` plus the Hydra
    ``overrides``, as ``python train.py experiment=<experiment> <overrides>`` builds them
    (``experiment`` None or "": configs/train.yaml's defaults)."""
    from xtransformer.api import compose_settings as compose

    chosen = [f"experiment={experiment}"] if experiment else []
    return compose(*chosen, *HYDRA_RUN, *overrides)


def describe(experiment: str | None, overrides: Sequence[str] = ()) -> str:
    """How a table names the settings it used: ``experiment=NAME`` (or the defaults) and the overrides."""
    return " ".join([f"experiment={experiment}" if experiment else "configs/train.yaml's defaults", *overrides])


def experiment_options(ap: argparse.ArgumentParser, default: str = EXPERIMENT) -> None:
    """``--experiment NAME`` and Hydra overrides after the options (e.g. ``data=reuters21578``)."""
    ap.add_argument(
        "--experiment",
        default=default,
        help=f"the experiment whose settings the overrides amend (default {default}; '' for none)",
    )
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, as train.py takes them")


# ---------------------------------------------------------------------------------------- a finished run
class RunFolder:
    """A finished ``python train.py ...`` run: its settings (``metrics.json``'s config, read back
    into the typed records), its data and its model folders (``model/<method>``)."""

    def __init__(self, folder: str | Path):
        from xtransformer.api import run_settings

        self.folder = Path(folder)
        path = self.folder / "metrics.json"
        if not path.is_file():
            raise SystemExit(f"error: --run {folder}: no metrics.json (expected the output folder of a train.py run)")
        self.metrics = json.loads(path.read_text())
        self.settings = run_settings(self.metrics["config"])

    @cached_property
    def dataset(self) -> Any:
        """The run's dataset (``data`` as the run read it)."""
        from xtransformer.api import load_dataset

        return load_dataset(self.settings.data)

    def model(self, method: str) -> Any:
        """The run's model folder of ``method`` (``xrlinear``, ``xrtransformer``, ...), loaded."""
        from xtransformer.api import XMCModel

        if not (self.folder / "model" / method).is_dir():
            raise SystemExit(
                f"error: --run {self.folder}: no model/{method} (a run with method={method}, "
                "or with train_xrlinear=true for xrlinear)"
            )
        return XMCModel.load(self.folder, method)


def run_option(ap: argparse.ArgumentParser, what: str) -> None:
    ap.add_argument(
        "--run",
        type=Path,
        required=True,
        help=f"output folder of a finished `python train.py {what}` run (its model/ folders are loaded)",
    )


def same_tfidf(a: Any, b: Any) -> bool:
    """Whether two model folders hold the same TF-IDF vectoriser (their manifests' checksums)."""

    def files(m: Any) -> dict[str, str]:
        return {k: v for k, v in m.manifest["files"].items() if k.startswith("tfidf/")}

    return bool(files(a)) and files(a) == files(b)


def embeddings(model: Any, texts: Sequence[str], work: Path = WORK) -> np.ndarray:
    """A fine-tuned model's embeddings of ``texts`` (``model.embed`` with its own prediction
    settings: what its final model reads), kept in ``work/embeddings/`` under the model's files
    and the texts, so a rerun or another study reads them back instead of encoding again."""
    from xtransformer.api import settings_key, texts_fingerprint

    texts = list(texts)
    key = settings_key("embeddings", model.manifest["files"], model.predict_settings, texts_fingerprint(texts))
    path = work / "embeddings" / f"{key}.npy"
    if path.is_file():
        return np.load(path)
    t0 = time.perf_counter()
    emb, _ = model.embed(texts, model.predict_settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{key}.partial.npy")
    np.save(tmp, emb)
    tmp.replace(path)  # a killed run leaves no half-written file under the final name
    print(f"embedded {len(texts)} documents in {time.perf_counter() - t0:.0f} s", flush=True)
    return emb


def run_rows(run: RunFolder, work: Path = WORK) -> tuple[Any, Any, dict[str, sp.csr_matrix], dict[str, sp.csr_matrix]]:
    """A finished XR-Transformer run's two models (``xrtransformer``, ``xrlinear``) and, for its
    training documents and its eval split, XR-Linear's TF-IDF rows and the final model's rows."""
    ds = run.dataset
    splits = ("train", ds.eval_split)
    texts = {n: ds.splits[n].texts for n in splits}
    xrt, xrl = run.model("xrtransformer"), run.model("xrlinear")
    X = {n: xrl.tfidf.from_texts(texts[n]) for n in splits}
    X_xrt = X if same_tfidf(xrt, xrl) else {n: xrt.tfidf.from_texts(texts[n]) for n in splits}
    return xrt, xrl, X, {n: final_rows(xrt, X_xrt[n], embeddings(xrt, texts[n], work)) for n in splits}


def final_rows(model: Any, X: sp.csr_matrix, emb: np.ndarray) -> sp.csr_matrix:
    """XR-Transformer's final-model rows (TF-IDF ⊕ embeddings) as ``model`` builds them."""
    from xtransformer.api import final_features

    return final_features(model.features["kind"], X, emb, model.features["neural_weight"])


@dataclass
class FinalModelRows:
    """A finished XR-Transformer run's final model and its rows (TF-IDF ⊕ the fine-tuned encoder's
    embeddings) for the documents it was fitted on, those the run held out of every model (a
    calibrated run's, else None) and the eval split; ``config``: the final model's settings as the
    run trained it (an ``XRLinearConfig`` for ``fit_rows``); ``train_s``: the run's XR-Transformer
    training seconds."""

    model: Any
    config: Any
    train: Any  # LabeledData
    X_train: sp.csr_matrix
    held: Any  # LabeledData | None
    X_held: sp.csr_matrix | None
    eval_Y: sp.csr_matrix
    X_eval: sp.csr_matrix
    train_s: float
    rows_s: float  # seconds to build the training rows


def final_model_rows(run_dir: Path, kept: Path | None = None, work: Path = WORK) -> FinalModelRows:
    """:class:`FinalModelRows` of the run in ``run_dir``; ``kept``: a folder with the run's own
    embeddings of its documents (``train.npy`` / ``<eval split>.npy``, e.g. from its stage cache),
    read instead of encoding again (a split without its file is encoded, and kept in ``work``)."""
    import dataclasses

    from xtransformer.api import FinalModelConfig, LabeledData

    run = RunFolder(run_dir)
    xrt, ds = run.model("xrtransformer"), run.dataset
    c, every = run.settings.calibration, LabeledData.from_split(ds, "train")
    train, held = c.hold_out(every) if c.enabled else (every, None)

    def rows(texts: Sequence[str], split: str | None) -> sp.csr_matrix:
        path = kept / f"{split}.npy" if kept is not None and split else None
        emb = np.load(path) if path is not None and path.is_file() else embeddings(xrt, texts, work)
        if emb.shape[0] != len(texts):
            raise SystemExit(f"error: {path}: {emb.shape[0]} rows, not {len(texts)}")
        return final_rows(xrt, xrt.tfidf.from_texts(texts), emb)

    t0 = time.perf_counter()
    X_train = rows(train.texts, "train")
    rows_s = time.perf_counter() - t0
    ev = ds.splits[ds.eval_split]
    final = FinalModelConfig.from_mapping(xrt.train_settings["xrtransformer"]["final"])
    return FinalModelRows(
        model=xrt,
        config=final_model_settings(dataclasses.replace(final, model=xrt.final.config)),
        train=train,
        X_train=X_train,
        held=held,
        X_held=None if held is None else rows(held.texts, None),
        eval_Y=ev.Y,
        X_eval=rows(ev.texts, ds.eval_split),
        train_s=float(run.metrics["timings_s"]["xrtransformer_train"]),
        rows_s=round(rows_s, 1),
    )


# ---------------------------------------------------------------------------------------- training
def final_model_settings(fcfg: Any, **changes: Any) -> Any:
    """XR-Transformer's final model (``xrtransformer.final``) as the XR-Linear it is on its feature
    rows (:func:`final_rows`): with ``tree: recluster`` the same tree settings and linear model."""
    import dataclasses

    if fcfg.tree != "recluster":
        raise SystemExit(
            "error: xrtransformer.final.tree=same trains on the fine-tuning tree; these studies need "
            "xrtransformer.final.tree=recluster"
        )
    return dataclasses.replace(fcfg, **changes).as_xrlinear()


def fit_rows(X: sp.spmatrix, Y: sp.spmatrix, label_ids: Sequence[str], config: Any) -> Any:
    """``XRLinear.fit`` on feature rows ``X`` (TF-IDF, or final-model rows) with ``config`` (an
    ``XRLinearConfig``); no stage cache (a scratch one)."""
    from xtransformer.api import XRLinear

    return XRLinear.fit(X, Y, label_ids=label_ids, xrlinear=config)


def trees(model: Any) -> list[Any]:
    """The tree models of a fitted ``XRLinear`` (one, or a forest's)."""
    inner = model.model
    return list(inner.trees) if hasattr(inner, "trees") else [inner]


# ---------------------------------------------------------------------------------------- selections
def compact_encoder(src: Path, out: Path, batches: Iterable[Sequence[str]], max_length: int = 512) -> tuple[int, int]:
    """A copy of the encoder folder ``src`` in ``out``, small enough for a machine that takes few MiB:
    weights in fp16 (the config asks for fp32 at load), and the embedding rows of tokens that none of
    the texts in ``batches`` reaches within ``max_length`` tokens set to zero, so that they compress.
    Returns (tokens used, vocabulary size)."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(src)
    used = np.zeros(len(tok), bool)
    for batch in batches:
        for ids in tok(list(batch), truncation=True, max_length=max_length)["input_ids"]:
            used[ids] = True
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(src, out, ignore=shutil.ignore_patterns("*.safetensors", "*.bin", "README.md"))
    weights = load_file(src / "model.safetensors")
    for k, v in weights.items():
        if "word_embeddings" in k:
            v = v.clone()
            v[~torch.from_numpy(used[: v.shape[0]])] = 0  # rows no text reaches: zeros compress
        weights[k] = v.to(torch.float16)
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config.pop("torch_dtype", None)
    (out / "config.json").write_text(json.dumps({**config, "dtype": "float32"}, indent=2))  # load as fp32
    return int(used.sum()), len(used)


def holdout_rows(n: int, holdout: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Rows fitted on and the ``holdout`` random rows held out, each sorted: the selections' split,
    the rows ``python train.py data.holdout=N data.holdout_seed=S`` holds out."""
    from xtransformer.api import held_out_rows

    return held_out_rows(n, holdout, seed)


def selection_parser(doc: str) -> argparse.ArgumentParser:
    """The options every held-out selection takes (a study adds ``--run`` or its settings)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--holdout", type=int, default=5000, help="random training documents held out for the selection")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tag", default="eurlex57k")
    results_option(ap)
    return ap


def results_option(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--results",
        type=Path,
        default=RESULTS,
        help="folder the table goes to (default benchmarks/results; a trial run: a scratch folder)",
    )


def rounded(metrics: dict[str, float]) -> dict[str, float]:
    return {m: round(metrics[m], 2) for m in METRICS}


def held_out_total(r: dict) -> float:
    """The selections' criterion: held-out P@1 + P@3 + P@5."""
    return round(r["holdout"]["P@1"] + r["holdout"]["P@3"] + r["holdout"]["P@5"], 2)


def score_cells(r: dict, split: str) -> str:
    """A selection row's held-out P@1 / P@3 / P@5 and eval-split P@1 / P@3 / P@5 / nDCG@5 cells."""
    h, e = r["holdout"], r.get(split)
    tail = f"{e['P@1']:.2f} | {e['P@3']:.2f} | {e['P@5']:.2f} | {e['nDCG@5']:.2f}" if e else "– | – | – | –"
    return f"{h['P@1']:.2f} | {h['P@3']:.2f} | {h['P@5']:.2f} | {tail}"


def save_selection(results: Path, stem: str, best: object, rows: list[dict], lines: list[str]) -> None:
    """Print a held-out selection's table; write ``<results>/<stem>.{json,md}``."""
    save_table(results, stem, {"best": best, "rows": rows}, "\n".join(lines))


def public_args(args: argparse.Namespace) -> dict:
    """A study's options as its result file keeps them: folders by their last name (no machine-local
    path), the results folder left out."""
    return {k: (v.name if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "results"}


def save_table(results: Path, stem: str, record: dict, table: str) -> None:
    """Print ``table``; write it to ``<results>/<stem>.md`` and ``record`` to ``<stem>.json``."""
    print(table)
    results.mkdir(parents=True, exist_ok=True)
    (results / f"{stem}.json").write_text(json.dumps(record, indent=1))
    (results / f"{stem}.md").write_text(table + "\n")


def timed(fn: Callable[[], Any], repeats: int = 3) -> tuple[Any, float]:
    """``fn()``'s result and its best wall time of ``repeats`` calls."""
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return out, best
