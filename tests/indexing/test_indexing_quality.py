"""Cluster-quality figures (by hand and on a planted problem), plots, the stage and its configs."""

from __future__ import annotations

import dataclasses
import zlib
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from omegaconf import OmegaConf

from xtransformer.configuration import compose
from xtransformer.indexing import (
    ClusterChain,
    IndexingConfig,
    IndexingError,
    build_index,
    centroid_cosine,
    cluster_quality,
    cooccurrence_purity,
    group_purity,
    random_balanced_codes,
    save_quality_plots,
)
from xtransformer.indexing.synthetic import planted_problem

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs" / "indexing"


def load_config(name: str) -> dict:
    """The ``indexing=<name>`` node as a run composes it (the record's defaults, the option's own
    values, train.yaml's for the default run; ``${seed}`` resolved)."""
    return OmegaConf.to_container(compose([f"indexing={name}", "seed=0"]).indexing, resolve=True)


@pytest.fixture(scope="module")
def problem() -> tuple[sp.csr_matrix, sp.csr_matrix, np.ndarray]:
    Y, X, groups = planted_problem(n_docs=3000, n_labels=400, n_features=1600, n_groups=8, labels_per_doc=3, seed=0)
    return Y, X, groups


def test_figures_by_hand() -> None:
    Y = sp.csr_matrix(np.array([[1, 1, 0], [1, 1, 1], [0, 0, 1]], dtype=np.float32))
    # doc 0: its one pair shares cluster 0; doc 1: 1 of 3 pairs shares; doc 2 has no pair -> 2 / 4
    assert cooccurrence_purity(Y, np.array([0, 0, 1])) == pytest.approx(0.5)
    assert group_purity(np.array([0, 0, 1, 1]), np.array(["a", "a", "a", "b"])) == pytest.approx(0.75)
    same = sp.csr_matrix(np.array([[1.0, 0], [1.0, 0], [0, 1.0], [0, 0]]))
    assert centroid_cosine(same, np.array([0, 0, 1, 1])) == pytest.approx(1.0)  # zero row left out
    orth = np.eye(2, dtype=np.float32)
    assert centroid_cosine(orth, np.array([0, 0])) == pytest.approx(1 / np.sqrt(2))


@pytest.mark.parametrize("n_features", [300, 300_000])  # a dense K x D grid, and (cluster, feature) pairs
def test_cluster_sums_in_blocks_are_the_sums_at_once(n_features, monkeypatch) -> None:
    """The cluster sums taken a block of nonzeros at a time are the one-pass sums to the bit, with
    the rows scaled to unit length on the fly as when they are scaled first."""
    from xtransformer.indexing import quality

    X = sp.random(600, n_features, density=min(0.5, 40 / n_features), format="csr", dtype=np.float32, random_state=3)
    codes = np.random.default_rng(0).integers(0, 150, 600)
    scale = 1.0 / np.sqrt(np.asarray(X.multiply(X).sum(axis=1), dtype=np.float64).ravel())
    at_once = quality.cluster_sum_sq(sp.csr_matrix(sp.diags(scale) @ X), codes)
    monkeypatch.setattr(quality, "_BLOCK_NNZ", 997)
    blocks = quality.cluster_sum_sq(X, codes, scale)
    assert len(quality._row_blocks(np.diff(X.indptr))) > 10 and np.array_equal(blocks, at_once)


def test_random_balanced_codes_keep_sizes() -> None:
    codes = random_balanced_codes(np.array([3, 1, 2]), seed=0)
    np.testing.assert_array_equal(np.bincount(codes), [3, 1, 2])
    with pytest.raises(IndexingError, match="one cluster per label"):
        group_purity(codes, np.zeros(5))


def test_build_index_beats_random_on_planted_clusters(problem, tmp_path) -> None:
    Y, X, groups = problem
    chain, report = build_index({"name": "pifa_tfidf", "n_clusters": 8, "seed": 0}, Y, X_train_tfidf=X)
    assert isinstance(chain, ClusterChain) and chain.n_clusters == 8 and chain.n_labels == 400
    q = report["quality"]
    assert q["centroid_cosine"] > q["centroid_cosine_random"] + 0.2
    assert q["cooccurrence_purity"] > 0.8 > 0.3 > q["cooccurrence_purity_random"]
    full = cluster_quality(chain, Y=Y, groups=groups)
    assert full["group_purity"] > 0.85 > 0.3 > full["group_purity_random"]
    assert report["level_sizes"] == [2, 4, 8, 400]
    assert report["config"]["name"] == "pifa_tfidf" and report["representation"]["n_orphans"] == 0

    paths = save_quality_plots(tmp_path / "plots", Y, chain, title="planted")
    assert [p.name for p in paths] == ["label_long_tail.png", "cluster_distribution.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000


def hashed_words(texts: list[str]) -> np.ndarray:
    """A fake encoder: mean of fixed random vectors per word (crc32-seeded, so stable across runs)."""
    out = np.zeros((len(texts), 32), dtype=np.float32)
    for i, t in enumerate(texts):
        words = t.split()
        for w in words:
            out[i] += np.random.default_rng(zlib.crc32(w.encode())).standard_normal(32).astype(np.float32) / len(words)
    return out


@pytest.mark.parametrize("config", ["pifa_tfidf", "pifa_neural", "text_emb", "pifa_concat"])
def test_build_index_from_each_config(problem, config: str) -> None:
    Y, X, groups = problem
    cfg = load_config(config) | {"n_clusters": 8}
    doc_emb = np.asarray(X @ np.random.default_rng(0).standard_normal((X.shape[1], 24)), dtype=np.float32)
    texts = [f"topic{g} item{i}" for i, g in enumerate(groups)]  # labels of a group share a word
    chain, report = build_index(
        cfg, Y, X_train_tfidf=X, doc_embeddings=doc_emb, label_texts=texts, embed_fn=hashed_words
    )
    assert chain.n_clusters == 8 and report["representation"]["blocks"] == (
        ["pifa_tfidf", "pifa_neural"] if config == "pifa_concat" else [config]
    )
    q = report["quality"]
    assert q["centroid_cosine"] > q["centroid_cosine_random"]
    assert q["cooccurrence_purity"] > q["cooccurrence_purity_random"] + 0.3


def test_labels_without_positives_get_a_cluster(problem) -> None:
    Y, X, _ = problem
    Y = Y.tolil()
    Y[:, :10] = 0  # ten labels lose every positive document
    Y = sp.csr_matrix(Y)
    for fallback in ("random_label", "none"):
        chain, report = build_index(IndexingConfig(n_clusters=8, orphan_fallback=fallback), Y, X_train_tfidf=X)
        assert report["representation"]["n_orphans"] == 10
        assert report["representation"]["orphan_fallback"] == fallback
        np.testing.assert_array_equal(np.diff(chain.leaf_assignment.indptr), 1)
        assert chain.cluster_sizes.max() - chain.cluster_sizes.min() <= 1


def test_each_option_composes_into_the_record() -> None:
    fields = [f.name for f in dataclasses.fields(IndexingConfig)]
    files = sorted(CONFIG_DIR.glob("*.yaml"))
    assert {p.stem for p in files} == {"pifa_tfidf", "pifa_neural", "text_emb", "pifa_concat"}
    for path in files:
        cfg = load_config(path.stem)
        assert list(cfg) == ["_target_", *fields], path.name
        assert IndexingConfig.from_mapping(cfg).name == path.stem


@pytest.mark.parametrize(
    "cfg, match",
    [
        ({"name": "nope"}, "unknown label representation"),
        ({"orphan_fallback": "x"}, "orphan_fallback"),
        ({"n_clusters": 8, "max_leaf_size": 10}, "at most one"),
        ({"branching": 1}, "branching"),
        ({"colour": "red"}, "unknown key"),
    ],
)
def test_config_errors(cfg: dict, match: str) -> None:
    with pytest.raises(IndexingError, match=match):
        IndexingConfig.from_mapping(cfg)
