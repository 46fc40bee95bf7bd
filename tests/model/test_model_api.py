"""XMCModel on a small hand-built XR-Linear folder: predictions equal to the model's own, TF-IDF
rebuilt from data equal to the fitted vectoriser's. Every method's folder from a real run
(XR-Transformer's included) is checked end to end in ``test_model_folder.py``."""

from __future__ import annotations

import pytest
from model_helpers import save_toy_xrlinear

from xtransformer.data.tfidf import TfidfConfig, _vectorizer
from xtransformer.model import ModelError, XMCModel


def test_tfidf_from_data_reproduces_the_fitted_vectorizer(tmp_path, toy_task):
    from xtransformer.data.tfidf import TfidfFeatures

    texts, _, _ = toy_task
    vec = _vectorizer(TfidfConfig(min_df=1))
    vec.fit(texts["train"])
    TfidfFeatures(vec, len(vec.vocabulary_)).save(tmp_path / "tfidf")
    new = texts["test"] + ["Ünïcödé words and an unseen token", ""]
    got = TfidfFeatures.load(tmp_path / "tfidf").from_texts(new)
    want = vec.transform(new).tocsr()
    want.sort_indices()
    assert (got != want).nnz == 0 and got.dtype == want.dtype


def test_tfidf_with_a_lead_block_from_data_reproduces_the_fitted_vectorizer(tmp_path, toy_task):
    from xtransformer.data.tfidf import LeadTfidf, TfidfFeatures

    texts, _, _ = toy_task
    cfg = TfidfConfig(min_df=1, lead_chars=20, lead_weight=0.6)
    vec = LeadTfidf(_vectorizer(cfg), _vectorizer(cfg), cfg.lead_chars, cfg.lead_weight)
    vec.fit_transform(texts["train"])
    TfidfFeatures(vec, vec.n_features).save(tmp_path / "tfidf")
    assert (tmp_path / "tfidf" / "lead" / "vocabulary.json").is_file()
    new = texts["test"] + ["Ünïcödé words and an unseen token", ""]
    got = TfidfFeatures.load(tmp_path / "tfidf").from_texts(new)
    want = vec.transform(new).tocsr()
    want.sort_indices()
    assert got.shape[1] == vec.n_features and (got != want).nnz == 0 and got.dtype == want.dtype


def test_xrlinear_folder_predicts_as_the_model(tmp_path):
    folder, texts = save_toy_xrlinear(tmp_path / "xrlinear")
    model = XMCModel.load(folder)
    direct = model.model.predict(model.tfidf.from_texts(texts["test"]))
    assert (model.predict_csr(texts["test"]) != direct).nnz == 0
    out = model.predict(texts["test"][:2], k=3)
    assert out[0]["names"][0].startswith("label number") and len(out[0]["scores"]) == 3
    assert model.predict([]) == []
    with pytest.raises(ModelError, match="list of texts"):
        model.predict("one string")
    with pytest.raises(ModelError, match="k must be"):
        model.predict(texts["test"], k=0)
