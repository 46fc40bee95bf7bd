"""Adding labels to a trained model: placement, old weights untouched, one-line errors, folders."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp
from model_helpers import toy_tree
from tiny_models import toy_xmc

from xtransformer import XMCModel, XRLinear
from xtransformer.cli import add_labels_main
from xtransformer.indexing.errors import IndexingError
from xtransformer.indexing.placement import Placing, place_labels
from xtransformer.methods.base import with_settings
from xtransformer.model.folder import ModelError
from xtransformer.ranker import HierarchicalLinear, HierarchicalLinearConfig, RankerError
from xtransformer.ranker.fit import LevelSpec, solver_params, train_level
from xtransformer.ranker.postprocess import get_post_processor

IDS = [f"L{i}" for i in range(12)]


def block_task(n_per_label: int = 6, seed: int = 0) -> tuple[sp.csr_matrix, sp.csr_matrix, sp.csr_matrix]:
    """4 leaves of 2 labels each; label ``l`` owns feature ``l`` and its leaf's shared feature
    ``8 + l // 2``; a ninth label (the new one) owns feature 12 and shares leaf 2's feature 10."""
    rng = np.random.default_rng(seed)
    rows, cols, vals, labels = [], [], [], []
    for label in range(9):
        own, shared = (label, 8 + label // 2) if label < 8 else (12, 10)
        for _ in range(n_per_label):
            i = len(labels)
            rows += [i, i, i]
            cols += [own, shared, 13 + int(rng.integers(0, 3))]  # and a filler feature
            vals += [1.0, 0.8, 0.3]
            labels.append(label)
    X = sp.csr_matrix((np.float32(vals), (rows, cols)), shape=(len(labels), 16))
    Y = sp.csr_matrix((np.ones(len(labels), np.float32), (np.arange(len(labels)), labels)), shape=(len(labels), 9))
    C = sp.csr_matrix((np.ones(8, np.float32), (np.arange(8), np.arange(8) // 2)), shape=(8, 4))
    return X, Y, C


def test_new_label_goes_to_the_leaf_whose_centroid_is_nearest():
    X, Y, C = block_task()
    placed = place_labels(Y, X, C)
    assert placed.leaves.toarray().tolist() == [[0, 0, 1, 0]]  # leaf 2: the one sharing its feature
    assert placed.how == ["centroid"] and placed.similarity[0] > 0
    two = place_labels(Y, X, C, n_leaves=2)
    assert two.leaves.nnz == 2 and two.leaves[0, 2] == 1


def test_without_old_labels_in_the_documents_the_models_routes_decide():
    X, Y, C = block_task()
    carriers = np.flatnonzero(Y[:, 8].toarray().ravel())
    routes = sp.csr_matrix(np.tile([0.1, 0.0, 0.0, 0.9], (len(carriers), 1)).astype(np.float32))
    placed = place_labels(Y[carriers], X[carriers], C, routes=routes)
    assert placed.how == ["routes"] and placed.leaves[0, 3] == 1


def test_routes_decide_where_the_documents_go_and_the_centroid_breaks_ties():
    X, Y, C = block_task()
    carriers = np.flatnonzero(Y[:, 8].toarray().ravel())
    routes = sp.lil_matrix((Y.shape[0], 4), dtype=np.float32)
    routes[carriers, 3] = 0.1  # all 6 documents of the new label reach leaf 3, whatever their path score
    routes[carriers[:3], 1] = 0.9  # 3 reach leaf 1
    routes[carriers[3:], 2] = 0.9  # 3 reach leaf 2, the nearest centroid: the tie with leaf 1 goes to it
    assert place_labels(Y, X, C, 1, routes.tocsr(), by="routes").leaves.toarray().tolist() == [[0, 0, 0, 1]]
    two = place_labels(Y, X, C, 2, routes.tocsr(), by="routes")
    assert two.how == ["routes"] and two.leaves.toarray().tolist() == [[0, 0, 1, 1]]
    assert place_labels(Y, X, C, 1, routes.tocsr(), by="centroid").leaves.toarray().tolist() == [[0, 0, 1, 0]]


@pytest.mark.parametrize(
    ("negatives", "added", "placing", "leaves"),
    [("tfn", "leaf", Placing("centroid", 1), [[0, 0, 1, 0]]),
     ("tfn+man", "leaf", Placing("centroid", 1), [[0, 0, 1, 0]]), ("tfn+man", "leaf", Placing(), None),
     ("tfn+man", "all", Placing("centroid", 1), [[0, 0, 1, 0]]), ("tfn+man", "all", Placing(), None)],
)  # fmt: skip
def test_old_weights_and_scores_are_unchanged(negatives, added, placing, leaves):
    X, Y, C = block_task()
    cfg = HierarchicalLinearConfig(threads=1, negatives=negatives, threshold=0.0, added_negatives=added)
    old = HierarchicalLinear.train(X, Y[:, :8], toy_tree(C), cfg)
    grown, report = old.add_labels(X, Y, placing=placing)
    if leaves is not None:
        assert report["leaves"].toarray().tolist() == leaves and grown.copies is None
    else:  # the default: its two nearest leaves, its own among them; old labels keep one copy each
        assert report["leaves"].nnz == 2 and report["leaves"][0, 2] == 1
        assert report["placement"]["by_centroid"] == 1
        assert grown.copies.n_labels == 9 and np.array_equal(grown.copies.label_of[:8], np.arange(8))
    assert grown.n_labels == 9 and grown.levels[0] is old.levels[0]
    before, after = old.levels[-1].W.tocsc(), grown.levels[-1].W.tocsc()
    assert (after[:, :8] != before).nnz == 0 and after[:, 8].nnz > 0
    assert (grown.chain[-1][:8] != old.chain[-1]).nnz == 0
    a, b = old.predict(X, topk=9).tocoo(), grown.predict(X, topk=9).tocsr()
    assert np.array_equal(a.data, np.asarray(b[a.row, a.col]).ravel())  # bit for bit
    top = grown.predict(X, topk=1).tocsr()
    carriers = np.flatnonzero(Y[:, 8].toarray().ravel())
    assert set(top[carriers].indices) == {8}  # the new label wins on its own documents


def test_added_labels_reach_every_document_with_added_reach_all(tmp_path):
    X, Y, C = block_task()
    cfg = HierarchicalLinearConfig(threads=1, negatives="tfn+man", threshold=0.0, matcher_weight=0.5)
    old = HierarchicalLinear.train(X, Y[:, :8], toy_tree(C), cfg)
    grown, _ = old.add_labels(X, Y)  # two leaves, so copies: the merge runs too
    reach = {r: with_settings(grown, {"added_reach": r}) for r in ("beam", "all")}
    # a beam over every leaf reaches the new label everywhere: both ways give the same scores
    wide = {r: m.predict(X, beam_size=4, topk=9).toarray() for r, m in reach.items()}
    np.testing.assert_allclose(wide["all"], wide["beam"], rtol=1e-6)
    # a beam of one leaf misses the new label's leaves on some documents; `all` scores it on every one
    narrow = {r: m.predict(X, beam_size=1, topk=9).tocsr() for r, m in reach.items()}
    assert narrow["beam"][:, 8].nnz < X.shape[0] == narrow["all"][:, 8].nnz
    a, b = narrow["beam"][:, :8].tocoo(), narrow["all"][:, :8].tocsr()
    assert np.array_equal(a.data, np.asarray(b[a.row, a.col]).ravel())  # old labels: bit for bit
    assert (narrow["beam"][:, :8] != narrow["all"][:, :8]).nnz == 0  # and the same ones (topk holds all)
    grown.save(tmp_path / "grown")
    loaded = with_settings(HierarchicalLinear.load(tmp_path / "grown"), {"added_reach": "all"})
    assert loaded.added_from == 8 and loaded.levels[-1]._W is None  # its added weights from the layout
    assert (loaded.predict(X, beam_size=1, topk=9) != narrow["all"]).nnz == 0
    with pytest.raises(RankerError, match="added_reach"):
        HierarchicalLinearConfig(added_reach="some")


def test_labels_added_against_every_document_train_once_and_score_alone():
    X, Y, C = block_task()
    cfg = HierarchicalLinearConfig(threads=1, negatives="tfn", threshold=0.0, matcher_weight=0.5, added_max_iter=2)
    assert cfg.added_negatives == "all" and cfg.added_reach == "alone"  # the defaults
    old = HierarchicalLinear.train(X, Y[:, :8], toy_tree(C), cfg)
    grown, _ = old.add_labels(X, Y, placing=Placing("centroid", 2))
    W = grown.levels[-1].W.tocsc()
    first, second = np.flatnonzero(grown.copies.label_of == 8)
    # one problem against every document, its weights in both leaves: a one-vs-all solve's of
    # added_max_iter passes, exactly (not the converged solve's)
    one, every = sp.csr_matrix(np.ones((1, 1), np.float32)), sp.csr_matrix(np.ones((X.shape[0], 1), np.float32))
    spec = LevelSpec(sp.csr_matrix(Y[:, 8:]), one, every)
    ova, info = train_level(X, spec, solver_params(cfg, 2), 1.0, 0.0, 10**6, 1)
    converged, _ = train_level(X, spec, solver_params(cfg), 1.0, 0.0, 10**6, 1)
    assert (W[:, first] != W[:, second]).nnz == 0 and (W[:, first] != ova.W.tocsc()[:, 0]).nnz == 0
    assert info["cd_passes"] == 2 and (W[:, first] != converged.W.tocsc()[:, 0]).nnz > 0
    leafwise, _ = old.add_labels(X, Y, placing=Placing("centroid", 2, negatives="leaf"))  # each leaf's documents
    V = leafwise.levels[-1].W.tocsc()
    assert (V[:, first] != W[:, first]).nnz > 0 and (V[:, first] != V[:, second]).nnz > 0
    assert (V[:, :8] != W[:, :8]).nnz == 0  # the old labels' weights, whatever the new ones train against
    # `alone`: on every document, even where the beam reaches neither of its leaves, its own score
    narrow = {r: with_settings(grown, {"added_reach": r}).predict(X, beam_size=1, topk=9) for r in ("beam", "alone")}
    raw = (sp.hstack([X, np.ones((X.shape[0], 1), np.float32)]) @ W[:, first]).toarray().ravel()
    expected = get_post_processor(cfg.post_processor).transform(raw)
    assert narrow["beam"][:, 8].nnz < X.shape[0] == narrow["alone"][:, 8].nnz
    np.testing.assert_allclose(narrow["alone"][:, 8].toarray().ravel(), expected, rtol=1e-5)
    a, b = narrow["beam"][:, :8].tocoo(), narrow["alone"][:, :8].tocsr()
    assert np.array_equal(a.data, np.asarray(b[a.row, a.col]).ravel())  # old labels: bit for bit
    with pytest.raises(RankerError, match="added_negatives"):
        HierarchicalLinearConfig(added_negatives="some")


@pytest.fixture(scope="module")
def toy_model():
    """XR-Linear on the toy task without label L11; the full task's texts and label lists."""
    texts, Y, _ = toy_xmc()
    lists = [[IDS[j] for j in Y["train"][i].indices] for i in range(Y["train"].shape[0])]
    without = [[label for label in row if label != "L11"] for row in lists]  # the documents stay, the label goes
    model = XRLinear.fit(texts["train"], without, label_ids=IDS[:11])
    return model, texts, lists


def one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


def test_bad_additions_fail_with_one_line(toy_model):
    model, texts, lists = toy_model
    with pytest.raises(ModelError) as err:
        model.add_labels(texts["train"], lists, new_labels=["L11", "L11"])
    assert "'L11' is listed twice" in one_line(err)
    with pytest.raises(ModelError) as err:
        model.add_labels(texts["train"], lists, new_labels=["L3"])
    assert "'L3' collides with the model's label" in one_line(err)
    old_only = [[label for label in row if label != "L11"] for row in lists]
    with pytest.raises(ModelError) as err:
        model.add_labels(texts["train"], old_only)
    assert "carry no label the model does not already have" in one_line(err)
    for bad, key in [({"placement": "nearest"}, "placement must be one of centroid, routes"),
                     ({"leaves": 0}, "leaves must be >= 1"), ({"leaves": 2.5}, "leaves must be a whole number"),
                     ({"leaves": 99}, "leaves is 99 but the tree has only"),
                     ({"negatives": "some"}, "negatives must be one of leaf, all")]:  # fmt: skip
        with pytest.raises(IndexingError) as err:
            model.add_labels(texts["train"], lists, **bad)
        assert key in one_line(err)
    grown = model.add_labels(texts["train"], lists)
    with pytest.raises(ModelError) as err:  # the same label added a second time
        grown.add_labels(texts["train"], lists, new_labels=["L11"])
    assert "'L11' collides" in one_line(err)


def test_added_model_keeps_old_scores_and_records_the_addition(toy_model):
    model, texts, lists = toy_model
    grown = model.add_labels(texts["train"], lists)
    assert grown.label_ids == IDS and model.label_ids == IDS[:11]  # the old model is untouched
    assert grown.train_settings["added_labels"][-1]["ids"] == ["L11"]
    assert grown.train_settings["added_labels"][-1]["placement"] == "routes"  # XR-Linear's own rule
    assert grown.training_run.report["added_labels"]["n_added"] == 1 and grown.training_run.report["added_labels"][
        "leaves"
    ]["L11"] == [0]
    assert grown.training_run.report["added_labels"]["placement"]["by_routes"] == 1
    by_centroid = model.add_labels(texts["train"], lists, placement="centroid")
    assert by_centroid.train_settings["added_labels"][-1]["placement"] == "centroid"
    assert by_centroid.training_run.report["added_labels"]["placement"]["by_centroid"] == 1
    by_leaf = model.add_labels(texts["train"], lists, negatives="leaf")
    assert by_leaf.train_settings["added_labels"][-1]["negatives"] == "leaf"
    assert grown.train_settings["added_labels"][-1]["negatives"] == "all"  # the model's added_negatives
    # labels that saw only their leaf's documents are never scored alone: under their leaf's path instead
    assert grown.predict_settings["added_reach"] == "alone" and by_leaf.predict_settings["added_reach"] == "all"
    a, b = model.predict_csr(texts["dev"]).tocoo(), grown.predict_csr(texts["dev"]).tocsr()
    shared = np.asarray(b[a.row, a.col]).ravel()
    assert np.array_equal(a.data[shared != 0], shared[shared != 0]) and (shared != 0).sum() > 0


def test_rows_of_documents_the_run_read_come_from_its_cache(tmp_path, monkeypatch, caplog):
    from xtransformer import StageCache, TrainContext
    from xtransformer.data.tfidf import TfidfFeatures

    texts, Y, _ = toy_xmc()
    lists = [[IDS[j] for j in Y["train"][i].indices] for i in range(Y["train"].shape[0])]
    without = [[label for label in row if label != "L11"] for row in lists]
    with TrainContext(cache=StageCache(tmp_path / "cache")) as ctx:
        model = XRLinear.fit(texts["train"], without, label_ids=IDS[:11], context=ctx)
    assert set(model.train_settings["stages"]) == {"documents", "tfidf", "xrlinear"}  # keys, no local path
    # one document the run never read, carrying the new label, among those it did
    extra = " ".join(keywords_of(11, texts["train"], Y["train"]) * 2)
    docs, labels = [*texts["train"], extra], [*lists, ["L11"]]
    vectorised = []
    original = TfidfFeatures.from_texts
    monkeypatch.setattr(TfidfFeatures, "from_texts", lambda self, t: vectorised.append(len(t)) or original(self, t))
    with caplog.at_level("INFO", logger="xtransformer.methods.reuse"):
        computed = model.add_labels(docs, labels)  # no cache named: every row computed
        assert vectorised == [len(docs)] and "documents found" not in caplog.text
        vectorised.clear()
        reused = model.add_labels(docs, labels, cache=tmp_path / "cache")
    assert vectorised == [1]  # only the new document is vectorised
    assert f"{len(docs) - 1} of {len(docs)} documents found" in caplog.text
    dev_a, dev_b = reused.predict_csr(texts["dev"]), computed.predict_csr(texts["dev"])
    assert np.array_equal(dev_a.toarray(), dev_b.toarray())  # the run's rows are the vectoriser's
    vectorised.clear()
    model.add_labels(docs, labels, cache=tmp_path / "elsewhere")  # a cache without the run: every row computed
    assert vectorised == [len(docs)]


def test_a_model_saved_before_added_reach_grows_with_it(toy_model, tmp_path):
    model, texts, lists = toy_model
    model.save(tmp_path / "old")
    settings = tmp_path / "old" / "predict_settings.json"
    record = json.loads(settings.read_text())
    settings.write_text(json.dumps({k: v for k, v in record.items() if k != "added_reach"}))
    old = XMCModel.load(tmp_path / "old", verify=False)
    assert "added_reach" not in old.predict_settings
    grown = old.add_labels(texts["train"], lists)
    assert grown.predict_settings["added_reach"] == "alone"  # XR-Linear's, and a call may change it
    beam, every = (grown.predict_csr(texts["dev"], added_reach=r) for r in ("beam", "all"))
    assert beam[:, 11].nnz <= every[:, 11].nnz == len(texts["dev"])


def keywords_of(label: int, texts: list[str], Y: sp.csr_matrix) -> list[str]:
    """The words only documents with ``label`` use (the toy task's keywords of that label)."""
    has = Y[:, label].toarray().ravel() > 0
    words_in = set(" ".join(t for t, h in zip(texts, has) if h).replace(".", "").split())
    words_out = set(" ".join(t for t, h in zip(texts, has) if not h).replace(".", "").split())
    return sorted(words_in - words_out)


def test_command_line_writes_a_new_folder_that_predicts_the_new_label(toy_model, tmp_path, capsys):
    from run_helpers import write_text_dataset

    model, texts, lists = toy_model
    old = model.save(tmp_path / "old")
    files_before = {p.name: p.read_bytes() for p in old.rglob("*") if p.is_file()}
    data = write_text_dataset(
        tmp_path / "data", {"train": (texts["train"], [" ".join(row) for row in lists])}, label_text=["L11\tnew topic"]
    )
    no_run = ["--cache", str(tmp_path / "cache")]  # a cache without the run's stages: every row computed
    rc = add_labels_main(["--model", str(old), "--data", str(data), "--output", str(tmp_path / "new"), *no_run])
    assert rc == 0 and "1 labels added" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in old.rglob("*") if p.is_file()} == files_before
    loaded = XMCModel.load(tmp_path / "new")
    assert loaded.label_ids == IDS and loaded.label_names[-1] == "new topic"
    _, Y, _ = toy_xmc()
    doc = " ".join(keywords_of(11, texts["train"], Y["train"]) * 2)
    assert loaded.predict([doc], k=1)[0]["labels"] == ["L11"]
    again = add_labels_main(["--model", str(tmp_path / "new"), "--data", str(data), "--output", str(tmp_path / "x")])
    err = capsys.readouterr().err.strip()
    assert again == 2 and err.count("\n") == 0 and "nothing to add" in err and not (tmp_path / "x").exists()
    clash = add_labels_main(["--model", str(old), "--data", str(data), "--output", str(old / "inside")])
    assert clash == 2 and "inside the model folder" in capsys.readouterr().err
    bad = add_labels_main(["--model", str(old), "--data", str(data), "--output", str(tmp_path / "y"), "--leaves", "0"])
    err = capsys.readouterr().err.strip()
    assert bad == 2 and err.count("\n") == 0 and "leaves must be >= 1" in err and not (tmp_path / "y").exists()


@pytest.mark.slow
def test_neural_combination_adds_labels_to_every_member(tmp_path):
    from run_helpers import TINY

    from xtransformer import Combination
    from xtransformer.pipeline.settings import compose_settings

    texts, Y, _ = toy_xmc()
    lists = [[IDS[j] for j in Y["train"][i].indices] for i in range(Y["train"].shape[0])]
    without = [[label for label in row if label != "L11"] for row in lists]
    over = [o for o in TINY if not o.startswith("data.")] + ["indexing.n_clusters=4", "logger=none"]
    final_tree = "xrtransformer.final.indexing.max_leaf_size=4"  # 4 leaves: room to choose among
    s = compose_settings("method=xrtransformer", *over, "matcher.level_steps=[4,4]", final_tree).methods
    combo = Combination.fit(
        texts["train"],
        without,
        members={"xrtransformer": s["xrtransformer"], "xrlinear": s["xrlinear"]},
        label_ids=IDS[:11],
    )
    grown = combo.add_labels(texts["train"], lists)
    assert [m.label_ids for m in grown.members] == [IDS, IDS]
    m, m_lin = grown.members
    # each member places the label by its own rule (both: routes, one leaf) and trains it one-vs-all
    per_member = grown.training_run.report["added_labels"]
    assert per_member["xrtransformer"]["placement"]["by_routes"] == 1
    assert per_member["xrlinear"]["placement"]["by_routes"] == 1
    assert [m.train_settings["added_labels"][-1]["placement"] for m in grown.members] == ["routes", "routes"]
    trees = [m.final.chain[-1], m_lin.model.chain[-1]]  # label x leaf, a label's copies collapsed
    assert [C[11].nnz for C in trees] == [1, 1] and trees[0].shape[1] == 4
    assert [m.predict_settings["added_reach"] for m in grown.members] == ["alone", "alone"]
    a, b = combo.members[0].predict_csr(texts["dev"]).tocoo(), grown.members[0].predict_csr(texts["dev"]).tocsr()
    shared = np.asarray(b[a.row, a.col]).ravel()
    assert np.array_equal(a.data[shared != 0], shared[shared != 0])
    grown.save(tmp_path / "combo")
    loaded = XMCModel.load(tmp_path / "combo")
    doc = " ".join(keywords_of(11, texts["train"], Y["train"]) * 2)
    assert "L11" in loaded.predict([doc], k=3)[0]["labels"]


def test_run_rows_put_computed_rows_back_in_the_given_order(tmp_path):
    from xtransformer.methods.reuse import RunRows

    stored = np.arange(12, dtype=np.float32).reshape(4, 3)  # the run's rows of its 4 documents
    np.save(tmp_path / "rows.npy", stored)
    rows = RunRows(source=np.array([2, -1, 0, -1, 3]), folders={"stage": tmp_path})
    got = rows.rows(
        "stage", lambda folder: np.load(folder / "rows.npy"), lambda at: -np.ones((len(at), 3)) * at[:, None]
    )
    assert np.array_equal(got, [stored[2], [-1, -1, -1], stored[0], [-3, -3, -3], stored[3]])
    sparse = rows.rows("stage", lambda folder: sp.csr_matrix(np.load(folder / "rows.npy")),
                       lambda at: sp.csr_matrix(-np.ones((len(at), 3)) * at[:, None]))  # fmt: skip
    assert np.array_equal(sparse.toarray(), got)
    assert rows.rows("absent", np.load, lambda at: None) is None


@pytest.mark.slow
def test_xrtransformer_takes_the_runs_embeddings_of_documents_it_read(tmp_path, monkeypatch):
    from run_helpers import TINY

    from xtransformer import StageCache, TrainContext, XRTransformer
    from xtransformer.methods.neural import NeuralModel
    from xtransformer.pipeline.settings import compose_settings

    texts, Y, _ = toy_xmc()
    lists = [[IDS[j] for j in Y["train"][i].indices] for i in range(Y["train"].shape[0])]
    without = [[label for label in row if label != "L11"] for row in lists]
    over = [o for o in TINY if not o.startswith("data.")] + ["indexing.n_clusters=4", "logger=none"]
    s = compose_settings("method=xrtransformer", *over, "matcher.level_steps=[4,4]").methods["xrtransformer"]
    with TrainContext(cache=StageCache(tmp_path / "cache")) as ctx:
        model = XRTransformer.fit(texts["train"], without, s, label_ids=IDS[:11], context=ctx)
    extra = " ".join(keywords_of(11, texts["train"], Y["train"]) * 2)
    docs, labels = [*texts["train"], extra], [*lists, ["L11"]]
    encoded = []
    original = NeuralModel.embed
    monkeypatch.setattr(
        NeuralModel, "embed", lambda self, t, *a, **k: encoded.append(len(t)) or original(self, t, *a, **k)
    )
    computed = model.add_labels(docs, labels)
    assert encoded == [len(docs)]
    encoded.clear()
    reused = model.add_labels(docs, labels, cache=tmp_path / "cache")
    assert encoded == [1]  # only the document the run never read is encoded
    dev_a, dev_b = reused.predict_csr(texts["dev"]), computed.predict_csr(texts["dev"])
    assert np.allclose(dev_a.toarray(), dev_b.toarray(), atol=1e-5)
    encoded.clear()
    model.predict_settings["inference_precision"] = "bf16-mixed"  # not what the run embedded with: encode all
    model.add_labels(docs, labels)
    assert encoded == [len(docs)]


@pytest.mark.slow
def test_xtransformer_ranks_the_new_label_over_its_matchers_clusters(tmp_path):
    from run_helpers import TINY

    from xtransformer import XTransformer
    from xtransformer.pipeline.settings import compose_settings

    texts, Y, _ = toy_xmc()
    lists = [[IDS[j] for j in Y["train"][i].indices] for i in range(Y["train"].shape[0])]
    without = [[label for label in row if label != "L11"] for row in lists]
    over = [o for o in TINY if not o.startswith("data.")] + ["indexing.n_clusters=4", "logger=none"]
    model = XTransformer.fit(
        texts["train"], without, compose_settings(*over).methods["xtransformer"], label_ids=IDS[:11]
    )
    with pytest.raises(ModelError) as err:  # its ranker scores labels over the matcher's clusters only
        model.add_labels(texts["train"], lists, negatives="all")
    assert "negatives 'all' is for the tree models" in one_line(err)
    grown = model.add_labels(texts["train"], lists)
    assert grown.chain.n_labels == 12 and grown.ranker.n_labels == 12
    assert len(grown.training_run.report["added_labels"]["leaves"]["L11"]) == 2  # the default: two leaves
    a, b = model.predict_csr(texts["dev"]).tocoo(), grown.predict_csr(texts["dev"]).tocsr()
    shared = np.asarray(b[a.row, a.col]).ravel()
    assert (shared != 0).sum() > 0 and np.array_equal(a.data[shared != 0], shared[shared != 0])
    grown.save(tmp_path / "xt")
    assert XMCModel.load(tmp_path / "xt").label_ids == IDS


def test_columns_appended_side_by_side_are_scipys_stack():
    from xtransformer.ranker.extend import side_by_side

    A = sp.random(50, 30, density=0.1, format="csr", dtype=np.float32, random_state=1)
    B = sp.random(50, 7, density=0.2, format="csr", dtype=np.float32, random_state=2)
    A.data[A.indptr[3] : A.indptr[4]] = 0  # empty rows on either side (a row assigned 0 would store 30 zeros)
    B.data[B.indptr[4] : B.indptr[5]] = 0
    A.eliminate_zeros()
    B.eliminate_zeros()
    W, ref = side_by_side(A, B), sp.hstack([A, B], format="csr")
    assert W.shape == ref.shape and W.has_sorted_indices
    for a, b in ((W.indptr, ref.indptr), (W.indices, ref.indices), (W.data, ref.data)):
        assert np.array_equal(a, b)


def test_centroids_compared_a_block_at_a_time_as_all_at_once(monkeypatch):
    from xtransformer.indexing import placement

    rows = sp.random(5, 40, density=0.3, format="csr", dtype=np.float32, random_state=1)
    dense = sp.random(9, 40, density=0.3, format="csr", dtype=np.float32, random_state=2).toarray()
    centroids = placement.Centroids(9, 40, lambda a, b: np.ascontiguousarray(dense[a:b].T))
    whole = placement._cosines(rows, centroids)
    monkeypatch.setattr(placement, "_DENSE_BYTES", 4 * 40 * 2)  # two centroids a block, five blocks
    assert np.array_equal(placement._cosines(rows, centroids), whole)
    np.testing.assert_allclose(whole, rows.toarray() @ dense.T, rtol=1e-6)
    np.testing.assert_allclose(placement._cosines(rows.toarray(), centroids), whole, rtol=1e-6)  # BLAS's sums


def test_leaf_centroids_are_the_unit_sums_of_pifa_rows():
    """The fused centroids equal PIFA's rows summed per leaf and normalised, to the bit, for any
    block of leaves and any number of threads."""
    from xtransformer.indexing.representations import pifa
    from xtransformer.indexing.sparse_sums import leaf_centroids
    from xtransformer.ranker.negatives import binarize

    X = sp.random(300, 200, density=0.1, format="csr", dtype=np.float32, random_state=3)
    Y = sp.random(300, 30, density=0.08, format="csr", dtype=np.float32, random_state=4)
    Y.data[:] = 1.0
    C = sp.csr_matrix((np.ones(30, np.float32), (np.arange(30), np.arange(30) % 7)), shape=(30, 7))
    want = pifa(binarize(C), pifa(Y, X)).toarray().T
    leaves = binarize(C).T.tocsr()
    for first, last, threads in ((0, 7, 1), (0, 7, 3), (2, 5, 2)):
        assert np.array_equal(leaf_centroids(Y.T.tocsr(), X, leaves, first, last, threads), want[:, first:last])
