"""LinearForest: several label trees (k-means seeds seed, seed + 1, ...), their scores averaged."""

from __future__ import annotations

import numpy as np
import pytest

from xtransformer.indexing import IndexingConfig
from xtransformer.metrics import evaluate
from xtransformer.ranker import HierarchicalLinear, HierarchicalLinearConfig, LinearForest, RankerError, load_tree_model


@pytest.fixture(scope="module")
def reuters(reuters_tfidf):
    return reuters_tfidf


@pytest.fixture(scope="module")
def forest(reuters):
    from xtransformer.methods.xrlinear import fit_tree_model as tree_model

    X, ds = reuters
    icfg, mcfg = IndexingConfig(max_leaf_size=8, seed=3), HierarchicalLinearConfig(topk=5, threads=1)
    args = (4, mcfg, X["train"], ds.splits["train"].Y, ds.vocab.ids)
    one, _ = tree_model(icfg, *args)
    three, report = tree_model(icfg, *args, n_trees=3)
    return one, three, report


def test_n_trees_builds_trees_from_seed_on_and_the_first_is_the_single_tree(forest, reuters):
    X, ds = reuters
    one, three, report = forest
    assert isinstance(one, HierarchicalLinear) and isinstance(three, LinearForest) and len(three.trees) == 3
    # tree 0 is what n_trees: 1 builds (seed 3), so a forest only adds trees
    assert all((a != b).nnz == 0 for a, b in zip(three.trees[0].chain, one.chain))
    assert (three.trees[0].predict(X["dev"]) != one.predict(X["dev"])).nnz == 0
    # the other seeds split the labels differently
    leaves = [t.chain[-1].indices for t in three.trees]
    assert not np.array_equal(leaves[0], leaves[1]) and not np.array_equal(leaves[1], leaves[2])
    assert [r["n_clusters"] for r in report["trees"]] == [report["n_clusters"]] * 3
    assert three.n_weights == sum(t.n_weights for t in three.trees)


def test_forest_predicts_the_mean_of_its_trees_top_k(forest, reuters):
    X, ds = reuters
    _, three, _ = forest
    got = three.predict(X["dev"]).toarray()
    each = [t.predict(X["dev"]).toarray() for t in three.trees]  # top-5 each, the rest 0
    mean = sum(each) / 3
    n = mean.shape[0]
    assert ((got > 0).sum(axis=1) <= 5).all() and ((got > 0).sum(axis=1) == np.minimum(5, (mean > 0).sum(axis=1))).all()
    kept = got > 0
    np.testing.assert_allclose(got[kept], mean[kept], rtol=1e-6)
    # every kept score is at least every dropped one in its row
    assert all(got[i][kept[i]].min(initial=np.inf) >= mean[i][~kept[i]].max(initial=0) - 1e-6 for i in range(n))
    Y = ds.splits["dev"].Y
    floor = 100 * Y[:, np.asarray(Y.sum(axis=0)).ravel().argmax()].mean()  # the most frequent label (41%)
    assert evaluate(Y, three.predict(X["dev"]))["P@1"] > floor + 30
    # a prediction setting reaches every tree
    narrow = three.predict(X["dev"], topk=2)
    assert (np.diff(narrow.indptr) <= 2).all()


def test_forest_round_trips_and_a_folder_loads_as_what_it_holds(forest, reuters, tmp_path):
    X, _ = reuters
    one, three, _ = forest
    three.save(tmp_path / "forest")
    one.save(tmp_path / "tree")
    assert sorted(p.name for p in (tmp_path / "forest").iterdir() if p.is_dir()) == ["tree_0", "tree_1", "tree_2"]
    loaded = load_tree_model(tmp_path / "forest")
    assert isinstance(loaded, LinearForest) and isinstance(load_tree_model(tmp_path / "tree"), HierarchicalLinear)
    assert (loaded.predict(X["dev"]) != three.predict(X["dev"])).nnz == 0
    with pytest.raises(RankerError, match="LinearForest"):
        LinearForest.load(tmp_path / "tree")
    with pytest.raises(RankerError, match="at least 2 trees"):
        LinearForest([one])


def test_xrlinear_folder_with_a_forest_predicts_as_the_forest(reuters, tmp_path):
    from xtransformer import XMCModel, XRLinear

    _, ds = reuters
    train = ds.splits["train"]
    model = XRLinear.fit(
        train.texts,
        train.Y,
        label_ids=ds.vocab.ids,
        xrlinear={"indexing": {"max_leaf_size": 8}, "nr_splits": 4, "n_trees": 2, "model": {"threads": 1}},
    )
    assert isinstance(model.model, LinearForest)
    model.save(tmp_path / "xrlinear")
    loaded = XMCModel.load(tmp_path / "xrlinear")
    texts = ds.splits["dev"].texts[:50]
    want = model.model.predict(model.tfidf.from_texts(texts))
    assert isinstance(loaded, XRLinear) and isinstance(loaded.model, LinearForest)
    assert (loaded.predict_csr(texts) != want).nnz == 0
    # a per-call setting reaches every tree, and leaves the loaded model's own settings alone
    assert (np.diff(loaded.predict_csr(texts, topk=1).indptr) <= 1).all()
    assert (loaded.predict_csr(texts) != want).nnz == 0


def test_n_trees_settings_fail_naming_the_key():
    from xtransformer.methods.xrlinear import XRLinearConfig
    from xtransformer.methods.xrtransformer.config import FinalModelConfig, XRTransformerConfigError
    from xtransformer.settings import SettingsError

    with pytest.raises(SettingsError, match=r"xrlinear.n_trees=0: must be an int >= 1"):
        XRLinearConfig(n_trees=0)
    with pytest.raises(XRTransformerConfigError, match=r"xrtransformer.final.n_trees=2: needs tree: recluster"):
        FinalModelConfig(n_trees=2, tree="same")
    assert FinalModelConfig(n_trees=2).training_settings()["n_trees"] == 2
    assert XRLinearConfig(n_trees=3).training_settings()["n_trees"] == 3


def test_forest_trains_one_vs_all_added_labels_once_for_every_tree(forest, reuters):
    import scipy.sparse as sp

    from xtransformer.ranker.extend import added_labels_solver, train_one_vs_all

    _, three, _ = forest
    X, ds = reuters
    Y = ds.splits["train"].Y
    Y_all = sp.hstack([Y, Y[:, [0]]], format="csr")  # one new label: the documents of label 0
    calls = []

    def counted(*args):
        calls.append(1)
        return train_one_vs_all(*args)

    with added_labels_solver(counted):
        grown, _ = three.add_labels(X["train"], Y_all)
    assert len(calls) == 1  # one solve, whatever the number of trees
    new = [t.levels[-1].W.tocsc()[:, t.added_from :] for t in grown.trees]  # two leaves a label by default
    assert new[0].nnz > 0 and all((w[:, [j]] != new[0][:, [0]]).nnz == 0 for w in new for j in range(w.shape[1]))
    assert grown.predict(X["test"][:50], topk=91).shape[1] == Y.shape[1] + 1
