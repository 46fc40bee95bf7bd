"""Tests for xtransformer.metrics against plain brute-force references (dense loops)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from xtransformer.matcher import metrics as XM
from xtransformer.matcher.metrics import XMCMetrics
from xtransformer.metrics import (
    MetricsError,
    decision_f1,
    document_hits,
    evaluate,
    format_metrics_table,
    ndcg_at_k,
    per_document,
    per_document_from_hits,
    precision_at_k,
    propensity,
    psp_at_k,
    recall_at_k,
    rprecision_at_k,
    topk_from_scores,
)

MAX_K = 5


# --------------------------------------------------------------------------- fixtures


def _random_problem(seed: int, n: int = 60, n_labels: int = 25):
    """Labels with some empty documents; scores with ties, short rows and empty rows."""
    rng = np.random.default_rng(seed)
    Y = sp.random(n, n_labels, density=0.12, format="csr", random_state=rng, dtype=np.float32)
    Y.data[:] = 1.0
    Y = sp.csr_matrix(Y.toarray() * (rng.random((n, 1)) > 0.15))  # force some empty documents
    nnz_per_row = rng.integers(0, 9, size=n)  # 0..8 stored scores: many rows have < k
    rows, cols, vals = [], [], []
    for i, m in enumerate(nnz_per_row):
        c = rng.choice(n_labels, size=m, replace=False)
        rows += [i] * m
        cols += list(c)
        vals += list(rng.integers(1, 4, size=m) / 4.0)  # 3 distinct values: many ties
    S = sp.csr_matrix((vals, (rows, cols)), shape=(n, n_labels))
    return Y, S


def _brute_topk(S: sp.csr_matrix, k: int):
    D = S.toarray()
    stored = S.toarray() != 0  # test data stores no explicit zeros
    idx = -np.ones((S.shape[0], k), dtype=np.int64)
    val = np.full((S.shape[0], k), -np.inf)
    for i in range(S.shape[0]):
        ranked = sorted((j for j in range(S.shape[1]) if stored[i, j]), key=lambda j: (-D[i, j], j))
        for r, j in enumerate(ranked[:k]):
            idx[i, r], val[i, r] = j, D[i, j]
    return idx, val


def _brute_metrics(Y: sp.csr_matrix, idx: np.ndarray, w: np.ndarray | None = None):
    T = Y.toarray() != 0
    n, k = idx.shape
    P, R, N, G, B, RAW = (np.zeros(k) for _ in range(6))
    for i in range(n):
        true = set(np.flatnonzero(T[i]))
        for kk in range(1, k + 1):
            pred = [j for j in idx[i, :kk] if j >= 0]
            hit = [j for j in pred if j in true]
            P[kk - 1] += len(hit) / kk
            R[kk - 1] += len(hit) / len(true) if true else 0.0
            dcg = sum(1 / math.log2(r + 2) for r, j in enumerate(idx[i, :kk]) if j in true)
            idcg = sum(1 / math.log2(r + 2) for r in range(min(kk, len(true))))
            N[kk - 1] += dcg / idcg if true else 0.0
            if w is not None:
                G[kk - 1] += sum(w[j] for j in hit)
                B[kk - 1] += sum(sorted((w[j] for j in true), reverse=True)[:kk])
                RAW[kk - 1] += sum(w[j] for j in hit) / kk
    out = {"P": P / n, "R": R / n, "nDCG": N / n}
    if w is not None:
        out["PSP"] = G / B
        out["PSP_raw"] = RAW / n
    return out


def _one_hot_labels(rows: list[list[int]], n_labels: int) -> sp.csr_matrix:
    r = [i for i, ls in enumerate(rows) for _ in ls]
    c = [j for ls in rows for j in ls]
    return sp.csr_matrix((np.ones(len(c), np.float32), (r, c)), shape=(len(rows), n_labels))


# --------------------------------------------------------------------------- top-k


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("k", [1, 3, 5, 12])
def test_topk_matches_brute_force(seed, k):
    _, S = _random_problem(seed)
    idx, val = topk_from_scores(S, k)
    ref_idx, ref_val = _brute_topk(S, k)
    assert idx.dtype == np.int64 and val.dtype == np.float32 and idx.shape == (S.shape[0], k)
    np.testing.assert_array_equal(idx, ref_idx)
    np.testing.assert_array_equal(val, ref_val.astype(np.float32))


def test_topk_skewed_rows_stay_correct():
    # One very full row among near-empty ones (a padded N x max_row layout would be wasteful).
    rng = np.random.default_rng(4)
    n, n_labels = 300, 2000
    rows = np.r_[np.zeros(1500, int), rng.integers(1, n, 200)]
    cols = np.r_[rng.choice(n_labels, 1500, replace=False), rng.integers(0, n_labels, 200)]
    S = sp.csr_matrix((rng.integers(1, 5, rows.size) / 5.0, (rows, cols)), shape=(n, n_labels))
    S.sum_duplicates()
    idx, val = topk_from_scores(S, 7)
    ref_idx, ref_val = _brute_topk(S, 7)
    np.testing.assert_array_equal(idx, ref_idx)
    np.testing.assert_array_equal(val, ref_val.astype(np.float32))


def test_topk_unsorted_duplicate_and_explicit_entries():
    # Unsorted column order and duplicates (summed, scipy semantics); stored zero and -inf count.
    S = sp.csr_matrix(
        (np.array([0.5, 0.0, 0.5, 0.2, -np.inf]), np.array([3, 0, 1, 3, 2]), np.array([0, 5])),
        shape=(1, 5),
    )
    idx, val = topk_from_scores(S, 6)
    np.testing.assert_array_equal(idx, [[3, 1, 0, 2, -1, -1]])
    np.testing.assert_allclose(val, [[0.7, 0.5, 0.0, -np.inf, -np.inf, -np.inf]], rtol=1e-6)


def test_topk_empty_and_bad_input():
    idx, val = topk_from_scores(sp.csr_matrix((3, 10)), 2)
    assert (idx == -1).all() and np.isneginf(val).all()
    with pytest.raises(MetricsError, match="k must be"):
        topk_from_scores(sp.csr_matrix((3, 10)), 0)
    with pytest.raises(MetricsError, match="scores must be a scipy sparse"):
        topk_from_scores(np.ones((3, 10)), 2)
    with pytest.raises(MetricsError, match="NaN"):
        topk_from_scores(sp.csr_matrix(np.array([[np.nan, 1.0]])), 1)


# --------------------------------------------------------------------------- metrics


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_metrics_match_brute_force(seed):
    Y, S = _random_problem(seed)
    assert (np.diff(Y.indptr) == 0).any()  # documents with no label are exercised
    assert (np.diff(S.indptr) < MAX_K).any()  # rows with fewer than k predictions too
    idx, _ = topk_from_scores(S, MAX_K)
    w = propensity(Y)
    ref = _brute_metrics(Y, idx, w)
    np.testing.assert_allclose(precision_at_k(Y, idx), ref["P"], rtol=1e-12)
    np.testing.assert_allclose(recall_at_k(Y, idx), ref["R"], rtol=1e-12)
    np.testing.assert_allclose(ndcg_at_k(Y, idx), ref["nDCG"], rtol=1e-12)
    np.testing.assert_allclose(psp_at_k(Y, idx, w), ref["PSP"], rtol=1e-12)
    np.testing.assert_allclose(psp_at_k(Y, idx, w, normalize=False), ref["PSP_raw"], rtol=1e-12)

    got = evaluate(Y, S, inv_propensity=w)
    for prefix, curve in ref.items():
        for k in range(1, MAX_K + 1):
            assert got[f"{prefix}@{k}"] == pytest.approx(100 * curve[k - 1], rel=1e-12)
    assert got["n_docs"] == Y.shape[0]
    assert got["n_docs_no_label"] == int((np.diff(Y.indptr) == 0).sum())


def test_max_k_truncates_and_pads():
    Y, S = _random_problem(5)
    idx, _ = topk_from_scores(S, 3)
    wide = precision_at_k(Y, idx, max_k=6)
    ref = _brute_metrics(Y, np.hstack([idx, -np.ones((idx.shape[0], 3), np.int64)]))
    np.testing.assert_allclose(wide, ref["P"])  # missing predictions are misses, denominator k
    np.testing.assert_allclose(recall_at_k(Y, idx, max_k=2), ref["R"][:2])


def test_binary_labels_ignore_values_zeros_and_duplicates():
    # Stored zero is not a label; duplicate entries and non-unit values count once.
    Y = sp.csr_matrix((np.array([3.0, 0.0, 1.0, 1.0]), np.array([1, 2, 1, 0]), np.array([0, 4])), shape=(1, 4))
    idx = np.array([[2, 1, 0]])
    np.testing.assert_allclose(precision_at_k(Y, idx), [0, 0.5, 2 / 3])
    np.testing.assert_allclose(recall_at_k(Y, idx), [0, 0.5, 1.0])


def test_evaluate_hand_made_example():
    # doc0 true {0,2}, ranked 0,1,2; doc1 true {1}, ranked 1; doc2 no label, tie 3/4 -> 3 then 4.
    Y = _one_hot_labels([[0, 2], [1], []], 5)
    S = sp.csr_matrix(([0.9, 0.8, 0.5, 0.3, 0.7, 0.7], ([0, 0, 0, 1, 2, 2], [0, 1, 2, 1, 4, 3])), shape=(3, 5))
    w = np.arange(1.0, 6.0)
    m = evaluate(Y, S, inv_propensity=w)
    expected = {
        "P@1": 200 / 3,
        "P@2": 100 / 3,
        "P@3": 100 / 3,
        "P@5": 20.0,
        "R@1": 50.0,
        "R@3": 200 / 3,
        # RP@k divides by min(k, |T|): doc0 1/1, 1/2, 2/2; doc1 1/1 at every k; doc2 0.
        "RP@1": 200 / 3,
        "RP@2": 50.0,
        "RP@3": 200 / 3,
        "RP@5": 200 / 3,
        "nDCG@1": 200 / 3,
        "nDCG@2": 100 * (1 / (1 + 1 / math.log2(3)) + 1) / 3,
        "nDCG@3": 100 * (1.5 / (1 + 1 / math.log2(3)) + 1) / 3,
        # PSP: gains (w0=1 | w1=2), best (w2=3 | w1=2) at k=1; (1+3 | 2) vs (3+1 | 2) at k=3.
        "PSP@1": 60.0,
        "PSP@2": 50.0,
        "PSP@3": 100.0,
        "PSP_raw@1": 100.0,
        "PSP_raw@3": 100 * (4 / 3 + 2 / 3) / 3,
        "n_docs": 3,
        "n_docs_no_label": 1,
    }
    for key, value in expected.items():
        assert m[key] == pytest.approx(value), key
    assert set(m) == {f"{p}@{k}" for p in ("P", "R", "RP", "nDCG", "PSP", "PSP_raw") for k in range(1, 6)} | {
        "n_docs",
        "n_docs_no_label",
    }
    # The same ranking given as an (idx, vals) pair gives the same numbers; ks selects keys.
    pair = evaluate(Y, topk_from_scores(S, 3), ks=(1, 3))
    assert set(pair) == {"P@1", "P@3", "R@1", "R@3", "RP@1", "RP@3", "nDCG@1", "nDCG@3", "n_docs", "n_docs_no_label"}
    assert pair["P@3"] == pytest.approx(m["P@3"]) and pair["nDCG@3"] == pytest.approx(m["nDCG@3"])


def test_evaluate_shape_errors():
    Y, S = _random_problem(0, n=10, n_labels=8)
    with pytest.raises(MetricsError, match="scores has 9 rows but Y_true has 10"):
        evaluate(Y, S[:9])
    with pytest.raises(MetricsError, match="scores has 7 label columns but Y_true has 8"):
        evaluate(Y, S[:, :7])
    idx, val = topk_from_scores(S, 3)
    with pytest.raises(MetricsError, match=r"scores\[0\].*9 rows"):
        evaluate(Y, (idx[:9], val[:9]))
    with pytest.raises(MetricsError, match=r"scores\[0\].*outside"):
        evaluate(Y, (idx + 8, val))
    with pytest.raises(MetricsError, match=r"scores\[1\].*decreasing"):
        evaluate(Y, (idx, val[:, ::-1].copy()))
    with pytest.raises(MetricsError, match="inv_propensity must have shape"):
        evaluate(Y, S, inv_propensity=np.ones(7))
    with pytest.raises(MetricsError, match="Y_true must be a scipy sparse"):
        evaluate(Y.toarray(), S)
    with pytest.raises(MetricsError, match="topk_idx repeats"):
        precision_at_k(Y, np.zeros((10, 2), dtype=np.int64))
    with pytest.raises(MetricsError, match="topk_idx must hold integer"):
        precision_at_k(Y, np.zeros((10, 2)))


# --------------------------------------------------------------------------- propensity


def test_propensity_known_numbers():
    # N=100 docs, label counts 0, 1, 10, 100: C = (ln 100 - 1) * 2.5^0.55.
    Y = _one_hot_labels([[0, 1, 2, 3]] + [[0, 2, 3]] * 9 + [[0, 3]] * 90, 5)
    Y = sp.csr_matrix(Y[:, [4, 1, 2, 3]])  # reorder columns so counts are 0, 1, 10, 100
    C = (math.log(100) - 1) * 2.5**0.55
    expected = [1 + C * (n + 1.5) ** -0.55 for n in (0, 1, 10, 100)]
    np.testing.assert_allclose(propensity(Y), expected, rtol=1e-12)
    np.testing.assert_allclose(propensity(Y)[[0, 3]], [5.7746615, 1.4701500], rtol=1e-6)
    w = propensity(Y, A=0.5, B=0.4)
    assert np.all(np.isfinite(w)) and w[0] > w[1] > w[2] > w[3]
    with pytest.raises(MetricsError, match="B must be"):
        propensity(Y, B=0.0)


# --------------------------------------------------------------------------- torchmetrics


def test_torchmetrics_wrapper_equals_evaluate_across_batches():
    rng = np.random.default_rng(7)
    n, n_labels = 90, 30
    Y, _ = _random_problem(7, n=n, n_labels=n_labels)
    dense = rng.integers(1, 5, size=(n, n_labels)).astype(np.float32)  # no zeros, many ties
    w = propensity(Y)
    metric = XMCMetrics(max_k=MAX_K, inv_propensity=w)
    # Batch 1: dense tensor scores + csr target; batch 2: dense scores + dense bool target;
    # batch 3: sparse (idx, vals) top-k + csr target; batch 4: scipy sparse scores.
    metric.update(torch.from_numpy(dense[:30]), Y[:30])
    metric.update(torch.from_numpy(dense[30:50]), torch.from_numpy(Y[30:50].toarray() > 0))
    idx, val = topk_from_scores(sp.csr_matrix(dense[50:75]), MAX_K)
    metric.update((torch.from_numpy(idx), torch.from_numpy(val)), Y[50:75])
    metric.update(sp.csr_matrix(dense[75:]), Y[75:])
    got = metric.compute()
    ref = evaluate(Y, sp.csr_matrix(dense), max_k=MAX_K, inv_propensity=w)
    assert set(got) == set(ref)
    for key in ref:
        assert got[key] == pytest.approx(ref[key], rel=1e-12, abs=1e-12), key
    # State is O(max_k): nothing grows with the number of documents seen.
    assert all(v.numel() <= MAX_K for v in metric.metric_state.values())
    metric.reset()
    metric.update(torch.from_numpy(dense[:30]), Y[:30])
    part = evaluate(Y[:30], sp.csr_matrix(dense[:30]), inv_propensity=w)
    assert metric.compute()["P@3"] == pytest.approx(part["P@3"])


def test_torch_dense_topk_ties_lowest_index():
    scores = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    np.testing.assert_array_equal(XM._torch_dense_topk(scores, 4), [[1, 2, 4, 3], [0, 1, 2, 3]])
    np.testing.assert_array_equal(XM._torch_dense_topk(scores[:, :2], 3), [[1, 0, -1], [0, 1, -1]])
    # Mixed batch: rows with distinct scores (fast path) and rows with ties at the k-th value.
    rng = np.random.default_rng(11)
    dense = rng.random((40, 50)) + 0.5
    dense[::3] = rng.integers(1, 4, size=(14, 50))
    ref_idx, _ = _brute_topk(sp.csr_matrix(dense), 6)
    np.testing.assert_array_equal(XM._torch_dense_topk(torch.from_numpy(dense), 6), ref_idx)


def test_torchmetrics_wrapper_shape_errors():
    metric = XMCMetrics(max_k=3)
    with pytest.raises(MetricsError, match="scores has shape"):
        metric.update(torch.rand(4, 6), sp.csr_matrix((4, 7)))
    with pytest.raises(MetricsError, match="scores has shape"):
        metric.update(sp.csr_matrix((3, 6)), sp.csr_matrix((4, 6)))
    with pytest.raises(MetricsError, match="inv_propensity must have shape"):
        XMCMetrics(max_k=3, inv_propensity=np.ones(5)).update(torch.rand(2, 6), np.ones((2, 6)))


# --------------------------------------------------------------------------- formatting


def test_format_metrics_table():
    m = {"P@1": 91.846, "P@3": 83.0, "n_docs": 6000}
    assert format_metrics_table(m, style="line") == "P@1 91.85 | P@3 83.00"
    table = format_metrics_table(m, keys=["P@1", "n_docs"])
    assert table.splitlines() == ["| P@1 | n_docs |", "|---:|---:|", "| 91.85 | 6000 |"]
    with pytest.raises(MetricsError, match="keys not in metrics"):
        format_metrics_table(m, keys=["P@5"])


def test_group_metrics_rank_each_group_alone():
    from xtransformer.metrics import group_metrics, label_groups

    counts = np.array([100, 60, 10, 1, 0, 0])  # frequent: 0, 1; few: 2, 3; zero: 4, 5
    assert {k: v.tolist() for k, v in label_groups(counts).items()} == {
        "frequent": [0, 1],
        "few": [2, 3],
        "zero": [4, 5],
    }
    Y = sp.csr_matrix(np.array([[1, 0, 1, 0, 0, 1], [0, 1, 0, 0, 0, 0], [0, 0, 0, 1, 1, 1]], dtype=np.float32))
    S = sp.csr_matrix(np.array([[0.9, 0.8, 0.1, 0.7, 0.0, 0.2], [0.5, 0.4, 0, 0, 0, 0], [0, 0, 0.3, 0.2, 0.6, 0.1]]))
    g = group_metrics(Y, S, counts, k=2)
    # frequent: doc 0 ranks 0 first (hit), doc 1 ranks 0 then 1 (hit at 2)
    assert g["frequent"]["n_docs"] == 2 and g["frequent"]["P@1"] == 50.0 and g["frequent"]["RP@2"] == 100.0
    # few: doc 0 ranks 3 then 2 (hit at 2 of 1 true), doc 2 ranks 2 then 3 (hit at 2)
    assert g["few"]["P@1"] == 0.0 and g["few"]["RP@2"] == 100.0
    ndcg = 1 / np.log2(3)
    assert abs(g["few"]["nDCG@2"] - 100 * ndcg) < 1e-6
    # zero-shot: doc 0 has 5 (scored), doc 2 has 4 and 5, ranked 4 then 5
    assert g["zero"]["n_docs"] == 2 and g["zero"]["RP@2"] == 100.0 and g["zero"]["n_labels"] == 2
    assert group_metrics(Y, sp.csr_matrix(Y.shape), counts)["zero"]["RP@5"] == 0.0  # nothing scored: 0


def test_rprecision_divides_by_the_smaller_of_k_and_the_true_labels():
    # doc0: 7 true labels (more than k), ranked 0..4 with hits at 0, 1, 3; doc1: 1 true label, found
    # at rank 2; doc2: no true label (0, and it stays in the mean).
    Y = _one_hot_labels([[0, 1, 3, 10, 11, 12, 13], [6], []], 14)
    idx = np.array([[0, 1, 2, 3, 4], [4, 5, 6, -1, -1], [7, 8, 9, -1, -1]])
    rp = rprecision_at_k(Y, idx)
    expected = [
        (1 / 1 + 0) / 3,  # k=1: doc0 1/1, doc1 0/1
        (2 / 2 + 0) / 3,
        (2 / 3 + 1 / 1) / 3,  # doc1's one label found by k=3: min(3, 1) = 1
        (3 / 4 + 1) / 3,
        (3 / 5 + 1) / 3,  # doc0 has 7 labels: min(5, 7) = 5, as P@5
    ]
    np.testing.assert_allclose(rp, expected)
    np.testing.assert_allclose(evaluate(Y, (idx, -np.arange(5.0)[None].repeat(3, 0)))["RP@5"], 100 * expected[4])
    assert rp[4] > precision_at_k(Y, idx)[4]  # doc1 is not punished for having one label


def test_decision_f1_by_hand():
    """doc0 true {0, 1}, decided {0, 2}; doc1 true {1}, decided nothing; doc2 true {2}, decided
    {2}; doc3 neither true nor decided labels. TP 2 (0 in doc0, 2 in doc2), FP 1, FN 2."""
    Y = _one_hot_labels([[0, 1], [1], [2], []], 4)
    D = _one_hot_labels([[0, 2], [], [2], []], 4)
    f1 = decision_f1(Y, D)
    assert f1["micro-F1"] == pytest.approx(100 * 2 * 2 / (2 * 2 + 1 + 2))
    # per label: 0: tp1 -> 1; 1: fn2 -> 0; 2: tp1 fp1 -> 2/3; 3: never true nor decided -> 0
    assert f1["macro-F1"] == pytest.approx(100 * (1 + 0 + 2 / 3 + 0) / 4)
    # per document: 2*1/(2+2), 0 (labels, none decided), 1, 1 (nothing to find, nothing claimed)
    assert f1["example-F1"] == pytest.approx(100 * (0.5 + 0 + 1 + 1) / 4)
    # the truth itself: perfect, but label 3 (never true, never decided) counts 0 in macro-F1
    assert decision_f1(Y, Y) == {"micro-F1": 100.0, "macro-F1": 75.0, "example-F1": 100.0}
    with pytest.raises(MetricsError, match="decided has shape"):
        decision_f1(Y, D[:2])


def test_per_document_by_hand_and_its_means_are_evaluates():
    """doc0 true {0, 1}, ranked 1, 2, 0: P@1 100, P@3 2/3; doc1 true {2}, ranked 0, 1, 3: no hit."""
    Y = _one_hot_labels([[0, 1], [2]], 4)
    S = sp.csr_matrix(np.array([[0.1, 0.9, 0.5, 0.0], [0.9, 0.5, 0.0, 0.1]]))
    docs = per_document(Y, S, max_k=3)
    np.testing.assert_allclose(docs["P@1"], [100.0, 0.0])
    np.testing.assert_allclose(docs["P@3"], [200 / 3, 0.0])
    idcg = 1 + 1 / np.log2(3)
    np.testing.assert_allclose(docs["nDCG@3"], [100 * (1 + 1 / np.log2(4)) / idcg, 0.0])
    rng = np.random.default_rng(0)
    Y = _one_hot_labels([list(rng.choice(30, rng.integers(1, 4), replace=False)) for _ in range(50)], 30)
    S = sp.random(50, 30, density=0.4, random_state=1, format="csr")
    means, docs = evaluate(Y, S), per_document(Y, S)
    assert {k: round(float(v.mean()), 9) for k, v in docs.items()} == {k: round(means[k], 9) for k in docs}
    hits, n_true = document_hits(Y, S)  # the few bytes a stored record keeps give the same metrics
    assert hits.shape == (50, 5) and hits.dtype == bool and n_true.tolist() == np.diff(Y.indptr).tolist()
    again = per_document_from_hits(hits, n_true)
    assert all(np.array_equal(again[k], docs[k]) for k in docs)
    with pytest.raises(MetricsError, match="hits must be N x k"):
        per_document_from_hits(hits, n_true[:-1])
