"""Finish a Table 5 sweep: build the ensembles of rows 7-9 per seed, then aggregate the table.

Runs by itself at the end of ``sweeps/table5.yaml`` (a Hydra callback), or by hand:

    python -m xtransformer.suite.table5 outputs/table5/multiruns/<date> [--method average]

Row 7: all indexings with XLNet; row 8: pifa_neural with all matchers; row 9: all x all
(members from ``sweeps/table5.yaml``: rows 4-6 and the extra runs x1-x4).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from xtransformer.ensemble import METHODS
from xtransformer.suite.aggregate import report_sweep
from xtransformer.suite.ensembles import ENSEMBLES, write_ensemble_folder
from xtransformer.suite.report import REPORT_FILES

log = logging.getLogger(__name__)

# Table 5 ensembles by the (indexing, matcher family) pairs of their members
ROWS = {
    7: [("pifa_tfidf", "xlnet"), ("pifa_neural", "xlnet"), ("text_emb", "xlnet")],
    8: [("pifa_neural", "bert"), ("pifa_neural", "roberta"), ("pifa_neural", "xlnet")],
    9: [(i, m) for i in ("pifa_tfidf", "pifa_neural", "text_emb") for m in ("bert", "roberta", "xlnet")],
}


def _family(matcher: str) -> str:
    name = matcher.lower()
    return next((f for f in ("roberta", "xlnet", "bert") if f in name), name)


def build_ensembles(sweep: Path, method: str = "average") -> list[Path]:
    """One ensemble folder per (row, seed) whose members all finished; returns their paths."""
    runs: dict[int, dict[tuple[str, str], Path]] = defaultdict(dict)
    for path in sorted(sweep.rglob("metrics.json")):
        doc = json.loads(path.read_text())
        cfg = doc.get("config", {})
        if doc.get("method") != "xtransformer" or "table5_id" not in cfg:
            continue
        ranker = cfg.get("ranker", {})
        if ranker.get("features") != "tfidf+neural" or ranker.get("negatives") != "tfn+man":
            continue  # rows 0-1 vary the ranker; the ensembles use the best ranker only
        runs[int(doc["seed"])][(cfg["indexing"]["name"], _family(cfg["matcher"]["name"]))] = path.parent
    made = []
    for seed, by_pair in sorted(runs.items()):
        for row, pairs in ROWS.items():
            members = [by_pair.get(p) for p in pairs]
            if any(m is None for m in members):
                continue
            out = sweep / ENSEMBLES / f"row{row}_seed{seed}"
            made.append(write_ensemble_folder(members, out, method, {"seed": seed, "table5_id": row}))
    return made


def finish(sweep: Path, method: str = "average") -> str:
    """Build the ensembles of rows 7-9, then write ``results.{md,csv,png}`` into the sweep folder."""
    made = build_ensembles(sweep, method)
    log.info("table 5: built %d ensemble(s) in %s", len(made), sweep / ENSEMBLES)
    table = report_sweep(sweep)
    log.info("table 5: %s", sweep / REPORT_FILES["md"])
    return table


class FinishTable5(Callback):
    """Hydra callback of ``sweeps/table5.yaml``: when the grid's last run ends, finish the table,
    so the whole of Table 5 is one command."""

    def __init__(self, method: str = "average") -> None:
        self.method = method

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        print(finish(Path(config.hydra.sweep.dir), self.method))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m xtransformer.suite.table5", description=__doc__.split("\n")[0])
    ap.add_argument("sweep", type=Path)
    ap.add_argument("--method", default="average", choices=METHODS)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(finish(args.sweep, args.method))
    return 0


if __name__ == "__main__":
    sys.exit(main())
