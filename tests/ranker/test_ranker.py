"""Linear rankers: negatives, the batched solver against scikit-learn, post-processors, scoring."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from model_helpers import dense_weights, with_bias
from sklearn.linear_model import LogisticRegression
from sklearn.svm import LinearSVC

from xtransformer.ranker import (
    HierarchicalLinearConfig,
    LinearRanker,
    RankerConfig,
    RankerError,
    blocks,
    concat_features,
    fit,
    get_post_processor,
    kernels,
    negative_mask,
    ranker_features,
    scoring,
    tfn_mask,
    topk_csr,
    train_ranker,
)
from xtransformer.ranker.blocks import build_block, make_groups, plan_batches
from xtransformer.ranker.fit import LevelSpec, train_level
from xtransformer.ranker.solver import Block, SolvedWeights, SolverParams, solve_block

TIGHT = {"eps": 1e-7, "max_iter": 100, "max_cg_iter": 500}


# ---------------------------------------------------------------------------------------------- data
def figure4() -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """The paper's Figure 4 setting: N=6, L=20, K=4, cluster k holds labels 5k..5k+4.

    Cluster 1 (index 0) is hit by x1, x2 and x6 only, as in the figure.
    """
    labels = [[0, 7], [3], [12], [6, 17], [19], [1, 4, 11]]
    rows = np.repeat(np.arange(6), [len(x) for x in labels])
    Y = sp.csr_matrix((np.ones(len(rows), np.float32), (rows, np.concatenate(labels))), shape=(6, 20))
    C = sp.csr_matrix((np.ones(20, np.float32), (np.arange(20), np.arange(20) // 5)), shape=(20, 4))
    return Y, C


def mask_sets(M: sp.csr_matrix) -> list[set[int]]:
    Mc = M.tocsc()
    return [set(Mc.indices[Mc.indptr[k] : Mc.indptr[k + 1]].tolist()) for k in range(M.shape[1])]


def random_problem(n=240, f=60, L=12, K=4, seed=0):
    rng = np.random.default_rng(seed)
    X = sp.random(n, f, density=0.15, format="csr", dtype=np.float32, random_state=seed)
    X = sp.csr_matrix(X.multiply(1.0 / np.maximum(sp.linalg.norm(X, axis=1), 1e-9)[:, None]), dtype=np.float32)
    W = rng.standard_normal((f, L))
    S = X @ W
    Y = sp.csr_matrix((np.quantile(S, 0.85, axis=0) < S).astype(np.float32))
    codes = np.arange(L) % K
    C = sp.csr_matrix((np.ones(L, np.float32), (np.arange(L), codes)), shape=(L, K))
    return X, Y, C


def sklearn_weights(X, y, loss="squared_hinge", Cp=1.0, Cn=1.0):
    """LIBLINEAR through scikit-learn, bias as an appended regularised feature of value 1."""
    cw = {1: Cp, -1: Cn}
    if loss == "squared_hinge":
        m = LinearSVC(loss="squared_hinge", dual=False, C=1.0, class_weight=cw, tol=1e-12, max_iter=100_000)
    else:
        m = LogisticRegression(solver="liblinear", C=1.0, class_weight=cw, tol=1e-12, max_iter=100_000)
    m.fit(X, y)
    return np.r_[m.coef_.ravel(), m.intercept_]


# ---------------------------------------------------------------------------------------------- negatives
def test_tfn_selects_figure4_instances():
    Y, C = figure4()
    assert mask_sets(tfn_mask(Y, C)) == [{0, 1, 5}, {0, 3}, {2, 5}, {3, 4}]


def test_man_and_union_select_exact_instances():
    Y, C = figure4()
    M_hat = sp.csr_matrix((np.array([0.9, 0.8, 0.7, 0.6], np.float32), ([2, 3, 0, 4], [0, 1, 3, 2])), shape=(6, 4))
    assert mask_sets(negative_mask("man", Y, C, M_hat)) == [{2}, {3}, {4}, {0}]
    union = negative_mask("tfn+man", Y, C, M_hat)
    assert mask_sets(union) == [{0, 1, 2, 5}, {0, 3}, {2, 4, 5}, {0, 3, 4}]
    assert set(np.unique(union.data)) == {1.0}


def test_negative_mask_errors():
    Y, C = figure4()
    with pytest.raises(RankerError, match="matcher_pred"):
        negative_mask("tfn+man", Y, C)
    with pytest.raises(RankerError, match="scheme"):
        negative_mask("hard", Y, C)
    with pytest.raises(RankerError, match="rows"):
        tfn_mask(Y, C[:10])


def test_block_rows_follow_the_mask():
    Y, C = figure4()
    X = sp.random(6, 9, density=0.5, format="csr", dtype=np.float32, random_state=1)
    groups = make_groups(C, tfn_mask(Y, C))
    for k, expected in enumerate([[0, 1, 5], [0, 3], [2, 5], [3, 4]]):
        bd = build_block(X, Y, groups, np.array([k]), bias=1.0)
        np.testing.assert_array_equal(bd.rows, expected)
        np.testing.assert_array_equal(bd.slot_label[0], np.arange(5 * k, 5 * k + 5))
        # targets: +1 exactly where the instance has the label
        np.testing.assert_array_equal(bd.Y > 0, Y[expected][:, 5 * k : 5 * k + 5].toarray() > 0)


def test_trained_weights_equal_sklearn_on_the_selected_rows():
    """Each label of cluster c is LIBLINEAR trained on exactly {i : M[i, c] = 1}."""
    X, Y, C = random_problem()
    mask = tfn_mask(Y, C)
    cfg = RankerConfig(features="tfidf", negatives="tfn", threshold=0.0, **TIGHT)
    W = LinearRanker.train(X, Y, C, mask, cfg).W.toarray()
    Mc = mask.tocsc()
    checked = 0
    for label in range(Y.shape[1]):
        c = C[label].indices[0]
        rows = Mc.indices[Mc.indptr[c] : Mc.indptr[c + 1]]
        y = np.where(Y[rows, label].toarray().ravel() > 0, 1, -1)
        if len(set(y)) < 2:
            continue
        np.testing.assert_allclose(W[:, label], sklearn_weights(X[rows], y), atol=2e-3)
        checked += 1
    assert checked >= 8


# ---------------------------------------------------------------------------------------------- solver
@pytest.mark.parametrize("loss", ["squared_hinge", "logistic"])
@pytest.mark.parametrize("costs", [(1.0, 1.0), (2.0, 0.5)])
def test_solver_matches_liblinear(loss, costs):
    X, Y, _ = random_problem(n=200, f=40, L=3)
    Cp, Cn = costs
    Xb = with_bias(X, 1.0)
    Yd = np.where(Y.toarray() > 0, 1.0, -1.0).astype(np.float32)
    block = Block.from_scipy(Xb, np.array([X.shape[0]]), np.array([Xb.shape[1]]), Yd, Cp, Cn)
    W = dense_weights(solve_block(block, SolverParams(loss=loss, Cp=Cp, Cn=Cn, **TIGHT)), Xb.shape[1], 3)
    for j in range(3):
        np.testing.assert_allclose(W[:, j], sklearn_weights(X, Yd[:, j], loss, Cp, Cn), atol=2e-3)


@pytest.mark.parametrize("bias", [1.0, 0.0])
def test_block_view_is_the_block_matrix(bias):
    """A block of several clusters, described by its rows and columns, equals its materialised
    matrix: the same rows, exactly the task's own features in increasing id, the bias last; the
    solver gives the same weights on both; X itself is left untouched."""
    X, Y, C = random_problem(n=300, L=16, K=8, seed=3)
    X0 = X.copy()
    groups = make_groups(C, tfn_mask(Y, C))
    batch = np.arange(groups.n_groups)
    bd = build_block(X, Y, groups, batch, bias=bias)
    block = Block.from_rows(X, bd, bias, 1.0, 1.0, materialise=True)
    Xf = with_bias(X, bias).toarray() if bias > 0 else X.toarray()
    r0 = c0 = 0
    for t in range(len(batch)):
        rows = bd.rows[r0 : r0 + bd.row_len[t]]
        cols = bd.col_feature[c0 : c0 + bd.col_len[t]]
        expected = np.zeros((len(rows), block.X.shape[1]), np.float32)
        expected[:, c0 : c0 + len(cols)] = Xf[np.ix_(rows, cols)]
        np.testing.assert_array_equal(block.X[r0 : r0 + len(rows)].toarray(), expected)
        np.testing.assert_array_equal(cols, np.flatnonzero(Xf[rows].any(0)))  # exactly the features present
        r0, c0 = r0 + len(rows), c0 + len(cols)
    assert block.X.has_sorted_indices and np.all(np.diff(block.X.indices[block.X.indptr[0] : block.X.indptr[1]]) > 0)
    view = Block.from_rows(X, bd, bias, 1.0, 1.0)
    own = Block.from_scipy(block.X, bd.row_len, bd.col_len, bd.Y)
    params = SolverParams(**TIGHT)
    shape = (len(bd.col_feature), bd.Y.shape[1])
    np.testing.assert_allclose(
        dense_weights(solve_block(view, params), *shape), dense_weights(solve_block(own, params), *shape), atol=1e-5
    )  # sums in another order
    assert (X != X0).nnz == 0


def test_packed_blocks_equal_one_block_per_cluster():
    """Solving many clusters in one block-diagonal block gives each cluster's own solution."""
    X, Y, C = random_problem(n=300, L=16, K=8, seed=3)
    mask = tfn_mask(Y, C)
    packed = RankerConfig(features="tfidf", negatives="tfn", threshold=0.0, batch_nnz=10**9, **TIGHT)
    single = RankerConfig(features="tfidf", negatives="tfn", threshold=0.0, batch_nnz=1, **TIGHT)
    groups = make_groups(C, mask)
    assert len(plan_batches(groups, np.diff(X.indptr), packed.batch_nnz)) == 1
    assert len(plan_batches(groups, np.diff(X.indptr), single.batch_nnz)) == 8
    Wa = LinearRanker.train(X, Y, C, mask, packed).W.toarray()
    Wb = LinearRanker.train(X, Y, C, mask, single).W.toarray()
    np.testing.assert_allclose(Wa, Wb, atol=1e-3)


def test_threshold_prunes_small_weights():
    X, Y, C = random_problem()
    mask = tfn_mask(Y, C)
    full = LinearRanker.train(X, Y, C, mask, RankerConfig(threshold=0.0)).W
    pruned = LinearRanker.train(X, Y, C, mask, RankerConfig(threshold=0.1)).W
    assert pruned.nnz < full.nnz
    assert np.abs(pruned.data).min() >= 0.1
    kept = full.toarray()
    np.testing.assert_allclose(pruned.toarray(), np.where(np.abs(kept) >= 0.1, kept, 0.0), atol=1e-6)


# ---------------------------------------------------------------------------------------------- post-processors
def test_post_processors_on_known_numbers():
    s = np.array([-1.0, 0.0, 0.5, 2.0], np.float32)
    parent = np.float32(0.5)
    sig = 1.0 / (1.0 + np.exp(-s))
    expected = {
        "noop": s,
        "sigmoid": sig * parent,
        "log-sigmoid": np.log(sig) + parent,
        "l1-hinge": np.exp(-np.array([2.0, 1.0, 0.5, 0.0])) * parent,
        "l2-hinge": np.exp(-np.array([4.0, 1.0, 0.25, 0.0])) * parent,
        "l3-hinge": np.exp(-np.array([8.0, 1.0, 0.125, 0.0])) * parent,
        "l4-hinge": np.exp(-np.array([16.0, 1.0, 0.0625, 0.0])) * parent,
        "log-l3-hinge": -np.array([8.0, 1.0, 0.125, 0.0]) + parent,
    }
    for name, want in expected.items():
        np.testing.assert_allclose(get_post_processor(name).combine(s, parent), want, rtol=1e-5, err_msg=name)


def test_post_processors_combine_ranker_and_matcher_scores():
    r, m = np.array([0.3, -2.0], np.float32), np.array([1.5, 0.2], np.float32)
    sig = lambda v: 1.0 / (1.0 + np.exp(-v))

    def combined(name: str, weight: float = 1.0) -> np.ndarray:
        return _combined(r, m, name, weight)

    np.testing.assert_allclose(combined("sigmoid"), sig(r) * sig(m), rtol=1e-6)
    np.testing.assert_allclose(combined("noop"), r)
    h3 = lambda v: np.exp(-(np.maximum(0, 1 - v) ** 3))
    np.testing.assert_allclose(combined("l3-hinge"), h3(r) * h3(m), rtol=1e-6)
    np.testing.assert_allclose(combined("l3-hinge", 0.0), h3(r), rtol=1e-6)  # matcher_weight 0: the ranker alone
    with pytest.raises(RankerError, match="post_processor"):
        get_post_processor("l5-hinge")


def _combined(r: np.ndarray, m: np.ndarray, name: str, matcher_weight: float = 1.0) -> np.ndarray:
    """The ranker's and the matcher's raw scores as a post-processor combines them."""
    pp = get_post_processor(name)
    return pp.combine(r, pp.weight_parent(pp.transform(m), matcher_weight))


def test_matcher_weight_on_known_numbers():
    r, m = np.array([0.3, -2.0], np.float32), np.array([1.5, 0.2], np.float32)
    h1 = lambda v: np.exp(-np.maximum(0, 1 - v))
    combine_scores = _combined
    np.testing.assert_allclose(combine_scores(r, m, "l1-hinge", matcher_weight=0.5), h1(r) * h1(m) ** 0.5, rtol=1e-6)
    np.testing.assert_allclose(combine_scores(r, m, "l1-hinge", matcher_weight=0.0), h1(r), rtol=1e-6)
    # log- post-processors: w * log-transform of the matcher
    np.testing.assert_allclose(
        combine_scores(r, m, "log-l1-hinge", matcher_weight=0.5),
        np.log(h1(r)) + 0.5 * np.log(h1(m)),
        rtol=1e-5,
        atol=1e-6,
    )
    np.testing.assert_allclose(combine_scores(r, m, "noop", matcher_weight=0.5), r)


# ---------------------------------------------------------------------------------------------- prediction
def brute_force(X, W, C, shortlist, post, k, matcher_weight=1.0):
    """Dense reference: every shortlisted cluster's labels scored with the full W."""
    pp = get_post_processor(post)
    raw = with_bias(X, 1.0).toarray() @ W.toarray()
    parent = pp.transform(shortlist.toarray()) if pp.rule != "child" else shortlist.toarray()
    if pp.rule == "mul":
        parent = parent**matcher_weight
    elif pp.rule == "add":
        parent = parent * matcher_weight
    cluster = C.tocsr().indices
    allowed = (shortlist.toarray() != 0)[:, cluster]
    final = np.where(allowed, pp.combine(raw, parent[:, cluster]), -np.inf)
    out = np.full_like(final, -np.inf)
    order = np.argsort(-final, axis=1, kind="stable")[:, :k]
    rows = np.arange(len(final))[:, None]
    out[rows, order] = final[rows, order]
    return out


@pytest.mark.parametrize(
    "post,matcher_weight",
    [
        ("l3-hinge", 1.0),
        ("sigmoid", 1.0),
        ("noop", 1.0),
        ("log-l2-hinge", 1.0),
        ("l3-hinge", 0.5),
        ("log-l2-hinge", 0.0),
    ],
)
def test_predict_equals_dense_reference(post, matcher_weight):
    X, Y, C = random_problem(L=20, K=5, seed=2)
    cfg = RankerConfig(threshold=0.0, topk=4, matcher_weight=matcher_weight)
    ranker = LinearRanker.train(X, Y, C, tfn_mask(Y, C), cfg)
    rng = np.random.default_rng(0)
    top2 = np.argsort(rng.random((X.shape[0], 5)), axis=1)[:, :2]
    shortlist = sp.csr_matrix(
        (rng.standard_normal(2 * X.shape[0]).astype(np.float32), top2.ravel(), np.arange(0, 2 * X.shape[0] + 1, 2)),
        shape=(X.shape[0], 5),
    )
    got = ranker.predict(X, shortlist, topk=4, post_processor=post)
    want = brute_force(X, ranker.W, C, shortlist, post, 4, matcher_weight)
    assert np.all(np.diff(got.indptr) == 4)
    dense = got.toarray()
    stored = np.zeros_like(dense, dtype=bool)
    stored[np.repeat(np.arange(got.shape[0]), 4), got.indices] = True
    np.testing.assert_array_equal(stored, np.isfinite(want))
    np.testing.assert_allclose(dense[stored], want[stored], rtol=1e-4, atol=1e-5)


def test_predict_in_chunks_and_threads_is_the_same(monkeypatch):
    X, Y, C = random_problem(L=20, K=5, seed=4)
    ranker = LinearRanker.train(X, Y, C, tfn_mask(Y, C), RankerConfig(topk=6, threads=1))
    shortlist = sp.random(X.shape[0], 5, density=0.6, format="csr", dtype=np.float32, random_state=2)
    want = ranker.predict(X, shortlist)
    monkeypatch.setattr(scoring, "SCORE_CHUNK_COST", 50)  # a few documents per chunk
    ranker.config.threads = 2
    got = ranker.predict(X, shortlist)
    assert abs(got - want).max() < 1e-6 and (got != 0).nnz == (want != 0).nnz


def test_predict_dense_and_sparse_layouts_agree(monkeypatch):
    """Wide beams of a small level go through the dense copy of W; the compiled loop gives the same."""
    X, Y, C = random_problem(L=20, K=5, seed=4)
    ranker = LinearRanker.train(X, Y, C, tfn_mask(Y, C), RankerConfig(topk=6))
    shortlist = sp.random(X.shape[0], 5, density=0.8, format="csr", dtype=np.float32, random_state=3)
    assert ranker.level._get_scorer().W_dense is not None
    dense = ranker.predict(X, shortlist)
    monkeypatch.setattr(scoring, "DENSE_BYTES", 0)
    monkeypatch.setattr(scoring, "DENSE_LAYOUT_SHARE", 0.0)
    ranker.level._scorer = None
    assert ranker.level._get_scorer().W_dense is None
    loop = ranker.predict(X, shortlist)
    assert abs(dense - loop).max() < 1e-5 and (dense != 0).nnz == (loop != 0).nnz


@pytest.mark.parametrize("trial", range(6))
def test_layout_with_labels_appended_is_the_layout_of_the_combined_weights(trial):
    """Labels appended to a scoring layout (``PairScorer.appended``) give the layout, dense copy
    and weights that the combined ``W`` would build, array for array."""
    from xtransformer.ranker.scoring import PairScorer

    rng = np.random.default_rng(trial)
    F1, K, n_old, n_new = int(rng.integers(5, 60)), int(rng.integers(1, 9)), int(rng.integers(1, 40)), 7
    density = float(rng.uniform(0.05, 0.9))
    W_old = sp.random(F1, n_old, density=density, format="csr", random_state=trial, dtype=np.float32)
    W_new = sp.random(F1, n_new, density=density, format="csr", random_state=trial + 100, dtype=np.float32)

    def clusters(n: int) -> sp.csr_matrix:
        return sp.csr_matrix((np.ones(n, np.float32), (np.arange(n), rng.integers(0, K, n))), shape=(n, K))

    C_old, C_new = clusters(n_old), clusters(n_new)
    got = PairScorer(W_old, C_old, 1.0).appended(W_new, C_new, threads=1 + trial % 3)  # feature ranges in threads
    want = PairScorer(sp.hstack([W_old, W_new], format="csr"), sp.vstack([C_old, C_new], format="csr"), 1.0)
    for name in ("feat_ptr", "rows", "entries", "slot_label"):
        assert np.array_equal(getattr(got, name), getattr(want, name)), name
    assert (got.n_max, got.n_labels, got.hard) == (want.n_max, want.n_labels, want.hard)
    assert (got.W_dense is None) == (want.W_dense is None)
    assert got.W_dense is None or np.array_equal(got.W_dense, want.W_dense)
    assert (got.weights() != want.weights()).nnz == 0


def test_predict_narrow_beam_of_many_clusters():
    """One cluster per document out of 20: common features hold more weight rows than 8x the beam,
    which the scoring loop finds by bisection instead of a scan."""
    X, Y, C = random_problem(L=40, K=20, seed=6)
    ranker = LinearRanker.train(X, Y, C, tfn_mask(Y, C), RankerConfig(threshold=0.0, topk=2))
    rng = np.random.default_rng(1)
    one = rng.integers(0, 20, X.shape[0])
    shortlist = sp.csr_matrix((np.ones(X.shape[0], np.float32), one, np.arange(X.shape[0] + 1)), shape=(X.shape[0], 20))
    got = ranker.predict(X, shortlist, topk=2)
    want = brute_force(X, ranker.W, C, shortlist, "l3-hinge", 2, 1.0)
    dense = got.toarray()
    stored = dense != 0
    np.testing.assert_array_equal(stored, np.isfinite(want) & (want != 0))
    np.testing.assert_allclose(dense[stored], want[stored], rtol=1e-4, atol=1e-5)


def test_labels_in_several_clusters():
    """A label in two clusters trains one copy per cluster on that cluster's rows (label
    disentanglement's pseudo-labels) and is returned once, with the best of its copies' scores."""
    X, Y, C = random_problem(L=12, K=4, seed=5)
    C = C.tolil()
    C[0, 1] = 1.0  # label 0 sits in clusters 0 and 1
    C[5, 3] = 1.0  # label 5 in clusters 1 and 3
    C = C.tocsr()
    mask = tfn_mask(Y, C)
    cfg = RankerConfig(features="tfidf", negatives="tfn", threshold=0.0, **TIGHT)
    ranker = LinearRanker.train(X, Y, C, mask, cfg)
    label_of = ranker.copies.label_of
    assert ranker.W.shape[1] == 14 and ranker.n_labels == 12
    Mc = mask.toarray() > 0
    y = np.where(Y[:, 0].toarray().ravel() > 0, 1, -1)
    for copy, k in zip(np.flatnonzero(label_of == 0), C[0].indices):  # each copy: its own cluster's rows
        rows = np.flatnonzero(Mc[:, k])
        np.testing.assert_allclose(ranker.W.toarray()[:, copy], sklearn_weights(X[rows], y[rows]), atol=2e-3)
    pred = ranker.predict(X, sp.csr_matrix(np.ones((X.shape[0], 4), np.float32)), topk=12, post_processor="noop")
    raw = with_bias(X, 1.0).toarray() @ ranker.W.toarray()
    best = np.full((X.shape[0], 12), -np.inf)
    for copy, label in enumerate(label_of):
        best[:, label] = np.maximum(best[:, label], raw[:, copy])
    assert np.all(np.diff(pred.indptr) == 12)  # every label once, although two sit in two clusters
    rr = np.repeat(np.arange(X.shape[0]), 12)
    np.testing.assert_allclose(pred.data, best[rr, pred.indices], rtol=1e-4, atol=1e-5)


def test_predict_validates_inputs():
    X, Y, C = random_problem()
    ranker = LinearRanker.train(X, Y, C, tfn_mask(Y, C), RankerConfig())
    with pytest.raises(RankerError, match="shortlist"):
        ranker.predict(X, sp.csr_matrix((X.shape[0], 3)))
    with pytest.raises(RankerError, match="features"):
        ranker.predict(X[:, :10], sp.csr_matrix((X.shape[0], 4)))


def test_linear_ranker_save_load_round_trip(tmp_path):
    X, Y, C = random_problem()
    mask = negative_mask("tfn+man", Y, C, sp.random(X.shape[0], 4, density=0.3, format="csr", random_state=0))
    ranker = LinearRanker.train(X, Y, C, mask, RankerConfig(topk=3))
    shortlist = sp.csr_matrix(np.ones((X.shape[0], 4), np.float32))
    ranker.save(tmp_path / "r")
    loaded = LinearRanker.load(tmp_path / "r")
    assert loaded.config == ranker.config
    assert (loaded.predict(X, shortlist) != ranker.predict(X, shortlist)).nnz == 0
    with pytest.raises(RankerError, match="not a complete"):
        LinearRanker.load(tmp_path / "missing")


# ---------------------------------------------------------------------------------------------- features, config, top-k
def test_concat_features_normalises_blocks():
    X = sp.csr_matrix(np.array([[3.0, 4.0, 0.0], [0.0, 0.0, 2.0]], np.float32))
    emb = np.array([[0.0, 10.0], [1.0, 1.0]], np.float32)
    out = concat_features(X, emb, weight=1.0).toarray()
    assert out.shape == (2, 5)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, rtol=1e-6)
    s = 1 / np.sqrt(2)
    np.testing.assert_allclose(out[0], [0.6 * s, 0.8 * s, 0.0, 0.0, s], rtol=1e-6)
    heavy = concat_features(X, emb, weight=3.0).toarray()
    assert np.linalg.norm(heavy[0, 3:]) > np.linalg.norm(out[0, 3:])
    np.testing.assert_allclose(concat_features(X).toarray()[0], [0.6, 0.8, 0.0], rtol=1e-6)
    with pytest.raises(RankerError, match="emb"):
        concat_features(X, emb[:1])


@pytest.mark.parametrize("zeros", [False, True])
def test_dense_block_is_laid_out_as_scipy_stacks_it(zeros):
    from xtransformer.ranker.features import with_dense_block

    rng = np.random.default_rng(0)
    A = sp.random(50, 30, density=0.2, format="csr", dtype=np.float32, random_state=1)
    A.data[A.indptr[3] : A.indptr[4]] = 0  # an empty row (a row assigned 0 would store 30 zeros)
    A.eliminate_zeros()
    A.indices[: A.indptr[2]] = A.indices[: A.indptr[2]][::-1]  # and unsorted ones: kept as they are
    A.has_sorted_indices = False
    D = rng.standard_normal((50, 7)).astype(np.float32)
    if zeros:
        D[::4, 2] = 0  # dropped, as sp.csr_matrix drops them
    got, want = with_dense_block(A, D), sp.hstack([A, sp.csr_matrix(D)], format="csr", dtype=np.float32)
    for name in ("indptr", "indices", "data"):
        assert np.array_equal(getattr(got, name), getattr(want, name)), name
    assert got.indices.dtype == want.indices.dtype and got.shape == want.shape


def test_train_ranker_builds_features_and_negatives():
    X, Y, C = random_problem()
    emb = np.random.default_rng(0).standard_normal((X.shape[0], 8)).astype(np.float32)
    top = sp.random(X.shape[0], 4, density=0.5, format="csr", dtype=np.float32, random_state=0)
    ranker = train_ranker(X, Y, C, RankerConfig(), emb=emb, matcher_pred=top)
    assert ranker.level.n_features == X.shape[1] + 8
    pred = ranker.predict(ranker_features(X, emb, ranker.config), top, topk=3)
    assert pred.shape == Y.shape and np.diff(pred.indptr).max() <= 3
    with pytest.raises(RankerError, match="emb"):
        train_ranker(X, Y, C, RankerConfig(), matcher_pred=top)
    with pytest.raises(RankerError, match="matcher_pred"):
        train_ranker(X, Y, C, RankerConfig(features="tfidf"))


def test_config_rejects_bad_values():
    with pytest.raises(RankerError, match="negatives"):
        RankerConfig(negatives="hard")
    with pytest.raises(RankerError, match="post_processor"):
        RankerConfig(post_processor="l9-hinge")
    with pytest.raises(RankerError, match="Cp"):
        RankerConfig(Cp=0)
    with pytest.raises(RankerError, match="beam_size"):
        RankerConfig(beam_size=0)
    with pytest.raises(RankerError, match="matcher_weight"):
        RankerConfig(matcher_weight=-1)
    with pytest.raises(RankerError, match="matcher_weight"):
        HierarchicalLinearConfig(matcher_weight=-0.5)


CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_ranker_options_and_the_xrlinear_model_build_their_records():
    from xtransformer.configuration import compose

    names = sorted(p.stem for p in (CONFIGS / "ranker").glob("*.yaml"))
    assert {"tfidf_tfn", "tfidf_neural_tfn", "tfidf_neural_tfn_man"} <= set(names)
    for name in names:
        cfg = RankerConfig.from_mapping(compose([f"ranker={name}"]).ranker)
        assert cfg.name == name
    # the pipeline's XR-Linear model settings: every field of its dataclass, and nothing else
    xr_model = compose(["method=xrlinear"]).xrlinear.model
    assert set(xr_model) == {f.name for f in dataclasses.fields(HierarchicalLinearConfig)}
    own = {"added_reach", "added_negatives", "added_max_iter"}  # the tree model's own settings
    assert set(xr_model) - {f.name for f in dataclasses.fields(RankerConfig)} == own
    assert HierarchicalLinearConfig.from_mapping(xr_model, "xrlinear.model").features == "tfidf"


def test_topk_csr_keeps_best_per_row():
    M = sp.csr_matrix(np.array([[0.1, 0.9, 0.5, 0.0], [0.0, 0.2, 0.0, 0.3]], np.float32))
    out = topk_csr(M, 2).toarray()
    np.testing.assert_array_equal(out, np.array([[0.0, 0.9, 0.5, 0.0], [0.0, 0.2, 0.0, 0.3]], np.float32))


@pytest.mark.parametrize("k", [1, 3, 7, 40])
def test_best_labels_equal_a_full_sort(k):
    """The beam's per-document selection (compiled, one pass) against sorting every candidate:
    best first, ties to the smaller label, padding (-1) never kept, short documents kept whole."""
    from xtransformer.ranker.level import best_labels

    rng = np.random.default_rng(k)
    doc = np.sort(rng.integers(0, 9, size=40))  # grouped; some documents absent, some with one row
    score = (rng.integers(0, 4, size=(40, 6)) / 4).astype(np.float32)  # few values: many ties
    label = rng.permutation(40 * 6).reshape(40, 6).astype(np.int64)
    label[rng.random((40, 6)) < 0.3] = -1
    got = best_labels(doc, score, label, 9, k)
    want_doc, want_label, want_score = [], [], []
    for d in np.unique(doc):
        cells = sorted((-s, lab) for s, lab in zip(score[doc == d].ravel(), label[doc == d].ravel()) if lab >= 0)
        for s, lab in cells[:k]:
            want_doc.append(d), want_label.append(lab), want_score.append(-s)
    np.testing.assert_array_equal(got.doc, want_doc)
    np.testing.assert_array_equal(got.item, want_label)
    np.testing.assert_array_equal(got.score, np.asarray(want_score, np.float32))
    with pytest.raises(RankerError, match="keep must be >= 1"):
        best_labels(doc, score, label, 9, 0)


@pytest.mark.parametrize("loss", ["squared_hinge", "logistic"])
def test_solver_hands_back_the_kept_weights_only(loss):
    """With a threshold, the solver returns exactly the weights of the full solution at or above
    it, never a padding slot's, each slot's as one run with increasing columns."""
    X, Y, C = random_problem(n=300, L=13, K=4, seed=5)  # clusters of unequal size: padded slots
    groups = make_groups(C, tfn_mask(Y, C))
    bd = build_block(X, Y, groups, np.arange(groups.n_groups), bias=1.0)
    params = SolverParams(loss=loss, **TIGHT)

    def solve(threshold):
        block = Block.from_rows(X, bd, 1.0, 1.0, 1.0, materialise=loss != "squared_hinge")
        return solve_block(block, params, threshold)

    full = solve(0.0)
    task = bd.col_task
    assert np.all(bd.slot_label[task[full.col], full.slot] >= 0)  # no padding slot
    assert len(full.col) == sum(bd.col_len[t] * (bd.slot_label[t] >= 0).sum() for t in range(len(bd.col_len)))
    kept = solve(0.05)
    dense = dense_weights(full, len(bd.col_feature), bd.Y.shape[1])
    slot, col = np.nonzero(np.abs(dense.T) >= 0.05)
    assert sorted(zip(kept.slot, kept.col)) == sorted(zip(slot, col))
    np.testing.assert_allclose(kept.val, dense[kept.col, kept.slot], atol=1e-6)
    for t, j in {(task[c], s) for c, s in zip(kept.col, kept.slot)}:  # one run per (task, slot), increasing
        at = np.flatnonzero((task[kept.col] == t) & (kept.slot == j))
        assert np.all(np.diff(at) == 1) and np.all(np.diff(kept.col[at]) > 0)


@pytest.mark.parametrize("eps,L,K", [(0.1, 13, 4), (0.01, 13, 4), (0.1, 200, 3)])
def test_lockstep_slots_do_not_depend_on_their_neighbours(eps, L, K):
    """The slots of a block run in lockstep and step out as they finish (padding at once, the
    others at different passes): each slot's weights are the same, bit for bit, whatever the
    order of the slots beside it. Over 64 slots a task, the row loops
    take them in blocks of 64, then 48, 32, 16, 8, 4, 2, 1 lanes as they finish (200 labels in
    3 clusters: 67 slots)."""
    X, Y, C = random_problem(n=300, L=L, K=K, seed=5)  # clusters of unequal size: padded slots
    groups = make_groups(C, tfn_mask(Y, C))
    bd = build_block(X, Y, groups, np.arange(groups.n_groups), bias=1.0)
    n = bd.Y.shape[1]

    def solve(perm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        Yp = np.ascontiguousarray(bd.Y[:, perm])
        passes = np.zeros((len(bd.row_len), n), np.int64)
        kept = kernels.dual_cd_squared_hinge(
            X.indptr, X.indices, X.data, X.shape[1], bd.rows, bd.row_len, bd.col_feature, bd.col_len,
            np.float32(1.0), Yp, 1.0, 1.0, np.zeros(0), eps, 100, 0, 0.0, passes,
        )  # fmt: skip
        return dense_weights(SolvedWeights(*kept), len(bd.col_feature), n), passes

    base, passes = solve(np.arange(n))
    assert (bd.slot_label < 0).any() and len(set(passes[bd.slot_label >= 0])) > 2  # slots finish apart
    for seed in range(3):
        perm = np.random.default_rng(seed).permutation(n)
        W, p = solve(perm)
        np.testing.assert_array_equal(W, base[:, perm])
        np.testing.assert_array_equal(p, passes[:, perm])


def test_block_order_changes_no_weight(monkeypatch):
    """Blocks go to the worker threads largest first; solved in the opposite order, every weight
    is the same."""
    X, Y, C = random_problem(n=300, L=16, K=8, seed=3)
    mask = tfn_mask(Y, C)
    cfg = RankerConfig(features="tfidf", negatives="tfn", threshold=0.0, batch_nnz=1, threads=2)
    first = LinearRanker.train(X, Y, C, mask, cfg).W
    monkeypatch.setattr(fit, "batch_costs", lambda *a: -blocks.batch_costs(*a))
    again = LinearRanker.train(X, Y, C, mask, cfg).W
    assert (first != again).nnz == 0 and first.nnz > 0


@pytest.mark.parametrize("bias", [1.0, 0.0])
def test_task_read_in_place_equals_the_task_copied(bias):
    """A task on at least half of all features is read in place (global feature ids, no copy of
    its rows); the same rows with many unused features appended are copied to their own columns.
    Both give the same weights, bias included."""
    X, Y, C = random_problem(n=200, f=40, L=8, K=1, seed=7)
    groups = make_groups(C, tfn_mask(Y, C))
    wide = sp.hstack([X, sp.csr_matrix((X.shape[0], 3 * X.shape[1]), dtype=np.float32)], format="csr")
    out = []
    for source in (X, wide):
        bd = build_block(source, Y, groups, np.arange(groups.n_groups), bias=bias)
        block = Block.from_rows(source, bd, bias, 1.0, 1.0)
        kept = solve_block(block, SolverParams(**TIGHT))
        W = np.zeros((source.shape[1] + 1, bd.Y.shape[1]), np.float32)
        W[bd.col_feature[kept.col], kept.slot] = kept.val
        out.append((W[np.r_[np.arange(X.shape[1]), source.shape[1]]], 2 * len(bd.col_feature) >= source.shape[1] + 1))
    (W_in_place, in_place), (W_copied, copied_in_place) = out
    assert in_place and not copied_in_place  # the two paths of the kernel
    np.testing.assert_allclose(W_in_place, W_copied, atol=1e-6)
    assert np.abs(W_in_place[-1]).max() > 0 if bias > 0 else np.all(W_in_place[-1] == 0)


def test_scoring_layout_from_rows_or_columns_scores_every_pair_exactly():
    """The feature-major layout (built from W's rows, whether W comes as csc after training or as
    csr from a model folder) scores each (document, cluster) pair as the dense product does,
    labels in two clusters included."""
    W = sp.random(31, 10, density=0.4, format="csc", dtype=np.float32, random_state=4)  # 30 features + bias
    C = sp.csr_matrix(
        np.array(
            [
                [1, 0, 0],
                [1, 0, 1],
                [0, 1, 0],
                [0, 1, 0],
                [0, 0, 1],
                [1, 0, 0],
                [0, 1, 1],
                [0, 0, 1],
                [1, 0, 0],
                [0, 1, 0],
            ],
            np.float32,
        )
    )
    X = sp.random(6, 30, density=0.3, format="csr", dtype=np.float32, random_state=5)
    doc = np.repeat(np.arange(6), 3)
    node = np.tile(np.arange(3), 6)
    dense = with_bias(X, 1.0).toarray() @ W.toarray()
    for Wf in (W, W.tocsr()):
        scorer = scoring.PairScorer(Wf, C, 1.0)
        scorer.W_dense = None  # the compiled loop, not the dense shortcut
        got = scorer.pair_scores(X, doc, node)
        labels = scorer.slot_label[node]
        want = np.where(labels >= 0, dense[doc[:, None], np.maximum(labels, 0)], 0.0)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_pair_chunks_cover_the_pairs_cut_between_documents():
    """Scoring chunks tile the pairs in order, never split a document, and a batch big enough to
    be worth threads gets at least one chunk per thread; a small one stays whole."""
    from xtransformer.topk import Candidates

    rng = np.random.default_rng(0)
    doc = np.repeat(np.arange(3000), rng.integers(1, 4, size=3000))
    parents = Candidates(doc, np.zeros(len(doc), np.int64), np.ones(len(doc), np.float32), 3000)
    row_nnz = rng.integers(20, 120, size=3000)
    for threads, n_max in ((1, 90), (2, 90), (3, 90), (2, 1)):
        chunks = scoring.pair_chunks(parents, row_nnz, n_max, threads)
        assert chunks[0].start == 0 and chunks[-1].stop == len(doc)
        assert all(a.stop == b.start for a, b in zip(chunks[:-1], chunks[1:]))
        assert all(doc[c.start - 1] != doc[c.start] for c in chunks[1:])  # cut between documents
        big = len(doc) * (n_max + row_nnz.max()) >= scoring.PARALLEL_MIN_COST
        assert len(chunks) >= (threads if big else 1)
    assert len(scoring.pair_chunks(Candidates(doc[:3], doc[:3] * 0, np.ones(3, np.float32), 3), row_nnz, 90, 2)) == 1


def test_threads_default_to_every_cpu_this_process_may_use(monkeypatch):
    """threads 0 (the default) is the process's CPU affinity, not a fixed count; a count stays."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 2, 5}, raising=False)
    assert RankerConfig().threads == 0 and RankerConfig().n_threads == 3
    assert RankerConfig(threads=1).n_threads == 1
    assert HierarchicalLinearConfig().n_threads == 3


@pytest.mark.parametrize("loss", ["squared_hinge", "logistic"])
def test_a_row_weighed_twice_trains_as_the_row_given_twice(loss):
    """A weighted mask multiplies a row's cost in its cluster: the same optimum as repeating the
    row (each copy at the plain cost), for both solvers; a mask of ones trains as the plain one."""
    X, Y, C = random_problem(n=200, L=8, K=4, seed=7)
    mask = tfn_mask(Y, C)
    twice = np.random.default_rng(0).random(X.shape[0]) < 0.3
    weighted = sp.csr_matrix(mask.multiply(np.where(twice, 2.0, 1.0)[:, None]))
    params = SolverParams(loss=loss, eps=1e-6 if loss == "squared_hinge" else 1e-8, max_iter=5000)

    def weights(X, Y, M):
        return train_level(X, LevelSpec(Y, C, M), params, 1.0, 0.0, 10**6, 1)[0].W.toarray()

    again = np.flatnonzero(twice)
    repeated = weights(sp.vstack([X, X[again]], format="csr"), sp.vstack([Y, Y[again]], format="csr"),
                       sp.vstack([mask, mask[again]], format="csr"))  # fmt: skip
    plain = weights(X, Y, mask)
    np.testing.assert_allclose(weights(X, Y, weighted), repeated, atol=2e-3)
    assert np.abs(plain - repeated).max() > 0.05  # the weights matter
    ones = sp.csr_matrix(mask, dtype=np.float64)
    assert np.array_equal(weights(X, Y, ones), plain)
    with pytest.raises(RankerError, match="weighted mask"):
        make_groups(sp.csr_matrix(np.ones((8, 2), np.float32)), weighted[:, :2])
