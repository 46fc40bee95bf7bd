"""Ensembles of several runs' sparse predictions."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp

from xtransformer.ensemble import EnsembleError, ensemble_predictions, ensemble_runs, main
from xtransformer.utils.io import load_csr, save_csr


def csr(rows: list[dict[int, float]], n_cols: int = 4) -> sp.csr_matrix:
    r = [i for i, row in enumerate(rows) for _ in row]
    c = [j for row in rows for j in row]
    v = [x for row in rows for x in row.values()]
    return sp.csr_matrix((np.array(v, np.float32), (r, c)), shape=(len(rows), n_cols))


A = csr([{0: 0.9, 1: 0.5}, {2: 0.4}])
B = csr([{1: 0.7, 3: 0.2}, {2: 0.6, 3: 0.8}])


def as_dicts(M: sp.csr_matrix) -> list[dict[int, float]]:
    return [
        {
            int(j): float(x)
            for j, x in zip(M.indices[M.indptr[i] : M.indptr[i + 1]], M.data[M.indptr[i] : M.indptr[i + 1]])
        }
        for i in range(M.shape[0])
    ]


def assert_rows(M: sp.csr_matrix, want: list[dict[int, float]]) -> None:
    got = as_dicts(M)
    assert [set(g) for g in got] == [set(w) for w in want]
    for g, w in zip(got, want):
        np.testing.assert_allclose([g[k] for k in sorted(w)], [w[k] for k in sorted(w)], rtol=1e-5)


def test_average_counts_missing_as_zero():
    assert_rows(ensemble_predictions([A, B], "average"), [{0: 0.45, 1: 0.6, 3: 0.1}, {2: 0.5, 3: 0.4}])


def test_rank_average_is_mean_reciprocal_rank():
    assert_rows(ensemble_predictions([A, B], "rank-average"), [{0: 0.5, 1: 0.75, 3: 0.25}, {2: 0.75, 3: 0.5}])


def test_softmax_average():
    s = lambda d: 1 / (1 + np.exp(-d))
    want = [
        {0: s(0.4) / 2, 1: (s(-0.4) + s(0.5)) / 2, 3: s(-0.5) / 2},
        {2: (1.0 + s(-0.2)) / 2, 3: s(0.2) / 2},
    ]
    assert_rows(ensemble_predictions([A, B], "softmax-average"), want)


def test_topk_truncates_each_row():
    assert_rows(ensemble_predictions([A, B], "average", topk=1), [{1: 0.6}, {2: 0.5}])


def test_single_run_average_is_identity():
    assert_rows(ensemble_predictions([A], "average"), as_dicts(A))


def test_weights_shift_the_average():
    # 0.75 A + 0.25 B (weights are normalised: [3, 1])
    assert_rows(
        ensemble_predictions([A, B], "average", weights=[3, 1]), [{0: 0.675, 1: 0.55, 3: 0.05}, {2: 0.45, 3: 0.2}]
    )
    equal = ensemble_predictions([A, B], "rank-average", weights=[2, 2])
    assert_rows(equal, as_dicts(ensemble_predictions([A, B], "rank-average")))
    for bad in ([1.0], [1, -1], [0, 0], ["x", 1], [float("nan"), 1]):
        with pytest.raises(EnsembleError, match="weights"):
            ensemble_predictions([A, B], "average", weights=bad)


def test_bad_inputs():
    with pytest.raises(EnsembleError, match="shape"):
        ensemble_predictions([A, csr([{0: 1.0}])], "average")
    with pytest.raises(EnsembleError, match="method"):
        ensemble_predictions([A], "vote")
    with pytest.raises(EnsembleError, match="empty"):
        ensemble_predictions([], "average")


def make_run(path, pred: sp.csr_matrix, vocab: list[str], truth: sp.csr_matrix | None = None) -> None:
    save_csr(pred, path / "predictions" / "dev.npz")
    (path / "label_vocab.txt").write_text("\n".join(vocab) + "\n")
    if truth is not None:
        save_csr(truth, path / "truth" / "dev.npz")


def test_command_line_writes_predictions_and_metrics(tmp_path):
    vocab = ["a", "b", "c", "7"]
    truth = csr([{1: 1.0}, {3: 1.0}])
    make_run(tmp_path / "r1", A, vocab, truth)
    make_run(tmp_path / "r2", B, vocab)
    out = tmp_path / "ens"
    assert main([str(tmp_path / "r1"), str(tmp_path / "r2"), "--method", "average", "--out", str(out)]) == 0
    assert_rows(load_csr(out / "predictions" / "dev.npz"), [{0: 0.45, 1: 0.6, 3: 0.1}, {2: 0.5, 3: 0.4}])
    assert (out / "label_vocab.txt").read_text().split() == vocab
    metrics = json.loads((out / "metrics" / "dev.json").read_text())
    assert metrics["P@1"] == pytest.approx(50.0)  # doc 0: label 1 on top (hit); doc 1: label 2 (miss)
    # --weights: one per run, recorded in ensemble.json
    assert main([str(tmp_path / "r1"), str(tmp_path / "r2"), "--weights", "3", "1", "--out", str(tmp_path / "w")]) == 0
    assert_rows(load_csr(tmp_path / "w" / "predictions" / "dev.npz"), [{0: 0.675, 1: 0.55, 3: 0.05}, {2: 0.45, 3: 0.2}])
    assert json.loads((tmp_path / "w" / "ensemble.json").read_text())["weights"] == [3.0, 1.0]
    assert main([str(tmp_path / "r1"), str(tmp_path / "r2"), "--weights", "1", "--out", str(tmp_path / "w1")]) == 2
    assert not (tmp_path / "w1").exists()


def test_member_can_name_a_method_of_its_run(tmp_path):
    """RUN_DIR:xrlinear takes predictions/xrlinear/ of that run (the TF-IDF-only model every run trains)."""
    vocab = ["a", "b", "c", "7"]
    make_run(tmp_path / "r1", A, vocab, csr([{1: 1.0}, {3: 1.0}]))
    save_csr(B, tmp_path / "r1" / "predictions" / "xrlinear" / "dev.npz")
    out = tmp_path / "ens"
    assert main([str(tmp_path / "r1"), f"{tmp_path / 'r1'}:xrlinear", "--out", str(out)]) == 0
    assert_rows(load_csr(out / "predictions" / "dev.npz"), [{0: 0.45, 1: 0.6, 3: 0.1}, {2: 0.5, 3: 0.4}])
    assert json.loads((out / "ensemble.json").read_text())["members"][1].endswith("r1:xrlinear")
    with pytest.raises(EnsembleError, match="from method 'nope'"):
        ensemble_runs([tmp_path / "r1", f"{tmp_path / 'r1'}:nope"], tmp_path / "o2", "average", splits=["dev"])


def test_explicit_truth_file(tmp_path):
    vocab = ["a", "b", "c", "d"]
    make_run(tmp_path / "r1", A, vocab)
    make_run(tmp_path / "r2", B, vocab)
    save_csr(csr([{1: 1.0}, {2: 1.0}]), tmp_path / "Y.npz")
    res = ensemble_runs([tmp_path / "r1", tmp_path / "r2"], tmp_path / "o", "rank-average", truth=tmp_path / "Y.npz")
    assert res["dev"]["P@1"] == pytest.approx(100.0)


def test_vocabularies_must_match(tmp_path, capsys):
    make_run(tmp_path / "r1", A, ["a", "b", "c", "d"])
    make_run(tmp_path / "r2", B, ["a", "b", "x", "d"])
    with pytest.raises(EnsembleError, match="line 3"):
        ensemble_runs([tmp_path / "r1", tmp_path / "r2"], tmp_path / "o", "average")
    assert main([str(tmp_path / "r1"), str(tmp_path / "r2"), "--out", str(tmp_path / "o")]) == 2
    assert "label vocabulary differs" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
