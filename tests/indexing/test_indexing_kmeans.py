"""Hierarchical balanced spherical k-means: balance, coverage, determinism, B-way, errors, quality."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import scipy.sparse as sp

from xtransformer.indexing import (
    ClusterChain,
    IndexingError,
    default_n_clusters,
    group_purity,
    hierarchical_kmeans,
    random_balanced_codes,
    resolve_n_clusters,
)
from xtransformer.indexing.kmeans_level import _split_rows, children_order, node_seeds, split_level
from xtransformer.indexing.synthetic import planted_label_features

# Balanced 2-means can merge two planted groups at a high split (PECOS does too: purity 0.85-1.0
# over seeds 0-5 on this problem), so recovery is asserted with a margin, far above random (~0.2).
PLANTED_PURITY = 0.85


@pytest.fixture(scope="module")
def planted() -> tuple[sp.csr_matrix, np.ndarray]:
    return planted_label_features(n_labels=1200, n_features=2000, n_groups=16, nnz_per_row=25, noise=0.2, seed=1)


def sibling_sizes(chain: ClusterChain) -> list[list[np.ndarray]]:
    """For each tree level, the label counts of every node's children (one array per parent)."""
    out = []
    for i in range(len(chain) - 1):
        counts = np.asarray(chain.label_to_level(i).sum(axis=0)).ravel()
        parent = chain[i].indices
        out.append([counts[parent == p] for p in range(chain[i].shape[1])])
    return out


def assert_valid_tree(chain: ClusterChain, n_labels: int, k: int) -> None:
    C = chain.leaf_assignment
    assert C.shape == (n_labels, k)
    np.testing.assert_array_equal(np.diff(C.indptr), 1)  # every label in exactly one leaf
    assert np.all(C.data == 1.0)
    sizes = chain.cluster_sizes
    assert sizes.sum() == n_labels and sizes.min() >= 1
    assert sizes.max() - sizes.min() <= 1  # leaves balanced to within one label
    for m in chain:
        assert m.nnz == m.shape[0]


def test_default_n_clusters_paper_rule() -> None:
    assert default_n_clusters(4271) == 64  # Eurlex-4K
    assert default_n_clusters(501070) == 8192  # Wiki-500K
    assert default_n_clusters(30938) == 512  # Wiki10-31K
    assert default_n_clusters(90) == 2
    assert resolve_n_clusters(4271, None, 100) == 64  # PECOS's max_leaf_size rule
    assert resolve_n_clusters(90, None, 100) == 1  # all labels fit one leaf: no clustering (PECOS)
    assert resolve_n_clusters(4271, 37, None) == 37


@pytest.mark.parametrize("k", [2, 16, 64])
def test_binary_splits_balanced_within_one(planted, k: int) -> None:
    X, _ = planted
    chain = hierarchical_kmeans(X, n_clusters=k, seed=0, threads=1)
    assert_valid_tree(chain, X.shape[0], k)
    assert chain.level_sizes == [2**d for d in range(1, int(math.log2(k)) + 1)] + [X.shape[0]]
    for level in sibling_sizes(chain):
        for sizes in level:
            assert len(sizes) in (1, 2) and sizes.max() - sizes.min() <= 1


@pytest.mark.parametrize("k, b", [(10, 2), (3, 2), (7, 3), (16, 4), (5, 8)])
def test_any_k_and_branching(planted, k: int, b: int) -> None:
    X, _ = planted
    chain = hierarchical_kmeans(X, n_clusters=k, branching=b, seed=0, threads=1)
    assert_valid_tree(chain, X.shape[0], k)
    assert len(chain) == math.ceil(math.log(k, b) - 1e-9) + 1
    assert max(m.shape[0] / m.shape[1] for m in chain[:-1]) <= b
    if k == b ** round(math.log(k, b)):  # complete tree: every split balanced within one
        for level in sibling_sizes(chain):
            for sizes in level:
                assert sizes.max() - sizes.min() <= 1


def test_all_labels_as_leaves(planted) -> None:
    X, _ = planted
    chain = hierarchical_kmeans(X[:50], n_clusters=50, threads=1)
    assert_valid_tree(chain, 50, 50)


def test_deterministic_under_seed_and_threads(planted) -> None:
    X, _ = planted
    a = hierarchical_kmeans(X, n_clusters=32, seed=3, threads=1)
    assert a == hierarchical_kmeans(X, n_clusters=32, seed=3, threads=1)
    assert a == hierarchical_kmeans(X, n_clusters=32, seed=3, threads=2)
    assert a != hierarchical_kmeans(X, n_clusters=32, seed=4, threads=1)


@pytest.mark.parametrize("threads", [2, 8])
def test_node_parallel_and_row_parallel_levels_give_the_same_tree(planted, threads: int) -> None:
    """Levels with fewer nodes than 2 x threads split each node's scoring over rows; the others
    run groups of nodes in threads: either way each node's split is the serial one."""
    X, groups = planted
    one = hierarchical_kmeans(X, n_clusters=64, seed=0, threads=1)
    assert one == hierarchical_kmeans(X, n_clusters=64, seed=0, threads=threads)
    assert_valid_tree(one, X.shape[0], 64)
    four = group_purity(one.label_to_level(3).indices, groups)  # 16 nodes at level 4
    assert four > PLANTED_PURITY


@pytest.mark.parametrize("branching", [2, 3])
def test_split_level_on_hand_built_nodes(branching: int) -> None:
    """Two nodes of obvious groups (one feature per group): each child gets its quota of the
    rows of one group, whatever the seeds."""
    rows, cols = [], []
    groups = [0, 0, 1, 1, 1, 0] if branching == 2 else [0, 1, 2, 2, 1, 0]
    for node in range(2):
        for g in groups:
            rows.append(len(rows))
            cols.append(node * 3 + g)
    X = sp.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)), shape=(len(rows), 6))
    caps = np.array([[3, 3, 0]] * 2 if branching == 2 else [[2, 2, 2]] * 2)[:, :branching]
    seeds = np.array([[0, 2, 1]] * 2)[:, :branching] if branching == 3 else np.array([[0, 2]] * 2)
    assign, iters = split_level(X, np.arange(12), np.array([0, 6, 12]), caps, seeds, max_iter=20, threads=1)
    for node in range(2):
        a = assign[node * 6 : (node + 1) * 6]
        for g in range(branching):  # rows of one group share one child, children have their quotas
            assert len(set(a[np.array(groups) == g])) == 1
        np.testing.assert_array_equal(np.bincount(a, minlength=branching), caps[node])
    assert (iters >= 2).all()  # the seeded assignment, then one that changes nothing


def test_linear_time_orderings_equal_the_stable_sorts() -> None:
    """The level's orderings skip full sorts (zero keys, per-node seeds, children by counting) and
    must give exactly the stable sorts they replace, ties included."""
    rng = np.random.default_rng(1)
    for t in range(200):
        b = int(rng.integers(2, 5))
        sizes = rng.integers(b, 12, size=rng.integers(1, 8))
        node = np.repeat(np.arange(len(sizes)), sizes)
        assign = rng.integers(0, b, size=len(node))
        node_start = np.searchsorted(node, np.arange(len(sizes) + 1))
        np.testing.assert_array_equal(
            children_order(node_start, assign, b), np.argsort(node * b + assign, kind="stable")
        )
        key = rng.choice([-1.0, -0.5, 0.0, 0.0, 0.5, 1.0], size=len(node)) if t % 2 else rng.random(len(node)) - 0.5
        order = np.argsort(-key, kind="mergesort")
        n_pos, n_zero = int((key > 0).sum()), int((key == 0).sum())
        for cap in {0, n_pos // 2, n_pos, n_pos + n_zero // 2, n_pos + n_zero, len(key) - 1, len(key)}:
            expected_child = np.ones(len(key), np.int64)
            expected_child[order[:cap]] = 0  # B = 2: child 0 takes the cap highest keys, ties by row
            np.testing.assert_array_equal(_split_rows(key, cap), expected_child)
        order = np.argsort(node * 8.0 - key, kind="stable")  # each node's highest keys first, ties by position
        rank = np.arange(len(node)) - node_start[node]
        first = rank < b
        expected = np.zeros((len(sizes), b), np.int64)
        expected[node[first], rank[first]] = order[first] - node_start[node[first]]
        np.testing.assert_array_equal(node_seeds(key, node_start, b), expected)


def test_recovers_planted_groups_better_than_random(planted) -> None:
    X, groups = planted
    chain = hierarchical_kmeans(X, n_clusters=16, seed=0)
    purity = group_purity(chain.leaf_codes, groups)
    random = group_purity(random_balanced_codes(chain.cluster_sizes, seed=0), groups)
    assert purity > PLANTED_PURITY and random < 0.3


def test_dense_features_and_unnormalised_rows(planted) -> None:
    X, groups = planted
    dense = X.toarray()
    chain = hierarchical_kmeans(dense, n_clusters=16, seed=0, threads=2)
    assert_valid_tree(chain, X.shape[0], 16)
    assert group_purity(chain.leaf_codes, groups) > PLANTED_PURITY
    scaled = sp.diags(np.linspace(0.5, 3.0, X.shape[0])) @ X  # rows are renormalised on a copy
    assert hierarchical_kmeans(scaled, n_clusters=16, seed=0) == hierarchical_kmeans(X, n_clusters=16, seed=0)


def test_branching_four_on_planted(planted) -> None:
    X, groups = planted
    chain = hierarchical_kmeans(X, n_clusters=16, branching=4, seed=0)
    assert chain.level_sizes == [4, 16, X.shape[0]]
    assert group_purity(chain.leaf_codes, groups) > PLANTED_PURITY


def test_zero_rows_still_get_a_leaf(planted) -> None:
    X, _ = planted
    X = X.tolil()
    X[::7] = 0
    chain = hierarchical_kmeans(sp.csr_matrix(X), n_clusters=16, seed=0)
    assert_valid_tree(chain, X.shape[0], 16)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"n_clusters": 1}, "n_clusters"),
        ({"n_clusters": 4, "max_leaf_size": 10}, "at most one"),
        ({"max_leaf_size": 0}, "max_leaf_size"),
        ({"max_leaf_size": 1}, "needs 2048 clusters"),
        ({"branching": 1}, "branching"),
        ({"max_iter": 0}, "max_iter"),
        ({"threads": 0}, "threads"),
        ({"n_clusters": 2.5}, "n_clusters"),
    ],
)
def test_argument_errors(planted, kwargs: dict, match: str) -> None:
    X, _ = planted
    with pytest.raises(IndexingError, match=match):
        hierarchical_kmeans(X, **kwargs)


@pytest.mark.parametrize(
    "features, match",
    [
        (sp.csr_matrix((10, 5), dtype=np.float32), "empty"),
        (np.zeros((10, 5), dtype=np.float32), "empty"),
        (np.ones((1, 5), dtype=np.float32), "at least 2 labels"),
        (np.full((4, 2), np.nan, dtype=np.float32), "NaN"),
        (np.ones(5), "2-D"),
        ([[1.0, 0.0], [0.0, 1.0]], "scipy sparse matrix or numpy array"),
    ],
)
def test_feature_errors(features, match: str) -> None:
    with pytest.raises(IndexingError, match=match):
        hierarchical_kmeans(features, n_clusters=2)


def test_n_clusters_above_the_labels_is_clamped_with_a_warning(caplog) -> None:
    """The default run's K = 16 on a data set of 10 labels: one label a cluster, and a warning."""
    X, _ = planted_label_features(n_labels=10, n_features=50, n_groups=2, nnz_per_row=5, seed=0)
    with caplog.at_level(logging.WARNING):
        chain = hierarchical_kmeans(X, n_clusters=16, seed=0)
    assert_valid_tree(chain, 10, 10)
    assert "n_clusters=16 is more than the 10 labels" in caplog.text
