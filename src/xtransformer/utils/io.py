"""Atomic artifact I/O and settings-keyed cache paths.

Every artifact is written to a temporary sibling and renamed into place, so a
killed run never leaves a half-written file or folder that a later run would
trust. A finished artifact folder carries the sha256 of every file
(``_CHECKSUMS.json``) and a ``_COMPLETE`` marker written last, so a folder
corrupted later (in place, truncated, replaced) is detected before it is trusted.
Temporary names carry the writer's pid, so leftovers of killed runs can be told
from the work of live ones (:func:`remove_stale_tmp`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

COMPLETE_MARKER = "_COMPLETE"
CHECKSUMS = "_CHECKSUMS.json"


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path in the same folder; rename it onto ``path`` on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.pid{os.getpid()}.", suffix=".tmp", dir=path.parent)
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
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.pid{os.getpid()}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        write_checksums(tmp)
        (tmp / COMPLETE_MARKER).write_text("ok\n")
        if path.exists():
            if not overwrite:
                raise FileExistsError(path)
            old = path.with_name(f".{path.name}.pid{os.getpid()}.old.tmp")
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def build_once(target: str | os.PathLike, build: Any) -> None:
    """Build the folder ``target`` atomically with ``build(tmp)`` unless it is already complete;
    a concurrent builder (another DDP rank) winning the race is fine."""
    target = Path(target)
    if is_complete(target):
        return
    try:
        with atomic_dir(target, overwrite=False) as tmp:
            build(tmp)
    except (FileExistsError, OSError):
        if not is_complete(target):
            raise


def is_complete(path: str | os.PathLike, verify: bool = False) -> bool:
    """True when ``path`` is an artifact folder that finished writing (and, with ``verify``, whose
    files still match their checksums)."""
    if not (Path(path) / COMPLETE_MARKER).is_file():
        return False
    return not verify or first_mismatch(path) is None


def file_sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def checksums(folder: str | os.PathLike, files: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """``{relative path: {size, sha256}}`` of ``files`` (default: every file under ``folder``)."""
    folder = Path(folder)
    if files is None:
        files = sorted(
            str(p.relative_to(folder))
            for p in folder.rglob("*")
            if p.is_file() and p.name not in (CHECKSUMS, COMPLETE_MARKER)
        )
    return {f: {"size": (folder / f).stat().st_size, "sha256": file_sha256(folder / f)} for f in files}


def mismatch(folder: str | os.PathLike, sums: dict[str, dict[str, Any]]) -> str | None:
    """The first file of ``sums`` that is missing or differs (size first, then content), else None."""
    folder = Path(folder)
    for name, want in sums.items():
        f = folder / name
        if not f.is_file() or f.stat().st_size != want["size"]:
            return name
    for name, want in sums.items():
        if file_sha256(folder / name) != want["sha256"]:
            return name
    return None


def write_checksums(folder: str | os.PathLike) -> None:
    save_json(checksums(folder), Path(folder) / CHECKSUMS)


def first_mismatch(folder: str | os.PathLike) -> str | None:
    """The first file of a finished folder that no longer matches its checksum (``_CHECKSUMS.json``
    itself when it is missing or unreadable), else None."""
    try:
        sums = load_json(Path(folder) / CHECKSUMS)
    except (OSError, ValueError):
        return CHECKSUMS
    return mismatch(folder, sums)


def remove_stale_tmp(root: str | os.PathLike) -> list[Path]:
    """Remove temporary files and folders under ``root`` left by writers that are no longer running
    (their pid is in the name); returns what was removed."""
    removed = []
    for p in Path(root).rglob(".*.tmp"):
        found = re.search(r"\.pid(\d+)\.", p.name)
        if found is None or _alive(int(found.group(1))):
            continue
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        removed.append(p)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        sp.save_npz(fh, sp.csr_matrix(mat), compressed=False)


def load_csr(path: str | os.PathLike) -> sp.csr_matrix:
    return sp.load_npz(path).tocsr()


def save_npy(arr: np.ndarray, path: str | os.PathLike) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        np.save(fh, arr)


def settings_key(*parts: Any, length: int = 16) -> str:
    """Stable short hash of JSON-serialisable settings (dict order does not matter)."""
    blob = json.dumps(parts, sort_keys=True, default=_json_default)
    return hashlib.sha256(blob.encode()).hexdigest()[:length]


def file_fingerprint(path: str | os.PathLike) -> dict[str, Any]:
    """Identity of an input file for cache keys: its size and content hash, never its path or
    times (a copied or touched file keeps its key; an edited one changes it)."""
    return {"size": Path(path).stat().st_size, "sha256": file_sha256(path)}


def text_digests(texts: Sequence[str]) -> np.ndarray:
    """A 64-bit blake2b digest of every text, in order (what finds a text among others)."""
    digests = b"".join(hashlib.blake2b(t.encode("utf-8", "surrogatepass"), digest_size=8).digest() for t in texts)
    return np.frombuffer(digests, dtype=np.uint64).copy()


def texts_fingerprint(texts: Sequence[str]) -> str:
    """sha256 of a list of texts (order and boundaries included)."""
    h = hashlib.sha256()
    h.update(str(len(texts)).encode())
    for t in texts:
        b = t.encode("utf-8", "surrogatepass")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()
