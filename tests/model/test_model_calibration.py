"""A calibrated model through every door: the Python API (``calibrate``, ``predict`` with decision
keywords), its folder (round trip, same sets and probabilities), ``xmc-predict`` (``--threshold``,
``--decision``) and ``xmc-serve`` (the same request fields), on the toy task."""

from __future__ import annotations

import json

import pytest
from tiny_models import toy_xmc

from xtransformer import Combination, XMCModel, XRLinear
from xtransformer.model import ModelError
from xtransformer.settings import SettingsError


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """An XR-Linear fitted on the toy task's train split, a copy calibrated on its dev split, both saved."""
    texts, Y, _ = toy_xmc()
    root = tmp_path_factory.mktemp("calibrated")
    plain = XRLinear.fit(texts["train"], Y["train"], tfidf={"min_df": 1})
    plain.save(root / "plain")
    fitted = XRLinear.fit(texts["train"], Y["train"], tfidf={"min_df": 1})
    model = fitted.calibrate(texts["dev"], Y["dev"], min_positives=2)
    assert fitted.calibration is None and "decision" not in fitted.predict_settings  # a new model; the old stays
    model.save(root / "calibrated")
    return {"root": root, "model": model, "texts": texts, "Y": Y}


def _sets(rows: list[dict]) -> list[list[str]]:
    return [row["labels"] for row in rows]


def test_decisions_return_label_sets_with_probabilities(toy):
    model, test = toy["model"], toy["texts"]["test"]
    top = model.predict(test, k=3)
    assert all(len(r["labels"]) == 3 and len(r["probabilities"]) == 3 for r in top)  # top-k still works
    decided = model.predict(test, decision="threshold")
    threshold = model.predict_settings["threshold"]
    assert all(p >= threshold for r in decided for p in r["probabilities"])
    assert all(r["probabilities"] == sorted(r["probabilities"], reverse=True) for r in decided)
    assert model.predict(test, threshold=threshold) == decided  # `threshold` alone asks for decisions
    assert all(len(r["labels"]) == 1 for r in model.predict(test, decision="threshold", max_labels=1))
    assert all(len(r["labels"]) >= 4 for r in model.predict(test, threshold=1.0, min_labels=4))
    assert _sets(model.predict(test, threshold=0.0)) == _sets(model.predict(test, k=20))  # every candidate
    metrics = model.evaluate(toy["texts"]["test"], toy["Y"]["test"]).metrics
    assert {"ECE", "ECE@1", "micro-F1", "macro-F1", "example-F1", "micro-F1 per-label", "RP@5"} <= set(metrics)


def test_bad_decision_values_and_uncalibrated_models_fail_in_one_line(toy):
    model, test = toy["model"], toy["texts"]["test"]
    with pytest.raises(SettingsError, match=r"^threshold=1\.5: must be a probability in \[0, 1\]$"):
        model.predict(test, threshold=1.5)
    with pytest.raises(SettingsError, match=r"^min_labels=3: must not exceed max_labels=2$"):
        model.predict(test, min_labels=3, max_labels=2)
    with pytest.raises(SettingsError, match=r"^decision='all': expected one of"):
        model.predict(test, decision="all")
    plain = XMCModel.load(toy["root"] / "plain")
    assert set(plain.predict(test[:1], k=2)[0]) == {"labels", "names", "scores"}  # as before: no probabilities
    with pytest.raises(ModelError, match=r"^threshold: a xrlinear model without a calibrator ranks labels only"):
        plain.predict(test, threshold=0.5)
    with pytest.raises(ModelError, match=r"^decision: "):
        plain.predict(test, decision="per_label")


def test_calibrating_on_training_documents_is_refused(toy):
    model = XRLinear.fit(toy["texts"]["train"], toy["Y"]["train"], tfidf={"min_df": 1})
    with pytest.raises(ModelError, match=r"^calibrate: 3 of the 35 documents are documents this xrlinear model"):
        model.calibrate(toy["texts"]["train"][:3] + toy["texts"]["dev"], [[]] * 3 + [[]] * 32)


def test_a_calibrated_folder_round_trips_and_decides_the_same_sets(toy):
    folder = toy["root"] / "calibrated"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["components"]["calibration"] == "calibration"
    assert {"calibration/calibration.json", "calibration/label_thresholds.npz"} <= set(manifest["files"])
    loaded = XMCModel.load(folder)
    test = toy["texts"]["test"]
    for settings in ({"decision": "threshold"}, {"decision": "per_label"}, {"k": 4}, {"threshold": 0.9}):
        assert loaded.predict(test, **settings) == toy["model"].predict(test, **settings)
    assert loaded.calibration.record == json.loads(json.dumps(toy["model"].calibration.record))
    assert loaded.calibration.record["fitted_on"]["documents"] == 32


def test_a_calibrated_combination_round_trips(toy):
    members = [XMCModel.load(toy["root"] / "plain"), XMCModel.load(toy["root"] / "calibrated")]
    both = Combination(members, weights=[0.5, 0.5])
    both = both.calibrate(toy["texts"]["dev"], toy["Y"]["dev"], method="isotonic", min_positives=2)
    both.save(toy["root"] / "both")  # beside its members
    loaded = XMCModel.load(toy["root"] / "both")
    test = toy["texts"]["test"]
    assert loaded.predict_settings["threshold"] == both.predict_settings["threshold"]
    assert loaded.predict(test, decision="per_label") == both.predict(test, decision="per_label")
    assert loaded.calibration.record["method"] == "isotonic"


def test_xmc_predict_decision_flags(toy, tmp_path, capsys):
    from xtransformer.cli import predict_main

    texts, labels = tmp_path / "texts.txt", tmp_path / "labels.txt"
    texts.write_text("".join(t + "\n" for t in toy["texts"]["test"]))
    Y = toy["Y"]["test"]
    ids = toy["model"].label_ids
    labels.write_text("".join(" ".join(ids[j] for j in Y[i].indices) + "\n" for i in range(Y.shape[0])))
    folder = str(toy["root"] / "calibrated")
    assert predict_main(["--model", folder, "--input", str(texts), "--decision", "per_label", "--no-progress"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows == toy["model"].predict(toy["texts"]["test"], decision="per_label")
    args = ["--model", folder, "--input", str(texts), "--threshold", "0.5", "--labels", str(labels), "--no-progress"]
    assert predict_main([*args, "--format", "tsv"]) == 0
    out = capsys.readouterr()
    assert "micro-F1" in out.err and "RP@5" in out.err
    first = out.out.splitlines()[0].split("\t")
    assert all(float(cell.rsplit(":", 1)[1]) >= 0.5 for cell in first)  # probabilities, each above the threshold
    assert predict_main(["--model", folder, "--input", str(texts), "--threshold", "2", "--no-progress"]) == 2
    assert capsys.readouterr().err.strip() == "xmc-predict: error: threshold=2.0: must be a probability in [0, 1]"
    plain = str(toy["root"] / "plain")
    assert predict_main(["--model", plain, "--input", str(texts), "--decision", "threshold", "--no-progress"]) == 2
    assert "without a calibrator" in capsys.readouterr().err


def test_xmc_serve_takes_the_decision_fields(toy):
    from fastapi.testclient import TestClient

    from xtransformer.serve import create_app

    model, test = XMCModel.load(toy["root"] / "calibrated"), toy["texts"]["test"][:3]
    with TestClient(create_app(model)) as client:
        assert client.get("/health").json()["calibrated"] is True
        got = client.post("/predict", json={"texts": test, "decision": "per_label"}).json()["predictions"]
        assert got == model.predict(test, decision="per_label")
        got = client.post("/predict", json={"texts": test, "k": 2}).json()["predictions"]
        assert got == model.predict(test, k=2) and len(got[0]["probabilities"]) == 2
        got = client.post("/predict", json={"texts": test, "k": 1, "threshold": 0.0}).json()["predictions"]
        assert got == model.predict(test, threshold=0.0) and len(got[0]["labels"]) > 1  # k does not cut a set
        bad = client.post("/predict", json={"texts": test, "threshold": 1.5})
        assert bad.status_code == 422 and bad.json()["field"] == "threshold"
        bad = client.post("/predict", json={"texts": test, "decision": "sometimes"})
        assert bad.status_code == 422 and bad.json()["field"] == "decision"
    with TestClient(create_app(XMCModel.load(toy["root"] / "plain"))) as client:
        bad = client.post("/predict", json={"texts": test, "threshold": 0.5})
        assert bad.status_code == 422 and bad.json()["field"] == "threshold"
        assert "without a calibrator" in bad.json()["error"]
