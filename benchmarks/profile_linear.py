"""Where XR-Linear spends time and memory: index, train and predict on a benchmark problem.

Usage (from the repository root, after ``python -m benchmarks.run`` has written the problem's
matrices under ``benchmarks/work``)::

  python -m benchmarks.profile_linear benchmarks/work/eurlex57k/data --top 25
  python -m benchmarks.profile_linear DATA --phases predict --model DIR  # a saved tree model

The tree and the model are XR-Linear's as ``python train.py method=xrlinear`` sets them (``ours-xrlinear``'s
settings; ``--max-leaf-size`` and ``--nr-splits`` change the tree), each stage profiled apart. Each phase
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

from benchmarks import phases


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
    p.add_argument("--max-leaf-size", type=int, default=None, help="default: configs/xrlinear's (0: IndexingConfig's)")
    p.add_argument("--nr-splits", type=int, default=None, help="default: the config's (0: the binary chain)")
    p.add_argument("--tracemalloc", action="store_true")
    args = p.parse_args()
    todo = args.phases.split(",")
    print(f"start: peak RSS {phases.vm_hwm_mb():.0f} MiB", flush=True)
    from xtransformer.api import HierarchicalLinear, build_index

    print(f"imports: peak RSS {phases.vm_hwm_mb():.0f} MiB, torch loaded: {'torch' in sys.modules}", flush=True)
    x = xrlinear_config(args)
    info = phases.load_problem(args.data)
    X, Y = phases.load_split(args.data, info.get("train_split", "train"))
    model = HierarchicalLinear.load(args.model) if args.model else None
    if "index" in todo or "train" in todo:

        def index():
            chain, _ = build_index(x.indexing, Y, X_train_tfidf=X, quality=False)
            return chain if args.nr_splits == 0 else chain.subsample(x.nr_splits)

        chain = _profiled("index", index, args.top, args.tracemalloc)
    if "train" in todo:
        model = _profiled(
            "train",
            lambda: HierarchicalLinear.train(X, Y, list(chain), x.model),
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


def xrlinear_config(args: argparse.Namespace):
    """``configs/xrlinear``'s settings (seed 0) with ``--threads``, ``--max-leaf-size`` and ``--nr-splits``."""
    from xtransformer.api import compose_settings

    overrides = ["method=xrlinear", "seed=0", *(f"xrlinear.{g}.threads={args.threads}" for g in ("indexing", "model"))]
    if args.max_leaf_size is not None:  # 0: none, IndexingConfig's K
        overrides.append(f"xrlinear.indexing.max_leaf_size={args.max_leaf_size or 'null'}")
    if args.nr_splits:
        overrides.append(f"xrlinear.nr_splits={args.nr_splits}")
    return compose_settings(*overrides).main.xrlinear


if __name__ == "__main__":
    main()
