"""The matcher stage under Lightning DDP with 2 CPU processes (gloo): ``ddp`` and ``ddp_spawn``."""

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

SCRIPT = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, {tests!r})
    import numpy as np
    from matcher_helpers import TRAINER, toy_data
    from xtransformer.cache import StageCache
    from xtransformer.context import TrainContext, TrainerConfig
    from xtransformer.matcher import EncodeOptions, LoadedMatcher, MatcherConfig, fine_tune_matcher

    def main():
        strategy, model, out = sys.argv[1:4]
        cfg = MatcherConfig(model_name_or_path=model, max_length=32, batch_size=8, lr=1e-3, max_steps=4,
                            checkpoint_every_n_steps=2, val_every_n_steps=2, topb=2, progress=False,
                            cache_dir=os.path.join(out, "tok"))
        ctx = TrainContext(cache=StageCache(os.path.join(out, "cache")), lightning=TRAINER,
                           trainer=TrainerConfig(devices=2, strategy=strategy))
        data, C = toy_data()
        folder = fine_tune_matcher(ctx, "ddp", data["train"], C, cfg, data["dev"])
        matcher = LoadedMatcher.load(folder)
        if os.environ.get("LOCAL_RANK", "0") == "0":
            emb = matcher.encode(data["test"].texts, EncodeOptions(topb=2, progress=False)).embeddings
            np.save(os.path.join(out, "test.npy"), emb)
        print("RESULT " + json.dumps({{"rank": os.environ.get("LOCAL_RANK", "0"),
                                      "step": matcher.meta["global_step"]}}), flush=True)

    if __name__ == "__main__":  # ddp_spawn re-imports this file in its workers
        main()
""")


def _run(strategy: str, model: Path, out: Path) -> list[dict]:
    script = out / "run_matcher.py"
    out.mkdir(parents=True, exist_ok=True)
    script.write_text(SCRIPT.format(tests=str(Path(__file__).resolve().parents[1])))
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "WANDB_MODE": "offline",
        "PYTHONWARNINGS": "ignore",
    }
    env.pop("LOCAL_RANK", None)
    proc = subprocess.run(
        [sys.executable, str(script), strategy, str(model), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Starting with 2 processes" in proc.stdout + proc.stderr
    return [json.loads(line[len("RESULT ") :]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]


@pytest.mark.slow
def test_ddp_and_ddp_spawn_two_cpu_processes(tmp_path: Path) -> None:
    model = build_tiny("bert", tmp_path / "tiny-bert")
    results = {}
    for strategy in ("ddp", "ddp_spawn"):
        out = tmp_path / strategy
        reports = _run(strategy, model, out)
        # ddp: the script runs once per rank and every rank returns the outputs; ddp_spawn: main only.
        assert sorted(r["rank"] for r in reports) == (["0", "1"] if strategy == "ddp" else ["0"])
        assert all(r["step"] == 4 for r in reports)
        stage = out / "cache" / "stages" / "matcher"
        assert (stage / "ddp" / "matcher" / "head.safetensors").is_file()  # committed once, by rank 0
        assert len(list((stage / "_work" / "ddp" / "logs").iterdir())) == 1  # one logger run: rank 0 only
        results[strategy] = np.load(out / "test.npy")
        assert np.isfinite(results[strategy]).all()
    # Same seed, same shards, same all-reduce: both launchers train the same model.
    np.testing.assert_allclose(results["ddp"], results["ddp_spawn"], atol=1e-4)
