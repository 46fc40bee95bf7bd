"""Our hierarchical balanced k-means vs libpecos's ``HierarchicalKMeans`` on the same PIFA.

    python -m benchmarks.bench_indexing                          # EURLEX57K, 3 interleaved repeats
    python -m benchmarks.bench_indexing --dataset reuters21578 --repeats 5
    python -m benchmarks.bench_indexing --synthetic 500000x100000 --repeats 1   # scale + peak RSS
    python -m benchmarks.bench_indexing --synthetic 500000x100000 --pecos-synthetic

Dataset mode builds PIFA once from our data layer's TF-IDF (``label_representation("pifa_tfidf",
orphan_fallback="none")``: labels without training documents keep zero rows, as PECOS's PIFA),
saves it as ``.npz`` (the PECOS venv has numpy<2: no pickles cross), then per repeat times ours
in-process and PECOS's ``Indexer.gen(feat, indexer_type="hierarchicalkmeans")`` with its defaults
(``nr_splits=16``, ``max_leaf_size=100``, ``kmeans_max_iter=20``) in a subprocess of the PECOS venv;
both get the same threads and seed, and ours the same K (``max_leaf_size=100``). Only the
clustering call is timed on both sides (not loading). Repeats interleave the two systems because
the machine is shared: read the per-repeat ratio more than the absolute seconds.

Synthetic mode makes a planted-cluster PIFA (``xtransformer.api.planted_label_features``), then runs ours
(and optionally PECOS) in a fresh subprocess each, reporting seconds and the child's peak RSS
(``VmHWM``: interpreter + libraries + the loaded matrix + clustering).

Results print as a table and go to ``benchmarks/work/indexing/<name>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
WORK = BENCH_DIR / "work" / "indexing"
PECOS_PY = BENCH_DIR / ".venvs" / "pecos" / "bin" / "python"
QUIET_ENV = {"WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")

# Child programs, run from the repository root: load the npz, time one clustering call, save leaf
# codes, print a JSON line.
PECOS_CHILD = """
import json, time
import numpy as np, scipy.sparse as sp
from benchmarks.phases import vm_hwm_mb
from pecos.xmc import Indexer
P = sp.load_npz({npz!r}).tocsr().astype(np.float32)
t, c = time.perf_counter(), time.process_time()
chain = Indexer.gen(P, indexer_type="hierarchicalkmeans", threads={threads}, seed={seed})
dt, dc = time.perf_counter() - t, time.process_time() - c
np.save({codes!r}, chain[-1].tocsr().indices.astype(np.int64))
sizes = [int(c.shape[0]) for c in chain]
print(json.dumps({{"seconds": dt, "cpu_seconds": dc, "level_sizes": sizes, "peak_rss_mb": vm_hwm_mb()}}))
"""
OURS_CHILD = """
import json, time
import numpy as np, scipy.sparse as sp
from benchmarks.phases import vm_hwm_mb
from xtransformer.api import hierarchical_kmeans
P = sp.load_npz({npz!r}).tocsr()
t, c = time.perf_counter(), time.process_time()
chain = hierarchical_kmeans(P, n_clusters={k}, max_leaf_size={leaf}, threads={threads}, seed={seed})
dt, dc = time.perf_counter() - t, time.process_time() - c
np.save({codes!r}, chain.leaf_codes)
print(json.dumps({{"seconds": dt, "cpu_seconds": dc, "level_sizes": chain.level_sizes, "peak_rss_mb": vm_hwm_mb()}}))
"""


def child_env(threads: int) -> dict[str, str]:
    env = dict(os.environ) | QUIET_ENV | {k: str(threads) for k in THREAD_ENV}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH", "")) if p)
    return env


def run_child(python: Path | str, code: str, threads: int, timeout: float) -> dict:
    proc = subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, env=child_env(threads), timeout=timeout, cwd=ROOT
    )
    if proc.returncode != 0:
        raise RuntimeError(f"child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def build_pifa(dataset: str) -> tuple[Path, sp.csr_matrix, dict]:
    """PIFA-TF-IDF of the training split, cached as npz; also returns Y_train."""
    from xtransformer.api import LabeledData, label_representation, load_dataset, tfidf_features

    ds = load_dataset(dataset)
    Y = ds.splits["train"].Y
    path = WORK / f"{ds.name}_pifa_{LabeledData.from_split(ds, 'train').key[:12]}.npz"  # the training data's content
    if not path.is_file():
        X = tfidf_features(ds)["train"]
        P, _ = label_representation("pifa_tfidf", Y, X_tfidf=X, orphan_fallback="none")
        path.parent.mkdir(parents=True, exist_ok=True)
        sp.save_npz(path, P, compressed=False)
    P = sp.load_npz(path).tocsr()
    info = {
        "dataset": ds.name,
        "labels": int(P.shape[0]),
        "features": int(P.shape[1]),
        "nnz": int(P.nnz),
        "zero_rows": int((np.diff(P.indptr) == 0).sum()),
    }
    return path, Y, info


def bench_dataset(args: argparse.Namespace) -> dict:
    from xtransformer.api import centroid_cosine, cooccurrence_purity, hierarchical_kmeans, random_balanced_codes

    path, Y, info = build_pifa(args.dataset)
    P = sp.load_npz(path).tocsr()
    print(f"PIFA {info}", flush=True)
    pecos_codes = WORK / "pecos_codes.npy"
    systems = ["ours", "pecos"] + (["pecos-1thread"] if args.pecos_one_thread else [])
    if args.skip_pecos:
        systems = ["ours"]
    rows: dict[str, list[float]] = {s: [] for s in systems}
    cpu: dict[str, list[float]] = {s: [] for s in systems}
    codes: dict[str, np.ndarray] = {}
    meta: dict[str, dict] = {}
    for r in range(args.repeats):
        for system in systems if r % 2 == 0 else systems[::-1]:  # alternate who goes first
            if system == "ours":
                t, c = time.perf_counter(), time.process_time()
                chain = hierarchical_kmeans(P, max_leaf_size=100, threads=args.threads, seed=args.seed)
                rows[system].append(time.perf_counter() - t)
                cpu[system].append(time.process_time() - c)
                codes[system], meta[system] = chain.leaf_codes, {"level_sizes": chain.level_sizes}
            else:
                threads = 1 if system == "pecos-1thread" else args.threads
                code = PECOS_CHILD.format(npz=str(path), threads=threads, seed=args.seed, codes=str(pecos_codes))
                out = run_child(PECOS_PY, code, threads, args.timeout)
                rows[system].append(out["seconds"])
                cpu[system].append(out["cpu_seconds"])
                codes[system], meta[system] = np.load(pecos_codes), {"level_sizes": out["level_sizes"]}
            print(f"repeat {r}: {system} {rows[system][-1]:.2f}s wall, {cpu[system][-1]:.2f}s CPU", flush=True)
    quality = {}
    for name, c in codes.items():
        rand = random_balanced_codes(np.bincount(c), seed=args.seed)
        quality[name] = {
            "clusters": int(c.max()) + 1,
            "size_min_max": [int(np.bincount(c).min()), int(np.bincount(c).max())],
            "centroid_cosine": round(centroid_cosine(P, c), 4),
            "centroid_cosine_random": round(centroid_cosine(P, rand), 4),
            "cooccurrence_purity": round(cooccurrence_purity(Y, c), 4),
            "cooccurrence_purity_random": round(cooccurrence_purity(Y, rand), 4),
        }
    return {
        "mode": "dataset",
        "info": info,
        "threads": args.threads,
        "seconds": rows,
        "cpu_seconds": cpu,
        "meta": meta,
        "quality": quality,
    }


def bench_synthetic(args: argparse.Namespace) -> dict:
    from xtransformer.api import default_n_clusters, planted_label_features

    n_labels, n_features = (int(v) for v in args.synthetic.lower().split("x"))
    k = args.n_clusters or default_n_clusters(n_labels)
    path = WORK / f"synthetic_{n_labels}x{n_features}_nnz{args.nnz_per_row}_g{args.groups}.npz"
    if not path.is_file():
        t = time.perf_counter()
        P, _ = planted_label_features(n_labels, n_features, n_groups=args.groups, nnz_per_row=args.nnz_per_row, seed=0)
        path.parent.mkdir(parents=True, exist_ok=True)
        sp.save_npz(path, P, compressed=False)
        print(f"generated {path.name} in {time.perf_counter() - t:.1f}s", flush=True)
        del P
    nnz = int(np.load(path)["data"].shape[0])
    info = {"labels": n_labels, "features": n_features, "nnz": nnz, "clusters": k}
    print(f"synthetic PIFA {info}", flush=True)
    results: dict[str, list[dict]] = {"ours": [], "pecos": []}
    systems = ("ours", "pecos") if args.pecos_synthetic else ("ours",)
    for r in range(args.repeats):
        for system in systems:
            if system == "ours":
                code = OURS_CHILD.format(
                    npz=str(path),
                    k=k,
                    leaf=None,
                    threads=args.threads,
                    seed=args.seed,
                    codes=str(WORK / "ours_codes.npy"),
                )
                out = run_child(sys.executable, code, args.threads, args.timeout)
            else:
                leaf = int(np.ceil(n_labels / k))  # PECOS picks K through max_leaf_size
                code = PECOS_CHILD.format(
                    npz=str(path),
                    threads=args.threads,
                    seed=args.seed,
                    codes=str(WORK / "pecos_codes.npy"),
                )
                code = code.replace(
                    'indexer_type="hierarchicalkmeans",', f'indexer_type="hierarchicalkmeans", max_leaf_size={leaf},'
                )
                out = run_child(PECOS_PY, code, args.threads, args.timeout)
            results[system].append(out)
            print(
                f"repeat {r}: {system} {out['seconds']:.1f}s wall, {out['cpu_seconds']:.1f}s CPU, "
                f"peak RSS {out['peak_rss_mb']:.0f} MiB, levels {out['level_sizes'][:-1]}",
                flush=True,
            )
    return {"mode": "synthetic", "info": info, "threads": args.threads, "runs": results}


def print_table(res: dict) -> None:
    if res["mode"] == "dataset":
        secs, cpu = res["seconds"], res["cpu_seconds"]
        print(
            f"\n{res['info']['dataset']}: PIFA {res['info']['labels']} x {res['info']['features']}, "
            f"nnz {res['info']['nnz']}, threads {res['threads']}"
        )
        print(
            "| system | median wall s | min-max wall s | median CPU s | repeats "
            "| wall x vs pecos (median of per-repeat ratios) |"
        )
        print("|---|---|---|---|---|---|")
        for name, s in secs.items():
            ratio = ""
            if name == "ours" and secs.get("pecos"):
                ratio = f"{statistics.median(a / b for a, b in zip(s, secs['pecos'])):.2f}"
            print(
                f"| {name} | {statistics.median(s):.2f} | {min(s):.2f}-{max(s):.2f} | "
                f"{statistics.median(cpu[name]):.2f} | {len(s)} | {ratio} |"
            )
        print("\n| system | K | leaf sizes | centroid cosine (random) | co-occurrence purity (random) |")
        print("|---|---|---|---|---|")
        for name, q in res["quality"].items():
            print(
                f"| {name} | {q['clusters']} | {q['size_min_max'][0]}-{q['size_min_max'][1]} | "
                f"{q['centroid_cosine']} ({q['centroid_cosine_random']}) | "
                f"{q['cooccurrence_purity']} ({q['cooccurrence_purity_random']}) |"
            )
    else:
        info = res["info"]
        print(
            f"\nsynthetic PIFA {info['labels']} x {info['features']}, nnz {info['nnz']}, K {info['clusters']}, "
            f"threads {res['threads']}"
        )
        print("| system | wall s (each run) | CPU s (each run) | peak RSS MiB (each run) | level sizes |")
        print("|---|---|---|---|---|")
        for name, runs in res["runs"].items():
            if runs:
                secs = ", ".join(f"{r['seconds']:.1f}" for r in runs)
                rss = ", ".join(f"{r['peak_rss_mb']:.0f}" for r in runs)
                cpus = ", ".join(f"{r['cpu_seconds']:.1f}" for r in runs)
                print(f"| {name} | {secs} | {cpus} | {rss} | {runs[-1]['level_sizes'][:-1]} |")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="eurlex57k")
    ap.add_argument("--synthetic", default=None, help="LABELSxFEATURES, e.g. 500000x100000 (instead of --dataset)")
    ap.add_argument(
        "--nnz-per-row", type=int, default=40, help="synthetic draws per row (duplicates merge: ~35 nonzeros)"
    )
    ap.add_argument("--groups", type=int, default=1024, help="synthetic planted label groups (feature blocks)")
    ap.add_argument("--n-clusters", type=int, default=None, help="synthetic K (default: the paper's rule)")
    ap.add_argument("--pecos-synthetic", action="store_true", help="also run PECOS on the synthetic PIFA")
    ap.add_argument("--skip-pecos", action="store_true")
    ap.add_argument("--pecos-one-thread", action="store_true", help="also time PECOS with 1 thread (dataset mode)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=3600.0)
    args = ap.parse_args(argv)
    for k, v in QUIET_ENV.items():
        os.environ.setdefault(k, v)
    if not args.skip_pecos and not PECOS_PY.is_file():
        sys.exit(f"no PECOS venv at {PECOS_PY}: run benchmarks/peers/setup_venvs.sh, or pass --skip-pecos")
    res = bench_synthetic(args) if args.synthetic else bench_dataset(args)
    print_table(res)
    name = f"synthetic_{args.synthetic}" if args.synthetic else args.dataset
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / f"{name}.json").write_text(json.dumps(res, indent=2, default=float) + "\n")


if __name__ == "__main__":
    main()
