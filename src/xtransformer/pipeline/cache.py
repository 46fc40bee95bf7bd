"""Stage cache: each stage's artifacts live under a key of the settings that influence them.

A stage folder is trusted only once it is complete (written through ``atomic_dir``), so a run
killed half-way leaves nothing a later run would reuse, and an interrupted sweep resumes at the
first stage that did not finish. ``StageCache.events`` records what ran and what was reused, so
tests assert on behaviour rather than on time.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from xtransformer.utils.io import atomic_dir, is_complete, load_json, save_json, settings_key

log = logging.getLogger(__name__)


@dataclass
class StageCache:
    root: Path
    enabled: bool = True
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (stage, key, ran|reused)

    def __post_init__(self) -> None:
        self.root = Path(self.root)

    def key(self, *parts: Any) -> str:
        return settings_key(*parts)

    def path(self, stage: str, key: str) -> Path:
        return self.root / "stages" / stage / key

    def run(self, stage: str, key: str, build: Callable[[Path], None], settings: Any = None) -> Path:
        """Return the complete folder for (stage, key), calling ``build(tmp_dir)`` if missing."""
        folder = self.path(stage, key)
        if self.enabled and is_complete(folder):
            log.info("stage %s: reusing %s", stage, folder)
            self.events.append((stage, key, "reused"))
            return folder
        log.info("stage %s: building %s", stage, folder)
        with atomic_dir(folder) as tmp:
            build(tmp)
            if settings is not None:
                save_json({"stage": stage, "key": key, "settings": settings, "pid": os.getpid()}, tmp / "stage.json")
        self.events.append((stage, key, "ran"))
        return folder

    def ran(self, stage: str | None = None) -> list[str]:
        return [s for s, _, what in self.events if what == "ran" and (stage is None or s == stage)]

    def reused(self) -> list[str]:
        return [s for s, _, what in self.events if what == "reused"]

    @staticmethod
    def settings_of(folder: Path) -> Any:
        return load_json(folder / "stage.json")["settings"]
