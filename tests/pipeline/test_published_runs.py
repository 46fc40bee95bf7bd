"""A run that names published rows (``published=[...]``) writes them into its metrics.json, logs them
beside its own results, hands them to its loggers, and the sweep aggregate prints them in its table."""

from __future__ import annotations

import json
import logging

from run_helpers import TINY, compose_run

from xtransformer.pipeline.loggers import log_final
from xtransformer.suite.aggregate import main as aggregate_main

ROW = "x-transformer/eurlex-4k/parabel"


class Collect:
    """A logger that keeps what it is given."""

    def __init__(self) -> None:
        self.metrics: dict[str, float] = {}

    def log_metrics(self, metrics: dict[str, float]) -> None:
        self.metrics |= metrics

    def save(self) -> None:
        pass


def test_a_run_sets_the_published_rows_it_names_beside_its_own(tmp_path, caplog, capsys):
    from xtransformer.pipeline.run import run

    tiny = [o for o in TINY if not o.startswith("logger=")]
    cfg = compose_run([*tiny, "logger=none", "train_xrlinear=false", f"published=[{ROW}]"], tmp_path)
    with caplog.at_level(logging.INFO, logger="xtransformer.pipeline.run"):
        run(cfg)
    run_dir = tmp_path / "run"
    saved = json.loads((run_dir / "metrics.json").read_text())
    row = saved["published"][ROW]
    assert row["printed"] == {"P@1": "82.12", "P@3": "68.91", "P@5": "57.89"} and row["metrics"]["P@1"] == 82.12
    assert row["method"] == "Parabel" and row["source"] == "X-Transformer (KDD 2020), Table 3, 'Parabel [20]'"
    ours = saved["metrics"]
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("published ")]
    assert line.endswith(
        f"P@1 82.12 P@3 68.91 P@5 57.89 | this run: P@1 {ours['P@1']:.2f} P@3 {ours['P@3']:.2f} P@5 {ours['P@5']:.2f}"
    )

    collect = Collect()
    log_final([collect], saved, run_dir)  # what a W&B / CSV logger receives
    assert collect.metrics[f"published/{ROW}/P@5"] == 57.89 and "final/xtransformer/P@1" in collect.metrics

    capsys.readouterr()  # the run's own output
    assert aggregate_main([str(run_dir)]) == 0
    table = [line.split(" | ") for line in capsys.readouterr().out.splitlines()[2:]]
    assert [row[:2] for row in table] == [["| reuters21578", "2"], ["| eurlex-4k", f"published: {ROW}"]]
    assert table[1][3] == "Parabel" and table[1][6:9] == ["82.12", "68.91", "57.89"]
    assert f"published: {ROW}" in (run_dir / "results.md").read_text()
