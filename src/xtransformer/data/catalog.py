"""The named datasets (``data=<name>``): their published sizes, where their archives come from,
the files they hold, and the check of a folder's documents against the published counts.

Sources of the figures:
- Eurlex-4K, Wiki10-31K, AmazonCat-13K, Wiki-500K: the X-Transformer paper (Chang et al., KDD 2020),
  Table 2 (``n_trn``, ``n_tst``, ``L``).
- Amazon-670K, Amazon-3M: training documents and labels from PECOS's ``examples/spmm/README.md``
  (amzn/pecos 7b989e0, "Data Statistics": the xmc-base archives' ``N`` and ``L``); their test
  counts were not found in a source the suite cites, so those two test splits are not checked.
- The archives: ``https://archive.org/download/pecos-dataset/xmc-base/<name>.tar.gz`` (PECOS's
  ``examples/xr-transformer-neurips21/README.md``); Wiki10-31K's size, 162,277,861 bytes, as
  PECOS's KDD'22 tutorial notebook (``tutorials/kdd22/Session 5 ...ipynb``) downloaded it.
- Reuters-21578 and EURLEX57K: the suite's own conversions (``../shared/data/README.md``), made from
  public sources named below; the archives the suite reads are not published.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from xtransformer.data.errors import DataError
from xtransformer.data.xmcbase import FILES

log = logging.getLogger(__name__)

PECOS = "https://archive.org/download/pecos-dataset/xmc-base/{}.tar.gz"
TEXT_FILES = tuple(f"{s}_{k}.txt" for s in ("train", "test") for k in ("texts", "labels", "ids"))


@dataclass(frozen=True)
class DatasetEntry:
    """A named dataset: its published document counts per split (None: not published, or not
    found in a cited source), its label count, where its archive is, and its files."""

    name: str
    title: str
    layout: str  # xmc-base | text
    docs: dict[str, int | None]
    labels: int
    source: str  # where the figures (and the documents) come from
    url: str | None = None  # the archive `xmc-data get` downloads (None: not published)
    archive_bytes: int | None = None
    sha256: str | None = None
    files: tuple[str, ...] = field(default=())

    @property
    def downloadable(self) -> bool:
        return self.url is not None


def _pecos(name: str, title: str, train: int, test: int | None, labels: int, source: str, size: int | None = None):
    return DatasetEntry(name, title, "xmc-base", {"train": train, "test": test}, labels, source, PECOS.format(name),
                        archive_bytes=size, files=FILES)  # fmt: skip


_KDD20 = "X-Transformer (Chang et al., KDD 2020), Table 2"
_SPMM = "PECOS examples/spmm/README.md, Data Statistics (test count not found in a cited source)"
ENTRIES: dict[str, DatasetEntry] = {
    e.name: e
    for e in (
        DatasetEntry(
            "reuters21578",
            "Reuters-21578 ModApte, 90 topics",
            "text",
            {"train": 7770, "test": 3019},
            90,
            "Reuters-21578 Distribution 1.0 (Lewis), http://kdd.ics.uci.edu/databases/reuters21578/"
            "reuters21578.html; the suite's ModApte conversion (reuters21578-modapte.tar.gz) is not published",
            files=(*TEXT_FILES, "label_map.txt", "label_text.txt"),
        ),
        DatasetEntry(
            "eurlex57k",
            "EURLEX57K, EuroVoc concepts (official test split withheld)",
            "text",
            {"train": 45000, "dev": 6000},
            4271,
            "EURLEX57K (Chalkidis et al., ACL 2019), http://nlp.cs.aueb.gr/software_and_datasets/EURLEX57K/; "
            "the suite's train+dev conversion (eurlex57k-train-dev.tar.gz) is not published",
            files=tuple(f.replace("test_", "dev_") for f in TEXT_FILES) + ("label_map.txt", "label_text.txt"),
        ),
        _pecos("eurlex-4k", "Eurlex-4K (AttentionXML's split)", 15449, 3865, 3956, _KDD20),
        _pecos("wiki10-31k", "Wiki10-31K (AttentionXML's split)", 14146, 6616, 30938, _KDD20, size=162277861),
        _pecos("amazoncat-13k", "AmazonCat-13K (AttentionXML's split)", 1186239, 306782, 13330, _KDD20),
        _pecos("wiki-500k", "Wiki-500K (AttentionXML's split)", 1779881, 769421, 501070, _KDD20),
        _pecos("amazon-670k", "Amazon-670K (AttentionXML's split)", 490449, None, 670091, _SPMM),
        _pecos("amazon-3m", "Amazon-3M (AttentionXML's split)", 1717899, None, 2812281, _SPMM),
    )
}


def find(name: str) -> DatasetEntry | None:
    return ENTRIES.get(name)


def entry(name: str) -> DatasetEntry:
    """The entry called ``name``, or one line listing the names there are."""
    found = ENTRIES.get(name)
    if found is None:
        raise DataError(f"no dataset called {name!r}; the named ones are {', '.join(ENTRIES)}")
    return found


def check_sizes(e: DatasetEntry, docs: dict[str, tuple[Path, int]], n_labels: int) -> None:
    """Refuse documents counts that differ from the published ones (one line naming the file and
    both counts); a label count that differs is reported in a warning, not refused (an archive may
    hold label columns no document of the paper's count carries)."""
    for split, published in e.docs.items():
        if published is None or split not in docs:
            continue
        path, n = docs[split]
        if n != published:
            raise DataError(f"{n:,} documents, but {e.name}'s published {split} split has {published:,}", path)
    if n_labels != e.labels:
        log.warning(
            "%s: %s labels, the published count is %s (%+d); documents match the published counts",
            e.name,
            f"{n_labels:,}",
            f"{e.labels:,}",
            n_labels - e.labels,
        )
