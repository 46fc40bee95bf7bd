"""XR-Linear (HierarchicalLinear): targets per level, beam search, MAN negatives, persistence."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from model_helpers import with_bias

from xtransformer.indexing import ClusterChain
from xtransformer.ranker import (
    HierarchicalLinear,
    HierarchicalLinearConfig,
    RankerError,
    get_post_processor,
    level_targets,
)
from xtransformer.ranker.negatives import binarize
from xtransformer.topk import Candidates


def onehot(codes: np.ndarray, k: int) -> sp.csr_matrix:
    return sp.csr_matrix((np.ones(len(codes), np.float32), (np.arange(len(codes)), codes)), shape=(len(codes), k))


def problem(n=300, f=50, L=24, seed=0):
    rng = np.random.default_rng(seed)
    X = sp.random(n, f, density=0.2, format="csr", dtype=np.float32, random_state=seed)
    X = sp.csr_matrix(X.multiply(1.0 / np.maximum(sp.linalg.norm(X, axis=1), 1e-9)[:, None]), dtype=np.float32)
    S = X @ rng.standard_normal((f, L))
    Y = sp.csr_matrix((np.quantile(S, 0.8, axis=0) < S).astype(np.float32))
    chain = [sp.csr_matrix(np.ones((2, 1), np.float32)), onehot(np.arange(6) % 2, 2), onehot(np.arange(L) % 6, 6)]
    return X, Y, chain


def brute_force(model: HierarchicalLinear, X: sp.csr_matrix, post: str, matcher_weight: float = 1.0) -> np.ndarray:
    """Dense N x L final scores with no beam: every root-to-label path combined, the labels' path
    score raised to ``matcher_weight`` (times it for log- post-processors)."""
    pp = get_post_processor(post)
    score = np.full((X.shape[0], 1), pp.root_score, np.float32)
    for d, level in enumerate(model.levels):
        raw = with_bias(X, level.bias).toarray() @ level.W.toarray()
        parent = score[:, level.C.tocsr().indices]
        if d == len(model.levels) - 1:
            parent = parent**matcher_weight if pp.rule == "mul" else parent * matcher_weight
        score = pp.combine(raw, parent)
    return score


def test_level_targets_compose_the_chain():
    X, Y, chain = problem()
    t = level_targets(binarize(Y), chain)
    assert [m.shape for m in t] == [(300, 2), (300, 6), (300, 24)]
    leaf = (Y.toarray() @ chain[2].toarray()) > 0
    np.testing.assert_array_equal(t[1].toarray() > 0, leaf)
    np.testing.assert_array_equal(t[0].toarray() > 0, (leaf @ chain[1].toarray()) > 0)


@pytest.mark.parametrize("post", ["l3-hinge", "sigmoid", "noop", "log-l1-hinge"])
def test_full_beam_returns_exact_topk(post):
    X, Y, chain = problem()
    model = HierarchicalLinear.train(X, Y, chain, HierarchicalLinearConfig(threshold=0.0, post_processor=post))
    k = 5
    got = model.predict(X, beam_size=6, topk=k)  # the beam covers every node of every level
    ref = brute_force(model, X, post)
    order = np.argsort(-ref, axis=1, kind="stable")[:, :k]
    want = np.take_along_axis(ref, order, axis=1)
    assert np.all(np.diff(got.indptr) == k)
    got_sorted = -np.sort(-got.data.reshape(-1, k), axis=1)  # stored scores may be negative
    np.testing.assert_allclose(got_sorted, want, rtol=1e-4, atol=1e-6)
    # the same labels (ties aside): each stored label's score equals its reference score
    rows = np.repeat(np.arange(X.shape[0]), k)
    np.testing.assert_allclose(got.data, ref[rows, got.indices], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("post,w", [("l3-hinge", 0.2), ("l3-hinge", 0.0), ("log-l1-hinge", 0.5), ("sigmoid", 2.0)])
def test_matcher_weight_scales_the_path_score_of_the_labels(post, w):
    X, Y, chain = problem()
    model = HierarchicalLinear.train(X, Y, chain, HierarchicalLinearConfig(threshold=0.0, post_processor=post))
    k = 5
    got = model.predict(X, beam_size=6, topk=k, matcher_weight=w)
    ref = brute_force(model, X, post, matcher_weight=w)
    rows = np.repeat(np.arange(X.shape[0]), k)
    np.testing.assert_allclose(got.data, ref[rows, got.indices], rtol=1e-4, atol=1e-6)
    want = -np.sort(-ref, axis=1)[:, :k]
    np.testing.assert_allclose(-np.sort(-got.data.reshape(-1, k), axis=1), want, rtol=1e-4, atol=1e-6)
    # the setting in the model's config is what predict uses by default
    model.config = HierarchicalLinearConfig(threshold=0.0, post_processor=post, matcher_weight=w)
    again = model.predict(X, beam_size=6, topk=k)
    np.testing.assert_array_equal(again.indices, got.indices)
    if w == 0.0:  # the label rankers alone: the ranking ignores the levels above (within the beam)
        raw = with_bias(X, model.levels[-1].bias).toarray() @ model.levels[-1].W.toarray()
        np.testing.assert_allclose(ref, get_post_processor(post).transform(raw), rtol=1e-6)


def test_narrow_beam_only_returns_labels_under_kept_clusters():
    X, Y, chain = problem()
    model = HierarchicalLinear.train(X, Y, chain, HierarchicalLinearConfig())
    got = model.predict(X, beam_size=1, topk=10)
    # beam 1: one level-1 node, one leaf cluster of 4 labels
    assert np.all(np.diff(got.indptr) == 4)
    leaf_of = chain[2].indices
    rows = np.repeat(np.arange(X.shape[0]), 4)
    per_row = leaf_of[got.indices].reshape(-1, 4)
    assert np.all(per_row == per_row[:, :1])
    assert len(rows) == got.nnz


def test_man_negatives_add_the_models_own_beam():
    X, Y, chain = problem()
    cfg = HierarchicalLinearConfig(negatives="tfn+man", beam_size=1)
    model = HierarchicalLinear.train(X, Y, chain, cfg)
    targets = level_targets(binarize(Y), chain)
    pp = get_post_processor(cfg.post_processor)
    beam = model.levels[0].score(X, Candidates.root(X.shape[0], pp.root_score), pp, 1)
    want = binarize(targets[0] + beam.to_csr(2))
    assert model.train_stats[1]["mask_nnz"] == want.nnz > targets[0].nnz
    tfn_only = HierarchicalLinear.train(X, Y, chain, HierarchicalLinearConfig(negatives="tfn"))
    assert tfn_only.train_stats[1]["mask_nnz"] == targets[0].nnz


def test_accepts_a_cluster_chain_and_learns_something():
    X, Y, chain = problem(n=400)
    model = HierarchicalLinear.train(X, Y, ClusterChain(chain), HierarchicalLinearConfig())
    pred = model.predict(X, topk=1)
    hits = np.asarray(Y[np.arange(X.shape[0]), pred.indices]).ravel()
    assert hits.mean() > 0.6  # training-set P@1 of a working model


def test_save_load_round_trip(tmp_path):
    X, Y, chain = problem()
    model = HierarchicalLinear.train(X, Y, chain, HierarchicalLinearConfig(topk=3, beam_size=2))
    model.save(tmp_path / "m")
    loaded = HierarchicalLinear.load(tmp_path / "m")
    assert loaded.config == model.config
    assert (loaded.predict(X) != model.predict(X)).nnz == 0
    # a loaded level keeps its weights in the scoring layout only; W is rebuilt from it, exactly
    assert all(lv._W is None for lv in loaded.levels) and loaded.n_weights == model.n_weights
    assert [lv.n_features for lv in loaded.levels] == [lv.n_features for lv in model.levels]
    for a, b in zip(loaded.levels, model.levels):
        assert a.W.shape == b.W.shape and (a.W != b.W).nnz == 0 and a.W.has_sorted_indices
    loaded.save(tmp_path / "again")  # a loaded model saves the same model
    again = HierarchicalLinear.load(tmp_path / "again")
    assert (again.predict(X) != model.predict(X)).nnz == 0
    with pytest.raises(RankerError, match="not a complete"):
        HierarchicalLinear.load(tmp_path / "nothing")


def test_bad_inputs_raise_clear_errors():
    X, Y, chain = problem()
    with pytest.raises(RankerError, match=r"chain\[1\]"):
        HierarchicalLinear.train(X, Y, [chain[0], chain[2]])
    with pytest.raises(RankerError, match="labels"):
        HierarchicalLinear.train(X, Y[:, :10], chain)
    with pytest.raises(RankerError, match="features"):
        HierarchicalLinearConfig(features="neural")  # tfidf+neural is XR-Transformer's final model
    model = HierarchicalLinear.train(X, Y, chain)
    with pytest.raises(RankerError, match="features"):
        model.predict(X[:, :20])
