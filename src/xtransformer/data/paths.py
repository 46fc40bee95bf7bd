"""Where data and caches live.

Datasets: the ``data.data_dir`` config key, else ``$XMC_DATA_DIR``, else ``../shared/data``
beside the project checkout. Caches (unpacked archives, TF-IDF, stage artifacts): the
``paths.cache_dir`` config key, else ``$XMC_CACHE_DIR``, else ``cache/`` in the checkout
(``~/.cache/xtransformer`` for an installed, non-editable package).
"""

from __future__ import annotations

import os
from pathlib import Path


def project_root() -> Path | None:
    """The source checkout this package runs from, if any (has pyproject.toml)."""
    root = Path(__file__).resolve().parents[3]
    return root if (root / "pyproject.toml").is_file() else None


def default_data_dir() -> Path:
    env = os.environ.get("XMC_DATA_DIR")
    if env:
        return Path(env).expanduser()
    root = project_root() or Path.cwd()
    return (root / ".." / "shared" / "data").resolve()


def default_cache_dir() -> Path:
    env = os.environ.get("XMC_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    root = project_root()
    return root / "cache" if root is not None else Path.home() / ".cache" / "xtransformer"
