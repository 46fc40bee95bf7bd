"""Tokenisation: a document's first ``max_length`` tokens, cached, kept ragged.

A fast tokenizer tokenises all of its input before it truncates, so the work is in the characters
handed to it, not in the tokens kept. :func:`first_tokens` hands it each text cut to
``CHARS_PER_TOKEN * max_length`` characters and keeps the result when the offsets show that the
kept window ends at or before a word end that whitespace follows in the cut: pre-tokenizers split
at whitespace, so the words the cut shortened or dropped cannot change the tokens before them.
Every other text (the window runs into the cut, no whitespace, a tokenizer without offsets,
left-side truncation) is tokenised whole, so the ids always equal
``tokenizer(texts, truncation=True, max_length=max_length)``'s (EURLEX57K, 20,000 acts: 4.5 s at
128 tokens against 10.7 whole and 5.6 cut at 16 characters a token; experiments/matcher_overheads).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from xtransformer.utils.io import atomic_path, settings_key, texts_fingerprint

TOKENIZE_CHUNK = 2048  # texts per tokenizer call: big enough for Rust batching, small for progress
CHARS_PER_TOKEN = 8  # the first cut: enough for every EURLEX57K act at 128 / 256 MiniLM tokens (6 was not)

log = logging.getLogger(__name__)


@dataclass
class TokenizedTexts:
    """Ragged token ids: row ``i`` is ``ids[offsets[i]:offsets[i+1]]`` (special tokens included)."""

    ids: np.ndarray  # int32, all rows concatenated
    offsets: np.ndarray  # int64, N + 1
    pad_id: int
    left_pad: bool
    type_ids: np.ndarray | None = None  # int8 aligned with ids; only kept when some are non-zero (XLNet)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def batch(self, rows: np.ndarray) -> dict[str, torch.Tensor]:
        """Padded ``input_ids`` / ``attention_mask`` (/ ``token_type_ids``) for ``rows``, vectorised."""
        rows = np.asarray(rows, dtype=np.int64)
        starts = self.offsets[rows]
        lengths = self.offsets[rows + 1] - starts
        width = int(lengths.max()) if len(rows) else 0
        row_of = np.repeat(np.arange(len(rows)), lengths)
        within = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        src = np.repeat(starts, lengths) + within
        col = within + (width - lengths)[row_of] if self.left_pad else within
        input_ids = np.full((len(rows), width), self.pad_id, dtype=np.int64)
        input_ids[row_of, col] = self.ids[src]
        mask = np.zeros((len(rows), width), dtype=np.int64)
        mask[row_of, col] = 1
        out = {"input_ids": torch.from_numpy(input_ids), "attention_mask": torch.from_numpy(mask)}
        if self.type_ids is not None:
            types = np.zeros((len(rows), width), dtype=np.int64)
            types[row_of, col] = self.type_ids[src]
            out["token_type_ids"] = torch.from_numpy(types)
        return out

    def take(self, rows: np.ndarray) -> TokenizedTexts:
        """The texts of ``rows``, in that order (a sample to evaluate on)."""
        rows = np.asarray(rows, dtype=np.int64)
        starts = self.offsets[rows]
        lengths = self.offsets[rows + 1] - starts
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        src = np.repeat(starts - offsets[:-1], lengths) + np.arange(int(offsets[-1]))
        return TokenizedTexts(
            ids=self.ids[src],
            offsets=offsets,
            pad_id=self.pad_id,
            left_pad=self.left_pad,
            type_ids=self.type_ids[src] if self.type_ids is not None else None,
        )

    def save(self, path: str | os.PathLike) -> None:
        arrays = {
            "ids": self.ids,
            "offsets": self.offsets,
            "meta": np.array(json.dumps({"pad_id": self.pad_id, "left_pad": self.left_pad})),
        }
        if self.type_ids is not None:
            arrays["type_ids"] = self.type_ids
        with atomic_path(path) as tmp, open(tmp, "wb") as fh:
            np.savez(fh, **arrays)

    @classmethod
    def load(cls, path: str | os.PathLike) -> TokenizedTexts:
        with np.load(path) as z:
            meta = json.loads(str(z["meta"]))
            return cls(ids=z["ids"], offsets=z["offsets"], type_ids=z.get("type_ids", None), **meta)


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """Identity of a tokenizer's behaviour (vocabulary, rules, padding side)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        state = json.loads(backend.to_str())
        state.pop("truncation", None)  # per-call state that the tokenizer call itself changes
        state.pop("padding", None)
        body = json.dumps(state, sort_keys=True)
    else:
        body = json.dumps(sorted(tokenizer.get_vocab().items()))
    extra = [
        type(tokenizer).__name__,
        tokenizer.padding_side,
        tokenizer.truncation_side,
        str(tokenizer.pad_token_id),
        sorted(tokenizer.model_input_names),
    ]
    return hashlib.sha256((body + json.dumps(extra)).encode()).hexdigest()


def tokenize_texts(
    tokenizer: Any,
    texts: Sequence[str],
    max_length: int = 128,
    truncate_chars: int | None = None,
    cache_dir: str | os.PathLike | None = None,
    progress: bool = True,
) -> TokenizedTexts:
    """Each text's first ``max_length`` tokens (of its first ``truncate_chars`` characters when set),
    as the tokenizer truncates (:func:`first_tokens`).

    With ``cache_dir`` the result is cached in ``cache_dir/tokens/<key>.npz`` (atomic write).
    """
    if tokenizer.pad_token_id is None:
        raise ValueError("the tokenizer has no pad token; batching needs one")
    cache_file = None
    if cache_dir is not None:
        cut = "whole" if truncate_chars is None else int(truncate_chars)
        key = settings_key(tokenizer_fingerprint(tokenizer), int(max_length), cut, texts_fingerprint(texts))
        cache_file = Path(cache_dir) / "tokens" / f"{key}.npz"
        if cache_file.is_file():
            try:
                return TokenizedTexts.load(cache_file)
            except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:  # truncated / corrupt
                log.warning("token cache %s is unreadable (%s); tokenising again", cache_file, err)
                cache_file.unlink(missing_ok=True)
    tokens = _tokenize(tokenizer, texts, int(max_length), truncate_chars, progress)
    if cache_file is not None:
        tokens.save(cache_file)
    return tokens


def _tokenize(
    tokenizer: Any, texts: Sequence[str], max_length: int, truncate_chars: int | None, progress: bool
) -> TokenizedTexts:
    from tqdm.auto import tqdm

    id_chunks: list[list[list[int]]] = []
    type_chunks: list[list[list[int]]] = []
    with tqdm(total=len(texts), desc="tokenising", unit="doc", disable=not progress, leave=False) as bar:
        for start in range(0, len(texts), TOKENIZE_CHUNK):
            chunk = texts[start : start + TOKENIZE_CHUNK]
            enc = first_tokens(tokenizer, chunk, max_length, truncate_chars)
            id_chunks.append(enc["input_ids"])
            if "token_type_ids" in enc:
                type_chunks.append(enc["token_type_ids"])
            bar.update(len(chunk))
    rows = list(itertools.chain.from_iterable(id_chunks))
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    ids = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int32, count=int(offsets[-1]))
    type_ids = None
    if type_chunks:
        flat = np.fromiter(
            itertools.chain.from_iterable(itertools.chain.from_iterable(type_chunks)),
            dtype=np.int8,
            count=int(offsets[-1]),
        )
        type_ids = flat if flat.any() else None  # all-zero segments equal the models' default
    return TokenizedTexts(
        ids=ids,
        offsets=offsets,
        pad_id=int(tokenizer.pad_token_id),
        left_pad=tokenizer.padding_side == "left",
        type_ids=type_ids,
    )


def first_tokens(
    tokenizer: Any, texts: Sequence[str], max_length: int, truncate_chars: int | None = None
) -> dict[str, list[list[int]]]:
    """``input_ids`` (and ``token_type_ids`` when the tokenizer makes them) of each text's first
    ``max_length`` tokens, special tokens included. ``truncate_chars``: cut every text to that many
    characters first (the user's setting); None: the whole text counts."""
    if truncate_chars is not None:
        return _encode(tokenizer, [t[:truncate_chars] for t in texts], max_length)
    limit = CHARS_PER_TOKEN * int(max_length)
    if not getattr(tokenizer, "is_fast", False) or tokenizer.truncation_side != "right":
        return _encode(tokenizer, list(texts), max_length)
    cut = [t[:limit] for t in texts]
    enc = _encode(tokenizer, cut, max_length, offsets=True)
    spans = enc.pop("offset_mapping")
    redo = [i for i, (t, c) in enumerate(zip(texts, cut)) if len(c) < len(t) and not _ends_before_cut(spans[i], c)]
    if redo:
        whole = _encode(tokenizer, [texts[i] for i in redo], max_length)
        for key, rows in whole.items():
            for i, row in zip(redo, rows):
                enc[key][i] = row
    return enc


def _encode(tokenizer: Any, texts: list[str], max_length: int, offsets: bool = False) -> dict[str, list[list[int]]]:
    enc = tokenizer(
        texts,
        truncation=True,
        max_length=int(max_length),
        padding=False,
        return_attention_mask=False,
        return_offsets_mapping=offsets,
    )
    return {k: list(v) for k, v in enc.items()}


def _ends_before_cut(spans: Sequence[tuple[int, int]], cut: str) -> bool:
    """Whether the window's last token ends at or before a word end that whitespace follows in
    ``cut`` (special tokens span (0, 0))."""
    head = cut.rsplit(None, 1)  # [text before the last whitespace run, last word]: a word ends at len(head[0])
    return len(head) == 2 and max((e for _, e in spans), default=0) <= len(head[0])
