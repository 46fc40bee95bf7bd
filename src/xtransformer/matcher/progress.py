"""Training progress as log lines: tqdm bars vanish in files and CI logs (stdout is block-buffered
there), so the matcher also logs step, loss, speed and ETA every ``every_s`` seconds."""

from __future__ import annotations

import logging
import time
from typing import Any

import lightning.pytorch as pl

log = logging.getLogger("xtransformer.matcher")


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


class ProgressLog(pl.Callback):
    def __init__(self, every_s: float = 30.0):
        self.every_s = float(every_s)
        self._start = self._last = 0.0
        self._first_step = 0

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start = self._last = time.perf_counter()
        self._first_step = trainer.global_step  # > 0 when resumed

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        now = time.perf_counter()
        step, total = trainer.global_step, trainer.max_steps
        if not trainer.is_global_zero or (now - self._last < self.every_s and step != total):
            return
        self._last = now
        done = max(step - self._first_step, 1)
        rate = (now - self._start) / done
        loss = trainer.callback_metrics.get("train/loss")
        eta = f", ETA {_clock(rate * (total - step))}" if total and total > 0 else ""
        of = f"/{total}" if total and total > 0 else ""
        log.info(
            "matcher step %d%s, loss %s, %.2f s/step%s",
            step,
            of,
            f"{float(loss):.4f}" if loss is not None else "n/a",
            rate,
            eta,
        )
