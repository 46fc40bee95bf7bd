"""libpecos XR-Transformer with PECOS's Eurlex-4K recipe, the encoder swapped for a local folder.

Runs inside ``benchmarks/.venvs/pecos-xrt`` (torch CPU, transformers 4.46, libpecos 1.2.8 without
its optional dependencies). The recipe is amzn/pecos
``examples/xr-transformer-neurips21/params/eurlex-4k/bert/params.json``, restated below field for
field. What this runner changes, and why:

- ``--encoder DIR``: ``model_shortcut`` (``bert-base-uncased`` in the recipe) is the given local
  model folder, the one our XR-Transformer fine-tunes (the harness passes it).
- ``--steps-scale S``: every level's ``max_steps`` and ``warmup_steps`` times ``S`` (at least 1), for
  CPU hosts where the published 600 / 800 / 1,200 steps take hours; 1.0 is the recipe.
- ``--max-length N``: ``truncate_length`` (the recipe's 128), so that a problem whose documents
  ours reads at another length is read at the same length by both.
- Tree depth: the recipe's chains name three fine-tuned levels and four levels of the final
  linear model (Eurlex-4K's 3,956 labels). The preliminary tree's leaves hold at least
  ``L / 256`` labels (16 for Eurlex-4K, 17 for EURLEX57K's 4,271), which keeps the recipe's
  16 / 256 / L tree; on another depth every chain is refitted: upper levels take the recipe's
  first entries, the last level its last entry (Reuters-21578: 8 / 90, steps 600 / 1,200).
- Documents cut to their first 4 x ``--max-length`` words before PECOS sees them: PECOS tokenizes
  a whole corpus at once, full length, then truncates (a run on EURLEX57K's full training
  documents reached 12 GiB and was killed); a word gives at least one token, so its encoder reads
  the same tokens.
- Host: ``batch_gen_workers`` (16 in the recipe: DataLoader worker processes, and the threads of
  PECOS's C++ products) is ``--threads``; ``--batch-workers N`` gives PECOS's DataLoaders N worker
  processes instead (0: batches made in the runner's own process; with two forked workers the
  recipe's third level on EURLEX57K held 23.2 GiB of anonymous memory and the host ran out;
  in-process two runs peaked at 14.1 and 22.5 GiB; PECOS itself cannot take 0, its C++ threads would be 0);
  torch gets ``--threads`` threads; PECOS uses a GPU when one is visible, else the CPU in fp32 (it
  has no bf16 path on a CPU).

Prediction loads the model folder with the final linear model on PECOS's C++ path
(``is_predict_only=True``), encodes 128 documents a batch (PECOS's example predict command) and
beam-searches TF-IDF ⊕ embeddings. Reported beside the phases: ``finetune`` (seconds inside
``TransformerMatcher.fine_tune_encoder``, every level) and ``train_embed`` (the passes of the
encoder over the training documents after each level).
"""

from __future__ import annotations

import functools
import math
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
from pecos.utils import torch_util
from pecos.xmc import Indexer, LabelEmbeddingFactory
from pecos.xmc.base import HierarchicalKMeans
from pecos.xmc.xtransformer import matcher as pecos_matcher
from pecos.xmc.xtransformer.matcher import TransformerMatcher
from pecos.xmc.xtransformer.model import XTransformer
from pecos.xmc.xtransformer.module import MLProblemWithText

from benchmarks import phases

# ---- the recipe (params/eurlex-4k/bert/params.json) ----------------------------------------------
TREE = {"imbalanced_ratio": 0.0, "imbalanced_depth": 100, "spherical": True, "kmeans_max_iter": 20}
PRELIMINARY = {**TREE, "nr_splits": 16, "min_codes": 16, "max_leaf_size": 16}
REFINED = {**TREE, "nr_splits": 8, "min_codes": None, "max_leaf_size": 16}
RECIPE_LEAVES = 256  # the recipe's preliminary tree: 16 / 256 / 3,956 labels
MAX_MATCH_CLUSTERS = 32768  # levels with at most this many clusters are fine-tuned
MATCHER_STEPS = (600, 800, 1200)
MATCHER = {
    "negative_sampling": "tfn+man",
    "loss_function": "weighted-squared-hinge",
    "bootstrap_method": "weighted-linear",
    "lr_schedule": "linear",
    "threshold": 0.001,
    "hidden_dropout_prob": 0.1,
    "batch_size": 32,
    "max_active_matching_labels": 1000,
    "max_num_labels_in_gpu": 65536,
    "max_no_improve_cnt": -1,
    "num_train_epochs": 10,
    "gradient_accumulation_steps": 1,
    "weight_decay": 0.0,
    "max_grad_norm": 1.0,
    "learning_rate": 5e-05,
    "adam_epsilon": 1e-08,
    "warmup_steps": 100,
    "logging_steps": 50,
    "save_steps": 200,
    "cost_sensitive_ranker": False,
    "use_gpu": True,
}
MATCHER_PRED = {"only_topk": 5, "post_processor": "l3-hinge", "ensemble_method": "concat-only", "truncate_length": 128}
RANKER = {
    "mode": "full-model",
    "ranker_level": 1,
    "nr_splits": 16,
    "min_codes": None,
    "shallow": False,
    "rel_mode": "induce",
    "rel_norm": "l1",
}
RANKER_LEVEL = {
    "threshold": 0.001,
    "max_nonzeros_per_label": None,
    "solver_type": "L2R_L2LOSS_SVC_DUAL",
    "max_iter": 100,
    "eps": 0.1,
    "bias": 1.0,
    "verbose": 0,
    "newton_eps": 0.01,
}
# per level of the final model: (negatives, Cp, Cn, beam only_topk, post-processor)
RANKER_CHAIN = (
    ("tfn", 1.0, 2.0, 75, "l3-hinge"),
    ("tfn", 1.0, 2.0, 75, "l3-hinge"),
    ("tfn", 1.0, 2.0, 100, "l3-hinge"),
    ("tfn+man", 2.0, 4.0, 25, "noop"),
)
PREDICT_BATCH = 128  # examples/xr-transformer-neurips21/train_and_predict.sh: --batch-size 128
WORDS_PER_TOKEN = 4  # documents cut to 4 x --max-length words: more than the tokens PECOS keeps


def fit_chain(recipe: tuple | list, depth: int) -> list:
    """The recipe's per-level entries for a tree of ``depth`` levels: the upper levels take the
    recipe's first entries, the last level its last entry (the recipe itself at its own depth)."""
    if depth < 1:
        raise phases.PhaseError(f"a label tree needs at least one level, got depth {depth}")
    upper = [recipe[min(i, len(recipe) - 2)] for i in range(depth - 1)]
    return upper + [recipe[-1]]


def scaled_steps(steps: int, scale: float) -> int:
    return max(1, round(steps * scale))


def tree_depth(n_labels: int, params: dict[str, Any]) -> int:
    """Levels of the tree PECOS's indexer builds for ``n_labels`` labels with ``params`` (the shape
    depends on the label count alone: clustered here from random points, in milliseconds)."""
    points = np.random.default_rng(0).random((n_labels, 4), dtype=np.float32)
    return len(Indexer.gen(points, train_params=HierarchicalKMeans.TrainParams.from_dict(params)))


class Stopwatch:
    """Seconds spent inside chosen methods of a class, summed per name (behaviour unchanged)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def wrap(self, owner: type, attr: str, name: str) -> None:
        inner = getattr(owner, attr)

        @functools.wraps(inner)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - t0

        setattr(owner, attr, timed)


class WorkersDataLoader(torch.utils.data.DataLoader):
    """PECOS's DataLoader with ``workers`` worker processes whatever ``num_workers`` it is given
    (PECOS passes ``batch_gen_workers``, which also sets its C++ threads)."""

    def __init__(self, *args: Any, workers: int, **kwargs: Any) -> None:
        super().__init__(*args, **{**kwargs, "num_workers": workers})


class PecosXRT(phases.System):
    has_index = True
    reads_texts = True
    single_docs = 50  # an encoder pass per call: the latency median over 50 documents

    def __init__(self, args: Any) -> None:
        super().__init__(args)
        if args.steps_scale <= 0:
            raise phases.PhaseError(f"--steps-scale must be > 0, got {args.steps_scale}")
        if not (Path(args.encoder) / "config.json").is_file():
            raise phases.PhaseError(f"--encoder: {args.encoder} is not a model folder (no config.json)")
        if args.batch_workers is not None and args.batch_workers < 0:
            raise phases.PhaseError(f"--batch-workers must be >= 0, got {args.batch_workers}")
        self.batch_workers = self.threads if args.batch_workers is None else args.batch_workers
        if self.batch_workers != self.threads:
            pecos_matcher.DataLoader = functools.partial(WorkersDataLoader, workers=self.batch_workers)
        torch.set_num_threads(self.threads)
        torch_util.set_seed(self.seed)
        self.clock = Stopwatch()
        self.levels: list[int] = []

    def read(self, texts: list[str]) -> list[str]:
        """The documents as PECOS's encoder reads them: PECOS tokenizes a whole corpus at once and
        only then truncates (on EURLEX57K's 45,000 full documents a run reached 12 GiB and was killed
        by the out-of-memory killer); cut to their first ``WORDS_PER_TOKEN`` x ``--max-length`` words,
        it reads the same tokens."""
        return phases.head_words(texts, WORDS_PER_TOKEN * self.args.max_length)

    def prepare(self, data_dir: Path, X: sp.csr_matrix, Y: sp.csr_matrix) -> None:
        self.texts = self.read(phases.load_texts(data_dir, self.args.train_split, X.shape[0]))

    def preliminary_params(self, n_labels: int) -> dict[str, Any]:
        leaf = max(PRELIMINARY["max_leaf_size"], math.ceil(n_labels / RECIPE_LEAVES))
        return {**PRELIMINARY, "max_leaf_size": leaf, "seed": self.seed, "threads": self.threads}

    def index(self, X: sp.csr_matrix, Y: sp.csr_matrix) -> None:
        params = HierarchicalKMeans.TrainParams.from_dict(self.preliminary_params(Y.shape[1]))
        self.chain = Indexer.gen(LabelEmbeddingFactory.pifa(Y, X), train_params=params)
        self.levels = [c.shape[0] for c in self.chain]

    def matcher_chain(self) -> list[dict[str, Any]]:
        """One ``TransformerMatcher.TrainParams`` per fine-tuned level (the recipe's steps, scaled)."""
        n_fine_tuned = sum(n <= MAX_MATCH_CLUSTERS for n in self.levels)
        return [
            {
                **MATCHER,
                "model_shortcut": str(self.args.encoder),
                "batch_gen_workers": self.threads,
                "max_steps": scaled_steps(steps, self.args.steps_scale),
                "warmup_steps": scaled_steps(MATCHER["warmup_steps"], self.args.steps_scale),
            }
            for steps in fit_chain(MATCHER_STEPS, n_fine_tuned)
        ]

    def ranker_params(self, refined: dict[str, Any], n_labels: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """(train, predict) params of the final linear model, one entry per level of its tree."""
        chain = fit_chain(RANKER_CHAIN, tree_depth(n_labels, refined))
        levels = [{**RANKER_LEVEL, "Cp": cp, "Cn": cn, "threads": self.threads} for _, cp, cn, *_ in chain]
        train = {**RANKER, "hlm_args": {"neg_mining_chain": [neg for neg, *_ in chain], "model_chain": levels}}
        pred = {"hlm_args": {"model_chain": [{"only_topk": k, "post_processor": p} for *_, k, p in chain]}}
        return train, pred

    def params(self, n_labels: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """(train_params, pred_params) of ``XTransformer.train``: the recipe fitted to this problem."""
        matcher = self.matcher_chain()
        refined = {**REFINED, "seed": self.seed, "threads": self.threads}
        ranker_train, ranker_pred = self.ranker_params(refined, n_labels)
        train = {
            "preliminary_indexer_params": self.preliminary_params(n_labels),
            "refined_indexer_params": refined,
            "matcher_params_chain": matcher,
            "ranker_params": ranker_train,
            "do_fine_tune": True,
            "only_encoder": False,
            "fix_clustering": False,
            "max_match_clusters": MAX_MATCH_CLUSTERS,
        }
        pred_matcher = {**MATCHER_PRED, "truncate_length": self.args.max_length}
        pred = {"matcher_params_chain": [dict(pred_matcher) for _ in matcher], "ranker_params": ranker_pred}
        return train, pred

    def train(self, X: sp.csr_matrix, Y: sp.csr_matrix, model_dir: Path) -> None:
        self.n_labels = Y.shape[1]
        self.train_params, pred_params = self.params(Y.shape[1])
        self.clock.wrap(TransformerMatcher, "fine_tune_encoder", "finetune")
        self.clock.wrap(TransformerMatcher, "predict", "train_embed")
        prob = MLProblemWithText(self.texts, Y, X_feat=X)
        self.model = XTransformer.train(
            prob, clustering=self.chain, train_params=self.train_params, pred_params=pred_params, threads=self.threads
        )
        self.train_seconds = dict(self.clock.seconds)
        del self.texts

    def save(self, model_dir: Path) -> None:
        self.model.save(str(model_dir))
        del self.model  # predict from disk, like a user would

    def load(self, model_dir: Path, variant: str) -> None:
        self.model = XTransformer.load(str(model_dir), is_predict_only=True)

    def predict_texts(self, texts: list[str], X: sp.csr_matrix, k: int, variant: str) -> sp.csr_matrix:
        return self.model.predict(
            self.read(texts),
            X_feat=X,
            only_topk=k,
            batch_size=PREDICT_BATCH,
            batch_gen_workers=self.threads,
            threads=self.threads,
        )

    def reported_seconds(self) -> dict[str, float]:
        return self.train_seconds

    def extra_info(self) -> dict:
        import pecos
        import transformers

        return {
            "library": "libpecos",
            "version": pecos.__version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "encoder": str(self.args.encoder),
            "steps_scale": self.args.steps_scale,
            "batch_workers": self.batch_workers,
            "max_length": self.args.max_length,
            "preliminary_tree": self.levels,
            "settings": "PECOS examples/xr-transformer-neurips21/params/eurlex-4k/bert/params.json, the encoder "
            "swapped; steps x steps_scale; chains fitted to the tree's depth; predict-only C++ ranker",
            "train_params": getattr(self, "train_params", None),
        }


EXTRA = (
    ("--encoder", {"type": Path, "required": True, "help": "local model folder (config.json, tokenizer, weights)"}),
    ("--steps-scale", {"type": float, "default": 1.0, "help": "max_steps and warmup_steps of every level times this"}),
    ("--max-length", {"type": int, "default": MATCHER_PRED["truncate_length"], "help": "tokens per document"}),
    ("--batch-workers", {"type": int, "default": None, "help": "batch_gen_workers (default --threads; 0: in-process)"}),
)

if __name__ == "__main__":
    phases.main(PecosXRT, extra=EXTRA)
