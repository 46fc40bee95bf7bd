"""Data layer: formats, label vocabulary, dev carving, TF-IDF cache, and every bad-input error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from run_helpers import write_text_dataset

from xtransformer.data import (
    DataError,
    LabelVocab,
    load_dataset,
    read_xc_sparse,
    tfidf_features,
    write_xc_sparse,
)
from xtransformer.data.tfidf import TfidfConfig
from xtransformer.utils.io import save_csr

TRAIN = (
    [f"doc {i} about {'wheat grain' if i % 2 else 'oil crude'} market" for i in range(20)],
    ["wheat grain" if i % 2 else "c_871b5612" for i in range(20)],
)
TEST = (["grain prices", "crude oil"], ["grain", "c_871b5612 wheat"])


@pytest.fixture
def toy(tmp_path):
    return write_text_dataset(
        tmp_path / "toy",
        {"train": TRAIN, "test": TEST},
        label_map=["c_871b5612", "grain", "wheat", "rare"],
        label_text=["c_871b5612\tcrude oil\tpetroleum | oil", "grain\tgrain", "wheat\twheat"],
    )


def test_text_layout_vocab_and_carved_dev(toy, tmp_path):
    ds = load_dataset(str(toy), cache_dir=tmp_path / "cache", dev_fraction=0.2, dev_seed=3)
    assert ds.vocab.ids == ["c_871b5612", "grain", "wheat", "rare"]  # label_map order, string ids
    assert set(ds.splits) == {"train", "dev", "test"} and ds.dev_carved_from_train
    assert len(ds.splits["train"]) == 16 and len(ds.splits["dev"]) == 4
    assert ds.eval_split == "test"
    Y = ds.splits["test"].Y
    assert sp.isspmatrix_csr(Y) and Y.shape == (2, 4)
    assert Y.toarray().tolist() == [[0, 1, 0, 0], [1, 0, 1, 0]]
    assert ds.label_text[0] == "crude oil (petroleum | oil)" and ds.label_text[3] == "rare"
    assert ds.n_label_text_missing == 1
    summary = ds.summary()
    assert summary["labels_without_train_docs"] == 1  # "rare" stays in the label space
    # the carve is seeded: same seed, same split; the union is the original train
    again = load_dataset(str(toy), cache_dir=tmp_path / "cache", dev_fraction=0.2, dev_seed=3)
    assert again.splits["dev"].texts == ds.splits["dev"].texts
    assert sorted(ds.splits["dev"].texts + ds.splits["train"].texts) == sorted(TRAIN[0])


def test_holdout_split_leaves_training_and_is_the_studies_draw(toy, tmp_path):
    """``data.holdout=N``: N training documents become split ``holdout`` and leave train (after the
    dev carve); the rows are experiments/common.py's ``holdout_rows`` draw over what train had."""
    carved = load_dataset(str(toy), cache_dir=tmp_path / "cache", dev_fraction=0.2)
    ds = load_dataset(str(toy), cache_dir=tmp_path / "cache", dev_fraction=0.2, holdout=5, eval_split="holdout")
    assert ds.eval_split == "holdout" and {k: len(v) for k, v in ds.splits.items()} == {
        "train": 11,
        "dev": 4,
        "test": 2,
        "holdout": 5,
    }
    perm = np.random.default_rng(0).permutation(16)  # holdout_rows(16, 5, seed=0)
    before = carved.splits["train"].texts
    assert ds.splits["holdout"].texts == [before[i] for i in sorted(perm[:5])]
    assert ds.splits["train"].texts == [before[i] for i in sorted(perm[5:])]
    assert ds.splits["dev"].texts == carved.splits["dev"].texts  # dev is not touched
    other = load_dataset(str(toy), cache_dir=tmp_path / "cache", dev_fraction=0.2, holdout=5, holdout_seed=1)
    assert other.eval_split == "test" and other.splits["holdout"].texts != ds.splits["holdout"].texts


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"holdout": 16}, r"^data\.holdout=16 leaves no holdout or no train documents out of 16"),
        ({"holdout": -1}, r"^data\.holdout=-1: must be 0"),
        ({"eval_split": "holdout"}, r"data\.eval_split='holdout' but .* needs data\.holdout=N"),
        ({"holdout": 5, "holdout_seed": -1}, r"^data\.holdout_seed=-1: must be an int >= 0"),
        ({"dev_seed": -2}, r"^data\.dev_seed=-2: must be an int >= 0"),
    ],
)
def test_bad_holdout_settings_name_the_setting(toy, tmp_path, settings, message):
    with pytest.raises(DataError, match=message):
        load_dataset(str(toy), cache_dir=tmp_path / "cache", dev_fraction=0.2, **settings)


def test_vocab_without_label_map_keeps_test_only_labels(tmp_path):
    folder = write_text_dataset(tmp_path / "d", {"train": TRAIN, "dev": TRAIN, "test": (["x"], ["only_in_test"])})
    ds = load_dataset(str(folder), cache_dir=tmp_path / "c")
    assert "only_in_test" in ds.vocab
    assert ds.summary()["splits"]["test"]["labels_not_in_train"] == 1
    assert not ds.dev_carved_from_train and ds.eval_split == "test"


def test_vocab_save_load_and_mismatch(tmp_path):
    v = LabelVocab(["a", "c_1", "b"])
    v.save(tmp_path / "v.txt")
    assert LabelVocab.load(tmp_path / "v.txt") == v
    with pytest.raises(DataError, match="index 1"):
        v.check_same(LabelVocab(["a", "b", "c_1"]))
    with pytest.raises(DataError, match="duplicate"):
        LabelVocab(["a", "a"])


def test_archive_is_unpacked_once_into_cache(tmp_path):
    import tarfile

    src = write_text_dataset(tmp_path / "src", {"train": TRAIN, "test": TEST})
    data_dir = tmp_path / "data"
    (data_dir / "mini").mkdir(parents=True)
    with tarfile.open(data_dir / "mini" / "mini.tar.gz", "w:gz") as tar:
        for p in src.iterdir():
            tar.add(p, arcname=p.name)
    ds = load_dataset("mini", data_dir=str(data_dir), cache_dir=tmp_path / "cache")
    assert ds.root.parent == tmp_path / "cache" / "datasets"
    assert len(ds.splits["test"]) == 2
    mtime = (ds.root / "train_texts.txt").stat().st_mtime_ns
    again = load_dataset("mini", data_dir=str(data_dir), cache_dir=tmp_path / "cache")
    assert again.root == ds.root and (again.root / "train_texts.txt").stat().st_mtime_ns == mtime


def test_env_var_sets_data_dir(tmp_path, monkeypatch):
    write_text_dataset(tmp_path / "envdata" / "toy2", {"train": TRAIN, "test": TEST})
    monkeypatch.setenv("XMC_DATA_DIR", str(tmp_path / "envdata"))
    assert load_dataset("toy2", cache_dir=tmp_path / "c").n_labels == 3


def test_real_reuters_loads(tmp_path):
    ds = load_dataset("reuters21578", cache_dir=tmp_path / "cache")
    s = ds.summary()
    assert s["n_labels"] == 90 and s["splits"]["test"]["docs"] == 3019
    assert s["splits"]["train"]["docs"] + s["splits"]["dev"]["docs"] == 7770
    assert ds.label_text[ds.vocab.index("acq")] == "Mergers/Acquisitions"


def test_xc_sparse_round_trip_and_npz_layout(tmp_path):
    rng = np.random.default_rng(0)
    X = sp.random(30, 50, density=0.1, format="csr", dtype=np.float32, random_state=0)
    Y = sp.csr_matrix((rng.random((30, 7)) < 0.3).astype(np.float32))
    Y = sp.csr_matrix(Y + sp.csr_matrix((np.ones(30), (np.arange(30), np.zeros(30))), shape=(30, 7)))
    Y.data[:] = 1.0
    write_xc_sparse(X, Y, tmp_path / "xc" / "train.txt")
    X2, Y2 = read_xc_sparse(tmp_path / "xc" / "train.txt")
    assert (Y2 != Y).nnz == 0 and np.allclose(X2.toarray(), X.toarray(), atol=1e-5)
    write_xc_sparse(X, Y, tmp_path / "xc" / "test.txt")
    ds = load_dataset(str(tmp_path / "xc"), cache_dir=tmp_path / "c")
    assert ds.vocab.ids == [str(i) for i in range(7)] and not ds.has_texts
    feats = tfidf_features(ds, cache_dir=tmp_path / "c")
    assert np.allclose(sp.linalg.norm(feats["test"], axis=1), 1.0, atol=1e-5)

    npz = tmp_path / "npz"
    for s in ("train", "test"):
        save_csr(X, npz / f"X.{s}.npz")
        save_csr(Y, npz / f"Y.{s}.npz")
    ds2 = load_dataset(str(npz), cache_dir=tmp_path / "c")
    assert ds2.splits["test"].X.shape == (30, 50) and (ds2.splits["test"].Y != Y).nnz == 0


def test_tfidf_settings_and_cache(toy, tmp_path):
    ds = load_dataset(str(toy), cache_dir=tmp_path / "c")
    cfg = {"min_df": 1, "max_features": 50}
    X = tfidf_features(ds, cfg, cache_dir=tmp_path / "c")
    assert X["train"].dtype == np.float32 and X["train"].shape[1] <= 50
    assert np.allclose(sp.linalg.norm(X["test"], axis=1), 1.0, atol=1e-5)
    folders = list((tmp_path / "c" / "stages" / "tfidf").iterdir())
    assert len(folders) == 1 and (folders[0] / "_COMPLETE").exists()
    # second call reads the cache: same matrix, no new folder; other settings, other key
    X2 = tfidf_features(ds, cfg, cache_dir=tmp_path / "c")
    assert (X2["test"] != X["test"]).nnz == 0
    tfidf_features(ds, {"min_df": 1, "max_features": 20}, cache_dir=tmp_path / "c")
    assert len(list((tmp_path / "c" / "stages" / "tfidf").iterdir())) == 2


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_given_feature_rows_are_unit_rows_and_the_input_is_untouched(dtype):
    """Feature rows given instead of texts come back l2-normalised (an all-zero row stays zero) as
    float32 csr; the caller's matrix is left as it was."""
    from xtransformer.data.tfidf import given_features

    scale = sp.diags(np.where(np.arange(30) == 3, 0.0, 5.0).astype(dtype))  # row 3 all zero
    X = sp.csr_matrix(scale @ sp.random(30, 12, density=0.3, format="csr", dtype=dtype, random_state=0))
    X.eliminate_zeros()
    X0 = X.copy()
    features, rows = given_features(X)
    assert rows.dtype == np.float32 and sp.isspmatrix_csr(rows) and features.n_features == 12
    norms = np.sqrt(np.asarray(rows.multiply(rows).sum(axis=1))).ravel()
    np.testing.assert_allclose(norms[np.arange(30) != 3], 1.0, rtol=1e-6)
    assert norms[3] == 0
    np.testing.assert_allclose(
        rows.toarray() * np.linalg.norm(X.toarray(), axis=1, keepdims=True), X.toarray(), rtol=1e-5
    )
    assert (X != X0).nnz == 0 and X.dtype == dtype


def test_given_unit_rows_are_taken_as_they_are():
    """Rows already l2-normalised in float32 (TF-IDF rows as feature files hold them) are not
    copied: a model trains on the caller's matrix, as it would on its own TF-IDF rows."""
    from xtransformer.data.tfidf import given_features
    from xtransformer.utils.rows import unit_rows

    X = unit_rows(sp.random(40, 25, density=0.3, format="csr", dtype=np.float32, random_state=1))
    _, rows = given_features(X)
    assert np.shares_memory(rows.data, X.data) and np.shares_memory(rows.indices, X.indices)  # the same arrays
    off = X.copy()
    off.data[:3] *= 1.01  # one row a little off unit length: normalised into a copy, as any other input
    _, rows = given_features(off)
    assert not np.shares_memory(rows.data, off.data) and abs(float(rows[0].multiply(rows[0]).sum()) - 1) < 1e-5


def test_tfidf_lead_block_is_the_documents_opening_weighted_beside_the_body(toy, tmp_path):
    from sklearn.feature_extraction.text import TfidfVectorizer

    ds = load_dataset(str(toy), cache_dir=tmp_path / "c")
    body = tfidf_features(ds, {"min_df": 1}, cache_dir=tmp_path / "c")
    X = tfidf_features(ds, {"min_df": 1, "lead_chars": 12, "lead_weight": 0.5}, cache_dir=tmp_path / "c")
    lead_vec = TfidfVectorizer(
        min_df=1, ngram_range=(1, 2), sublinear_tf=True, strip_accents="unicode", dtype=np.float32
    ).fit([t[:12] for t in ds.splits["train"].texts])
    for split in ("train", "test"):
        lead = lead_vec.transform([t[:12] for t in ds.splits[split].texts]).toarray()
        want = np.hstack([body[split].toarray(), 0.5 * lead])
        want /= np.linalg.norm(want, axis=1, keepdims=True)
        assert X[split].shape == want.shape and np.allclose(X[split].toarray(), want, atol=1e-6)
    # only the opening counts: a word after the first 12 characters is in the body block alone
    assert X["train"].shape[1] == body["train"].shape[1] + len(lead_vec.vocabulary_) < 2 * body["train"].shape[1]


def test_tfidf_lead_settings_fail_naming_the_key():
    with pytest.raises(DataError, match=r"tfidf.lead_chars"):
        TfidfConfig(lead_chars=-1).check()
    with pytest.raises(DataError, match=r"tfidf.lead_weight"):
        TfidfConfig(lead_chars=100, lead_weight=0)


# ---- bad input: one clear error naming the file and the line ----


def test_error_line_count_mismatch(tmp_path):
    folder = write_text_dataset(tmp_path / "d", {"train": (["a b", "c d", "e f"], ["x", "y"])})
    with pytest.raises(DataError, match=r"train_labels.txt.*3 lines.*has 2"):
        load_dataset(str(folder), cache_dir=tmp_path / "c")


def test_error_empty_label_line(tmp_path):
    folder = write_text_dataset(tmp_path / "d", {"train": (["a b", "c d", "e f"], ["x", "", "y"])})
    with pytest.raises(DataError, match=r"train_labels.txt:2: empty label line"):
        load_dataset(str(folder), cache_dir=tmp_path / "c")
    ds = load_dataset(str(folder), cache_dir=tmp_path / "c", allow_empty_labels=True, dev_fraction=0.34)
    assert sum(len(s) for s in ds.splits.values()) == 3


def test_error_empty_document(tmp_path):
    folder = write_text_dataset(tmp_path / "d", {"train": (["a b", "   ", "e f"], ["x", "y", "x"])})
    with pytest.raises(DataError, match=r"train_texts.txt:2: empty document"):
        load_dataset(str(folder), cache_dir=tmp_path / "c")


def test_error_undecodable_bytes(tmp_path):
    folder = write_text_dataset(tmp_path / "d", {"train": (["a b", "c d", "e f"], ["x", "y", "x"])})
    (folder / "train_texts.txt").write_bytes(b"a b\nc d\ne \xff\xfe f\n")
    with pytest.raises(DataError, match=r"train_texts.txt:3: undecodable bytes"):
        load_dataset(str(folder), cache_dir=tmp_path / "c")


def test_error_missing_file_and_split(tmp_path):
    folder = write_text_dataset(tmp_path / "d", {"train": (["a b"] * 4, ["x"] * 4), "test": (["a"], ["x"])})
    (folder / "test_labels.txt").unlink()
    with pytest.raises(DataError, match=r"test_labels.txt: split 'test' is incomplete"):
        load_dataset(str(folder), cache_dir=tmp_path / "c")
    (folder / "train_texts.txt").unlink()
    (folder / "train_labels.txt").unlink()
    with pytest.raises(DataError, match=r"missing split 'train'|no dataset files"):
        load_dataset(str(folder), cache_dir=tmp_path / "c")
    folder = write_text_dataset(tmp_path / "e", {"train": (["a"] * 20, ["x"] * 20), "test": (["a"], ["x"])})
    with pytest.raises(DataError, match=r"data.eval_split='validation'"):
        load_dataset(str(folder), cache_dir=tmp_path / "c", eval_split="validation")


def test_error_unknown_dataset_name(tmp_path):
    with pytest.raises(DataError, match=r"unknown dataset 'no_such_data'.*reuters21578"):
        load_dataset("no_such_data", cache_dir=tmp_path / "c")


def test_error_label_not_in_label_map(tmp_path):
    folder = write_text_dataset(
        tmp_path / "d",
        {"train": (["a b"] * 4, ["x"] * 4), "test": (["a", "b", "c"], ["x", "x", "x zz"])},
        label_map=["x", "y"],
    )
    with pytest.raises(DataError, match=r"test_labels.txt:3: label id 'zz' is not in the label map"):
        load_dataset(str(folder), cache_dir=tmp_path / "c")


def test_error_bad_xc_line(tmp_path):
    (tmp_path / "xc").mkdir()
    (tmp_path / "xc" / "train.txt").write_text("2 5 3\n0,1 0:1.0 3:0.5\n2 1:0.3 9:1\n")
    with pytest.raises(DataError, match=r"train.txt:3: feature index 9 outside"):
        load_dataset(str(tmp_path / "xc"), cache_dir=tmp_path / "c")


def _rewrite(folder: Path, name: str, fn) -> None:
    path = folder / name
    path.write_bytes(fn(path.read_bytes()))


@pytest.mark.parametrize("how", ["bom", "crlf", "cr"])
def test_bom_and_every_line_end_read_alike(toy, tmp_path, how):
    """A UTF-8 BOM is no label (it made a phantom "\\ufeffwheat"); CRLF and CR-only files align."""
    ref = load_dataset(str(toy), cache_dir=tmp_path / "c")
    change = {
        "bom": lambda b: b"\xef\xbb\xbf" + b,
        "crlf": lambda b: b.replace(b"\n", b"\r\n"),
        "cr": lambda b: b.replace(b"\n", b"\r"),
    }[how]
    for name in ("train_texts.txt", "train_labels.txt", "label_map.txt", "label_text.txt"):
        _rewrite(toy, name, change)
    ds = load_dataset(str(toy), cache_dir=tmp_path / "c")
    assert ds.vocab == ref.vocab and ds.splits["train"].texts == ref.splits["train"].texts
    assert (ds.splits["train"].Y != ref.splits["train"].Y).nnz == 0 and ds.label_text == ref.label_text


def test_bom_does_not_make_a_phantom_label_without_label_map(tmp_path):
    folder = write_text_dataset(tmp_path / "d", {"train": (["a b"] * 10, ["x y"] * 10)})
    _rewrite(folder, "train_labels.txt", lambda b: b"\xef\xbb\xbf" + b)
    assert load_dataset(str(folder), cache_dir=tmp_path / "c").vocab.ids == ["x", "y"]


@pytest.mark.parametrize("name, line", [("train_labels.txt", 3), ("label_map.txt", 2)])
def test_error_comma_in_label_id(toy, tmp_path, name, line):
    """Comma-separated labels (the XC convention) would be one compound label: rejected, line named."""
    lines = (toy / name).read_text().splitlines()
    lines[line - 1] = "grain,wheat"
    (toy / name).write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=rf"{name}:{line}: label id 'grain,wheat' contains a comma.*'grain wheat'"):
        load_dataset(str(toy), cache_dir=tmp_path / "c")


@pytest.mark.parametrize("value", [-5, 0, 2.5, "abc", True])
def test_error_max_docs_not_positive(toy, tmp_path, value):
    with pytest.raises(
        DataError, match=rf"^data\.max_docs={value!r}: (must be null .* or an int >= 1|expected an int or null)$"
    ):
        load_dataset(str(toy), cache_dir=tmp_path / "c", max_docs=value)


def test_error_custom_data_without_path(tmp_path):
    with pytest.raises(DataError, match=r"^data.path is not set: data=custom needs data.path="):
        load_dataset({"name": "custom", "path": "???"}, cache_dir=tmp_path / "c")


def test_unseen_eval_labels_counted(tmp_path):
    folder = write_text_dataset(
        tmp_path / "d",
        {"train": (["a"] * 10, ["x"] * 10), "test": (["a", "b", "c", "d"], ["x", "y z", "x y", "x"])},
        label_map=["x", "y", "z", "w"],
    )
    ds = load_dataset(str(folder), cache_dir=tmp_path / "c")
    assert ds.unseen_labels() == {
        "split": "test",
        "labels": 2,
        "positives": 3,
        "docs": 2,
        "docs_only_unseen": 1,
        "n_docs": 4,
    }
    assert ds.summary()["splits"]["test"]["labels_not_in_train"] == 2


def test_error_feature_only_data_for_a_text_method(tmp_path):
    (tmp_path / "xc").mkdir()
    (tmp_path / "xc" / "train.txt").write_text("".join(["20 5 2\n", *["0 0:1.0\n", "1 1:1.0\n"] * 10]))
    ds = load_dataset(str(tmp_path / "xc"), cache_dir=tmp_path / "c")
    with pytest.raises(DataError, match=r"method=xtransformer needs the documents' texts.*use method=xrlinear"):
        ds.require_texts("method=xtransformer")
