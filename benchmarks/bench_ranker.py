"""Compare our hierarchical linear model (XR-Linear) with PECOS ``XLinearModel`` on one dataset.

Usage (from the repository root)::

    python -m benchmarks.bench_ranker --dataset eurlex57k [--threads 2] [--beam 10]

The driver (system python) builds TF-IDF with our data layer, writes the train/dev matrices as
``.npz`` into a work folder, then runs two workers one after the other, each in its own process so
that their peak RSS and wall times are measured the same way:

* the PECOS worker (this same module, run by the PECOS venv's python with ``--worker pecos``): PIFA
  label features + ``HierarchicalKMeans`` defaults, ``XLinearModel.train`` with ``tfn`` negatives
  and its default solver settings, prediction through the C++ predict-only path;
* our worker (system python, ``--worker ours``): our indexing (PIFA + hierarchical
  k-means with PECOS's default tree shape), or with ``--chain pecos`` PECOS's own tree, then
  ``HierarchicalLinear`` with ``tfn`` negatives.

Both predict with the same beam size and top-k. Metrics are computed by the driver with
``xtransformer.api.evaluate``. Data cross the two environments only as ``.npz`` files (PECOS
pins numpy<2). Wall times on this shared 2-core machine are noisy: compare the two libraries
within one run, not across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PECOS_PY = ROOT / "benchmarks" / ".venvs" / "pecos" / "bin" / "python"
SPLITS = ("train", "dev")
NR_SPLITS, MAX_LEAF_SIZE = 16, 100  # PECOS HierarchicalKMeans defaults


def peak_rss_gib() -> float:
    """Peak resident set size of this process (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def load_inputs(work: Path) -> dict[str, sp.csr_matrix]:
    return {f"{m}_{s}": sp.load_npz(work / f"{m}_{s}.npz").tocsr() for m in ("X", "Y") for s in SPLITS}


def timing_fields(t_index: float, t_train: float, c_train: float, t_pred: float, n_docs: int, chain: list) -> dict:
    """The measurements both workers report, under the same keys."""
    return {
        "index_s": t_index,
        "train_s": t_train,
        "train_cpu_s": c_train,
        "predict_s": t_pred,
        "predict_docs_per_s": n_docs / t_pred,
        "level_sizes": [int(c.shape[0]) for c in chain],
    }


def write_result(work: Path, name: str, result: dict, pred: sp.csr_matrix, chain: list | None = None) -> None:
    sp.save_npz(work / f"{name}_pred.npz", sp.csr_matrix(pred), compressed=False)
    if chain is not None:
        for i, c in enumerate(chain):
            sp.save_npz(work / f"{name}_chain{i}.npz", sp.csr_matrix(c, dtype=np.float32), compressed=False)
    result["peak_rss_gib"] = peak_rss_gib()
    (work / f"{name}_result.json").write_text(json.dumps(result, indent=2) + "\n")


# ---------------------------------------------------------------------------------------------- PECOS
def pecos_worker(work: Path, threads: int, beam: int, topk: int) -> None:
    """Runs under the PECOS venv: only numpy/scipy/pecos may be imported here."""
    from pecos.xmc import Indexer, LabelEmbeddingFactory
    from pecos.xmc.xlinear.model import XLinearModel

    d = load_inputs(work)
    X, Y = d["X_train"], d["Y_train"]
    t0 = time.perf_counter()
    label_feat = LabelEmbeddingFactory.create(Y, X, method="pifa", threads=threads)
    chain = Indexer.gen(label_feat, indexer_type="hierarchicalkmeans", threads=threads)
    t_index = time.perf_counter() - t0
    t0, c0 = time.perf_counter(), time.process_time()
    model = XLinearModel.train(X, Y, C=chain, threads=threads, negative_sampling_scheme="tfn")
    t_train, c_train = time.perf_counter() - t0, time.process_time() - c0
    model_dir = work / "pecos_model"
    model.save(str(model_dir))
    fast = XLinearModel.load(str(model_dir), is_predict_only=True)
    Xd = d["X_dev"]
    t0 = time.perf_counter()
    pred = fast.predict(Xd, beam_size=beam, only_topk=topk, threads=threads)
    t_pred = time.perf_counter() - t0
    n_w = sum(int(m.W.nnz) for m in model.model.model_chain)
    result = {
        "library": "pecos",
        **timing_fields(t_index, t_train, c_train, t_pred, Xd.shape[0], chain),
        "weights_nnz": n_w,
    }
    write_result(work, "pecos", result, pred, chain=list(chain))


# ---------------------------------------------------------------------------------------------- ours
def ours_worker(work: Path, threads: int, beam: int, topk: int, config: str | None, chain_source: str) -> None:
    from xtransformer.api import HierarchicalLinear, HierarchicalLinearConfig

    d = load_inputs(work)
    X, Y = d["X_train"], d["Y_train"]
    cfg = HierarchicalLinearConfig(threads=threads, beam_size=beam, topk=topk)
    if config:
        cfg = HierarchicalLinearConfig(**(vars(cfg) | json.loads(config)))
    t0 = time.perf_counter()
    chain, chain_source = build_chain(work, X, Y, cfg, chain_source)
    t_index = time.perf_counter() - t0
    t0, c0 = time.perf_counter(), time.process_time()
    model = HierarchicalLinear.train(X, Y, chain, cfg)
    t_train, c_train = time.perf_counter() - t0, time.process_time() - c0
    Xd = d["X_dev"]
    t0 = time.perf_counter()
    pred = model.predict(Xd)
    t_pred = time.perf_counter() - t0
    result = {
        "library": "xtransformer",
        "chain": chain_source,
        **timing_fields(t_index, t_train, c_train, t_pred, Xd.shape[0], chain),
        "weights_nnz": model.n_weights,
        "train_stats": model.train_stats,
        "config": vars(cfg),
    }
    write_result(work, "ours", result, pred, chain=list(chain))


def build_chain(work: Path, X: sp.csr_matrix, Y: sp.csr_matrix, cfg, source: str) -> tuple[list, str]:
    """The label tree our model trains on.

    ``ours``: our indexer mirroring PECOS's defaults (PIFA over TF-IDF, binary hierarchical
    spherical k-means down to leaves of at most ``max_leaf_size`` labels, then a ``nr_splits``-ary
    tree over those leaves, as ``ClusterChain.from_partial_chain(C, nr_splits=16)`` does);
    ``pecos``: the chain the PECOS worker wrote in this work folder (same tree for both models).
    """
    if source == "pecos":
        paths = sorted(work.glob("pecos_chain*.npz"), key=lambda p: int(p.stem.removeprefix("pecos_chain")))
        if not paths:
            raise SystemExit("bench_ranker: --chain pecos needs the PECOS worker's chain; run it first")
        return [sp.load_npz(p).tocsr() for p in paths], "pecos HierarchicalKMeans (shared)"
    from xtransformer.api import hierarchical_kmeans, label_representation

    feats, _ = label_representation("pifa_tfidf", Y, X_tfidf=X)
    binary = hierarchical_kmeans(feats, max_leaf_size=MAX_LEAF_SIZE, branching=2, threads=cfg.n_threads)
    return list(binary.subsample(NR_SPLITS)), "xtransformer.indexing.hierarchical_kmeans"


# ---------------------------------------------------------------------------------------------- driver
def prepare_inputs(dataset: str, work: Path, cache_dir: Path) -> None:
    if all((work / f"{m}_{s}.npz").is_file() for m in ("X", "Y") for s in SPLITS):
        return
    from xtransformer.api import load_dataset, tfidf_features

    ds = load_dataset(dataset)
    X = tfidf_features(ds, cache_dir=cache_dir)
    work.mkdir(parents=True, exist_ok=True)
    for s in SPLITS:
        sp.save_npz(work / f"X_{s}.npz", X[s].astype(np.float32), compressed=False)
        sp.save_npz(work / f"Y_{s}.npz", ds.splits[s].Y.astype(np.float32), compressed=False)


def run_worker(python: str, name: str, args: argparse.Namespace) -> dict:
    cmd = [
        python,
        "-m",
        "benchmarks.bench_ranker",
        "--worker",
        name,
        "--work",
        str(args.work.resolve()),  # the worker runs from the repository root
        "--threads",
        str(args.threads),
        "--beam",
        str(args.beam),
        "--topk",
        str(args.topk),
    ]
    if args.config:
        cmd += ["--config", args.config]
    if name == "ours":
        cmd += ["--chain", args.chain]
    env = os.environ | {
        "OMP_NUM_THREADS": str(args.threads),
        "MKL_NUM_THREADS": str(args.threads),
        "WANDB_MODE": "offline",
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    }
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, cwd=ROOT)
    result = json.loads((args.work / f"{name}_result.json").read_text())
    result["process_wall_s"] = time.perf_counter() - t0
    return result


def report(results: dict[str, dict], work: Path) -> None:
    from xtransformer.api import evaluate

    Y = sp.load_npz(work / "Y_dev.npz").tocsr()
    rows = []
    for name, r in results.items():
        m = evaluate(Y, sp.load_npz(work / f"{name}_pred.npz").tocsr())
        r["metrics"] = {k: m[k] for k in ("P@1", "P@3", "P@5")}
        rows.append((name, r))
    print(
        f"\n{'':14s}{'index s':>9s}{'train s':>9s}{'cpu s':>9s}{'docs/s':>9s}{'RSS GiB':>9s}"
        f"{'P@1':>8s}{'P@3':>8s}{'P@5':>8s}"
    )
    for name, r in rows:
        m = r["metrics"]
        print(
            f"{name:14s}{r['index_s']:9.1f}{r['train_s']:9.1f}{r['train_cpu_s']:9.1f}{r['predict_docs_per_s']:9.0f}"
            f"{r['peak_rss_gib']:9.2f}{m['P@1']:8.2f}{m['P@3']:8.2f}{m['P@5']:8.2f}"
        )
    if "ours" in results and "pecos" in results:
        o, p = results["ours"], results["pecos"]
        print(
            f"\nours - pecos: P@1 {o['metrics']['P@1'] - p['metrics']['P@1']:+.2f} points; ranker-training wall ratio "
            f"ours/pecos {o['train_s'] / p['train_s']:.2f} (cpu {o['train_cpu_s'] / p['train_cpu_s']:.2f}); "
            f"indexing + training {(o['index_s'] + o['train_s']) / (p['index_s'] + p['train_s']):.2f}; "
            f"chain: {o.get('chain')}"
        )
        print("(wall times on a shared machine are noisy: compare the ratio within this run, not across runs)")
    (work / "summary.json").write_text(json.dumps(results, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="eurlex57k")
    ap.add_argument(
        "--work", type=Path, default=None, help="work folder (default benchmarks/work/bench_ranker/DATASET)"
    )
    ap.add_argument("--cache-dir", type=Path, default=None, help="TF-IDF cache folder (data layer default if unset)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--beam", type=int, default=10)
    ap.add_argument("--topk", type=int, default=10)
    ap.add_argument("--pecos-python", default=os.environ.get("PECOS_PYTHON", str(DEFAULT_PECOS_PY)))
    ap.add_argument(
        "--only", choices=("pecos", "ours"), default=None, help="run one worker (reuses the other's result)"
    )
    ap.add_argument("--config", default=None, help="JSON overrides of HierarchicalLinearConfig for our worker")
    ap.add_argument(
        "--chain",
        choices=("ours", "pecos"),
        default="ours",
        help="label tree of our model: our indexer (default) or PECOS's (same tree for both)",
    )
    ap.add_argument("--worker", choices=("pecos", "ours"), default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.work = args.work or ROOT / "benchmarks" / "work" / "bench_ranker" / args.dataset
    if args.worker == "pecos":
        return pecos_worker(args.work, args.threads, args.beam, args.topk)
    if args.worker == "ours":
        return ours_worker(args.work, args.threads, args.beam, args.topk, args.config, args.chain)

    prepare_inputs(args.dataset, args.work, args.cache_dir)
    results = {}
    for name in ("pecos", "ours"):
        if args.only and args.only != name:
            prev = args.work / f"{name}_result.json"
            if prev.is_file():
                results[name] = json.loads(prev.read_text())
            continue
        python = args.pecos_python if name == "pecos" else sys.executable
        if name == "pecos" and not Path(python).is_file():
            raise SystemExit(
                f"bench_ranker: PECOS python not found at {python} (run benchmarks/peers/setup_venvs.sh pecos)"
            )
        print(f"== {name} worker", flush=True)
        results[name] = run_worker(python, name, args)
    report(results, args.work)


if __name__ == "__main__":
    main()
