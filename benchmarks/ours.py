"""Our stages as benchmark systems (run with the main environment's python).

Usage (the harness calls it, from the repository root):
``python -m benchmarks.ours --adapter xrlinear --data ... --out ...``.
Each adapter is a :class:`phases.System`; registering a new stage is one subclass decorated with
``@adapter("name")`` plus one ``SystemSpec`` line in ``systems.py`` naming the names it needs.
The calls into ``xtransformer.api`` are kept in the few lines of each phase method.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from benchmarks import phases

ADAPTERS: dict[str, type[phases.System]] = {}


def adapter(name: str) -> Callable[[type[phases.System]], type[phases.System]]:
    def register(cls: type[phases.System]) -> type[phases.System]:
        ADAPTERS[name] = cls
        return cls

    return register


@adapter("popular")
class Popular(phases.System):
    """Predicts the k most frequent training labels for every document: a sanity floor that
    needs nothing but numpy, so the harness's own tests can run end to end."""

    def train(self, X: sp.csr_matrix, Y: sp.csr_matrix, model_dir: Path) -> None:
        self.freq = np.asarray(Y.sum(axis=0)).ravel().astype(np.float32)

    def save(self, model_dir: Path) -> None:
        np.save(model_dir / "label_freq.npy", self.freq)

    def load(self, model_dir: Path, variant: str) -> None:
        self.freq = np.load(model_dir / "label_freq.npy")

    def predict(self, X: sp.csr_matrix, k: int, variant: str) -> sp.csr_matrix:
        k = min(k, len(self.freq))
        top = np.argsort(-self.freq, kind="stable")[:k]
        n = X.shape[0]
        indptr = np.arange(n + 1, dtype=np.int64) * k
        return phases.topk_csr(np.tile(top, n), np.tile(self.freq[top], n), indptr, len(self.freq))


class _Ours(phases.System):
    # The linear path imports no torch (its threads are set per call); the pipeline sets its own.
    def extra_info(self) -> dict:
        import xtransformer

        return {"library": "xtransformer", "version": xtransformer.__version__, "settings": type(self).__doc__}

    def prepare(self, data_dir: Path, X: sp.csr_matrix, Y: sp.csr_matrix) -> None:
        # PECOS's runner imports its compiled core with the module, untimed. Ours imports its
        # modules (and scipy's) lazily: run the phases once on 64 documents of the same matrices
        # (same dtypes), so the timed phases time the work, not the loading. Its cost is the
        # JSON's `prepare` seconds.
        Xs, Ys = X[:64], Y[:64]
        Ys = Ys[:, np.flatnonzero(Ys.getnnz(axis=0))]
        if self.has_index:
            self.index(Xs, Ys)
        if self.has_train:
            self.train(Xs, Ys, data_dir)
            self.predict(Xs, 5, "default")


@adapter("indexing")
class OursIndexing(_Ours):
    """PIFA (pifa_tfidf) + hierarchical balanced k-means with IndexingConfig defaults; index only."""

    has_index = True
    has_train = False

    def index(self, X: sp.csr_matrix, Y: sp.csr_matrix) -> None:
        # build_index's cluster-quality diagnostics are left out: time only the tree itself
        from xtransformer.api import IndexingConfig, build_index

        cfg = IndexingConfig(seed=self.seed, threads=self.threads)
        self.chain, _ = build_index(cfg, Y, X_train_tfidf=X, quality=False)


@adapter("xrlinear")
class OursXRLinear(_Ours):
    """XRLinear.fit with the settings of ``python train.py method=xrlinear`` (``compose_settings``:
    configs/xrlinear, seed = the repeat's, --threads its worker threads) on the benchmark's TF-IDF
    rows: the label tree is built inside the fit, so the train column holds it (as napkinXC's and
    omikuji's do); prediction from the saved folder (``XMCModel.load``), top-k at the config's beam."""

    has_train = True
    THREADED = ("xrlinear.indexing", "xrlinear.model")  # run fields: no effect on the model

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        from xtransformer.api import compose_settings

        threads = [f"{group}.threads={self.threads}" for group in self.THREADED]
        self.settings = compose_settings("method=xrlinear", f"seed={self.seed}", *threads).main

    def train(self, X: sp.csr_matrix, Y: sp.csr_matrix, model_dir: Path) -> None:
        from xtransformer.api import XRLinear

        self.model = XRLinear.fit(X, Y, self.settings)

    def save(self, model_dir: Path) -> None:
        self.model.save(model_dir)
        del self.model  # predict from disk, like the peers

    def load(self, model_dir: Path, variant: str) -> None:
        from xtransformer.api import XMCModel

        self.model = XMCModel.load(model_dir)

    def predict(self, X: sp.csr_matrix, k: int, variant: str) -> sp.csr_matrix:
        return self.model.predict_features_csr(X, topk=k)

    def extra_info(self) -> dict:
        return {**super().extra_info(), "settings_train": self.settings.training_settings()}


@adapter("xrtransformer")
class OursXRTransformer(_Ours):
    """XR-Transformer through the public API with the settings ``python train.py OVERRIDES`` runs
    (``compose_settings``, the overrides from ``--override``), fit from an empty stage cache on the
    benchmark's documents and labels (no validation documents: nothing of the eval split is seen
    while training). When those settings also train XR-Linear and combine it (``train_xrlinear``,
    ``combine_with_xrlinear``, e.g. ``experiment=eurlex57k_xr_ensemble``), XR-Linear is fit after it
    on the same cache (it reuses the TF-IDF; its row is charged that stage's seconds) and the
    combination is saved beside them: three variants (``default`` = XR-Transformer, ``xrlinear``,
    ``combined``), each predicted from its folder, each with its own fit seconds (the combination's:
    both). ``finetune``: the fine-tuned levels' stage seconds; ``train_embed``: the pass of the
    fine-tuned encoder over the training documents."""

    reads_texts = True
    single_docs = 50  # an encoder pass per call: the latency median over 50 documents
    QUIET = ("matcher.progress=false", "trainer.enable_progress_bar=false")  # run fields: no effect on results
    # the linear stages' worker threads (run fields): the harness's --threads, as the peers get
    THREADED = (
        "indexing",
        "xrtransformer.final.indexing",
        "xrtransformer.final.model",
        "xrlinear.indexing",
        "xrlinear.model",
    )

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        import torch

        from xtransformer.api import compose_settings

        torch.set_num_threads(self.threads)
        threads = [f"{group}.threads={self.threads}" for group in self.THREADED]
        self.s = compose_settings(*args.override, f"seed={self.seed}", *self.QUIET, *threads)
        if self.s.method != "xrtransformer":
            raise phases.PhaseError(
                f"ours-xrtransformer: the overrides {args.override} give method={self.s.method}; "
                "name method=xrtransformer or an experiment that does"
            )
        self.variants = ("default", "xrlinear", "combined") if self.s.combined else ("default",)
        self.fit_s: dict[str, dict[str, float]] = {}

    def prepare(self, data_dir: Path, X: sp.csr_matrix, Y: sp.csr_matrix) -> None:
        self.texts = phases.load_texts(data_dir, self.args.train_split, X.shape[0])

    def train(self, X: sp.csr_matrix, Y: sp.csr_matrix, model_dir: Path) -> None:
        from xtransformer.api import EMBED_STAGE, LEVEL_STAGE, Combination, StageCache, TrainContext

        cache = StageCache(model_dir.parent / "stage-cache")
        with TrainContext(cache=cache, trainer=self.s.trainer, lightning=self.s.lightning) as ctx:
            xrt = self._fit("xrtransformer", Y, ctx)
            xrt.save(model_dir / "xrtransformer")
            self.tfidf_same = same_rows(xrt.tfidf.from_texts(self.texts[:200]), X[:200])
            self.fit_s["default"] |= {"finetune": cache.seconds[LEVEL_STAGE], "train_embed": cache.seconds[EMBED_STAGE]}
            if self.s.combined:
                xrl = self._fit("xrlinear", Y, ctx)
                xrl.save(model_dir / "xrlinear")
                both = Combination([xrt, xrl], method=self.s.combine_with_xrlinear, weights=self.s.combine_weights())
                both.save(model_dir / "combined")
                train = self.fit_s["default"]["train"] + self.fit_s["xrlinear"]["train"]
                self.fit_s["combined"] = self.fit_s["default"] | {"train": train}
        shutil.rmtree(cache.root, ignore_errors=True)
        del self.texts

    def _fit(self, method: str, Y: sp.csr_matrix, ctx: Any) -> Any:
        """Fit one of the run's methods; its seconds (``fit_s``), plus those of the stages it reused."""
        from xtransformer.api import method_class

        before, t0 = len(ctx.cache.events), time.perf_counter()
        model = method_class(method).fit(self.texts, Y, self.s.methods[method], context=ctx)
        reused = {stage for stage, _, what in ctx.cache.events[before:] if what == "reused"}
        train = time.perf_counter() - t0 + sum(ctx.cache.seconds.get(stage, 0.0) for stage in reused)
        self.fit_s["default" if method == "xrtransformer" else method] = {"train": train}
        return model

    def load(self, model_dir: Path, variant: str) -> None:
        from xtransformer.api import XMCModel

        folder = model_dir / {"default": "xrtransformer"}.get(variant, variant)
        self.model = XMCModel.load(folder, device=self.s.trainer.device)  # where the run trained (a GPU run: cuda)

    def predict_texts(self, texts: list[str], X: sp.csr_matrix, k: int, variant: str) -> sp.csr_matrix:
        return self.model.predict_csr(texts, **self.model.overrides_for_k(k, {}))

    def variant_seconds(self, variant: str) -> dict[str, float]:
        return self.fit_s.get(variant, {})

    def reported_seconds(self) -> dict[str, float]:
        return {k: v for k, v in self.fit_s["default"].items() if k != "train"}

    def extra_info(self) -> dict:
        return {
            **super().extra_info(),
            "overrides": self.args.override,
            "trainer": self.s.trainer.placement(),
            "settings_train": self.s.records()["train"],
            "combine": [self.s.combine_with_xrlinear, self.s.combine_weights()] if self.s.combined else None,
            "tfidf_same_as_benchmark": getattr(self, "tfidf_same", None),
        }


@adapter("pipeline")
class OursPipeline(_Ours):
    """The whole method (``run_pipeline``, the run of ``python train.py``: method=xtransformer, its
    default Hydra config, baseline and stage cache off). It reads the text dataset itself, so it needs a real dataset.
    Phases are the pipeline's own laps: index = the indexing stage, train = the rest of the fit; the
    pipeline predicts the eval split from its texts itself, so prediction throughput is not reported
    here (its ``xtransformer_predict`` lap is in the extra info)."""

    times_prediction = False
    model_in_dir = False  # its stage artifacts go to the pipeline's own cache folders
    CONFIGS = Path(__file__).resolve().parents[1] / "configs"

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        import torch

        torch.set_num_threads(self.threads)  # the matcher's torch kernels: match the peers

    def prepare(self, data_dir: Path, X: sp.csr_matrix, Y: sp.csr_matrix) -> None:
        source = phases.load_problem(data_dir)["info"]["source"]
        if "dataset" not in source:
            raise phases.PhaseError("ours-pipeline needs a text dataset (--dataset), not a synthetic problem")
        name, root = source["dataset"], source["root"]
        preset = self.CONFIGS / "data" / f"{name}.yaml"
        self.data_overrides = (
            [f"data={preset.stem}"] if preset.is_file() else ["data=custom", f"data.path={root}", f"data.name={name}"]
        )
        if source.get("max_docs"):
            self.data_overrides.append(f"data.max_docs={source['max_docs']}")

    def train(self, X: sp.csr_matrix, Y: sp.csr_matrix, model_dir: Path) -> None:
        from xtransformer.api import compose_config, run_pipeline

        overrides = [
            *self.data_overrides,
            "method=xtransformer",
            "train_xrlinear=false",
            "cache=false",
            "logger=none",
            f"seed={self.seed}",
            f"paths.output_dir={model_dir}",
            *self.args.override,
        ]
        self.metrics = run_pipeline(compose_config(*overrides))
        self.n_labels = Y.shape[1]
        self.model_dir = model_dir

    def reported_seconds(self) -> dict[str, float]:
        laps = self.metrics["timings_s"]
        stage = {k.removeprefix("stage/"): v for k, v in laps.items() if k.startswith("stage/")}
        return {
            "index": stage.get("indexing", 0.0),
            "train": laps["xtransformer_train"] - stage.get("indexing", 0.0),
            "save": 0.0,
            "pipeline_total": laps["total"],
        }

    def predict(self, X: sp.csr_matrix, k: int, variant: str) -> sp.csr_matrix:
        pred = sp.load_npz(self.model_dir / "predictions" / f"{self.args.eval_split}.npz").tocsr()
        if pred.shape != (X.shape[0], self.n_labels):
            raise phases.PhaseError(
                f"pipeline predictions have shape {pred.shape}, the benchmark's eval split "
                f"{(X.shape[0], self.n_labels)}: its data settings differ from the benchmark's"
            )
        return pred

    def extra_info(self) -> dict:
        return {
            **super().extra_info(),
            "pipeline_timings_s": self.metrics["timings_s"],
            "pipeline_metrics": self.metrics["metrics"],
            "overrides": self.args.override,
        }


def same_rows(A: sp.csr_matrix, B: sp.csr_matrix, tol: float = 1e-5) -> bool:
    """Whether two TF-IDF blocks are the same rows (same vocabulary, same weights)."""
    return bool(A.shape == B.shape and (A.nnz == 0 or abs(A - B).max() < tol))


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = [
        ("--adapter", {"required": True, "choices": sorted(ADAPTERS)}),
        (
            "--override",
            {"action": "append", "default": [], "help": "Hydra override for the pipeline adapter (repeatable)"},
        ),
    ]
    args = phases.parse_args(argv, extra)
    phases.run(ADAPTERS[args.adapter](args), args)


if __name__ == "__main__":
    main()
