"""Abilities are declared by a method's bases, never inherited as failures: a model lists what it can
do, a verb it lacks is not there (or, for a combination, fails in one line before any work), the
command line checks before reading any data, and verbs that make a model return a new one."""

from __future__ import annotations

import pytest
import scipy.sparse as sp
from model_helpers import toy_xmc

from xtransformer import XMLCNN, Combination, KimCNN, XMCModel, XRLinear, XRTransformer, XTransformer
from xtransformer.methods.abilities import Ability, MissingAbility, declared_abilities
from xtransformer.methods.base import ModelRecords

EVERY = frozenset(Ability)


class Constant(XMCModel):
    """A text-only method with no optional ability: every document gets the same scores."""

    kind = "constant"

    def _predict_texts(self, texts, settings, report):
        n = len(texts)
        return sp.csr_matrix(([1.0] * n, ([*range(n)], [0] * n)), shape=(n, self.n_labels))


@pytest.fixture(scope="module")
def toy():
    texts, Y, _ = toy_xmc()
    model = XRLinear.fit(texts["train"], Y["train"], tfidf={"min_df": 1})
    records = ModelRecords(model.label_ids, model.label_names, {"topk": 5})
    return {"texts": texts, "Y": Y, "xrlinear": model, "constant": Constant(records)}


def test_each_method_declares_what_it_can_do():
    assert declared_abilities(XRLinear) == EVERY
    for cls in (XTransformer, XRTransformer):
        assert declared_abilities(cls) == {Ability.ADD_LABELS, Ability.ZERO_SHOT, Ability.CALIBRATION}
    for cls in (KimCNN, XMLCNN):
        assert declared_abilities(cls) == {Ability.CALIBRATION}
        for verb in ("add_labels", "fit_zero_shot", "predict_features", "predict_features_csr"):
            assert not hasattr(cls, verb), verb  # not inherited, only to raise


def test_a_combination_can_do_what_every_member_can(toy):
    both = Combination([toy["xrlinear"], toy["xrlinear"]])
    assert both.abilities == EVERY
    mixed = Combination([toy["xrlinear"], toy["constant"]])
    assert mixed.abilities == {Ability.CALIBRATION}
    X = toy["xrlinear"].tfidf.from_texts(toy["texts"]["test"])
    assert both.predict_features_csr(X).shape == (X.shape[0], toy["xrlinear"].n_labels)
    with pytest.raises(MissingAbility) as err:
        mixed.predict_features_csr(X)
    assert str(err.value) == (
        "predict_features: a xrlinear+constant model cannot predict from feature rows (it reads texts: pass them "
        "instead) (its abilities: calibration)"
    )
    with pytest.raises(MissingAbility, match=r"^add_labels: a xrlinear\+constant model cannot add labels"):
        mixed.add_labels(toy["texts"]["train"], toy["Y"]["train"], label_ids=toy["xrlinear"].label_ids)
    with pytest.raises(MissingAbility, match=r"^evaluate on feature rows: a constant model cannot predict"):
        toy["constant"].evaluate(X, toy["Y"]["test"])


def test_verbs_that_make_a_model_leave_the_old_one_as_it_was(toy):
    model = toy["xrlinear"]
    before = dict(model.predict_settings)
    calibrated = model.calibrate(toy["texts"]["dev"], toy["Y"]["dev"], min_positives=2)
    assert calibrated is not model and calibrated.calibration is not None and calibrated.folder is None
    assert model.calibration is None and model.predict_settings == before
    assert calibrated.model is model.model  # the components are shared, never copied


def test_the_command_line_checks_an_ability_before_reading_any_data(toy, tmp_path, monkeypatch, capsys):
    from xtransformer import methods
    from xtransformer.cli import add_labels_main

    monkeypatch.setitem(methods.METHODS, "popularity", "xtransformer_popularity:Popularity")
    from xtransformer_popularity import Popularity

    folder = Popularity.fit(toy["texts"]["train"], toy["Y"]["train"], label_ids=toy["xrlinear"].label_ids)
    folder = folder.save(tmp_path / "pop")
    for extra, cannot in (([], "add labels to a trained model"), (["--zero-shot"], "score labels without")):
        rc = add_labels_main(
            ["--model", str(folder), "--data", str(tmp_path / "no-such-folder"), "--output", str(tmp_path / "o")]
            + extra
        )
        err = capsys.readouterr().err.strip()
        assert rc == 2 and err.startswith(f"xmc-add-labels: error: {folder}: a popularity model cannot {cannot}")
        assert "\n" not in err and "no-such-folder" not in err  # the data folder was never read


def test_fit_on_a_helper_rank_names_share_fit(toy, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(ValueError, match=r"^XRLinear\.fit runs on rank 0 of a DDP run; the other ranks call "):
        XRLinear.fit(toy["texts"]["train"], toy["Y"]["train"])
    from xtransformer import TrainContext

    with TrainContext() as ctx:  # nothing collective to share: XR-Linear trains on rank 0 alone
        assert XRLinear.share_fit(toy["texts"]["train"], toy["Y"]["train"], context=ctx) is None
