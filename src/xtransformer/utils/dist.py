"""Which process is rank 0, before any process group exists.

Lightning's DDP launcher re-runs the script once per extra rank (setting LOCAL_RANK / NODE_RANK /
RANK); under SLURM every task runs it from the start with SLURM_PROCID set. Only rank 0 builds the
stages and writes artifacts; the other ranks only help train the matcher.
"""

from __future__ import annotations

import os

_RANK_VARS = ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID")


def is_rank_zero() -> bool:
    return all(int(os.environ.get(k) or 0) == 0 for k in _RANK_VARS)


def rank_label() -> str:
    return ",".join(f"{k}={os.environ[k]}" for k in _RANK_VARS if k in os.environ) or "single process"
