"""Calibrators, thresholds, decision rules and the calibration settings, on hand-built cases.

What is checked: a calibrator is monotone and, on a held-out set, gives probabilities whose ECE
is at most that of the raw scores squashed by a sigmoid; per-label thresholds on a case where they
are known; bad settings fail with one line naming the key.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from xtransformer.calibration import Calibration, CalibrationConfig, ReliabilityTable, reliability
from xtransformer.calibration.calibrator import Isotonic, Platt, row_ranks, sigmoid
from xtransformer.calibration.decide import decide
from xtransformer.calibration.thresholds import tune_label_thresholds, tune_threshold
from xtransformer.errors import UserError


def _rows(entries: list[list[tuple[int, float]]], n_labels: int) -> sp.csr_matrix:
    """A csr with row i holding ``(label, value)`` pairs ``entries[i]``."""
    rows = [i for i, row in enumerate(entries) for _ in row]
    cols = [label for row in entries for label, _ in row]
    vals = [value for row in entries for _, value in row]
    return sp.csr_matrix((np.array(vals, np.float32), (rows, cols)), shape=(len(entries), n_labels))


def _labels(sets: list[list[int]], n_labels: int) -> sp.csr_matrix:
    return _rows([[(label, 1.0) for label in row] for row in sets], n_labels)


def _miscalibrated(seed: int, n_docs: int = 3000, n_labels: int = 40) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """Ten candidates a document with scores in [0, 1]; a candidate is true with probability
    score ** 3 (far below the score, as a ranker's scores are): scores and labels."""
    rng = np.random.default_rng(seed)
    cols = np.stack([rng.choice(n_labels, 10, replace=False) for _ in range(n_docs)])
    score = rng.random((n_docs, 10)).astype(np.float32)
    rows = np.repeat(np.arange(n_docs), 10)
    pred = sp.csr_matrix((score.ravel(), (rows, cols.ravel())), shape=(n_docs, n_labels))
    truth = rng.random(score.shape) < score**3
    Y = sp.csr_matrix((np.ones(truth.sum(), np.float32), (rows[truth.ravel()], cols.ravel()[truth.ravel()])))
    Y.resize(n_docs, n_labels)
    return pred, sp.csr_matrix(Y)


@pytest.mark.parametrize("method, features", [("platt", "score"), ("platt", "score+rank"), ("isotonic", "score")])
def test_calibration_is_monotone_and_beats_a_sigmoid_on_held_out_documents(method, features):
    fit_pred, fit_Y = _miscalibrated(0)
    held_pred, held_Y = _miscalibrated(1)
    config = CalibrationConfig(method=method, features=features, holdout=fit_pred.shape[0])
    cal, _ = Calibration.fit(fit_pred, fit_Y, config, {"source": "test"})
    prob = cal.probabilities(held_pred)
    # monotone: within every document the probabilities keep the scores' order
    assert np.array_equal(row_ranks(sp.csr_matrix(prob)), row_ranks(held_pred)) or method == "isotonic"
    s = np.linspace(0, 1, 101)
    for rank in (0, 3, 9):
        p = cal.calibrator.apply(s, np.full_like(s, rank))
        assert np.all(np.diff(p) >= 0) and np.all((p >= 0) & (p <= 1))
    raw = sp.csr_matrix((sigmoid(held_pred.data.astype(np.float64)), held_pred.indices, held_pred.indptr))
    ece, ece_raw = reliability(prob, held_Y, 15).ece, reliability(raw, held_Y, 15).ece
    assert ece <= ece_raw and ece < 0.03, (ece, ece_raw)


def test_platt_drops_a_feature_of_the_wrong_sign():
    # a better rank that is less often true (here: rank does not matter at all but noise says it
    # hurts) must not turn a document's ranking around: the rank weight is never positive
    rng = np.random.default_rng(0)
    score, rank = rng.random(4000), rng.integers(0, 10, 4000)
    target = (rng.random(4000) < 0.2 + 0.6 * score * (rank > 4)).astype(float)
    p = Platt.fit(score, rank, target, "score+rank")
    assert p.weights[0] > 0 and p.weights[1] == 0.0


def test_isotonic_pools_adjacent_violators():
    iso = Isotonic.fit(np.array([0.1, 0.2, 0.3, 0.4]), np.zeros(4), np.array([0.0, 1.0, 0.0, 1.0]))
    np.testing.assert_allclose(iso.y, [0.0, 0.5, 0.5, 1.0])
    np.testing.assert_allclose(iso.apply(np.array([0.0, 0.25, 0.9]), np.zeros(3)), [0.0, 0.5, 1.0])


def test_reliability_table_and_ece_by_hand():
    # two bins: {0.1, 0.1} with one of two true (gap 0.4), {0.9, 0.9} both true (gap 0.1)
    t = ReliabilityTable.of(np.array([0.1, 0.1, 0.9, 0.9]), np.array([0.0, 1.0, 1.0, 1.0]), bins=2)
    assert t.ece == pytest.approx((2 * 0.4 + 2 * 0.1) / 4)
    np.testing.assert_allclose(t.count, [2, 2])
    # ECE@1 reads each document's most probable candidate only: two at 0.9, one of them true
    prob = _rows([[(0, 0.9), (1, 0.1)], [(0, 0.1), (1, 0.9)]], 2)
    Y = _labels([[0], [0]], 2)
    assert reliability(prob, Y, 2, top1=True).ece == pytest.approx(0.4)
    assert reliability(prob, Y, 2).ece == pytest.approx(0.4)  # all four: 0.1 (one of two true), 0.9 likewise


def test_global_threshold_maximises_held_out_micro_f1():
    # one candidate a document; true: 0.9, 0.8, 0.55. Cuts: (0.3, 0.55] keeps 3 true + 1 false:
    # micro-F1 6/7, the best; the lowest grid point in it is 0.31
    probs = [0.9, 0.8, 0.6, 0.55, 0.3, 0.2]
    truth = [True, True, False, True, False, False]
    prob = _rows([[(0, p)] for p in probs], 1)
    Y = _labels([[0] if t else [] for t in truth], 1)
    settings = {"decision": "threshold", "threshold": 0.5, "min_labels": 0, "max_labels": None}
    assert tune_threshold(prob, Y, settings) == pytest.approx(0.31)


def test_per_label_thresholds_on_a_case_where_they_are_known():
    """Global threshold 0.5; label 0 has a true candidate below it (and a false one further
    down): its threshold drops to the middle of (0.3, 0.45]. Label 1 has one held-out positive,
    fewer than min_positives: it keeps the global one (NaN). Label 2's candidates are all false:
    its threshold rises above its best, to the middle of (0.95, 1]. Label 3 is best cut where the
    global threshold already cuts: it stays 0.5."""
    label_probs = {
        0: [(0.9, True), (0.8, True), (0.45, True), (0.3, False)],
        1: [(0.7, False), (0.6, False), (0.2, True)],
        2: [(0.95, False), (0.6, False)],
        3: [(0.7, True), (0.4, False)],
    }
    entries = [[(label, p)] for label, cands in label_probs.items() for p, _ in cands]
    truth = [[label] if t else [] for label, cands in label_probs.items() for _, t in cands]
    truth += [[2], [2], [3]]  # positives no candidate reaches (documents the model missed)
    prob = _rows(entries + [[], [], []], 4)
    thresholds = tune_label_thresholds(prob, _labels(truth, 4), threshold=0.5, min_positives=2)
    np.testing.assert_allclose(thresholds, [0.375, np.nan, 0.975, 0.5], rtol=1e-6)
    # the rule reads them: label 0 at 0.45 is decided, label 2 at 0.95 is not, label 1 uses 0.5
    decided = decide(
        _rows([[(0, 0.45), (1, 0.55), (2, 0.95), (3, 0.45)]], 4),
        {"decision": "per_label", "threshold": 0.5, "min_labels": 0, "max_labels": None},
        thresholds,
    )
    assert sorted(decided.indices.tolist()) == [0, 1]


def test_decision_rules_threshold_min_and_max_labels():
    prob = _rows([[(0, 0.9), (1, 0.6), (2, 0.4), (3, 0.2)], [(0, 0.3), (1, 0.1)]], 4)
    base = {"decision": "threshold", "threshold": 0.5, "min_labels": 0, "max_labels": None}

    def sets(**changes) -> list[list[int]]:
        out = decide(prob, {**base, **changes}, np.array([np.nan, 0.7, 0.3, np.nan], np.float32))
        return [sorted(out.indices[a:b].tolist()) for a, b in zip(out.indptr[:-1], out.indptr[1:])]

    assert sets() == [[0, 1], []]  # the second document has no label above 0.5: none decided
    assert sets(min_labels=1) == [[0, 1], [0]]  # ... unless it must get one: its most probable
    assert sets(min_labels=3) == [[0, 1, 2], [0, 1]]
    assert sets(max_labels=1) == [[0], []]
    assert sets(decision="per_label") == [[0, 2], []]  # label 1 needs 0.7, label 2 only 0.3
    assert sets(threshold=0.0) == [[0, 1, 2, 3], [0, 1]]
    assert sets(threshold=1.0) == [[], []]


def _config(**fields) -> CalibrationConfig:
    return CalibrationConfig.from_mapping(fields)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"method": "platt", "holdout": 10, "threshold": 1.5}, r"^calibration\.threshold=1\.5: must be a probability"),
        ({"method": "platt", "holdout": 10, "threshold": -0.1}, r"^calibration\.threshold=-0\.1: "),
        (
            {"method": "platt", "holdout": 10, "min_labels": 3, "max_labels": 2},
            r"^calibration\.min_labels=3: must not exceed max_labels=2",
        ),
        ({"decision": "per_label"}, r"^calibration\.decision='per_label': per-label thresholds are tuned on held-out"),
        ({"method": "platt", "holdout": 0}, r"^calibration\.holdout=0: method=platt is fitted on held-out"),
        ({"threshold": 0.4}, r"^calibration\.threshold=0\.4: decisions need a calibrator"),
        ({"holdout": 100}, r"^calibration\.holdout=100: held-out documents fit a calibrator"),
        ({"method": "beta"}, r"^calibration\.method='beta': expected one of"),
        ({"method": "platt", "holdout": 10, "decision": "all"}, r"^calibration\.decision='all': expected one of"),
        ({"method": "platt", "holdout": 10, "max_labels": 0}, r"^calibration\.max_labels=0: "),
        ({"method": "platt", "holdout": "many"}, r"^calibration\.holdout='many': expected an int"),
    ],
)
def test_bad_calibration_settings_fail_in_one_line_naming_the_key(fields, message):
    with pytest.raises(UserError, match=message) as err:
        _config(**fields)
    assert "\n" not in str(err.value)


def test_hold_out_is_seeded_disjoint_and_keys_the_training_data():
    from xtransformer.data.inputs import LabeledData

    texts = [f"document {i}" for i in range(50)]
    data = LabeledData.build(texts, [["a"] if i % 2 else ["b"] for i in range(50)])
    train, held = _config(method="platt", holdout=10, seed=3).hold_out(data)
    again, held_again = _config(method="platt", holdout=10, seed=3).hold_out(data)
    other, _ = _config(method="platt", holdout=10, seed=4).hold_out(data)
    assert len(train) == 40 and len(held) == 10 and not set(train.texts) & set(held.texts)
    assert held_again.texts == held.texts and again.key == train.key  # the same documents, the same stage keys
    assert other.key != train.key and train.key != data.key  # other documents: other keys
    assert _config().hold_out(data) == (data, None)
    with pytest.raises(UserError, match=r"^calibration\.holdout=50: the training split has 50 documents"):
        _config(method="platt", holdout=50).hold_out(data)
