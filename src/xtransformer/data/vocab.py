"""Label vocabulary: string label id <-> contiguous column index of Y.

Label ids stay strings (EURLEX57K has ids such as ``c_871b5612``). The order is that of
``label_map.txt`` when the dataset has one, else sorted ids, so the same data always gives the
same columns; every artifact stores the vocabulary it was built with.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from xtransformer.data.errors import DataError
from xtransformer.utils.io import atomic_path, settings_key


class LabelVocab:
    def __init__(self, ids: Sequence[str]):
        self.ids: list[str] = list(ids)
        self._index = {label: i for i, label in enumerate(self.ids)}
        if len(self._index) != len(self.ids):
            seen: set[str] = set()
            dup = next(x for x in self.ids if x in seen or seen.add(x))
            raise DataError(f"label vocabulary has duplicate id {dup!r}")

    def __len__(self) -> int:
        return len(self.ids)

    def __contains__(self, label: str) -> bool:
        return label in self._index

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LabelVocab) and self.ids == other.ids

    def __repr__(self) -> str:
        return f"LabelVocab({len(self)} labels)"

    def index(self, label: str) -> int:
        return self._index[label]

    def get(self, label: str, default: int = -1) -> int:
        return self._index.get(label, default)

    @property
    def fingerprint(self) -> str:
        return settings_key(self.ids)

    @classmethod
    def from_labels(cls, label_lists: Iterable[Iterable[str]]) -> LabelVocab:
        return cls(sorted({label for labels in label_lists for label in labels}))

    def save(self, path: str | os.PathLike) -> None:
        with atomic_path(path) as tmp:
            tmp.write_text("".join(f"{label}\n" for label in self.ids))

    @classmethod
    def load(cls, path: str | os.PathLike) -> LabelVocab:
        path = Path(path)
        if not path.is_file():
            raise DataError("label vocabulary file not found", path)
        return cls(path.read_text(encoding="utf-8").splitlines())

    def check_same(self, other: LabelVocab, what: str = "artifact") -> None:
        """Raise a clear error when an artifact was built with another label space."""
        diff = vocab_difference(other.ids, self.ids)
        if diff is not None:
            raise DataError(f"{what} label vocabulary differs from the data's ({diff})")


def vocab_difference(theirs: Sequence[str], ours: Sequence[str]) -> str | None:
    """None when two label vocabularies are identical, else the first difference in words
    (every consumer that checks an artifact's label space words its error with this)."""
    theirs, ours = list(theirs), list(ours)
    if theirs == ours:
        return None
    if len(theirs) != len(ours):
        return f"{len(theirs)} labels vs {len(ours)}"
    i = next(j for j, (a, b) in enumerate(zip(theirs, ours)) if a != b)
    n = sum(a != b for a, b in zip(theirs, ours))
    return f"{n} ids differ; first at index {i} (line {i + 1}): {theirs[i]!r} vs {ours[i]!r}"
