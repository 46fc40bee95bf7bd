"""``xmc-data`` (``python -m xtransformer data``): the named datasets and where they are.

    xmc-data list [--dir DIR]          each named dataset: published sizes, where it is read from, whether it is there
    xmc-data get NAME [--dir DIR]      download, check and unpack one into DIR/NAME (resumes a partial download)

DIR defaults to where training looks: ``$XMC_DATA_DIR``, else ``../shared/data`` beside the checkout
(``data.data_dir`` in a run). Bad input and failed downloads print one line and exit 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from xtransformer.data.catalog import ENTRIES, DatasetEntry
from xtransformer.data.paths import default_cache_dir, default_data_dir
from xtransformer.errors import UserError


def sizes(e: DatasetEntry) -> str:
    """``15,449 train / 3,865 test / 3,956 labels`` (``?`` where no count is published)."""
    docs = " / ".join(f"{'?' if n is None else f'{n:,}'} {split}" for split, n in e.docs.items())
    return f"{docs} / {e.labels:,} labels"


def list_main(data_dir: Path, cache_dir: Path) -> int:
    from xtransformer.data.download import status

    width = max(len(name) for name in ENTRIES)
    for e in ENTRIES.values():
        print(f"{e.name:<{width}}  {sizes(e):<48}  {status(e, data_dir, cache_dir)}")
    return 0


def get_main(name: str, data_dir: Path, timeout: float) -> int:
    from xtransformer.data.download import get

    get(name, data_dir, timeout=timeout)
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="xmc-data", description="The named datasets (data=<name>): list them, get one.")
    sub = p.add_subparsers(dest="command", required=True)
    for name, text in (("list", "each dataset, its published sizes, where it is and whether it is there"),
                       ("get", "download, check and unpack a dataset (a partial download resumes)")):  # fmt: skip
        one = sub.add_parser(name, help=text, description=text)
        if name == "get":
            one.add_argument("name", choices=list(ENTRIES), metavar="NAME", help=f"one of: {', '.join(ENTRIES)}")
            one.add_argument("--timeout", type=float, default=10.0, help="seconds per connection and read (10)")
        one.add_argument("--dir", type=Path, help="the data folder (default: $XMC_DATA_DIR, else ../shared/data)")
        if name == "list":
            one.add_argument("--cache-dir", type=Path, help="where archives are unpacked (paths.cache_dir)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    data_dir = (args.dir or default_data_dir()).expanduser()
    try:
        if args.command == "list":
            return list_main(data_dir, (args.cache_dir or default_cache_dir()).expanduser())
        return get_main(args.name, data_dir, args.timeout)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # a partial download stays beside the data folder
        print("interrupted: run the same command again to resume", file=sys.stderr)
        return 130


def entry() -> None:
    sys.exit(main())
