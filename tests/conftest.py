"""What the tests share: an offline environment, and fixtures for tiny data, tiny models and
composed configs. Helper modules beside this file (``tiny_models``, ``run_helpers``,
``matcher_helpers``, ``model_helpers``) are importable from every test folder."""

from __future__ import annotations

import os

import pytest

for _key, _value in {
    "WANDB_MODE": "offline",
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}.items():
    os.environ.setdefault(_key, _value)  # no network here, and no progress noise in the logs


@pytest.fixture(scope="session")
def toy_task():
    """The learnable toy XMC task: ``(texts, Y, C)`` per split (``tiny_models.toy_xmc``)."""
    from tiny_models import toy_xmc

    return toy_xmc()


@pytest.fixture(scope="session")
def tiny_bert():
    """A tiny random BERT folder with a tokenizer trained on the toy corpus, built once a session."""
    from tiny_models import tiny_model_dir

    return tiny_model_dir("bert")


@pytest.fixture(scope="session")
def reuters_tfidf(tmp_path_factory):
    """A slice of Reuters-21578 (1,500 documents a split, scored on dev) and its TF-IDF per split."""
    from xtransformer.data import load_dataset, tfidf_features

    ds = load_dataset("reuters21578", max_docs=1500, eval_split="dev")
    return tfidf_features(ds, cache_dir=tmp_path_factory.mktemp("cache")), ds
