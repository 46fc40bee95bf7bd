"""Benchmark our XMC stages against libpecos, napkinXC and omikuji on the same TF-IDF.

Examples (from the repository root):
  python -m benchmarks.run --dataset reuters21578 --repeats 3
  python -m benchmarks.run --dataset eurlex57k --systems pecos,napkinxc,omikuji --repeats 1
  python -m benchmarks.run --synthetic 100000x100000 --systems pecos,ours-xrlinear --repeats 1
  python -m benchmarks.run --scaling            # growth curves vs L and N, writes a PNG

Each system runs in its own subprocess (peers in their own virtual environment under
benchmarks/.venvs, created on demand); repeats are interleaved across systems so that machine
noise hits all of them alike. Results: one Markdown table printed and written to
<out>/<problem>.md, with the full record in <out>/<problem>.json.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.harness import benchmark, log, merge_results, render, write_result
from benchmarks.measure import RunSettings
from benchmarks.phases import STAGES
from benchmarks.scaling import run_scaling
from benchmarks.synthetic import SyntheticError, SyntheticSpec
from benchmarks.systems import REGISTRY, SystemSpec, get_systems
from benchmarks.workdata import prepare_dataset, prepare_synthetic
from xtransformer.api import load_json

BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_SYSTEMS = "pecos,napkinxc,omikuji,ours-indexing,ours-xrlinear"
SCALING_SYSTEMS = "pecos,ours-indexing,ours-xrlinear"
NEURAL_SYSTEMS = ("pecos-xrt", "ours-xrtransformer")
# ours-xrtransformer's settings per dataset when --xr-override is not given (else method=xrtransformer)
XR_DEFAULTS = {"eurlex57k": ("experiment=eurlex57k_xr_ensemble",)}


class BenchmarkArgError(ValueError):
    """A command-line value the benchmark cannot use."""


def _int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise BenchmarkArgError(f"{flag}: expected comma-separated integers, got {text!r}") from exc
    if not values or min(values) < 1:
        raise BenchmarkArgError(f"{flag}: expected positive integers, got {text!r}")
    return values


def tfidf_settings(pairs: Sequence[str]) -> dict[str, Any]:
    """``["lead_chars=600", ...]`` -> ``{"lead_chars": 600}`` (values read as YAML scalars)."""
    import yaml

    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise BenchmarkArgError(f"--tfidf: expected KEY=VALUE such as lead_chars=600, got {pair!r}")
        out[key.strip()] = yaml.safe_load(value)
    return out


def parse_synthetic(text: str) -> tuple[int, int]:
    """``"100000x50000"`` -> (documents, labels)."""
    parts = text.lower().replace(",", "").split("x")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise BenchmarkArgError(f"--synthetic: expected NDOCSxNLABELS such as 20000x5000, got {text!r}")
    return int(parts[0]), int(parts[1])


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--dataset", help="dataset name or folder in the standard layout (see xtransformer.data)")
    what.add_argument("--synthetic", metavar="NxL", help="synthetic problem with N train docs and L labels")
    what.add_argument("--scaling", action="store_true", help="growth curves on synthetic problems (PNG)")
    what.add_argument(
        "--rerender",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="rebuild the table of a saved result (e.g. with another --reference); several results of one "
        "problem are merged into one table, written as <out>/<problem>-<tag>",
    )
    p.add_argument(
        "--systems",
        default=None,
        help=f"comma list or 'all' (known: {', '.join(REGISTRY)}); default {DEFAULT_SYSTEMS} "
        f"({SCALING_SYSTEMS} with --scaling)",
    )
    p.add_argument(
        "--repeats", type=int, default=None, help="default 3 (1 with --scaling or a system that fine-tunes an encoder)"
    )
    p.add_argument(
        "--first-repeat",
        type=int,
        default=0,
        help="seed of the first repeat (repeat r runs with seed r): more seeds of a slow system later, "
        "merged into one row by --rerender",
    )
    p.add_argument("--reference", default="pecos", help="row that ratios are taken against")
    p.add_argument("--topk", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--stop-after",
        choices=STAGES,
        default="predict",
        help="last phase to run: index, train or predict (e.g. train for scaling runs)",
    )
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per system run")
    p.add_argument("--out", type=Path, default=BENCH_DIR / "results")
    p.add_argument("--work", type=Path, default=BENCH_DIR / "work", help="inputs, predictions, logs")
    p.add_argument("--eval-split", default=None, help="default: the dataset's (test if present, else dev)")
    p.add_argument("--max-docs", type=int, default=None, help="first N docs of each split (quick runs)")
    p.add_argument(
        "--holdout",
        type=int,
        default=0,
        metavar="N",
        help="score N training documents held out of training (data.holdout, seed 0) instead of dev / test: "
        "the problem to choose settings on",
    )
    p.add_argument("--rebuild-data", action="store_true")
    p.add_argument("--keep-models", action="store_true")
    p.add_argument(
        "--pipeline-override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Hydra override for ours-pipeline (repeatable), e.g. matcher=tiny_bert",
    )
    p.add_argument(
        "--tfidf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a TF-IDF setting of --dataset's features (repeatable), e.g. lead_chars=600",
    )
    p.add_argument(
        "--xr-override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Hydra override for ours-xrtransformer (repeatable); default for eurlex57k "
        "experiment=eurlex57k_xr_ensemble, else method=xrtransformer. Its TF-IDF becomes every system's "
        "(unless --tfidf; given without a neural system, it still sets the TF-IDF, so that linear peers run "
        "apart see the same features), its encoder folder and token length pecos-xrt's",
    )
    p.add_argument(
        "--steps-scale",
        type=float,
        default=1.0,
        help="pecos-xrt: every level's steps and warm-up steps of PECOS's recipe times this (CPU runs)",
    )
    p.add_argument(
        "--pecos-batch-workers",
        type=int,
        default=None,
        help="pecos-xrt: DataLoader worker processes (default: the thread count; 0 makes batches in-process, "
        "no forked copies of a large process)",
    )
    p.add_argument("--tag", default="", help="suffix of the result files: <out>/<problem>-<tag>.md/.json")
    syn = p.add_argument_group("synthetic problems")
    syn.add_argument("--n-test", type=int, default=2000)
    syn.add_argument("--n-features", type=int, default=50_000)
    syn.add_argument("--seed", type=int, default=0)
    syn.add_argument("--scale-labels", default="1000,4000,16000,64000", help="L values at --fixed-docs")
    syn.add_argument("--scale-docs", default="5000,10000,20000,40000", help="N values at --fixed-labels")
    syn.add_argument("--fixed-docs", type=int, default=20_000)
    syn.add_argument("--fixed-labels", type=int, default=4_000)
    return p


def rerender(paths: list[Path], reference: str, out: Path, tag: str) -> dict[str, Any]:
    """Redraw one saved result in place, or merge several into ``<out>/<problem>-<tag>``."""
    if len(paths) > 1 and not tag:
        raise BenchmarkArgError("--rerender with several results needs --tag (the merged table's name)")
    try:
        saved = merge_results([load_json(p) for p in paths]) if len(paths) > 1 else load_json(paths[0])
    except ValueError as exc:
        raise BenchmarkArgError(str(exc)) from exc
    result = render(saved, reference)
    if len(paths) > 1:
        write_result(result, out, f"{saved['settings']['problem']}-{tag}")
    else:
        write_result(result, paths[0].parent, paths[0].stem)
    print(result["markdown"])
    return result


def xr_overrides(args: argparse.Namespace) -> list[str]:
    """ours-xrtransformer's Hydra overrides: ``--xr-override``, else the dataset's default."""
    if args.xr_override:
        return list(args.xr_override)
    return list(XR_DEFAULTS.get(Path(args.dataset or "").name, ("method=xrtransformer",)))


def neural_setup(args: argparse.Namespace) -> tuple[dict[str, list[str]], dict[str, Any]]:
    """What the neural systems share: their script arguments (ours' overrides; PECOS's encoder
    folder, token length and steps scale, all from ours' settings) and the TF-IDF settings that
    differ from the defaults (every system's features when one of them runs)."""
    from xtransformer.api import TfidfConfig, compose_settings, resolve_model

    if args.steps_scale <= 0:
        raise BenchmarkArgError(f"--steps-scale must be > 0, got {args.steps_scale}")
    if args.pecos_batch_workers is not None and args.pecos_batch_workers < 0:
        raise BenchmarkArgError(f"--pecos-batch-workers must be >= 0, got {args.pecos_batch_workers}")
    batch_workers = [] if args.pecos_batch_workers is None else ["--batch-workers", str(args.pecos_batch_workers)]
    overrides = xr_overrides(args)
    s = compose_settings(*overrides)
    if s.method != "xrtransformer":
        raise BenchmarkArgError(
            f"--xr-override {overrides} gives method={s.method}; ours-xrtransformer needs xrtransformer"
        )
    matcher, tfidf = s.main.matcher, s.main.tfidf.training_settings()
    pecos = ["--encoder", str(resolve_model(matcher.model_name_or_path)), "--max-length", str(matcher.max_length)]
    extra = {
        "ours-xrtransformer": [f"--override={o}" for o in overrides],
        "pecos-xrt": [*pecos, "--steps-scale", str(args.steps_scale), *batch_workers],
    }
    defaults = TfidfConfig().training_settings()
    return extra, {k: v for k, v in tfidf.items() if defaults.get(k) != v}


def run_setup(args: argparse.Namespace, systems: list[SystemSpec]) -> tuple[dict[str, list[str]], dict[str, Any], int]:
    """``neural_setup``'s (arguments, TF-IDF) when a neural system runs or ``--xr-override`` is given
    (linear peers run apart then see the neural run's features), and the repeats: ``--repeats``, else
    1 for scaling runs and runs that fine-tune an encoder (minutes each), else 3."""
    neural = any(spec.name in NEURAL_SYSTEMS for spec in systems)
    extra, tfidf = neural_setup(args) if args.dataset and (neural or args.xr_override) else ({}, {})
    return extra, tfidf, args.repeats or (1 if args.scaling or neural else 3)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    if (args.repeats is not None and args.repeats < 1) or args.topk < 1 or args.threads < 1:
        raise BenchmarkArgError("--repeats, --topk and --threads must be >= 1")
    if args.first_repeat < 0:
        raise BenchmarkArgError(f"--first-repeat must be >= 0, got {args.first_repeat}")
    if args.holdout < 0 or (args.holdout and (args.eval_split not in (None, "holdout") or not args.dataset)):
        raise BenchmarkArgError("--holdout N: N >= 1 training documents of a --dataset, scored instead of --eval-split")
    if args.rerender:
        return rerender(args.rerender, args.reference, args.out, args.tag)
    systems = get_systems(args.systems or (SCALING_SYSTEMS if args.scaling else DEFAULT_SYSTEMS))
    extra, xr_tfidf, repeats = run_setup(args, systems)
    settings = RunSettings(
        topk=args.topk,
        threads=args.threads,
        stop_after=args.stop_after,
        timeout_s=args.timeout,
        keep_models=args.keep_models,
        first_repeat=args.first_repeat,
        extra_args=extra | {"ours-pipeline": [f"--override={o}" for o in args.pipeline_override]},
    )
    base = SyntheticSpec(n_test=args.n_test, n_features=args.n_features, seed=args.seed)
    try:
        if args.scaling:
            return run_scaling(
                base,
                systems,
                repeats,
                settings,
                args.work,
                args.out,
                args.reference,
                labels=_int_list(args.scale_labels, "--scale-labels"),
                docs=_int_list(args.scale_docs, "--scale-docs"),
                fixed_docs=args.fixed_docs,
                fixed_labels=args.fixed_labels,
            )
        if args.synthetic:
            n_docs, n_labels = parse_synthetic(args.synthetic)
            problem = prepare_synthetic(replace(base, n_train=n_docs, n_labels=n_labels), args.work, args.rebuild_data)
        else:
            problem = prepare_dataset(
                args.dataset,
                args.work,
                args.eval_split,
                args.max_docs,
                args.rebuild_data,
                tfidf=tfidf_settings(args.tfidf) if args.tfidf else xr_tfidf,
                holdout=args.holdout,
            )
    except SyntheticError as exc:
        raise BenchmarkArgError(str(exc)) from exc
    result = benchmark(problem, systems, repeats, settings, args.work, args.reference)
    md = write_result(result, args.out, f"{problem.name}-{args.tag}" if args.tag else problem.name)
    print(result["markdown"])
    log(f"wrote {md} and {md.with_suffix('.json')}")
    return result


if __name__ == "__main__":
    try:
        main()
    except BenchmarkArgError as exc:
        sys.exit(f"error: {exc}")
