"""A method is a class, a config file and one line in the registry: the popularity baseline of
``examples/plugin_method``, registered here by that line instead of its entry point, trains through
``python train.py method=popularity``, beside XR-Linear and combined with it, and its folder loads
back as its class."""

from __future__ import annotations

import json

import pytest

from xtransformer import XMCModel, methods
from xtransformer.configuration import compose
from xtransformer.model import ModelError


@pytest.fixture
def registered(monkeypatch, tmp_path):
    monkeypatch.setattr(methods, "plugin_methods", dict)  # as here, whatever packages this Python has
    monkeypatch.setitem(methods.METHODS, "popularity", "xtransformer_popularity:Popularity")  # the one line
    (tmp_path / "configs" / "method").mkdir(parents=True)
    (tmp_path / "configs" / "method" / "popularity.yaml").write_text(  # the one config file
        "# @package _global_\nmethod: popularity\npopularity:\n  smoothing: 1.0\n  topk: 20\n"
    )
    return tmp_path


def test_a_registered_method_trains_through_the_run_and_loads_as_its_class(registered):
    from xtransformer_popularity import Popularity

    from xtransformer.pipeline.run import run

    tmp = registered
    cfg = compose(
        [
            "method=popularity",
            f"hydra.searchpath=[file://{tmp / 'configs'}]",
            "data.max_docs=300",
            "logger=none",
            "tfidf.max_features=2000",
            f"paths.cache_dir={tmp / 'cache'}",
            f"paths.output_dir={tmp / 'run'}",
        ]
    )
    metrics = run(cfg)
    assert metrics["method"] == "popularity" and metrics["stages"]["ran"] == [
        "documents",
        "tfidf",
        "xrlinear",
        "popularity",
    ]
    assert set(metrics["results"]) == {"xrlinear", "popularity", "popularity+xrlinear"}
    assert 0 < metrics["results"]["popularity"]["P@1"] < metrics["results"]["xrlinear"]["P@1"]
    index = json.loads((tmp / "run" / "model" / "models.json").read_text())
    assert index == {"main": "popularity", "methods": ["xrlinear", "popularity", "popularity+xrlinear"]}
    model = XMCModel.load(tmp / "run")  # the run's main method, as the class its manifest names
    assert isinstance(model, Popularity) and model.predict(["any text"], k=2)[0]["labels"][0] == "earn"
    assert metrics["settings"]["train"]["popularity"] == {"smoothing": 1.0}


def test_an_unregistered_kind_fails_in_one_line(registered, tmp_path):
    from xtransformer_popularity import Popularity

    from xtransformer.data.inputs import LabeledData

    data = LabeledData.build(["a b", "c d"], [["x"], ["y"]])
    folder = Popularity.fit(data).save(tmp_path / "pop")
    methods.METHODS.pop("popularity")
    with pytest.raises(ModelError, match=r"pop: unknown model kind 'popularity'; this xtransformer knows"):
        XMCModel.load(folder)
