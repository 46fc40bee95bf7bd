"""``xmc-data`` (``data/download.py``, ``data/command.py``) against an HTTP server on 127.0.0.1
serving a small archive in PECOS's layout: a dropped transfer resumes with a Range request, a wrong
archive is refused with nothing left in the data folder, no network is one line, ``list`` says
where each dataset is."""

from __future__ import annotations

import io
import re
import socket
import tarfile
import threading
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from run_helpers import write_xmc_base_toy

from xtransformer.cli import main as cli_main
from xtransformer.data import DataError, catalog, download, load_dataset
from xtransformer.data.catalog import DatasetEntry
from xtransformer.data.command import main as data_main
from xtransformer.data.download import Progress, get
from xtransformer.data.xmcbase import FILES

NAME = "toy-xmc"


@dataclass
class Served:
    """The archive's bytes, the Range header of every request, and whether to drop the next transfer."""

    data: bytes
    ranges: list[str | None] = field(default_factory=list)
    drop_next: bool = False


def _handler(served: Served) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked = self.headers.get("Range")
            served.ranges.append(asked)
            start = int(re.match(r"bytes=(\d+)-", asked).group(1)) if asked else 0
            body = served.data[start:]
            self.send_response(206 if start else 200)
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(served.data) - 1}/{len(served.data)}")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if served.drop_next:  # the first part, then the connection goes
                served.drop_next = False
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The toy set as PECOS packs its archives: ``xmc-base/<name>/...``."""
    root = tmp_path_factory.mktemp("archive")
    write_xmc_base_toy(root / "xmc-base" / NAME)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(root / "xmc-base", arcname="xmc-base")
    return buf.getvalue()


@pytest.fixture()
def server(archive: bytes) -> Iterator[tuple[Served, str]]:
    served = Served(archive)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(served))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield served, f"http://127.0.0.1:{httpd.server_address[1]}/xmc-base/{NAME}.tar.gz"
    finally:
        httpd.shutdown()
        httpd.server_close()


def _entry(monkeypatch: pytest.MonkeyPatch, url: str, **changes: object) -> DatasetEntry:
    e = DatasetEntry(NAME, "toy", "xmc-base", {"train": 128, "test": 32}, 12, "the tests", url, files=FILES)
    e = replace(e, **changes)
    monkeypatch.setitem(catalog.ENTRIES, NAME, e)
    return e


def _quiet() -> Progress:
    return Progress(NAME, stream=io.StringIO(), every_s=0.0)


def test_a_dropped_transfer_resumes_with_a_range_request(server, tmp_path, monkeypatch) -> None:
    served, url = server
    _entry(monkeypatch, url, archive_bytes=len(served.data))
    data_dir, part = tmp_path / "data", tmp_path / "data" / f"{NAME}.tar.gz.part"
    served.drop_next = True
    monkeypatch.setattr(download, "ATTEMPTS", 1)  # this run gives up after the drop...
    with pytest.raises(DataError, match="the transfer stopped at .* bytes; run the command again to resume"):
        get(NAME, data_dir, _quiet(), wait_s=0)
    assert 0 < part.stat().st_size < len(served.data) and not (data_dir / NAME).exists()
    monkeypatch.setattr(download, "ATTEMPTS", 5)  # ...the next resumes from what arrived
    progress = _quiet()
    target = get(NAME, data_dir, progress, wait_s=0)
    assert served.ranges == [None, f"bytes={len(served.data) // 2}-"]
    assert target == data_dir / NAME and sorted(p.name for p in data_dir.iterdir()) == [NAME]  # the part is gone
    ds = load_dataset(NAME, data_dir=str(data_dir))  # where training looks, its counts checked
    assert (len(ds.splits["train"]) + len(ds.splits["dev"]), len(ds.splits["test"])) == (128, 32)
    assert "ready in" in progress.stream.getvalue()
    served.drop_next = True  # within one run a drop is resumed at once
    other = tmp_path / "other"
    get(NAME, other, _quiet(), wait_s=0)
    assert served.ranges[2:] == [None, f"bytes={len(served.data) // 2}-"] and (other / NAME).is_dir()


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"archive_bytes": 10}, "bytes, but toy-xmc's archive has 10"),
        ({"sha256": "0" * 64}, "but toy-xmc's archive has 0000"),
        ({"docs": {"train": 129, "test": 32}}, "X.trn.txt: 128 documents, but toy-xmc's published train split has 129"),
    ],
)
def test_a_wrong_archive_is_refused_leaving_nothing(server, tmp_path, monkeypatch, changes, message) -> None:
    _, url = server
    _entry(monkeypatch, url, **changes)
    data_dir = tmp_path / "data"
    with pytest.raises(DataError, match=re.escape(message)) as err:
        get(NAME, data_dir, _quiet(), wait_s=0)
    assert "\n" not in str(err.value) and ".tmp" not in str(err.value)  # names the archive, not a scratch folder
    assert list(data_dir.iterdir()) == []  # no folder, no scratch, no partial download to resume


def test_offline_is_one_line_naming_the_url_and_the_folder(tmp_path, monkeypatch) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/{NAME}.tar.gz"
    _entry(monkeypatch, url)
    err = io.StringIO()
    with redirect_stderr(err):
        rc = data_main(["get", NAME, "--dir", str(tmp_path / "data"), "--timeout", "3"])
    lines = err.getvalue().splitlines()
    assert rc == 1 and len(lines) == 1 and url in lines[0]
    assert f"put it in {tmp_path / 'data'} as {NAME}.tar.gz" in lines[0]
    assert not (tmp_path / "data" / NAME).exists()


def test_an_archive_put_by_hand_is_checked_and_unpacked_without_network(archive, tmp_path, monkeypatch) -> None:
    _entry(monkeypatch, "http://127.0.0.1:9/unreachable.tar.gz")
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / f"{NAME}.tar.gz").write_bytes(archive)
    get(NAME, data_dir, _quiet())
    assert (data_dir / f"{NAME}.tar.gz").is_file() and load_dataset(NAME, data_dir=str(data_dir)).n_labels == 12
    (data_dir / "stray").mkdir()
    monkeypatch.setitem(catalog.ENTRIES, "stray", replace(catalog.ENTRIES[NAME], name="stray"))
    with pytest.raises(DataError, match="stray: exists but holds no dataset"):
        get("stray", data_dir, _quiet())


def test_list_says_where_each_dataset_is(server, tmp_path, monkeypatch) -> None:
    served, url = server
    _entry(monkeypatch, url)
    data_dir, cache = tmp_path / "data", tmp_path / "cache"

    def listing(*via_cli: str) -> dict[str, str]:
        out = io.StringIO()
        args = ["list", "--dir", str(data_dir), "--cache-dir", str(cache)]
        with redirect_stdout(out):
            assert (cli_main(["data", *args]) if via_cli else data_main(args)) == 0
        return {line.split()[0]: line for line in out.getvalue().splitlines()}

    rows = listing()
    assert set(rows) == set(catalog.ENTRIES)
    assert "15,449 train / 3,865 test / 3,956 labels" in rows["eurlex-4k"]
    assert f"absent from {data_dir / NAME} (xmc-data get {NAME})" in rows[NAME]
    served.drop_next = True
    monkeypatch.setattr(download, "ATTEMPTS", 1)
    with pytest.raises(DataError):
        get(NAME, data_dir, _quiet(), wait_s=0)
    assert f"partial download ({len(served.data) // 2:,} bytes)" in listing()[NAME]
    monkeypatch.setattr(download, "ATTEMPTS", 5)
    get(NAME, data_dir, _quiet(), wait_s=0)
    assert listing("cli")[NAME].endswith(f"unpacked in {data_dir / NAME}")
