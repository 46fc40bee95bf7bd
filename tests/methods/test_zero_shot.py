"""Zero-shot labels: a label no training document carries, scored from its text when asked."""

from __future__ import annotations

import numpy as np
import pytest
from tiny_models import toy_xmc

from xtransformer import XMCModel, XRLinear
from xtransformer.model.folder import ModelError

IDS = [f"L{i}" for i in range(12)]


def keywords(label: int, texts: list[str], Y) -> list[str]:
    """The words only documents with ``label`` use (the toy task's keywords of that label)."""
    has = Y[:, label].toarray().ravel() > 0
    words_in = set(" ".join(t for t, h in zip(texts, has) if h).replace(".", "").split())
    words_out = set(" ".join(t for t, h in zip(texts, has) if not h).replace(".", "").split())
    return sorted(words_in - words_out)


@pytest.fixture(scope="module")
def zero_shot_model():
    """XR-Linear on the toy task whose label L11 has no training document; every label is named
    by its keywords (the label texts the zero-shot scores read)."""
    texts, Y, _ = toy_xmc()
    names = [" ".join(keywords(j, texts["train"], Y["train"])) for j in range(12)]
    lists = [[IDS[j] for j in Y["train"][i].indices if j != 11] for i in range(Y["train"].shape[0])]
    model = XRLinear.fit(texts["train"], lists, label_ids=IDS, label_names=names)
    return model, texts, lists, names


def test_zero_shot_label_is_scored_from_its_text_only_when_asked(zero_shot_model, tmp_path):
    model, texts, lists, names = zero_shot_model
    doc = texts["train"][0] + " " + names[11]  # a document built to carry L11 too
    before = model.predict_csr([doc])
    plain, model = model, model.fit_zero_shot(texts["train"], lists)
    assert plain.zero_shot is None and "zero_shot_labels" not in plain.predict_settings  # a new model; the old stays
    assert model.zero_shot.labels.tolist() == [11] and model.predict_settings["zero_shot_labels"] is False
    off = model.predict_csr([doc])
    assert (off != before).nnz == 0  # the default predicts exactly as before
    on = model.predict([doc], k=3, zero_shot_labels=True)[0]
    assert "L11" in on["labels"] and 0 < on["scores"][on["labels"].index("L11")] <= model.zero_shot.ceiling
    plain = [t for t, row in zip(texts["dev"], lists) if row][:8]
    a, b = model.predict_csr(plain).tocoo(), model.predict_csr(plain, zero_shot_labels=True).tocsr()
    shared = np.asarray(b[a.row, a.col]).ravel()
    trained = (shared != 0) & (a.col != 11)  # L11's own weights (trained on negatives only) give way
    assert trained.sum() > 0 and np.array_equal(a.data[trained], shared[trained])  # the others keep theirs
    model.save(tmp_path / "zs")
    loaded = XMCModel.load(tmp_path / "zs")
    assert loaded.predict([doc], k=3, zero_shot_labels=True) == [on]
    assert loaded.predict([doc], k=3) == model.predict([doc], k=3)


def test_zero_shot_bounds_limit_what_a_document_gains(zero_shot_model, tmp_path):
    model, texts, lists, names = zero_shot_model
    model = model.fit_zero_shot(texts["train"], lists)
    doc = texts["train"][0] + " " + names[11].split()[0]  # one of L11's keywords: a middling match
    off = model.predict_csr([doc])
    on = model.predict_csr([doc], zero_shot_labels=True)
    (a, b), zs = model.zero_shot.text_fit, model.zero_shot
    cos = float((model.tfidf.from_texts([doc]) @ zs.rows.T).toarray()[0, 0]) - float(zs.centre[0])
    chance = 1.0 / (1.0 + np.exp(-(a * cos + b)))
    assert 0.1 < chance < 0.9 and on[0, 11] > off[0, 11]
    assert (model.predict_csr([doc], zero_shot_labels=True, zero_shot_per_doc=0) != off).nnz == 0
    kept = model.predict_csr([doc], zero_shot_labels=True, zero_shot_floor=chance - 0.05)
    assert (kept != on).nnz == 0  # a floor under the label's chance keeps it, at the same score
    assert (model.predict_csr([doc], zero_shot_labels=True, zero_shot_floor=chance + 0.05) != off).nnz == 0
    for key, bad in (("zero_shot_per_doc", -1), ("zero_shot_per_doc", 1.5), ("zero_shot_floor", 1.0)):
        with pytest.raises(ModelError) as err:
            model.predict([doc], **{key: bad})
        assert key in str(err.value) and "\n" not in str(err.value)
    model.predict_settings["zero_shot_floor"] = chance + 0.05  # a setting saved with the model, read back
    model.save(tmp_path / "floor")
    model.predict_settings["zero_shot_floor"] = 0.0
    assert (XMCModel.load(tmp_path / "floor").predict_csr([doc], zero_shot_labels=True) != off).nnz == 0


def test_a_combination_hands_its_zero_shot_settings_to_every_member(zero_shot_model, tmp_path):
    from xtransformer import Combination

    model, texts, lists, names = zero_shot_model
    combo = Combination([model, XRLinear.fit(texts["train"], lists, label_ids=IDS, label_names=names)])
    combo = combo.fit_zero_shot(texts["train"], lists)
    assert {"zero_shot_labels", "zero_shot_per_doc", "zero_shot_floor"} <= set(combo.predict_settings)
    doc = texts["train"][0] + " " + names[11]
    off, on = combo.predict_csr([doc]), combo.predict_csr([doc], zero_shot_labels=True)
    assert on[0, 11] > off[0, 11]
    combo.predict_settings["zero_shot_per_doc"] = 0  # saved, read back, handed to the members
    combo.save(tmp_path / "combo")
    loaded = XMCModel.load(tmp_path / "combo")
    assert (loaded.predict_csr([doc], zero_shot_labels=True) != off).nnz == 0
    assert (loaded.predict_csr([doc], zero_shot_labels=True, zero_shot_per_doc=5) != on).nnz == 0


def test_zero_shot_needs_a_label_without_documents(zero_shot_model):
    model, texts, _, _ = zero_shot_model
    _, Y, _ = toy_xmc()
    every = [[IDS[j] for j in Y["train"][i].indices] for i in range(Y["train"].shape[0])]
    fresh = XRLinear.fit(texts["train"], every, label_ids=IDS)
    with pytest.raises(ModelError) as err:
        fresh.fit_zero_shot(texts["train"], every)
    assert "no zero-shot label" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ModelError, match="zero_shot_labels"):
        fresh.predict(texts["dev"][:1], zero_shot_labels=True)  # a model without the part: named setting


def test_command_line_scores_labels_without_documents_from_label_text(tmp_path, capsys):
    from run_helpers import write_text_dataset

    from xtransformer.cli import add_labels_main

    texts, Y, _ = toy_xmc()
    lists = [[IDS[j] for j in Y["train"][i].indices if j != 11] for i in range(Y["train"].shape[0])]
    XRLinear.fit(texts["train"], lists, label_ids=IDS).save(tmp_path / "model")  # named by their ids only
    label_text = [f"{IDS[j]}\t{' '.join(keywords(j, texts['train'], Y['train']))}" for j in range(12)]
    data = write_text_dataset(
        tmp_path / "data", {"train": (texts["train"], [" ".join(r) for r in lists])}, label_text=label_text
    )
    argv = ["--model", str(tmp_path / "model"), "--data", str(data), "--output", str(tmp_path / "zs"), "--zero-shot"]
    assert add_labels_main(argv) == 0 and "1 labels without documents" in capsys.readouterr().err
    model = XMCModel.load(tmp_path / "zs")
    assert model.label_names[11] == label_text[11].split("\t")[1]
    doc = texts["train"][0] + " " + model.label_names[11]
    assert "L11" in model.predict([doc], k=3, zero_shot_labels=True)[0]["labels"]
    bad = write_text_dataset(tmp_path / "bad", {"train": (texts["train"][:2], ["L1 X9", "L2"])})
    argv[3], argv[5] = str(bad), str(tmp_path / "zs2")
    assert add_labels_main(argv) == 2 and "'X9' of train_labels.txt is not one of the model's labels" in (
        capsys.readouterr().err
    )
