"""Atomic artifact I/O and settings-keyed cache paths.

Every artifact is written to a temporary sibling and renamed into place, so a
killed run never leaves a half-written file or folder that a later run would
trust. A finished artifact folder carries a ``_COMPLETE`` marker written last.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import scipy.sparse as sp

COMPLETE_MARKER = "_COMPLETE"


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path in the same folder; rename it onto ``path`` on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, overwrite: bool = True) -> Iterator[Path]:
    """Yield a temporary folder; on success mark it complete and rename it onto ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        (tmp / COMPLETE_MARKER).write_text("ok\n")
        if path.exists():
            if not overwrite:
                raise FileExistsError(path)
            old = path.with_name(f".{path.name}.old.{os.getpid()}")
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def is_complete(path: str | os.PathLike) -> bool:
    """True when ``path`` is an artifact folder that finished writing."""
    return (Path(path) / COMPLETE_MARKER).is_file()


def save_json(obj: Any, path: str | os.PathLike) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def load_json(path: str | os.PathLike) -> Any:
    return json.loads(Path(path).read_text())


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def save_csr(mat: sp.spmatrix, path: str | os.PathLike) -> None:
    """Save a sparse matrix as CSR ``.npz`` atomically."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            sp.save_npz(fh, sp.csr_matrix(mat), compressed=False)


def load_csr(path: str | os.PathLike) -> sp.csr_matrix:
    return sp.load_npz(path).tocsr()


def save_npy(arr: np.ndarray, path: str | os.PathLike) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            np.save(fh, arr)


def settings_key(*parts: Any, length: int = 16) -> str:
    """Stable short hash of JSON-serialisable settings (dict order does not matter)."""
    blob = json.dumps(parts, sort_keys=True, default=_json_default)
    return hashlib.sha256(blob.encode()).hexdigest()[:length]


def file_fingerprint(path: str | os.PathLike) -> dict[str, Any]:
    """Cheap identity of an input file for cache keys: name, size, mtime."""
    st = Path(path).stat()
    return {"name": Path(path).name, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
