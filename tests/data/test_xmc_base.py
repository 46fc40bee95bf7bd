"""PECOS's xmc-base layout (``data/xmcbase.py``), the named datasets' published sizes
(``data/catalog.py``) and the dataset's own TF-IDF rows (``tfidf=given``), on folders the tests write."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from run_helpers import TOY_LABEL_NAMES, write_xmc_base_toy
from tiny_models import toy_xmc

from xtransformer.data import DataError, TfidfConfig, catalog, load_dataset
from xtransformer.data.catalog import DatasetEntry
from xtransformer.data.inputs import LabeledData
from xtransformer.data.tfidf import tfidf_key
from xtransformer.data.xmcbase import FILES
from xtransformer.utils.io import settings_key


@pytest.fixture()
def toy(tmp_path: Path) -> Path:
    return write_xmc_base_toy(tmp_path / "data" / "toy-xmc")


@pytest.fixture()
def named(monkeypatch: pytest.MonkeyPatch) -> DatasetEntry:
    """A catalog entry for the toy folder, with its true counts."""
    e = DatasetEntry("toy-xmc", "toy", "xmc-base", {"train": 128, "test": 32}, 12, "the tests", files=FILES)
    monkeypatch.setitem(catalog.ENTRIES, e.name, e)
    return e


def test_reader_texts_labels_names_carved_dev_and_test(toy: Path) -> None:
    ds = load_dataset(str(toy), cache_dir=toy.parent / "cache")
    assert sorted(ds.splits) == ["dev", "test", "train"] and ds.dev_carved_from_train and ds.eval_split == "test"
    assert (len(ds.splits["train"]), len(ds.splits["dev"]), len(ds.splits["test"])) == (115, 13, 32)  # 10% carved
    assert list(ds.vocab.ids) == [str(j) for j in range(12)] and ds.label_text == TOY_LABEL_NAMES
    texts, Y, _ = toy_xmc()
    test = ds.splits["test"]
    assert test.texts == texts["test"] and (Y["test"] != test.Y).nnz == 0 and test.X is None  # rows only when asked
    with_rows = load_dataset(str(toy), given_tfidf=True, max_docs=20)
    assert all(s.X is not None and s.X.shape[0] == len(s) for s in with_rows.splits.values())
    assert len(with_rows.splits["test"]) == 20  # max_docs applies to the rows as to the texts


def test_label_names_default_to_the_column_numbers(tmp_path: Path) -> None:
    folder = write_xmc_base_toy(tmp_path / "plain", names=False)
    ds = load_dataset(str(folder))
    assert ds.label_text == list(ds.vocab.ids) == [str(j) for j in range(12)] and ds.n_label_text_missing == 12


def _shorter_texts(folder: Path) -> None:
    lines = (folder / "X.trn.txt").read_text().splitlines(keepends=True)
    (folder / "X.trn.txt").write_text("".join(lines[:-1]))


def _bad_npz(folder: Path) -> None:
    (folder / "Y.tst.npz").write_bytes(b"not an archive")


def _wider_test_labels(folder: Path) -> None:
    Y = sp.load_npz(folder / "Y.tst.npz")
    sp.save_npz(folder / "Y.tst.npz", sp.hstack([Y, sp.csr_matrix((Y.shape[0], 1))], format="csr"))


def _fewer_given_rows(folder: Path) -> None:
    X = sp.load_npz(folder / "tfidf-attnxml/X.trn.npz")
    sp.save_npz(folder / "tfidf-attnxml/X.trn.npz", X[:-2])


def _names_short(folder: Path) -> None:
    (folder / "output-items.txt").write_text("a\nb\n")


@pytest.mark.parametrize(
    "spoil, where, message",
    [
        (_shorter_texts, "Y.trn.npz", "128 label rows but X.trn.txt has 127 lines"),
        (_bad_npz, "Y.tst.npz", "not a sparse matrix saved with scipy.sparse.save_npz"),
        (_wider_test_labels, "Y.tst.npz", "13 label columns, train has 12"),
        (_fewer_given_rows, "tfidf-attnxml/X.trn.npz", "126 rows but X.trn.txt has 128 lines"),
        (_names_short, "output-items.txt", "2 label names, the label matrices have 12 columns"),
    ],
)
def test_bad_files_are_one_line_naming_the_file(toy: Path, spoil, where: str, message: str) -> None:
    spoil(toy)
    with pytest.raises(DataError) as err:
        load_dataset(str(toy), given_tfidf=True)
    assert str(err.value).startswith(f"{toy / where}: ") and message in str(err.value)
    assert "\n" not in str(err.value)


def test_given_rows_are_asked_of_a_layout_that_has_them(toy: Path, tmp_path: Path) -> None:
    shutil.rmtree(toy / "tfidf-attnxml")
    with pytest.raises(DataError, match="tfidf.source=given: no tfidf-attnxml/X.trn.npz"):
        load_dataset(str(toy), given_tfidf=True)
    load_dataset(str(toy))  # without them the texts are all a run needs


def test_published_sizes_checked_for_the_entrys_own_folder(toy: Path, named: DatasetEntry, monkeypatch, caplog) -> None:
    data_dir = str(toy.parent)
    assert len(load_dataset("toy-xmc", data_dir=data_dir).splits["test"]) == 32
    monkeypatch.setitem(catalog.ENTRIES, "toy-xmc", DatasetEntry(**{**named.__dict__, "docs": {"train": 130}}))
    with pytest.raises(DataError) as err:
        load_dataset("toy-xmc", data_dir=data_dir, max_docs=10)  # counted in the files, before max_docs
    assert str(err.value) == f"{toy / 'X.trn.txt'}: 128 documents, but toy-xmc's published train split has 130"
    # data.path: another folder read under the entry's name; its sizes are its own
    assert len(load_dataset("toy-xmc", data_dir=data_dir, path=str(toy)).splits["test"]) == 32
    monkeypatch.setitem(catalog.ENTRIES, "toy-xmc", DatasetEntry(**{**named.__dict__, "labels": 10}))
    with caplog.at_level(logging.WARNING, logger="xtransformer.data.catalog"):
        load_dataset("toy-xmc", data_dir=data_dir)  # a label count that differs is reported, not refused
    assert "toy-xmc: 12 labels, the published count is 10 (+2)" in caplog.text


def test_a_missing_named_dataset_names_the_command_that_gets_it(tmp_path: Path) -> None:
    with pytest.raises(DataError) as err:
        load_dataset("wiki10-31k", data_dir=str(tmp_path))
    line = str(err.value)
    assert f"run `xmc-data get wiki10-31k --dir {tmp_path}`" in line and catalog.entry("wiki10-31k").url in line


def test_catalog_holds_the_published_sizes() -> None:
    e = catalog.entry("eurlex-4k")
    assert (e.docs, e.labels) == ({"train": 15449, "test": 3865}, 3956)
    assert e.url == "https://archive.org/download/pecos-dataset/xmc-base/eurlex-4k.tar.gz"
    assert catalog.entry("wiki10-31k").archive_bytes == 162277861
    assert catalog.entry("amazon-670k").docs == {"train": 490449, "test": None}
    assert not catalog.entry("reuters21578").downloadable and "not published" in catalog.entry("eurlex57k").source
    configs = Path(__file__).resolve().parents[2] / "configs" / "data"
    assert set(catalog.ENTRIES) <= {p.stem for p in configs.glob("*.yaml")}
    with pytest.raises(DataError, match="no dataset called 'nope'; the named ones are reuters21578, eurlex57k"):
        catalog.entry("nope")


def test_given_rows_change_the_tfidf_key_and_nothing_for_text(toy: Path) -> None:
    texts, Y, _ = toy_xmc()
    data = LabeledData.build(texts["train"], Y["train"])
    text_settings = {k: v for k, v in TfidfConfig().training_settings().items() if k != "source"}
    assert TfidfConfig().training_settings()["source"] == "text"  # in the records, not in the key
    assert tfidf_key(data.key, TfidfConfig()) == settings_key("tfidf", data.key, text_settings)
    assert tfidf_key(data.key, TfidfConfig(source="given")) != tfidf_key(data.key, TfidfConfig())
    rows = sp.random(len(data), 7, density=0.5, format="csr", dtype=np.float32, random_state=0)
    both = LabeledData(data.Y, data.label_ids, data.label_names, data.texts, rows)
    assert both.key != data.key  # the given rows are part of the documents' content
    with pytest.raises(DataError, match=r"tfidf.source='shipped': expected one of \['text', 'given'\]"):
        TfidfConfig(source="shipped")


def test_xrlinear_trains_on_the_given_rows_and_predicts_from_rows(toy: Path) -> None:
    from xtransformer.methods.xrlinear import XRLinear

    ds = load_dataset(str(toy), given_tfidf=True)
    train, test = LabeledData.from_split(ds, "train"), LabeledData.from_split(ds, "test")
    model = XRLinear.fit(train, tfidf={"source": "given"})
    assert not model.takes_texts and model.tfidf.n_features == train.features.shape[1]
    assert model.evaluate(test).metrics["P@1"] > 80  # scored on the test rows, not by re-reading texts
    assert (model.predict_features_csr(test.features) != model.evaluate(test).predictions).nnz == 0
    with pytest.raises(DataError, match="trained on given features"):
        model.predict_csr(test.texts[:2])
    with pytest.raises(DataError, match="tfidf.source=given: method=xrlinear got no TF-IDF rows"):
        XRLinear.fit(test.texts, test.Y, tfidf={"source": "given"})


def test_transformer_methods_refuse_given_rows_in_one_line(toy: Path) -> None:
    from xtransformer.methods import method_class
    from xtransformer.pipeline.settings import compose_settings

    data = LabeledData.from_split(load_dataset(str(toy), given_tfidf=True), "train")
    for method in ("xtransformer", "xrtransformer"):
        s = compose_settings(f"method={method}", "tfidf=given").main
        with pytest.raises(DataError, match=f"tfidf=given: method={method} computes its rankers' TF-IDF"):
            method_class(method)._check(data, s)
