"""A named dataset fetched once (``xmc-data get NAME``): its archive downloaded beside the data
folder (``<dir>/<name>.tar.gz.part``, resumed with HTTP Range after a dropped connection), checked
(its size and sha256 where the catalog knows them; that it unpacks, its files agree, and its
documents are as many as published), then unpacked atomically into ``<dir>/<name>/``. A refused
archive leaves nothing in the data folder; an archive put at ``<dir>/<name>.tar.gz`` by hand (no
network) is checked and unpacked the same way and kept.

Training never downloads: a named dataset that is not there fails in one line naming this command.
"""

from __future__ import annotations

import hashlib
import http.client
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO
from urllib.error import HTTPError, URLError
from urllib.request import Request, urlopen

from xtransformer.data import catalog
from xtransformer.data.catalog import DatasetEntry
from xtransformer.data.dataset import DataConfig, detect_format, extract_archives, read_folder, unpacked_dir
from xtransformer.data.errors import DataError
from xtransformer.data.xmcbase import TEXTS, layout_counts
from xtransformer.utils.io import atomic_dir, is_complete

TIMEOUT_S = 10.0  # per connection and per read: an unreachable host fails in seconds
ATTEMPTS = 5  # requests a download may take, each resuming where the last one stopped
CHUNK = 1 << 20
_RANGE = re.compile(r"bytes (\d+)-\d+/(\d+|\*)")


class Unreachable(DataError):
    """No connection to the archive's host (offline, refused, timed out)."""


@dataclass
class Progress:
    """Lines on stderr for long work, at most one every ``every_s`` seconds while bytes come in."""

    label: str
    stream: TextIO = field(default_factory=lambda: sys.stderr)
    every_s: float = 2.0
    last: float = 0.0

    def say(self, text: str) -> None:
        print(f"{self.label}: {text}", file=self.stream, flush=True)

    def bytes(self, done: int, total: int | None) -> None:
        now = time.monotonic()
        if now - self.last < self.every_s and done != total:
            return
        self.last = now
        share = f" ({100 * done / total:.0f}%)" if total else ""
        self.say(f"{done / 1e6:,.1f} of {total / 1e6:,.1f} MB{share}" if total else f"{done / 1e6:,.1f} MB")


def _open(url: str, have: int, timeout: float) -> http.client.HTTPResponse:
    headers = {"User-Agent": "xtransformer-data"} | ({"Range": f"bytes={have}-"} if have else {})
    try:
        return urlopen(Request(url, headers=headers), timeout=timeout)
    except HTTPError:
        raise
    except (URLError, OSError, http.client.HTTPException) as err:
        raise Unreachable(f"cannot reach {url} ({getattr(err, 'reason', err)})") from None


def _response_start(resp: http.client.HTTPResponse, have: int) -> tuple[int, int | None]:
    """Where the response's body starts in the file and the file's full size (None: not said)."""
    if resp.status == 206:
        m = _RANGE.match(resp.headers.get("Content-Range", ""))
        if m and int(m.group(1)) == have:
            return have, None if m.group(2) == "*" else int(m.group(2))
        raise DataError(f"{resp.url}: the server answered another range ({resp.headers.get('Content-Range')})")
    length = resp.headers.get("Content-Length")
    return 0, int(length) if length else None  # a whole file: the server ignored the range


def transfer(url: str, part: Path, timeout: float, progress: Progress) -> int | None:
    """One request: append the rest of ``url`` to ``part``. Returns the file's full size (None: the
    server did not say); a dropped connection leaves what came in ``part``."""
    have = part.stat().st_size if part.exists() else 0
    try:
        resp = _open(url, have, timeout)
    except HTTPError as err:
        if err.code == 416 and have:  # nothing after `have`: the part may be whole already
            m = re.search(r"/(\d+)", err.headers.get("Content-Range", ""))
            return int(m.group(1)) if m else have
        raise DataError(f"{url}: HTTP {err.code} {err.reason}") from None
    with resp:
        start, total = _response_start(resp, have)
        try:
            with open(part, "ab" if start else "wb") as fh:
                done = start
                while block := resp.read(CHUNK):
                    fh.write(block)
                    done += len(block)
                    progress.bytes(done, total)
        except PermissionError as err:
            raise DataError(f"cannot write {part}: {err.strerror}; choose another folder with --dir") from None
        except (OSError, http.client.HTTPException):
            pass  # the connection dropped: the caller resumes from what arrived
    return total


def download(url: str, part: Path, progress: Progress, timeout: float = TIMEOUT_S, wait_s: float = 2.0) -> None:
    """``url`` into ``part``, resumed by Range requests while each attempt brings more bytes."""
    for attempt in range(ATTEMPTS):
        before = part.stat().st_size if part.exists() else 0
        total = transfer(url, part, timeout, progress)
        size = part.stat().st_size
        if total is None or size == total:
            return
        if size > total:
            part.unlink()
            raise DataError(f"{url}: {size} bytes arrived for a file of {total}; the partial download was removed")
        if size == before and attempt:
            break
        progress.say(f"connection dropped at {size:,} of {total:,} bytes; resuming")
        time.sleep(wait_s)
    raise DataError(f"{url}: the transfer stopped at {part.stat().st_size:,} bytes; run the command again to resume")


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def check_archive(e: DatasetEntry, archive: Path, progress: Progress) -> str:
    """The archive's size and sha256 against the catalog's (where it has them); returns the sha256."""
    size = archive.stat().st_size
    if e.archive_bytes is not None and size != e.archive_bytes:
        raise DataError(f"{size:,} bytes, but {e.name}'s archive has {e.archive_bytes:,}", archive)
    progress.say("computing the archive's sha256")
    digest = sha256_of(archive)
    if e.sha256 is not None and digest != e.sha256:
        raise DataError(f"sha256 {digest}, but {e.name}'s archive has {e.sha256}", archive)
    return digest


def folder_counts(e: DatasetEntry, folder: Path) -> tuple[dict[str, tuple[Path, int]], int]:
    """Per split the file counted and its documents, and the label count, of a folder in ``e``'s layout."""
    if e.layout == "xmc-base":
        counts = layout_counts(folder)
        return {s: (folder / TEXTS[s], c["docs"]) for s, c in counts.items()}, counts["train"]["labels"]
    got = read_folder(folder, DataConfig(name=e.name, path=str(folder), allow_empty_docs=True, allow_empty_labels=True))
    return got.docs, len(got.vocab)


def install(e: DatasetEntry, archive: Path, target: Path, progress: Progress) -> None:
    """Unpack ``archive`` into ``target`` atomically, after its files and document counts pass."""
    progress.say(f"unpacking into {target}")
    try:
        with atomic_dir(target, overwrite=False) as tmp:
            extract_archives([archive], tmp)
            docs, n_labels = folder_counts(e, tmp)
            catalog.check_sizes(e, docs, n_labels)
    except DataError as err:  # name the archive, not the scratch folder it was unpacked into
        raise DataError(re.sub(r"\S*/\.[^/\s]+\.tmp/?", f"{archive}:", str(err))) from None
    except OSError as err:
        raise DataError(f"cannot unpack into {target.parent}: {err.strerror}; choose another --dir") from None


def get(
    name: str, data_dir: Path, progress: Progress | None = None, timeout: float = TIMEOUT_S, wait_s: float = 2.0
) -> Path:
    """``data_dir/name``: the named dataset, downloaded, checked and unpacked unless already there."""
    e = catalog.entry(name)
    data_dir = Path(data_dir).expanduser()
    target, archive, part = data_dir / name, data_dir / f"{name}.tar.gz", data_dir / f"{name}.tar.gz.part"
    progress = progress or Progress(name)
    if target.is_dir() and (is_complete(target) or detect_format(target) is not None):
        progress.say(f"already in {target}")
        return target
    if target.exists():
        raise DataError("exists but holds no dataset: remove it, or choose another folder with --dir", target)
    source = archive if archive.is_file() else part
    if source is part:
        if e.url is None:
            raise DataError(f"{name} has no public archive ({e.source}); put {name}.tar.gz in {data_dir}")
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
            download(e.url, part, progress, timeout, wait_s)
        except Unreachable as err:
            raise Unreachable(f"{err}: download it elsewhere and put it in {data_dir} as {name}.tar.gz") from None
    try:
        digest = check_archive(e, source, progress)
        install(e, source, target, progress)
    except DataError:
        if source is part:  # a wrong archive does not become right by resuming it
            part.unlink(missing_ok=True)
        raise
    if source is part:
        part.unlink()
    progress.say(f"ready in {target} (archive sha256 {digest})")
    return target


def status(e: DatasetEntry, data_dir: Path, cache_dir: Path | None = None) -> str:
    """Where ``e`` would be read from under ``data_dir`` and whether it is there (and unpacked)."""
    folder = data_dir / e.name
    if folder.is_dir() and detect_format(folder) is not None:
        return f"unpacked in {folder}"
    archives = sorted(folder.glob("*.tar.gz")) if folder.is_dir() else []
    archives = archives or ([data_dir / f"{e.name}.tar.gz"] if (data_dir / f"{e.name}.tar.gz").is_file() else [])
    if archives:
        cached = unpacked_dir(archives, e.name, cache_dir)
        where = f"unpacked in {cached}" if is_complete(cached) else "unpacked into the cache on first use"
        return f"archive {', '.join(str(a) for a in archives)}, {where}"
    part = data_dir / f"{e.name}.tar.gz.part"
    if part.is_file():
        return f"partial download ({part.stat().st_size:,} bytes) in {part}: xmc-data get {e.name} resumes it"
    how = f"xmc-data get {e.name}" if e.downloadable else "no public archive"
    return f"absent from {folder} ({how})"
