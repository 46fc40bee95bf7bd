"""Label disentanglement: counts -> overlapping leaf level, copies trained and merged, λ = 1 unchanged."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from xtransformer.data import load_dataset
from xtransformer.indexing import (
    ClusterChain,
    IndexingConfig,
    IndexingError,
    build_index,
    check_copies_fit,
    cluster_counts,
    cluster_quality,
    learn_overlap,
    reassign,
    save_quality_plots,
)
from xtransformer.metrics import evaluate
from xtransformer.ranker import HierarchicalLinear, HierarchicalLinearConfig, LinearRanker, RankerConfig, negative_mask
from xtransformer.ranker.copies import LabelCopies
from xtransformer.ranker.errors import RankerError


def onehot(codes, k: int) -> sp.csr_matrix:
    codes = np.asarray(codes)
    return sp.csr_matrix((np.ones(len(codes), np.float32), (np.arange(len(codes)), codes)), shape=(len(codes), k))


@pytest.fixture(scope="module")
def reuters(reuters_tfidf):
    """A slice of Reuters-21578 (train / dev) with its TF-IDF and a 16-cluster XR-Linear tree."""
    X, ds = reuters_tfidf
    Y = ds.splits["train"].Y
    chain, _ = build_index(IndexingConfig(n_clusters=16), Y, X_train_tfidf=X["train"])
    return X, ds, chain.subsample(16)


# ---------------------------------------------------------------------------------------------- reassign
def test_label_routed_to_two_clusters_gets_both_and_only_one_at_lambda_1():
    # label 0 lives in cluster 0; the search sends its 4 positives: 2 to cluster 0, 3 to cluster 1
    # (doc 3 reaches both); label 1 (cluster 1) is found in clusters 0 and 1; label 2 (cluster 0)
    # has no positives
    Y = sp.csr_matrix(np.array([[1, 0, 0], [1, 0, 0], [1, 1, 0], [1, 1, 0], [0, 1, 0]], np.float32))
    M = sp.csr_matrix(np.array([[1, 0, 0], [0, 1, 0], [0, 1, 0], [1, 1, 0], [0, 1, 0]], np.float32))
    C = onehot([0, 1, 0], 3)
    counts = cluster_counts(Y, M)
    np.testing.assert_array_equal(counts.toarray(), [[2, 3, 0], [1, 3, 0], [0, 0, 0]])
    two = reassign(C, counts, n_copies=2)
    np.testing.assert_array_equal(two.toarray(), [[1, 1, 0], [1, 1, 0], [1, 0, 0]])  # both clusters
    one = reassign(C, counts, n_copies=1)
    np.testing.assert_array_equal(one.toarray(), [[0, 1, 0], [0, 1, 0], [1, 0, 0]])  # the best only: 0 moved


def test_a_cluster_every_label_left_takes_one_back():
    Y = sp.csr_matrix(np.array([[1, 1], [1, 1], [1, 0]], np.float32))
    M = sp.csr_matrix(np.array([[0, 1], [0, 1], [1, 1]], np.float32))
    C = onehot([0, 1], 2)  # label 0's positives mostly reach cluster 1
    out = reassign(C, cluster_counts(Y, M), n_copies=1).toarray()
    np.testing.assert_array_equal(out, [[1, 0], [0, 1]])  # cluster 0 would be empty: label 0 stays
    np.testing.assert_array_equal(reassign(C, cluster_counts(Y, M), n_copies=2).toarray(), [[1, 1], [0, 1]])


def test_min_count_and_ties_prefer_the_current_cluster():
    C = onehot([2, 0], 3)
    counts = sp.csr_matrix(np.array([[4, 1, 4], [2, 2, 0]], np.float32))
    out = reassign(C, counts, n_copies=2, min_count=2).toarray()
    np.testing.assert_array_equal(out[0], [1, 0, 1])  # the count-1 pair is ignored
    out = reassign(C, counts, n_copies=1).toarray()
    np.testing.assert_array_equal(out, [[0, 0, 1], [1, 0, 0]])  # ties: stay where it was


def test_label_without_training_positives_keeps_its_cluster(reuters):
    X, ds, chain = reuters
    Y = ds.splits["train"].Y.tolil()
    Y[:, 5] = 0  # label 5 now has no training positive
    Y = Y.tocsr()
    Y.eliminate_zeros()
    M = sp.csr_matrix(np.ones((Y.shape[0], chain[-1].shape[1]), np.float32))  # every doc everywhere
    C = reassign(chain[-1], cluster_counts(Y, M), n_copies=3, max_cluster_growth=None)
    assert (C[5] != chain[-1][5]).nnz == 0
    assert C.getnnz(axis=1)[np.diff(sp.csc_matrix(Y).indptr) > 0].min() == 3


@pytest.mark.parametrize("growth", [None, 1.3])
def test_rows_have_at_most_lambda_clusters_none_empty(growth):
    L, K = 300, 12
    C = onehot(np.arange(L) % K, K)
    counts = sp.random(L, K, density=0.3, random_state=1, format="csr", dtype=np.float32)
    counts.data = np.ceil(counts.data * 20)
    for lam in (1, 2, 3, 4, 6):
        out = reassign(C, counts, lam, max_cluster_growth=growth)
        per_row = out.getnnz(axis=1)
        assert per_row.max() <= lam and per_row.min() >= 1
        assert out.getnnz(axis=0).min() >= 1  # no leaf cluster left without labels
        ClusterChain([sp.csr_matrix(np.ones((K, 1), np.float32)), out])  # a valid tree


def test_cap_bounds_cluster_growth():
    L, K = 120, 6
    C = onehot(np.arange(L) % K, K)
    counts = sp.csr_matrix(np.random.default_rng(2).integers(1, 9, (L, K)).astype(np.float32))
    out = reassign(C, counts, 3, max_cluster_growth=1.5)
    sizes = np.bincount(out.indices, minlength=K)
    firsts = reassign(C, counts, 1)  # where the labels' first clusters went (never refused)
    assert np.all(sizes <= np.maximum(np.floor(1.5 * L / K), np.bincount(firsts.indices, minlength=K)))
    assert out.nnz > L


# ---------------------------------------------------------------------------------------------- copies
def test_max_and_mean_merges_on_a_hand_built_score_matrix():
    copies, C_copies = LabelCopies.of(sp.csr_matrix(np.array([[1, 1, 0], [0, 0, 1], [1, 0, 1]], np.float32)))
    np.testing.assert_array_equal(copies.label_of, [0, 0, 1, 2, 2])
    np.testing.assert_array_equal(C_copies.indices, [0, 1, 2, 0, 2])
    # copies 0, 1 are label 0; 2 is label 1; 3, 4 are label 2. Row 1 reaches only one copy of label 2.
    S = sp.csr_matrix(np.array([[0.9, 0.5, 0.7, 0.2, 0.4], [0.1, 0.3, 0.0, 0.0, 0.8]], np.float32))
    copies.merge = "max"
    np.testing.assert_allclose(copies.merge_scores(S, k=3).toarray(), [[0.9, 0.7, 0.4], [0.3, 0.0, 0.8]])
    copies.merge = "mean"  # over the copies the row reached: unreached copies are not zeros
    np.testing.assert_allclose(copies.merge_scores(S, k=3).toarray(), [[0.7, 0.7, 0.3], [0.2, 0.0, 0.8]])
    top1 = copies.merge_scores(S, k=1).toarray()
    np.testing.assert_allclose(top1, [[0.7, 0, 0], [0, 0, 0.8]])  # mean: label 0 (0.7) ties label 1; lower id
    with pytest.raises(RankerError, match="merge"):
        LabelCopies.of(sp.eye(3, format="csr"), merge="sum")


def test_a_partition_has_no_copies():
    C = onehot([1, 0, 1], 2)
    copies, same = LabelCopies.of(C, "mean")
    assert copies is None and (same != C).nnz == 0


def test_lambda_1_bit_identical_chain_and_predictions(reuters):
    X, ds, chain = reuters
    Y = ds.splits["train"].Y
    cfg = HierarchicalLinearConfig()
    # λ = 1 in the config changes nothing in the key or the tree: the stage keys drop the new fields
    icfg = IndexingConfig(n_clusters=16)
    assert set(icfg.training_settings()) == {
        "name",
        "n_clusters",
        "max_leaf_size",
        "branching",
        "max_iter",
        "seed",
        "normalize_y_rows",
        "orphan_fallback",
        "n_copies",
    }
    again, _ = build_index(icfg, Y, X_train_tfidf=X["train"])
    assert again.subsample(16) == chain
    before = HierarchicalLinear.train(X["train"], Y, list(chain), cfg)
    after = HierarchicalLinear.train(X["train"], Y, list(chain), cfg, merge="mean")  # merge unused: no copies
    assert after.copies is None
    for a, b in zip(before.levels, after.levels):
        assert (a.W != b.W).nnz == 0 and (a.C != b.C).nnz == 0
    pa, pb = before.predict(X["dev"]), after.predict(X["dev"])
    assert (pa != pb).nnz == 0 and np.array_equal(pa.indices, pb.indices)


def test_overlapping_xrlinear_trains_copies_and_predicts_labels(reuters, tmp_path):
    X, ds, chain = reuters
    Y, Yd = ds.splits["train"].Y, ds.splits["dev"].Y
    cfg = HierarchicalLinearConfig(topk=5)
    new, report = learn_overlap(
        chain, X["train"], Y, IndexingConfig(n_clusters=16, n_copies=2, max_cluster_growth=None), cfg
    )
    C = new.leaf_assignment
    assert report["labels_in_multiple_clusters"] > 0 and C.getnnz(axis=1).max() == 2
    assert (new[0] != chain[0]).nnz == 0  # only the leaf level changes
    model = HierarchicalLinear.train(X["train"], Y, list(new), cfg)
    assert model.levels[-1].n_labels == C.nnz and model.n_labels == Y.shape[1]
    assert (model.chain[-1] != C).nnz == 0
    # copy p trains on its own cluster's rows: its positives are the label's, seen through that cluster
    pred = model.predict(X["dev"])
    assert pred.shape == Yd.shape and np.all(np.diff(pred.indptr) <= 5)
    rows = np.repeat(np.arange(pred.shape[0]), np.diff(pred.indptr))
    assert len(set(zip(rows, pred.indices))) == pred.nnz  # one score per (document, label)
    assert evaluate(Yd, pred)["R@5"] > 80  # it learned the task
    model.save(tmp_path / "m")
    loaded = HierarchicalLinear.load(tmp_path / "m")
    assert loaded.copies.merge == "max" and (loaded.predict(X["dev"]) != pred).nnz == 0


def test_linear_ranker_trains_copies_with_their_clusters_negatives(reuters, tmp_path):
    X, ds, chain = reuters
    Y = ds.splits["train"].Y
    C = chain[-1].tolil()
    C[0, (chain[-1].indices[0] + 1) % 16] = 1  # label 0 also in the next cluster
    C = C.tocsr()
    cfg = RankerConfig(features="tfidf", negatives="tfn", topk=5)
    mask = negative_mask("tfn", Y, C)
    ranker = LinearRanker.train(X["train"], Y, C, mask, cfg, merge="mean")
    assert ranker.level.n_labels == Y.shape[1] + 1 and ranker.n_labels == Y.shape[1]
    shortlist = sp.csr_matrix(np.ones((X["dev"].shape[0], 16), np.float32))
    pred = ranker.predict(X["dev"], shortlist)
    assert pred.shape == (X["dev"].shape[0], Y.shape[1])
    ranker.save(tmp_path / "r")
    assert (LinearRanker.load(tmp_path / "r").predict(X["dev"], shortlist) != pred).nnz == 0


# ---------------------------------------------------------------------------------------------- consumers
def test_chain_quality_plots_and_persistence_accept_overlap(reuters, tmp_path):
    X, ds, chain = reuters
    Y = ds.splits["train"].Y
    C = chain[-1].tolil()
    C[:10, 0] = 1
    chain2 = ClusterChain([chain[0], C.tocsr()])
    assert not chain2.is_hard and len(chain2.leaf_codes) == len(chain2.leaf_labels) == chain2.leaf_assignment.nnz
    q = cluster_quality(chain2, Y=Y)
    n_multi = int((chain2.leaf_assignment.getnnz(axis=1) > 1).sum())
    assert q["labels_in_multiple_clusters"] == n_multi > 0
    assert q["mean_clusters_per_label"] == pytest.approx(chain2.leaf_assignment.nnz / Y.shape[1], abs=1e-4)
    assert 0 <= q["cooccurrence_purity"] <= 1
    assert cluster_quality(chain, Y=Y)["labels_in_multiple_clusters"] == 0
    assert len(save_quality_plots(tmp_path, Y, chain2)) == 2
    # the matcher's targets: a document is positive for every cluster holding one of its labels
    from xtransformer.matcher.datamodule import instance_cluster_targets

    M = instance_cluster_targets(Y, chain2.leaf_assignment)
    assert M.data.max() == 1 and ((M.toarray() > 0) != ((Y @ chain2.leaf_assignment).toarray() > 0)).sum() == 0
    assert M.nnz > instance_cluster_targets(Y, chain.leaf_assignment).nnz
    chain2.save(tmp_path / "c", ds.vocab.ids)
    assert ClusterChain.load(tmp_path / "c", ds.vocab.ids) == chain2


@pytest.mark.parametrize(
    "cfg, match",
    [
        ({"n_copies": 0}, "indexing.n_copies"),
        ({"n_copies": 17, "n_clusters": 16}, "indexing.n_copies"),
        ({"n_copies": 2.5}, "indexing.n_copies"),
        ({"merge": "sum"}, "indexing.merge"),
        ({"min_count": 0}, "indexing.min_count"),
        ({"max_cluster_growth": 0.5}, "indexing.max_cluster_growth"),
    ],
)
def test_bad_settings_name_the_key(cfg, match):
    with pytest.raises(IndexingError, match=match):
        IndexingConfig.from_mapping(cfg)
    with pytest.raises(IndexingError, match="xrlinear." + match):
        IndexingConfig.from_mapping(cfg, where="xrlinear.indexing")


def test_n_copies_above_k_from_the_label_count():
    check_copies_fit(IndexingConfig(n_copies=2, max_leaf_size=100), 150)  # K = 2
    with pytest.raises(IndexingError, match=r"xrlinear.indexing.n_copies=3 is above the number of leaf clusters \(2"):
        check_copies_fit(IndexingConfig(n_copies=3, max_leaf_size=100), 150, "xrlinear.indexing")
    with pytest.raises(IndexingError, match=r"leaf clusters \(1 for 90"):  # all labels fit one leaf (PECOS)
        check_copies_fit(IndexingConfig(n_copies=2, max_leaf_size=100), 90)


# ---------------------------------------------------------------------------------------------- pipeline
def test_pipeline_bad_settings_fail_before_any_data_work(tmp_path):
    from run_helpers import TINY, compose_run

    from xtransformer.pipeline.run import run

    for override, key in (
        ("indexing.n_copies=0", "indexing.n_copies"),
        ("xrlinear.indexing.merge=sum", "xrlinear.indexing.merge"),
    ):
        with pytest.raises(IndexingError, match=key):
            run(compose_run([*TINY, override], tmp_path))
        assert not (tmp_path / "cache").exists() and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_pipeline_xrlinear_lambda_keys_and_index_section(tmp_path):
    from run_helpers import TINY, compose_run

    from xtransformer.pipeline.run import run
    from xtransformer.utils.io import load_csr

    base = [*TINY, "method=xrlinear", "xrlinear.indexing.max_leaf_size=8"]
    one = run(compose_run(base, tmp_path))
    assert one["index"] == {"n_copies": 1, "labels_in_multiple_clusters": 0, "mean_clusters_per_label": 1.0}
    pred1 = load_csr(tmp_path / "run" / "predictions" / "test.npz")
    # λ = 1 with other disentanglement settings: the same stage key, reused, the same predictions
    same = run(compose_run([*base, "xrlinear.indexing.n_copies=1", "xrlinear.indexing.merge=mean"], tmp_path))
    assert same["stages"]["ran"] == [] and same["results"]["xrlinear"] == one["results"]["xrlinear"]
    assert (load_csr(tmp_path / "run" / "predictions" / "test.npz") != pred1).nnz == 0
    two = run(
        compose_run([*base, "xrlinear.indexing.n_copies=2", "xrlinear.indexing.max_cluster_growth=null"], tmp_path)
    )
    assert two["stages"]["ran"] == ["xrlinear"]
    assert two["index"]["n_copies"] == 2 and two["index"]["labels_in_multiple_clusters"] > 0
    assert 1 < two["index"]["mean_clusters_per_label"] <= 2
    # merge is part of the key: it changes the saved model's predictions
    mean = run(
        compose_run(
            [
                *base,
                "xrlinear.indexing.n_copies=2",
                "xrlinear.indexing.max_cluster_growth=null",
                "xrlinear.indexing.merge=mean",
            ],
            tmp_path,
        )
    )
    assert mean["stages"]["ran"] == ["xrlinear"]
    with pytest.raises(IndexingError, match=r"xrlinear.indexing.n_copies=99 is above the number of leaf clusters"):
        run(compose_run([*base, "xrlinear.indexing.n_copies=99"], tmp_path))
    # a forest of trees is a new model (its own key) and what the run's model folder ships
    forest = run(compose_run([*base, "xrlinear.n_trees=2"], tmp_path))
    assert forest["stages"]["ran"] == ["xrlinear"] and forest["settings"]["train"]["xrlinear"]["n_trees"] == 2
    ranker = tmp_path / "run" / "model" / "xrlinear" / "ranker"
    assert (ranker / "tree_0" / "model.json").is_file() and (ranker / "tree_1" / "model.json").is_file()


@pytest.mark.slow
def test_pipeline_xtransformer_on_overlapping_clusters(tmp_path):
    import json

    from run_helpers import TINY, compose_run

    from xtransformer.pipeline.run import run
    from xtransformer.utils.io import load_json

    metrics = run(
        compose_run(
            [*TINY, "indexing.n_copies=2", "indexing.max_cluster_growth=null", "combine_with_xrlinear=null"], tmp_path
        )
    )
    index = metrics["index"]
    assert index["n_copies"] == 2 and index["labels_in_multiple_clusters"] > 0
    assert index["xrlinear"]["n_copies"] == 1
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert saved["index"] == index and 0 < saved["results"]["xtransformer"]["P@1"] <= 100
    # the ranker trained one copy per (label, cluster) of the index's overlapping leaf level
    folder = next((tmp_path / "cache" / "stages" / "ranker").iterdir()) / "model"
    assert load_json(folder / "copies" / "copies.json")["merge"] == "max"
    report = load_json(next((tmp_path / "cache" / "stages" / "indexing").iterdir()) / "report.json")
    assert report["disentangle"]["n_copies"] == 2 and report["quality"]["labels_in_multiple_clusters"] > 0


@pytest.mark.slow
def test_pipeline_xrtransformer_on_overlapping_clusters(tmp_path):
    """λ = 2 for XR-Transformer: the fine-tuned levels' targets use the overlapping leaf level (a
    label with two parents starts from their mean head), the final model keeps it (tree: same)
    with one copy per (label, cluster), and the model folder predicts what the run did."""
    from run_helpers import TINY, compose_run

    from xtransformer.model import XMCModel
    from xtransformer.pipeline.run import run
    from xtransformer.utils.io import load_csr, load_json

    overrides = [
        *TINY,
        "method=xrtransformer",
        "indexing.n_copies=2",
        "indexing.max_cluster_growth=null",
        "xrtransformer.final.tree=same",
        "xrtransformer.eval_docs=50",
        "train_xrlinear=false",
    ]
    metrics = run(compose_run(overrides, tmp_path))
    index = metrics["index"]
    assert index["n_copies"] == 2 and index["labels_in_multiple_clusters"] > 0
    final = next((tmp_path / "cache" / "stages" / "xrfinal").iterdir()) / "model"
    assert load_json(final / "copies" / "copies.json")["merge"] == "max"
    run_dir = tmp_path / "run"
    model = XMCModel.load(run_dir / "model" / "xrtransformer")
    ds = load_dataset(compose_run(overrides, tmp_path).data.name, max_docs=400)
    got = model.predict_csr(ds.splits["test"].texts)
    want = load_csr(run_dir / "predictions" / "xrtransformer" / "test.npz")
    assert (got != want).nnz == 0


@pytest.mark.slow
def test_pipeline_xrtransformer_lambda_on_the_final_tree(tmp_path):
    """λ = 2 on XR-Transformer's re-clustered final tree (xrtransformer.final.indexing.n_copies):
    the fine-tuning tree stays a partition, the final model trains one copy per (label, leaf) of
    the tree its own search on the training documents disentangled, and its folder predicts what
    the run did."""
    from run_helpers import TINY, compose_run

    from xtransformer.model import XMCModel
    from xtransformer.pipeline.run import run
    from xtransformer.utils.io import load_csr, load_json

    overrides = [
        *TINY,
        "method=xrtransformer",
        "xrtransformer.final.indexing.n_copies=2",
        "xrtransformer.final.indexing.max_leaf_size=8",
        "xrtransformer.final.indexing.max_cluster_growth=null",
        "xrtransformer.final.indexing.merge=mean",
        "xrtransformer.eval_docs=50",
        "train_xrlinear=false",
    ]
    metrics = run(compose_run(overrides, tmp_path))
    assert metrics["index"]["n_copies"] == 1  # the fine-tuning tree
    stage = next((tmp_path / "cache" / "stages" / "xrfinal").iterdir())
    report = load_json(stage / "index_report.json")["disentangle"]
    assert report["n_copies"] == 2 and report["labels_in_multiple_clusters"] > 0
    assert load_json(stage / "model" / "copies" / "copies.json")["merge"] == "mean"
    model = XMCModel.load(tmp_path / "run" / "model" / "xrtransformer")
    ds = load_dataset(compose_run(overrides, tmp_path).data.name, max_docs=400)
    want = load_csr(tmp_path / "run" / "predictions" / "xrtransformer" / "test.npz")
    assert (model.predict_csr(ds.splits["test"].texts) != want).nnz == 0
