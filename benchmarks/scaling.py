"""How each stage's time and memory grow with L (at fixed N) and with N (at fixed L).

Every point is a synthetic problem (``benchmarks.synthetic``) benchmarked like a dataset; its
own table and JSON go to ``<out>/scaling/``. The curves (medians per system and phase) go to
``<out>/scaling-<tag>.json`` / ``.md`` and a PNG plot next to them.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.harness import benchmark, log, write_result
from benchmarks.measure import RunSettings
from benchmarks.plot import PHASE_STYLES, plot_scaling
from benchmarks.synthetic import SyntheticSpec
from benchmarks.systems import SystemSpec
from benchmarks.workdata import prepare_synthetic
from xtransformer.api import atomic_path, save_json

CURVE_FIELDS = (*PHASE_STYLES, "peak_rss_mb", "P@1")


def scaling_points(
    labels: list[int], docs: list[int], fixed_docs: int, fixed_labels: int
) -> list[tuple[str, int, int]]:
    """(axis, N, L) for every point of both curves."""
    return [("labels", fixed_docs, L) for L in labels] + [("docs", N, fixed_labels) for N in docs]


def curves_from(
    results: dict[tuple[int, int], dict[str, Any]], points: list[tuple[str, int, int]]
) -> dict[str, dict[str, dict[str, list[list[float]]]]]:
    """``{axis: {row: {field: [[x, median], ...]}}}`` from per-point summaries."""
    curves: dict[str, dict[str, dict[str, list[list[float]]]]] = {}
    for axis, n, L in points:
        x = L if axis == "labels" else n
        for row, stats in results[(n, L)]["summary"].items():
            for field in CURVE_FIELDS:
                if field in stats:
                    curves.setdefault(axis, {}).setdefault(row, {}).setdefault(field, []).append(
                        [x, stats[field]["median"]]
                    )
    return curves


def curves_markdown(results: dict[tuple[int, int], dict[str, Any]]) -> str:
    cols = ["N", "L", "system", "index s", "train s", "predict s", "peak RSS MiB", "P@1"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for (n, L), res in sorted(results.items()):
        for row, s in res["summary"].items():
            cells = [f"{n:,}", f"{L:,}", row] + [
                "–" if f not in s else f"{s[f]['median']:,.{d}f}"
                for f, d in (("index_s", 2), ("train_s", 2), ("predict_s", 2), ("peak_rss_mb", 0), ("P@1", 2))
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_scaling(
    base: SyntheticSpec,
    systems: list[SystemSpec],
    repeats: int,
    settings: RunSettings,
    work_root: Path,
    out_dir: Path,
    reference: str | None,
    *,
    labels: list[int],
    docs: list[int],
    fixed_docs: int,
    fixed_labels: int,
) -> dict[str, Any]:
    points = scaling_points(labels, docs, fixed_docs, fixed_labels)
    results: dict[tuple[int, int], dict[str, Any]] = {}
    for _, n, L in points:
        if (n, L) in results:  # the two curves may share a point
            continue
        problem = prepare_synthetic(replace(base, n_train=n, n_labels=L), work_root)
        results[(n, L)] = benchmark(problem, systems, repeats, settings, work_root, reference)
        write_result(results[(n, L)], out_dir / "scaling", problem.name)
    curves = curves_from(results, points)
    tag = f"n{fixed_docs}-l{fixed_labels}-f{base.n_features}"
    first = next(iter(results.values()))
    title = (
        f"Synthetic scaling: L in {labels} at N={fixed_docs:,}; N in {docs} at L={fixed_labels:,}; "
        f"F={base.n_features:,}; {settings.threads} threads; {first['settings']['date']}, "
        f"{first['machine']['cores']} cores, commit {first['commit']}"
    )
    png = plot_scaling(curves, out_dir / f"scaling-{tag}.png", title)
    markdown = f"{title}\n\n{curves_markdown(results)}\n\n![growth curves]({png.name})\n"
    with atomic_path(out_dir / f"scaling-{tag}.md") as tmp:
        tmp.write_text(markdown)
    record = {
        "title": title,
        "points": [list(p) for p in points],
        "curves": curves,
        "results": {f"{n}x{L}": r["summary"] for (n, L), r in results.items()},
        "skipped": first["skipped"],
        "markdown": markdown,
    }
    save_json(record, out_dir / f"scaling-{tag}.json")
    print(markdown)
    log(f"wrote {png} and scaling-{tag}.md/.json")
    return record
