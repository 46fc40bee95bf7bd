"""train_matcher under Lightning DDP with 2 CPU processes (gloo): ``ddp`` and ``ddp_spawn``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tiny_models import build_tiny

SCRIPT = textwrap.dedent('''
    import json, os, sys
    sys.path.insert(0, {tests!r})
    from tiny_models import toy_xmc
    from xtransformer.matcher import MatcherConfig, train_matcher

    def main():
        strategy, model, out = sys.argv[1:4]
        cfg = MatcherConfig(model_name_or_path=model, max_length=32, batch_size=8, lr=1e-3, max_steps=4,
                            checkpoint_every_n_steps=2, val_every_n_steps=2, topb=2, progress=False,
                            cache_dir=os.path.join(out, "cache"))
        trainer = {{"accelerator": "cpu", "devices": 2, "strategy": strategy, "enable_progress_bar": False,
                   "enable_model_summary": False, "num_sanity_val_steps": 0, "log_every_n_steps": 1}}
        res = train_matcher(cfg, trainer, *toy_xmc(), os.path.join(out, "matcher"))
        print("RESULT " + json.dumps({{"rank": os.environ.get("LOCAL_RANK", "0"), "splits": res.splits,
                                      "step": res.metrics["global_step"]}}), flush=True)

    if __name__ == "__main__":  # ddp_spawn re-imports this file in its workers
        main()
''')


def _run(strategy: str, model: Path, out: Path) -> list[dict]:
    script = out / "run_matcher.py"
    out.mkdir(parents=True, exist_ok=True)
    script.write_text(SCRIPT.format(tests=str(Path(__file__).parent)))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "WANDB_MODE": "offline",
           "PYTHONWARNINGS": "ignore"}
    env.pop("LOCAL_RANK", None)
    proc = subprocess.run([sys.executable, str(script), strategy, str(model), str(out)], env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Starting with 2 processes" in proc.stdout + proc.stderr
    return [json.loads(line[len("RESULT "):]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]


@pytest.mark.slow
def test_ddp_and_ddp_spawn_two_cpu_processes(tmp_path: Path) -> None:
    model = build_tiny("bert", tmp_path / "tiny-bert")
    results = {}
    for strategy in ("ddp", "ddp_spawn"):
        out = tmp_path / strategy
        reports = _run(strategy, model, out)
        # ddp: the script runs once per rank and every rank returns the outputs; ddp_spawn: main only.
        assert sorted(r["rank"] for r in reports) == (["0", "1"] if strategy == "ddp" else ["0"])
        assert all(r["step"] == 4 and r["splits"] == ["train", "dev", "test"] for r in reports)
        matcher = out / "matcher"
        assert (matcher / "outputs.json").is_file() and (matcher / "model" / "head.pt").is_file()
        assert len(list((matcher / "logs").iterdir())) == 1  # one logger run: rank 0 only
        results[strategy] = np.load(matcher / "embeddings" / "test.npy")
        assert np.isfinite(results[strategy]).all()
    # Same seed, same shards, same all-reduce: both launchers train the same model.
    np.testing.assert_allclose(results["ddp"], results["ddp_spawn"], atol=1e-4)
