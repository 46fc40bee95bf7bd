"""The stage cache: every stage's artifacts live under a key of its training settings and its inputs' keys.

One cache serves every stage (TF-IDF, XR-Linear, indexing, matcher, ranker, XR-Transformer levels
and final model). A folder is trusted only when it finished writing (``atomic_dir``) *and* every
file still matches its checksum: a folder corrupted in place, truncated or swapped is named in a
warning, removed and rebuilt. Keys come from content and settings (each method's ``stage_keys``), never
from paths or file times, so a copied cache is still a cache. ``enabled=False`` reads nothing and
writes nothing under ``root``: stages then build in a scratch folder removed by :meth:`close`.
``events`` records what ran and what was reused, so tests assert on behaviour rather than on time.

A stage that trains a model across DDP processes is built ``collective``: every rank calls the
build (the fit is a collective operation), rank 0 alone commits the folder and the others wait for
it. Work that must outlive a killed run (training checkpoints) goes in :meth:`StageCache.work_dir`.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xtransformer.utils.dist import is_rank_zero
from xtransformer.utils.io import atomic_dir, first_mismatch, is_complete, load_json, remove_stale_tmp, save_json

log = logging.getLogger(__name__)


@dataclass
class StageCache:
    root: Path
    enabled: bool = True
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (stage, key, ran|reused|corrupt)
    seconds: dict[str, float] = field(default_factory=dict)  # build time per stage name, summed

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        self._scratch: Path | None = None
        if self.enabled and (self.root / "stages").is_dir():
            for p in remove_stale_tmp(self.root / "stages"):
                log.info("cache: removed %s, left by a run that was killed", p)

    @property
    def base(self) -> Path:
        """Where stage folders live: the cache, or (cache disabled) this run's scratch folder."""
        if self.enabled:
            return self.root
        if self._scratch is None:
            self._scratch = Path(tempfile.mkdtemp(prefix="xmc-nocache-"))
        return self._scratch

    def path(self, stage: str, key: str) -> Path:
        return self.base / "stages" / stage / key

    def trusted(self, stage: str, key: str, folder: Path | None = None) -> bool:
        """True when the finished folder of (stage, key) is intact; a corrupt one is reported and removed."""
        folder = folder or self.path(stage, key)
        if not self.enabled or not is_complete(folder):
            return False
        bad = first_mismatch(folder)
        if bad is None and _stage_key(folder) in (key, None):
            return True
        why = "checksum mismatch" if bad else f"it was built for key {_stage_key(folder)}"
        log.warning(
            "stage %s: cached artifact %s is corrupt, incomplete or foreign (%s); rebuilding it",
            stage,
            folder / (bad or "stage.json"),
            why,
        )
        self.events.append((stage, key, "corrupt"))
        shutil.rmtree(folder, ignore_errors=True)
        return False

    def work_dir(self, stage: str, key: str) -> Path:
        """A folder for (stage, key)'s work in progress that survives a killed run (checkpoints)."""
        return self.base / "stages" / stage / "_work" / key

    def run(
        self, stage: str, key: str, build: Callable[[Path], None], settings: Any = None, collective: bool = False
    ) -> Path:
        """Return the complete folder for (stage, key), calling ``build(tmp_dir)`` if missing or corrupt.

        ``collective``: on a DDP helper rank, ``build`` runs in a throwaway folder (its fit takes
        part in the collective work and writes nothing) and the call returns rank 0's folder."""
        folder = self.path(stage, key)
        if self.trusted(stage, key, folder):
            log.info("stage %s: reusing %s", stage, folder)
            self.events.append((stage, key, "reused"))
            return folder
        if collective and not is_rank_zero():
            return self._help_build(stage, folder, build)
        log.info("stage %s: building %s", stage, folder)
        start = time.perf_counter()
        with atomic_dir(folder) as tmp:
            build(tmp)
            save_json({"stage": stage, "key": key, "settings": settings, "pid": os.getpid()}, tmp / "stage.json")
            failpoint(stage)
        self.seconds[stage] = round(self.seconds.get(stage, 0.0) + time.perf_counter() - start, 3)
        self.events.append((stage, key, "ran"))
        return folder

    def _help_build(self, stage: str, folder: Path, build: Callable[[Path], None], poll_s: float = 1.0) -> Path:
        """A helper rank's share of a collective stage: build in scratch, then wait for rank 0's folder."""
        with tempfile.TemporaryDirectory(prefix=f"xmc-{stage}-rank-") as scratch:
            build(Path(scratch))
        parent = os.getppid()
        while not is_complete(folder):
            if os.getppid() != parent:
                raise RuntimeError(f"rank 0 exited before writing {folder}")
            time.sleep(poll_s)
        return folder

    def ran(self, stage: str | None = None) -> list[str]:
        return [s for s, _, what in self.events if what == "ran" and (stage is None or s == stage)]

    def reused(self) -> list[str]:
        return [s for s, _, what in self.events if what == "reused"]

    def corrupt(self) -> list[str]:
        return [s for s, _, what in self.events if what == "corrupt"]

    def close(self) -> None:
        """Remove the scratch folder of a run without cache (the model folder was copied out of it)."""
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None


def failpoint(stage: str) -> None:
    """Fault injection for tests: ``XMC_KILL_IN_STAGE=<stage>`` kills this process with SIGKILL (as
    ``kill -9``) when the stage's work is done but its folder not yet committed, so a test can check
    that a killed run leaves nothing a rerun would trust, and that the rerun ends the same."""
    if os.environ.get("XMC_KILL_IN_STAGE") == stage:
        log.warning("XMC_KILL_IN_STAGE=%s: killing this process before the stage's folder is committed", stage)
        logging.shutdown()
        os.kill(os.getpid(), signal.SIGKILL)


def _stage_key(folder: Path) -> str | None:
    """The key a stage folder was built for (``stage.json``), None for folders written without one."""
    try:
        return load_json(folder / "stage.json").get("key")
    except (OSError, ValueError):
        return None
