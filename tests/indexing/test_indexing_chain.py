"""ClusterChain: validation, shape facts, subsampling to B-way, save/load with a vocabulary check."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp

from xtransformer.indexing import ClusterChain, IndexingError, codes_to_csr, hierarchical_kmeans


def binary_tree_chain(n_labels: int, depth: int) -> ClusterChain:
    """A complete binary tree over labels in order: leaf j holds a contiguous label block."""
    mats = [sp.csr_matrix(np.ones((2, 1), dtype=np.float32))]
    for d in range(1, depth):
        mats.append(codes_to_csr(np.arange(2 ** (d + 1)) // 2, 2**d))
    k = 2**depth
    mats.append(codes_to_csr(np.arange(n_labels) * k // n_labels, k))
    return ClusterChain(mats)


def test_shape_facts() -> None:
    chain = binary_tree_chain(100, 3)
    assert len(chain) == 4
    assert chain.level_sizes == [2, 4, 8, 100]
    assert chain.n_labels == 100 and chain.n_clusters == 8
    assert chain.leaf_assignment is chain[-1]
    assert chain.leaf_assignment.dtype == np.float32 and sp.isspmatrix_csr(chain.leaf_assignment)
    assert chain.is_hard
    np.testing.assert_array_equal(chain.leaf_codes, np.arange(100) * 8 // 100)
    assert chain.cluster_sizes.sum() == 100 and chain.cluster_sizes.max() - chain.cluster_sizes.min() <= 1
    assert [m.shape for m in chain] == [(2, 1), (4, 2), (8, 4), (100, 8)]
    assert repr(chain) == "ClusterChain(level_sizes=[2, 4, 8, 100])"


def test_label_to_level_composes_parents() -> None:
    chain = binary_tree_chain(64, 3)
    top = chain.label_to_level(0)  # L x 2
    assert top.shape == (64, 2)
    np.testing.assert_array_equal(top.indices, np.arange(64) // 32)
    assert (chain.label_to_level(-1) != chain.leaf_assignment).nnz == 0
    assert chain.label_to_level(1).shape == (64, 4)
    with pytest.raises(IndexingError, match="out of range"):
        chain.label_to_level(3)


@pytest.mark.parametrize(
    "bad, match",
    [
        ([sp.csr_matrix(np.ones((2, 2)))], "K_1 x 1"),
        ([sp.csr_matrix(np.ones((2, 1))), sp.csr_matrix(np.ones((5, 3)))], "columns"),
        ([sp.csr_matrix(np.ones((2, 1))), sp.csr_matrix(np.array([[1.0, 0], [0, 0], [0, 1]]))], "row 1 has no parent"),
        ([sp.csr_matrix(np.ones((2, 1))), sp.csr_matrix(np.array([[1.0, 0], [1, 0]]))], "column 1 has no child"),
        ([np.ones((2, 1))], "scipy sparse"),
        ([], "empty"),
    ],
)
def test_validation_errors(bad: list, match: str) -> None:
    with pytest.raises(IndexingError, match=match):
        ClusterChain(bad)


def test_explicit_zeros_do_not_count_as_parents() -> None:
    leaf = sp.csr_matrix((np.array([1.0, 0.0], dtype=np.float32), np.array([0, 1]), np.array([0, 1, 2])), shape=(2, 2))
    with pytest.raises(IndexingError, match="no parent"):
        ClusterChain([sp.csr_matrix(np.ones((2, 1))), leaf])


def test_subsample_matches_pecos_grouping() -> None:
    # PECOS: from_partial_chain(C with 64 codes, nr_splits=16) -> [4 x 1, 64 x 4, L x 64], parent = code // 16.
    chain = binary_tree_chain(300, 6)
    sub = chain.subsample(16)
    assert sub.level_sizes == [4, 64, 300]
    np.testing.assert_array_equal(sub[1].indices, np.arange(64) // 16)
    assert (sub.leaf_assignment != chain.leaf_assignment).nnz == 0
    assert chain.subsample(4).level_sizes == [4, 16, 64, 300]
    assert chain.subsample(2) == chain
    assert chain.subsample(64).level_sizes == [64, 300]  # K <= B: flat under the root


def test_subsample_keeps_ancestry() -> None:
    chain = binary_tree_chain(200, 5)
    sub = chain.subsample(4)  # sizes [2, 8, 32, 200]
    assert sub.level_sizes == [2, 8, 32, 200]
    for i in range(len(sub) - 1):
        # the level with the same node count in the deep chain gives the same label ancestry
        j = chain.level_sizes.index(sub.level_sizes[i])
        assert (sub.label_to_level(i) != chain.label_to_level(j)).nnz == 0
    with pytest.raises(IndexingError, match="branching"):
        chain.subsample(1)


def test_from_codes_builds_flat_chain() -> None:
    chain = ClusterChain.from_codes(np.array([2, 0, 1, 2]))
    assert chain.level_sizes == [3, 4]
    np.testing.assert_array_equal(chain.leaf_codes, [2, 0, 1, 2])
    with pytest.raises(IndexingError, match="column 1 has no child"):
        ClusterChain.from_codes(np.array([0, 2, 2]))
    with pytest.raises(IndexingError, match="lie in"):
        ClusterChain.from_codes(np.array([0, 3]), n_clusters=2)


def test_save_load_roundtrip_and_vocab_check(tmp_path) -> None:
    rng = np.random.default_rng(0)
    chain = hierarchical_kmeans(rng.standard_normal((40, 5)).astype(np.float32), n_clusters=4)
    ids = [f"L{i}" for i in range(40)]
    out = tmp_path / "chain"
    chain.save(out, ids, {"name": "test", "K": 4})
    assert (out / "_COMPLETE").is_file()
    assert not list(tmp_path.glob(".*tmp"))  # nothing half-written left behind
    assert ClusterChain.load(out) == chain
    assert ClusterChain.load(out, vocab_ids=ids) == chain
    assert ClusterChain.load_settings(out) == {"name": "test", "K": 4}
    assert json.loads((out / "chain.json").read_text())["level_sizes"] == [2, 4, 40]

    with pytest.raises(IndexingError, match=r"index 7 \(line 8\): 'L7' vs 'X'"):
        ClusterChain.load(out, vocab_ids=ids[:7] + ["X"] + ids[8:])
    with pytest.raises(IndexingError, match="saved vs given: 40 labels vs 39"):
        ClusterChain.load(out, vocab_ids=ids[:-1])
    with pytest.raises(IndexingError, match="vocab_ids"):
        chain.save(tmp_path / "bad", ids[:-1])
    with pytest.raises(IndexingError, match="not a complete ClusterChain"):
        ClusterChain.load(tmp_path / "missing")
