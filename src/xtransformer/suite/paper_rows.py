"""The paper's Table 5 rows: which aggregated configuration is which numbered row, and the table's order."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from xtransformer.suite.runs import MEMBER_SEP, STAT_KEYS

METHOD_ORDER = {"xtransformer": 0, "ensemble": 1, "xrlinear": 2, "kimcnn": 3, "xmlcnn": 4}

# --------------------------------------------------------------------------- Table 5 numbering


ALL = "all"  # an ensemble row whose members span more than one value


@dataclass(frozen=True)
class Table5Row:
    """One row of the paper's Table 5 ablation, in normalised names."""

    id: int
    indexing: str
    matcher: str
    features: frozenset[str] = frozenset({"tfidf", "neural"})
    negatives: frozenset[str] = frozenset({"tfn", "man"})
    ensemble: bool = False


TABLE5 = (
    Table5Row(0, "pifa_tfidf", "BERT", features=frozenset({"tfidf"}), negatives=frozenset({"tfn"})),
    Table5Row(1, "pifa_tfidf", "BERT", negatives=frozenset({"tfn"})),
    Table5Row(2, "pifa_tfidf", "BERT"),
    Table5Row(3, "pifa_tfidf", "RoBERTa"),
    Table5Row(4, "pifa_tfidf", "XLNet"),
    Table5Row(5, "pifa_neural", "XLNet"),
    Table5Row(6, "text_emb", "XLNet"),
    Table5Row(7, ALL, "XLNet", ensemble=True),
    Table5Row(8, "pifa_neural", ALL, ensemble=True),
    Table5Row(9, ALL, ALL, ensemble=True),
)

# Substrings of our model names -> the paper's Transformer families (checked in order: "roberta"
# contains "bert"). all-MiniLM-L6-v2 is a BertModel, our offline stand-in for BERT.
MATCHER_FAMILIES = (("roberta", "RoBERTa"), ("xlnet", "XLNet"), ("bert", "BERT"), ("minilm", "BERT"))
INDEXING_ALIASES = {"pifa": "pifa_tfidf", "text_embedding": "text_emb", "label_text_emb": "text_emb"}


def matcher_family(name: Any) -> str:
    """``bert``, ``bert_base``, ``tiny_bert``, ``minilm`` -> ``BERT``; ``roberta*`` -> ``RoBERTa``; ..."""
    text = str(name).lower()
    return next((fam for needle, fam in MATCHER_FAMILIES if needle in text), text)


def normalise_indexing(name: Any) -> str:
    text = re.sub(r"[-\s]+", "_", str(name).lower())
    return INDEXING_ALIASES.get(text, text)


def _token_set(name: Any) -> frozenset[str]:
    """``tfidf+neural`` / ``tfidf_neural`` / ``TF-IDF + neural`` -> {tfidf, neural}."""
    return frozenset(t for t in re.split(r"[^a-z]+", str(name).lower().replace("tf-idf", "tfidf")) if t)


def _members(value: Any) -> list[str]:
    return [] if value is None else str(value).split(MEMBER_SEP)


def _matches(values: set[str], wanted: str) -> bool:
    return len(values) > 1 if wanted == ALL else values == {wanted}


def table5_row(desc: Mapping[str, Any]) -> int | None:
    """The paper's Table 5 config id this descriptor matches, or None.

    Model names match by family (see :data:`MATCHER_FAMILIES`); for ensembles "all" means the
    members span more than one indexing (or matcher family). Extra config keys are not compared.
    """
    method = desc.get("method")
    indexing = {normalise_indexing(v) for v in _members(desc.get("indexing"))}
    families = {matcher_family(v) for v in _members(desc.get("matcher"))}
    features = {_token_set(v) for v in _members(desc.get("ranker_features"))}
    negatives = {_token_set(v) for v in _members(desc.get("negatives"))}
    for row in TABLE5:
        if (
            method == ("ensemble" if row.ensemble else "xtransformer")
            and _matches(indexing, row.indexing)
            and _matches(families, row.matcher)
            and features == {row.features}
            and negatives == {row.negatives}
        ):
            return row.id
    return None


def assign_config_ids(agg: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Number configurations per dataset, like Table 5 where they match its rows.

    When at least one configuration matches a Table 5 row and no two match the same row, matched
    ones keep the paper's id and the others follow from 10 on; otherwise ids run 0, 1, ... (still
    in Table 5 order where rows match). Returns the rows sorted by dataset, then id.
    """
    blocks: dict[str, list[dict[str, Any]]] = {}
    for row in agg:
        row["paper_row"] = table5_row(row)
        blocks.setdefault(str(row.get("dataset")), []).append(row)
    out: list[dict[str, Any]] = []
    for name in sorted(blocks):
        block = sorted(blocks[name], key=_row_sort_key)
        matched = [r["paper_row"] for r in block if r["paper_row"] is not None]
        use_paper = bool(matched) and len(set(matched)) == len(matched)
        next_id = len(TABLE5) if use_paper else 0
        for row in block:
            if use_paper and row["paper_row"] is not None:
                row["config_id"] = row["paper_row"]
            else:
                row["config_id"], next_id = next_id, next_id + 1
        out.extend(sorted(block, key=lambda r: r["config_id"]))
    return out


def _sort_value(value: Any) -> tuple[int, Any]:
    # numbers numerically, then text, then unknown: a total order over mixed values
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, value)
    return (2, "") if value is None else (1, str(value))


def _row_sort_key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    paper = row.get("paper_row")
    rest = tuple(_sort_value(row[k]) for k in sorted(row) if k not in STAT_KEYS)
    return (paper is None, paper or 0, METHOD_ORDER.get(str(row.get("method")), len(METHOD_ORDER)), rest)
