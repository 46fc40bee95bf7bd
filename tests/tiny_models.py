"""Tiny random Hugging Face models and a learnable toy XMC task, for tests (no hub, no network).

    from tiny_models import tiny_model_dir, build_tiny, toy_xmc
    path = tiny_model_dir("bert")          # built once per test session, HF layout
    model = AutoModel.from_pretrained(path); tok = AutoTokenizer.from_pretrained(path)
    texts, Y, C = toy_xmc()                # {"train","dev","test"} texts / N x L csr, L x K csr

Families: "bert" (WordPiece), "roberta" (byte-level BPE), "xlnet" (unigram, left padding).
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import scipy.sparse as sp

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("WANDB_MODE", "offline")

from xtransformer.encoders import TinySpec, build_tiny_model

FAMILIES = ("bert", "roberta", "xlnet")
# Tests want milliseconds per step: smaller than the pipeline's tiny:* models.
TEST_SHAPE = {"hidden": 32, "layers": 2, "heads": 2, "intermediate": 64, "vocab_size": 600, "max_positions": 256}


def tiny_spec(family: str, **overrides: int) -> TinySpec:
    return TinySpec(family=family, **{**TEST_SHAPE, **overrides})


def build_tiny(family: str, path: str | os.PathLike, corpus: Sequence[str] | None = None, **overrides: int) -> Path:
    """Build a tiny random ``family`` model + tokenizer trained on ``corpus`` into ``path``."""
    return build_tiny_model(tiny_spec(family, **overrides), path, corpus if corpus is not None else toy_corpus())


_SESSION_DIR: Path | None = None


def _session_dir() -> Path:
    global _SESSION_DIR
    if _SESSION_DIR is None:
        _SESSION_DIR = Path(tempfile.mkdtemp(prefix="xt-tiny-models-"))
        atexit.register(shutil.rmtree, _SESSION_DIR, True)
    return _SESSION_DIR


@functools.cache
def tiny_model_dir(family: str) -> Path:
    """A tiny ``family`` model trained-tokenizer folder, built once per process (toy corpus)."""
    return build_tiny(family, _session_dir() / f"tiny-{family}")


# --------------------------------------------------------------------------- toy task


def _pseudo_words(rng: np.random.Generator, n: int, length: int = 6) -> list[str]:
    letters = np.array(list("bcdfghjklmnpqrstvwxz"))
    vowels = np.array(list("aeiou"))
    words = set()
    while len(words) < n:
        chars = [rng.choice(letters) if i % 2 == 0 else rng.choice(vowels) for i in range(length)]
        words.add("".join(chars))
    return sorted(words)


def toy_xmc(
    n_train: int = 96,
    n_dev: int = 32,
    n_test: int = 32,
    n_labels: int = 12,
    n_clusters: int = 4,
    seed: int = 0,
) -> tuple[dict[str, list[str]], dict[str, sp.csr_matrix], sp.csr_matrix]:
    """A learnable toy problem: each label has its own keywords; documents mix their labels'
    keywords with shared filler words. Labels ``l`` go to cluster ``l % n_clusters``."""
    rng = np.random.default_rng(seed)
    words = _pseudo_words(rng, 3 * n_labels + 40)
    keywords = [words[3 * j : 3 * j + 3] for j in range(n_labels)]
    filler = words[3 * n_labels :]
    texts: dict[str, list[str]] = {}
    Y: dict[str, sp.csr_matrix] = {}
    for split, n in (("train", n_train), ("dev", n_dev), ("test", n_test)):
        rows, cols, docs = [], [], []
        for i in range(n):
            labels = rng.choice(n_labels, size=int(rng.integers(1, 3)), replace=False)
            tokens = list(rng.choice(filler, size=int(rng.integers(8, 20))))
            for j in labels:
                tokens += list(rng.choice(keywords[j], size=3))
            rng.shuffle(tokens)
            docs.append(" ".join(tokens) + ".")
            rows += [i] * len(labels)
            cols += list(labels)
        texts[split] = docs
        Y[split] = sp.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)), shape=(n, n_labels))
    C = sp.csr_matrix(
        (np.ones(n_labels, np.float32), (np.arange(n_labels), np.arange(n_labels) % n_clusters)),
        shape=(n_labels, n_clusters),
    )
    return texts, Y, C


def toy_corpus() -> list[str]:
    """Texts of the default toy task (tokenizer training corpus)."""
    texts, _, _ = toy_xmc()
    return texts["train"] + texts["dev"] + texts["test"]
