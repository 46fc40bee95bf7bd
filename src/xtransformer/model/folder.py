"""The portable model folder: manifest, checksums and format version.

A model folder is self-describing: ``manifest.json`` names the format and its version, the
library that wrote it, the method, the component layout and the sha256 of every file, so a
loader can refuse a folder it cannot read (newer format) and name the exact file that is
damaged (checksum) before trusting any of it. The folder never refers to the stage cache.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from xtransformer.utils.io import COMPLETE_MARKER, save_json

FORMAT = "xtransformer-model"
# Bump when a reader of the previous version could misread a new folder; readers refuse newer ones.
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
TRAIN_SETTINGS = "train_settings.json"
PREDICT_SETTINGS = "predict_settings.json"
LABELS = "labels.json"
# settings that would point into this machine's cache or checkout: meaningless in a portable folder
LOCAL_KEYS = frozenset({"cache_dir", "base_model", "output_dir", "log_dir", "root_dir"})


class ModelError(ValueError):
    """A model folder that cannot be used; the message names the folder or file at fault."""


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def _listed_files(folder: Path) -> list[str]:
    """Every file of the folder except the manifest and the completion marker (written after it)."""
    out = []
    for root, _, names in os.walk(folder):
        for name in names:
            rel = (Path(root) / name).relative_to(folder).as_posix()
            if rel not in (MANIFEST, COMPLETE_MARKER):
                out.append(rel)
    return sorted(out)


def write_manifest(folder: Path, method: str, components: dict[str, Any]) -> dict[str, Any]:
    """Write ``manifest.json`` last, over the files already in ``folder``."""
    from xtransformer import __version__

    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "library": "xtransformer",
        "library_version": __version__,
        "method": method,
        "components": components,
        "files": {rel: sha256_file(folder / rel) for rel in _listed_files(folder)},
    }
    save_json(manifest, folder / MANIFEST)
    return manifest


def read_manifest(folder: str | os.PathLike, verify: bool = True) -> dict[str, Any]:
    """The manifest of ``folder``, after checking format, version and (``verify``) every checksum."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ModelError(f"{folder}: no such model folder")
    path = folder / MANIFEST
    if not path.is_file():
        raise ModelError(f"{folder}: not a model folder (no {MANIFEST})")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ModelError(f"{path}: corrupt manifest ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ModelError(f"{path}: not an {FORMAT} manifest")
    version = manifest.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ModelError(f"{path}: model format version {version} is newer than this xtransformer reads "
                         f"({FORMAT_VERSION}); upgrade xtransformer (model written by "
                         f"{manifest.get('library_version')})")
    if verify:
        for rel, digest in manifest.get("files", {}).items():
            file = folder / rel
            if not file.is_file():
                raise ModelError(f"{file}: missing (listed in {MANIFEST})")
            if sha256_file(file) != digest:
                raise ModelError(f"{file}: checksum mismatch (sha256 differs from {MANIFEST}); the model folder is corrupt")
    return manifest


def scrub(obj: Any) -> Any:
    """A record without machine-local paths (cache, output folders): what a folder may keep."""
    if isinstance(obj, dict):
        return {k: scrub(v) for k, v in obj.items() if k not in LOCAL_KEYS}
    if isinstance(obj, list):
        return [scrub(v) for v in obj]
    return obj


def load_record(folder: Path, name: str) -> Any:
    """A JSON record of a verified folder (a decode error still names the file)."""
    try:
        return json.loads((folder / name).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelError(f"{folder / name}: missing") from None
    except ValueError as e:
        raise ModelError(f"{folder / name}: corrupt JSON ({e})") from None
