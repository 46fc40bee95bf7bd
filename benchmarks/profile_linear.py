"""Where XR-Linear spends time and memory: index, train and predict on a benchmark problem.

Usage (after ``run.py`` has written the problem's matrices under ``benchmarks/work``)::

  PYTHONPATH=src python benchmarks/profile_linear.py benchmarks/work/eurlex57k/data --top 25
  PYTHONPATH=src python benchmarks/profile_linear.py DATA --phases predict --model DIR  # a saved model

The tree is built as ``ours-xrlinear`` builds it (``--max-leaf-size``, ``--nr-splits``). Each phase
runs under cProfile (cumulative time of our functions, top ``--top``) with the process's
peak RSS (``VmHWM``) before and after it; ``--tracemalloc`` adds the phase's largest Python
allocations (numpy buffers included), slower.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import phases


def _profiled(name: str, fn, top: int, trace: bool):
    prof = cProfile.Profile()
    if trace:
        tracemalloc.start(5)
    rss0 = phases.vm_hwm_mb()
    t0 = time.perf_counter()
    prof.enable()
    out = fn()
    prof.disable()
    wall = time.perf_counter() - t0
    print(f"\n== {name}: {wall:.2f} s wall, peak RSS {rss0:.0f} -> {phases.vm_hwm_mb():.0f} MiB", flush=True)
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(top)
    print("\n".join(line for line in s.getvalue().splitlines() if line.strip())[:6000])
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(top)
    print("\n".join(line for line in s.getvalue().splitlines() if line.strip())[:6000])
    if trace:
        _, peak = tracemalloc.get_traced_memory()
        snap = tracemalloc.take_snapshot()
        tracemalloc.stop()
        print(f"-- tracemalloc peak {peak / 2**20:.0f} MiB; live now by line:")
        for stat in snap.statistics("lineno")[:10]:
            print("  ", stat)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", type=Path)
    p.add_argument("--phases", default="index,train,predict")
    p.add_argument("--model", type=Path, help="saved model folder (predict alone)")
    p.add_argument("--eval-split", default=None)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--max-leaf-size", type=int, default=100, help="as configs/xrlinear (0: IndexingConfig's K)")
    p.add_argument("--nr-splits", type=int, default=16, help="ClusterChain.subsample (0: the binary chain)")
    p.add_argument("--tracemalloc", action="store_true")
    args = p.parse_args()
    todo = args.phases.split(",")
    print(f"start: peak RSS {phases.vm_hwm_mb():.0f} MiB", flush=True)
    from xtransformer.indexing import IndexingConfig, hierarchical_kmeans, label_representation
    from xtransformer.ranker import HierarchicalLinear, HierarchicalLinearConfig

    print(f"imports: peak RSS {phases.vm_hwm_mb():.0f} MiB, torch loaded: {'torch' in sys.modules}", flush=True)
    info = phases.load_problem(args.data)
    X, Y = phases.load_split(args.data, info.get("train_split", "train"))
    model = HierarchicalLinear.load(args.model) if args.model else None
    if "index" in todo or "train" in todo:
        cfg = IndexingConfig(
            seed=0, threads=args.threads, max_leaf_size=args.max_leaf_size or None, orphan_fallback="none"
        )  # as configs/xrlinear

        def index():
            Z, _ = label_representation(
                cfg.name,
                Y,
                X_tfidf=X,
                normalize_y_rows=cfg.normalize_y_rows,
                orphan_fallback=cfg.orphan_fallback,
                seed=cfg.seed,
            )
            chain = hierarchical_kmeans(
                Z,
                n_clusters=cfg.n_clusters,
                max_leaf_size=cfg.max_leaf_size,
                branching=cfg.branching,
                max_iter=cfg.max_iter,
                seed=cfg.seed,
                threads=cfg.threads,
            )
            return chain.subsample(args.nr_splits) if args.nr_splits else chain

        chain = _profiled("index", index, args.top, args.tracemalloc)
    if "train" in todo:
        model = _profiled(
            "train",
            lambda: HierarchicalLinear.train(X, Y, list(chain), HierarchicalLinearConfig(threads=args.threads)),
            args.top,
            args.tracemalloc,
        )
    print(f"torch loaded: {'torch' in sys.modules}")
    if "predict" in todo:
        X_ev, _ = phases.load_split(args.data, args.eval_split or info.get("eval_split", "test"))
        _profiled("predict", lambda: model.predict(X_ev, topk=5), args.top, args.tracemalloc)
        t = []
        for i in range(min(200, X_ev.shape[0])):
            t0 = time.perf_counter()
            model.predict(X_ev[i], topk=5)
            t.append(time.perf_counter() - t0)
        t.sort()
        print(f"single-document predict: p50 {1e3 * t[len(t) // 2]:.2f} ms, p95 {1e3 * t[int(len(t) * 0.95)]:.2f} ms")


if __name__ == "__main__":
    main()
