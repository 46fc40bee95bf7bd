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
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from xtransformer.utils.io import CHECKSUMS, COMPLETE_MARKER, save_json

FORMAT = "xtransformer-model"
# Bump when a reader of the previous version could misread a new folder; readers refuse newer ones.
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
TRAIN_SETTINGS = "train_settings.json"
PREDICT_SETTINGS = "predict_settings.json"
LABELS = "labels.json"
INDEX = "models.json"  # in a run's model/ folder: the methods it holds and the main one
# settings that would point into this machine's cache or checkout: meaningless in a portable folder
LOCAL_KEYS = frozenset({"cache_dir", "base_model", "output_dir", "log_dir", "root_dir"})
# what the Hugging Face Hub keeps at a repository's root beside the folder (model/hub.py writes the card)
HUB_ROOT_FILES = frozenset({"README.md", ".gitattributes"})


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
    """The manifest of ``folder``, after checking everything that can be checked before any weights
    are read: format and version, that no listed file (or any symlink in the folder) leads outside
    it (a Hugging Face cache snapshot's links into its repository's blobs aside), that every member
    of a combination is there and passes the same checks, and (``verify``) every checksum, with no
    file in the folder left unlisted (the Hub's own files at a snapshot's root aside). Each refusal
    is one line naming the file at fault (:class:`ModelError`)."""
    return _read_manifest(Path(folder), verify, ())


def _read_manifest(folder: Path, verify: bool, parents: tuple[Path, ...]) -> dict[str, Any]:
    if not folder.is_dir():
        raise ModelError(f"{folder}: no such model folder")
    path = folder / MANIFEST
    if not path.is_file():
        raise ModelError(f"{folder}: not a model folder (no {MANIFEST})")
    try:
        raw = path.read_bytes()
        manifest = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ModelError(f"{path}: corrupt manifest ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ModelError(f"{path}: not an {FORMAT} manifest")
    version = manifest.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ModelError(f"{path}: corrupt manifest (format_version {version!r} is not a version number)")
    if version > FORMAT_VERSION:
        raise ModelError(
            f"{path}: model format version {version} is newer than this xtransformer reads "
            f"({FORMAT_VERSION}); upgrade xtransformer (model written by "
            f"{manifest.get('library_version')})"
        )
    files = manifest.get("files", {})
    components = manifest.get("components")
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        raise ModelError(f"{path}: corrupt manifest (files must map relative paths to sha256 digests)")
    if not isinstance(components, dict) or not isinstance(components.get("kind"), str):
        raise ModelError(f"{path}: corrupt manifest (components must name the model kind)")
    root = folder.resolve()
    store = hub_blobs(root)
    within = (root,) if store is None else (root, store)
    for rel in files:
        _check_inside(folder, within, rel, path)
    _check_symlinks(folder, within)
    if components["kind"] == "ensemble":
        _check_members(folder, root, components.get("members"), path, verify, (*parents, root))
    if verify:
        hub_files = HUB_ROOT_FILES if store is not None and root.parent.name == "snapshots" else frozenset()
        _verify_files(folder, root, files, raw, hub_files)
    return manifest


def hub_blobs(root: Path) -> Path | None:
    """The ``blobs/`` folder of the Hugging Face cache repository whose snapshot holds ``root``
    (``<cache>/models--owner--name/snapshots/<commit>/...``, every file a link into it), else None:
    where a folder's symlinks may lead besides the folder itself."""
    for snapshot in (root, *root.parents):
        if snapshot.parent.name == "snapshots" and snapshot.parent.parent.name.startswith("models--"):
            blobs = snapshot.parent.parent / "blobs"
            return blobs.resolve() if blobs.is_dir() else None
    return None


def _check_inside(folder: Path, within: tuple[Path, ...], rel: str, manifest: Path) -> None:
    """A listed path must name a file inside the folder: relative, no '..', no symlink out of it."""
    pure = PurePosixPath(rel)
    if not rel or pure.is_absolute() or PureWindowsPath(rel).is_absolute() or PureWindowsPath(rel).drive:
        raise ModelError(f"{manifest}: lists {rel!r}, an absolute path; a model folder lists only its own files")
    if ".." in pure.parts or ".." in PureWindowsPath(rel).parts:
        raise ModelError(f"{manifest}: lists {rel!r}, which leaves the model folder ('..'); refusing it")
    target = (folder / rel).resolve()
    if not any(target.is_relative_to(place) for place in within):
        raise ModelError(f"{folder / rel}: a symlink leading outside the model folder (to {target}); refusing it")


def _check_symlinks(folder: Path, within: tuple[Path, ...]) -> None:
    """No symlink anywhere in the folder (listed or not, file or directory) may lead outside it (or,
    in a Hugging Face cache snapshot, outside its repository's blobs)."""
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in (*dirnames, *filenames):
            p = Path(dirpath) / name
            if p.is_symlink():
                target = p.resolve()
                if not any(target.is_relative_to(place) for place in within):
                    raise ModelError(f"{p}: a symlink leading outside the model folder (to {target}); refusing it")


def _check_members(
    folder: Path, root: Path, members: Any, manifest: Path, verify: bool, parents: tuple[Path, ...]
) -> None:
    """Every member of a combination: a sibling folder (``../<method>``) that exists and passes the
    same checks, before any member's weights are read."""
    if not isinstance(members, list) or not members or not all(isinstance(m, str) for m in members):
        raise ModelError(f"{manifest}: corrupt manifest (a combination lists its members as relative paths)")
    siblings = root.parent
    for rel in members:
        if not rel or PurePosixPath(rel).is_absolute() or PureWindowsPath(rel).drive:
            raise ModelError(f"{manifest}: member {rel!r} is an absolute path; members are sibling folders (../name)")
        member = (folder / rel).resolve()
        if member in (root, siblings) or not member.is_relative_to(siblings):
            raise ModelError(f"{manifest}: member {rel!r} is not a sibling model folder (it resolves to {member})")
        if member in parents:
            raise ModelError(f"{manifest}: member {rel!r} refers back to {member} (a cycle)")
        if not member.is_dir():
            raise ModelError(f"{manifest}: member {rel!r} of the combination is missing ({member}: no such folder)")
        if not (member / MANIFEST).is_file():
            raise ModelError(
                f"{manifest}: member {rel!r} of the combination is not a model folder ({member}: no {MANIFEST})"
            )
        _read_manifest(member, verify, parents)


# folder -> (manifest sha256, (path, size, mtime, inode) of every file) of the last folder whose checksums
# passed: a combination checks its members before loading them, and loading a member checks it again
_VERIFIED: dict[Path, tuple[str, tuple[tuple[str, int, int, int], ...]]] = {}


def _verify_files(
    folder: Path, root: Path, files: dict[str, str], manifest_bytes: bytes, hub_files: frozenset[str]
) -> None:
    # the folder's own checksum record and completion marker are written after the manifest
    unlisted = sorted(set(_listed_files(folder)) - set(files) - {CHECKSUMS} - hub_files)
    if unlisted:
        raise ModelError(
            f"{folder / unlisted[0]}: not listed in {MANIFEST} (a file added after the folder was "
            f"written{f', and {len(unlisted) - 1} more' if len(unlisted) > 1 else ''}); refusing it"
        )
    stats = []
    for rel in sorted(files):
        file = folder / rel
        if not file.is_file():
            raise ModelError(f"{file}: missing (listed in {MANIFEST})")
        st = file.stat()
        stats.append((rel, st.st_size, st.st_mtime_ns, st.st_ino))
    signature = (hashlib.sha256(manifest_bytes).hexdigest(), tuple(stats))
    if _VERIFIED.get(root) == signature:
        return
    for rel, digest in files.items():
        file = folder / rel
        if sha256_file(file) != digest:
            raise ModelError(f"{file}: checksum mismatch (sha256 differs from {MANIFEST}); the model folder is corrupt")
    if len(_VERIFIED) >= 64:
        _VERIFIED.clear()
    _VERIFIED[root] = signature


def index_folder(path: Path) -> Path | None:
    """The run's ``model/`` folder (``models.json`` beside a folder per method) that ``path`` names:
    that folder itself, or a run folder holding it; None for anything else."""
    if (path / "model" / INDEX).is_file() and not (path / INDEX).is_file():
        path = path / "model"
    return path if (path / INDEX).is_file() else None


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
