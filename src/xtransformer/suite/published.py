"""The seed papers' published results, set beside the suite's own (``published.yaml``, package data).

A row's id is ``<paper>/<set>/<row>`` (``x-transformer/eurlex-4k/table5-2``); its metrics are kept as
printed (``"62.90"``) and read as numbers where they are compared. A run names the rows it stands
beside (``published: [...]`` in ``train.yaml``'s run settings): the run writes them into its
``metrics.json`` (:func:`published_section`) and logs them next to its own results
(:func:`published_lines`); the sweep aggregate prints them as ``published`` rows of its table
(:class:`PublishedRow.from_record`, ``suite/report.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from xtransformer.errors import UserError

PUBLISHED_FILE = "published.yaml"
ROW_KEYS = frozenset({"row", "method", "where", "metrics", "config", "note", "training"})


class PublishedError(UserError):
    """A published row that is not in ``published.yaml``, or a malformed entry of it (named)."""


@dataclass(frozen=True)
class PublishedRow:
    """One row of a seed paper's table (or one sentence's figures), as printed."""

    id: str  # <paper>/<set>/<row>
    dataset: str
    method: str
    source: str  # the paper and where in it: "X-Transformer (KDD 2020), Table 3, 'Parabel [20]'"
    url: str
    printed: Mapping[str, str]  # metric -> the figure as printed
    config: Mapping[str, str] = field(default_factory=dict)  # Table 5's configuration columns
    note: str | None = None
    training: Mapping[str, str] = field(default_factory=dict)  # time, hardware, what, where

    @property
    def metrics(self) -> dict[str, float]:
        return {k: float(v) for k, v in self.printed.items()}

    def record(self) -> dict[str, Any]:
        """The row as a run's ``metrics.json`` holds it (``published``: id -> record)."""
        out = {k: v for k, v in vars(self).items() if k not in ("id", "printed", "config", "training", "note")}
        out |= {"metrics": self.metrics, "printed": dict(self.printed)}
        out |= {"note": self.note} if self.note else {}
        return out | {k: dict(getattr(self, k)) for k in ("config", "training") if getattr(self, k)}

    @classmethod
    def from_record(cls, row_id: str, rec: Mapping[str, Any]) -> PublishedRow:
        """A row read back from a run's ``metrics.json``: the figures as the run stored them."""
        printed = rec.get("printed") or {k: f"{v:g}" for k, v in (rec.get("metrics") or {}).items()}
        return cls(
            id=row_id,
            dataset=str(rec.get("dataset", row_id.split("/")[1] if row_id.count("/") == 2 else "")),
            method=str(rec.get("method", "")),
            source=str(rec.get("source", "")),
            url=str(rec.get("url", "")),
            printed=dict(printed),
            config=dict(rec.get("config") or {}),
            note=rec.get("note"),
            training=dict(rec.get("training") or {}),
        )

    def figures(self) -> str:
        """``P@1 87.22 P@3 75.12 P@5 62.90``: the row's figures as printed."""
        return " ".join(f"{m} {text}" for m, text in self.printed.items())


@cache
def published_rows() -> dict[str, PublishedRow]:
    """Every published row of ``published.yaml``, by id (read once, checked)."""
    import yaml

    text = resources.files("xtransformer.suite").joinpath(PUBLISHED_FILE).read_text(encoding="utf-8")
    return rows_from_document(yaml.safe_load(text))


def rows_from_document(doc: Mapping[str, Any]) -> dict[str, PublishedRow]:
    """The rows of a parsed ``published.yaml`` (``sets`` -> set -> paper -> rows), each checked."""
    papers = doc.get("papers") or {}
    rows: dict[str, PublishedRow] = {}
    for dataset, by_paper in (doc.get("sets") or {}).items():
        for paper, entries in by_paper.items():
            if paper not in papers:
                raise PublishedError(f"{PUBLISHED_FILE}: sets.{dataset}.{paper}: no such paper under `papers`")
            for entry in entries:
                row = _row(dataset, paper, papers, entry)
                if row.id in rows:
                    raise PublishedError(f"{PUBLISHED_FILE}: row {row.id} is there twice")
                rows[row.id] = row
    return rows


def _row(dataset: str, paper: str, papers: Mapping[str, Any], entry: Mapping[str, Any]) -> PublishedRow:
    row_id, info = f"{paper}/{dataset}/{entry.get('row')}", papers[paper]
    unknown, missing = set(entry) - ROW_KEYS, {"row", "method", "where", "metrics"} - set(entry)
    if unknown or missing:
        why = ", ".join(
            f"{what} {sorted(keys)}" for what, keys in (("unknown keys", unknown), ("missing", missing)) if keys
        )
        raise PublishedError(f"{PUBLISHED_FILE}: row {row_id}: {why}")
    printed = {str(k): str(v) for k, v in entry["metrics"].items()}
    for name, text in printed.items():
        try:
            float(text)
        except ValueError:
            raise PublishedError(f"{PUBLISHED_FILE}: row {row_id}: {name}={text!r} is not a number") from None
    training = dict(entry.get("training") or {})
    if "source" in training:  # a figure from another text than the row's: cited by that text's name
        if training["source"] not in papers:
            raise PublishedError(f"{PUBLISHED_FILE}: row {row_id}: training.source is no paper under `papers`")
        training["source"] = papers[training["source"]].get("short", training["source"])
    return PublishedRow(
        id=row_id,
        dataset=dataset,
        method=str(entry["method"]),
        source=f"{info.get('short', paper)}, {entry['where']}",
        url=str(info.get("url", "")),
        printed=printed,
        config={str(k): str(v) for k, v in (entry.get("config") or {}).items()},
        note=entry.get("note"),
        training={str(k): str(v) for k, v in training.items()},
    )


def select(ids: Sequence[str]) -> list[PublishedRow]:
    """The rows ``ids`` name, in that order; an unknown id fails naming the rows of its set."""
    rows = published_rows()
    out = []
    for row_id in ids:
        if row_id not in rows:
            parts = str(row_id).split("/")
            dataset = parts[1] if len(parts) == 3 else None
            same: dict[str, list[str]] = {}
            for r in sorted(rows):
                if rows[r].dataset == dataset:
                    same.setdefault(r.split("/")[0], []).append(r.split("/")[2])
            known = "; ".join(f"{p}/{dataset}/: {', '.join(names)}" for p, names in same.items())
            known = known or f"sets: {', '.join(sorted({r.dataset for r in rows.values()}))}"
            raise PublishedError(f"no published row {row_id!r} (ids are <paper>/<set>/<row>; {known})")
        out.append(rows[row_id])
    return out


def published_section(ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``metrics.json``'s ``published``: id -> the row's record."""
    return {row.id: row.record() for row in select(ids)}


def published_lines(section: Mapping[str, Mapping[str, Any]], ours: Mapping[str, Any]) -> list[str]:
    """One log line per published row: its figures, then this run's on the same metrics."""
    lines = []
    for row_id, rec in section.items():
        row = PublishedRow.from_record(row_id, rec)
        mine = " ".join(f"{m} {float(ours[m]):.2f}" for m in row.printed if isinstance(ours.get(m), (int, float)))
        lines.append(f"published {row_id} ({row.method}; {row.source}): {row.figures()} | this run: {mine or '—'}")
    return lines
