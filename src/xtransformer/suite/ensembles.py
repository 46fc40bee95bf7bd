"""Finish an ensemble sweep: the papers' ensembles of several encoders or indexings, one Hydra
multirun whose finished runs are the members (``sweeps/xt_<set>.yaml``, ``sweeps/xrt_<set>.yaml``).

Runs by itself at the end of such a sweep (a Hydra callback), or by hand::

    python -m xtransformer.suite.ensembles <sweep folder> --method softmax-average [--published ID ...]

The members' predictions on their eval split are combined into ``<sweep>/ensembles/all`` (its
``metrics.json`` names the published rows it stands beside), then the sweep's table is written
(``results.{md,csv,png}``: every configuration, the ensemble and the published rows).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from xtransformer.ensemble import METHODS, ensemble_runs
from xtransformer.suite.aggregate import report_sweep
from xtransformer.suite.published import published_section, select
from xtransformer.suite.runs import METRICS_FILE, AggregateError
from xtransformer.utils.io import save_json

log = logging.getLogger(__name__)

ENSEMBLES = "ensembles"  # the sweep's subfolder of ensemble folders (no member lives there)


def write_ensemble_folder(members: Sequence[Path], out: Path, method: str, fields: Mapping[str, Any]) -> Path:
    """``out``: the members' predictions on their eval split combined by ``method``, and its
    ``metrics.json`` (members, data set, split, method, ``fields``, the metrics)."""
    first = json.loads((members[0] / METRICS_FILE).read_text())
    split = first["eval_split"]
    results = ensemble_runs(members, out, method, splits=[split])
    doc = {
        "method": "ensemble",
        "ensemble_method": method,
        "members": [str(m) for m in members],
        "dataset": first["dataset"],
        "eval_split": split,
        **fields,
        "metrics": results[split],
    }
    save_json(doc, out / METRICS_FILE)
    return out


def member_runs(sweep: Path) -> list[Path]:
    """The sweep's finished runs (not its ensembles), in folder order."""
    out = []
    for path in sorted(sweep.rglob(METRICS_FILE)):
        if ENSEMBLES in path.relative_to(sweep).parts[:-1]:
            continue
        if json.loads(path.read_text()).get("method") != "ensemble":
            out.append(path.parent)
    return out


def build_ensemble(sweep: Path, method: str = "average", published: Sequence[str] = ()) -> Path:
    """``<sweep>/ensembles/all``: every finished run of the sweep combined by ``method``."""
    members = member_runs(sweep)
    if len(members) < 2:
        raise AggregateError(f"{sweep}: {len(members)} finished run(s); an ensemble needs at least 2")
    fields = {"published": published_section(published)} if published else {}
    return write_ensemble_folder(members, sweep / ENSEMBLES / "all", method, fields)


def finish(sweep: Path, method: str = "average", published: Sequence[str] = ()) -> str:
    """Build the sweep's ensemble, then write its table; returns the Markdown table."""
    out = build_ensemble(sweep, method, published)
    log.info("ensemble of %s (%s): %s", sweep, method, out)
    return report_sweep(sweep)


class FinishEnsemble(Callback):
    """Hydra callback of an ensemble sweep: when its last run ends, combine the runs and write the
    table, so a paper's ensemble is one command. ``method`` and ``published`` are checked at the
    sweep's start."""

    def __init__(self, method: str = "average", published: Sequence[str] | None = None) -> None:
        if method not in METHODS:
            raise AggregateError(f"FinishEnsemble: method must be one of {list(METHODS)}, got {method!r}")
        self.method, self.published = method, [str(p) for p in published or []]
        select(self.published)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        print(finish(Path(config.hydra.sweep.dir), self.method, self.published))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m xtransformer.suite.ensembles", description=__doc__.split("\n")[0])
    ap.add_argument("sweep", type=Path)
    ap.add_argument("--method", default="average", choices=METHODS)
    ap.add_argument("--published", nargs="*", default=[], metavar="ID", help="<paper>/<set>/<row> (published.yaml)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        print(finish(args.sweep, args.method, args.published))
    except AggregateError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
