"""XR-Transformer: level algebra on hand-built trees, the shortlist loss, the level loop's resume,
bad settings caught up front, and the whole method on a Reuters slice with a tiny model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from xtransformer.matcher.config import MatcherConfig, MatcherConfigError
from xtransformer.matcher.loss import hinge_weights, weighted_squared_hinge
from xtransformer.methods.xrtransformer.config import XRTransformerConfig, XRTransformerConfigError
from xtransformer.methods.xrtransformer.levels import (
    children_table,
    count_targets,
    inherit_head,
    matched_levels,
    teacher_shortlist,
    tree_levels,
)

ROOT = Path(__file__).resolve().parents[2]

# A hand-built tree: 2 top clusters -> 4 clusters -> 6 labels.
#   top 0: clusters 0, 1      top 1: clusters 2, 3
#   cluster 0: labels 0, 1    cluster 1: label 2    cluster 2: labels 3, 4    cluster 3: label 5
C1 = sp.csr_matrix(np.ones((2, 1), dtype=np.float32))
C2 = sp.csr_matrix((np.ones(4, np.float32), [0, 0, 1, 1], [0, 1, 2, 3, 4]), shape=(4, 2))
C3 = sp.csr_matrix((np.ones(6, np.float32), [0, 0, 1, 2, 2, 3], np.arange(7)), shape=(6, 4))
CHAIN = [C1, C2, C3]
# doc 0: labels 0, 1, 4; doc 1: label 2; doc 2: labels 3, 4, 5
Y = sp.csr_matrix(np.array([[1, 1, 0, 0, 1, 0], [0, 0, 1, 0, 0, 0], [0, 0, 0, 1, 1, 1]], dtype=np.float32))


def test_level_targets_are_counts_of_y_times_c():
    levels = tree_levels(CHAIN)
    assert [lv.n_nodes for lv in levels] == [2, 4, 6]
    np.testing.assert_array_equal(count_targets(Y, levels[0]).toarray(), [[2, 1], [1, 0], [0, 3]])
    np.testing.assert_array_equal(count_targets(Y, levels[1]).toarray(), [[2, 0, 1, 0], [0, 1, 0, 0], [0, 0, 2, 1]])
    np.testing.assert_array_equal(count_targets(Y, levels[2]).toarray(), Y.toarray())  # the label level is Y
    assert [lv.n_nodes for lv in matched_levels(levels, 4)] == [2, 4]  # the 6 labels exceed 4


def test_teacher_shortlist_is_children_of_true_parents():
    levels = tree_levels(CHAIN)
    tfn = teacher_shortlist(Y, levels[0], levels[1]).toarray()
    # doc 0 has true top clusters 0 and 1 -> all four; doc 1 only top 0 -> clusters 0, 1; doc 2 top 1 -> 2, 3
    np.testing.assert_array_equal(tfn, [[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 1, 1]])
    assert (tfn >= (count_targets(Y, levels[1]).toarray() > 0)).all()  # every positive is shortlisted
    np.testing.assert_array_equal(children_table(levels[1]), [[0, 1], [2, 3]])
    np.testing.assert_array_equal(children_table(levels[2]), [[0, 1], [2, -1], [3, 4], [5, -1]])


def test_inherited_head_reproduces_parent_scores():
    levels = tree_levels(CHAIN)
    rng = np.random.default_rng(0)
    W1, b1 = rng.normal(size=(2, 5)).astype(np.float32), rng.normal(size=2).astype(np.float32)
    W2, b2 = inherit_head(W1, b1, levels[1])
    emb = rng.normal(size=(7, 5)).astype(np.float32)
    parent_scores = emb @ W1.T + b1
    child_scores = emb @ W2.T + b2
    parent_of = C2.indices  # each level-1 cluster's parent
    np.testing.assert_allclose(child_scores, parent_scores[:, parent_of], rtol=1e-6)


def test_shortlist_loss_equals_dense_loss_restricted_to_the_shortlist():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 9, generator=g)
    targets = torch.zeros(4, 9)
    targets[0, 1], targets[0, 4], targets[1, 2], targets[2, 8], targets[3, 0] = 3, 1, 2, 1, 1
    mask = torch.rand(4, 9, generator=g) < 0.4
    mask |= targets > 0
    for importance in ("counts", "normalized", "none"):
        weights = hinge_weights(targets, importance, neg_weight=0.5)
        rows, cols = mask.nonzero(as_tuple=True)
        short = weighted_squared_hinge(logits[rows, cols], targets[rows, cols], weights[rows, cols], rows, 4)
        # dense form, one document at a time over its shortlisted columns
        dense = torch.stack(
            [weighted_squared_hinge(logits[i, mask[i]], targets[i, mask[i]], weights[i, mask[i]]) for i in range(4)]
        ).mean()
        torch.testing.assert_close(short, dense)
    # with every cluster shortlisted the two forms are the same function
    full = torch.ones(4, 9, dtype=torch.bool)
    rows, cols = full.nonzero(as_tuple=True)
    w = hinge_weights(targets)
    torch.testing.assert_close(
        weighted_squared_hinge(logits[rows, cols], targets[rows, cols], w[rows, cols], rows, 4),
        weighted_squared_hinge(logits, targets, w),
    )
    # counts weigh a positive by how many of the document's labels sit in the cluster
    assert hinge_weights(targets)[0, 1] == 3 and hinge_weights(targets, neg_weight=0.5)[0, 0] == 0.5


def test_shortlist_holds_positives_and_children_of_predicted_parents(tmp_path):
    from tiny_models import build_tiny

    from xtransformer.matcher.module import TrainOptions
    from xtransformer.methods.xrtransformer.module import XRLevelModule

    levels = tree_levels(CHAIN)
    model = build_tiny("bert", tmp_path / "tiny")
    module = XRLevelModule(str(model), 6, TrainOptions(pooling="cls"))
    H = module.head.in_features
    # a previous head that ranks top cluster... by the first embedding coordinate's sign
    prev_W = np.zeros((4, H), np.float32)
    prev_W[:, 0] = [1.0, -1.0, 0.5, -0.5]
    module.setup_level(
        2,
        children=children_table(levels[2]),
        prev_head=(prev_W, np.zeros(4, np.float32)),
        loss=XRTransformerConfig(negatives="tfn+man", only_topk=1),
    )
    emb = torch.zeros(3, H)
    emb[:, 0] = torch.tensor([1.0, -1.0, 2.0])  # top parent: 0, 1, 0
    targets = torch.as_tensor(Y.toarray())
    tfn = torch.as_tensor(teacher_shortlist(Y, levels[1], levels[2]).toarray() > 0)
    mask = module.shortlist_mask(emb, targets, tfn)
    assert bool((mask >= (targets > 0)).all()), "a positive label left the shortlist"
    assert bool((mask >= tfn).all())
    predicted = module.predicted_children(emb)
    np.testing.assert_array_equal(predicted.numpy(), [[1, 1, 0, 0, 0, 0], [0, 0, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0]])
    assert bool((mask >= predicted).all())
    # matcher-aware only: positives + predicted children, nothing else
    module.setup_level(
        2,
        children=children_table(levels[2]),
        prev_head=(prev_W, np.zeros(4, np.float32)),
        loss=XRTransformerConfig(negatives="man", only_topk=1),
    )
    np.testing.assert_array_equal(module.shortlist_mask(emb, targets, tfn).numpy(), (predicted | (targets > 0)).numpy())


def test_shortlisted_loss_gradients_repeat_exactly_on_threads(tmp_path):
    """Same inputs, same gradients, every time: same-seed runs must give the same model (advanced
    indexing's backward accumulated repeated head rows in a thread-dependent order)."""
    from tiny_models import build_tiny

    from xtransformer.matcher.module import TrainOptions
    from xtransformer.methods.xrtransformer.module import XRLevelModule

    module = XRLevelModule(str(build_tiny("bert", tmp_path / "tiny")), 256, TrainOptions(pooling="cls"))
    gen = torch.Generator().manual_seed(0)
    emb = torch.randn(64, module.head.in_features, generator=gen, requires_grad=True)
    targets = (torch.rand(64, 256, generator=gen) < 0.05).float()
    rows, cols = (torch.rand(64, 256, generator=gen) < 0.4).nonzero(as_tuple=True)  # each head row many times

    def grads() -> list[torch.Tensor]:
        module.zero_grad()
        emb.grad = None
        logits = module.shortlist_logits(emb, rows, cols)
        w = hinge_weights(targets)
        weighted_squared_hinge(logits, targets[rows, cols], w[rows, cols], rows, 64).backward()
        return [module.head.weight.grad.clone(), module.head.bias.grad.clone(), emb.grad.clone()]

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        first = grads()
        for _ in range(10):
            assert all(torch.equal(a, b) for a, b in zip(first, grads()))
    finally:
        torch.set_num_threads(threads)


def test_level_schedule_and_bad_settings():
    assert [s["steps"] for s in MatcherConfig(max_steps=600).level_schedule(3)] == [100, 200, 300]
    cfg = MatcherConfig(level_steps=[200, 300, 500], level_lr=[1e-4, 1e-4, 5e-5])
    assert [(s["steps"], s["lr"]) for s in cfg.level_schedule(3)] == [(200, 1e-4), (300, 1e-4), (500, 5e-5)]
    with pytest.raises(MatcherConfigError, match=r"matcher\.level_steps.*2 entries but 3 levels"):
        MatcherConfig(level_steps=[1, 2]).level_schedule(3)
    with pytest.raises(MatcherConfigError, match=r"matcher\.level_lr"):
        MatcherConfig(level_lr=[0.0])
    with pytest.raises(XRTransformerConfigError, match=r"xrtransformer\.bootstrap"):
        XRTransformerConfig(bootstrap="copy")
    with pytest.raises(XRTransformerConfigError, match=r"xrtransformer\.final\.features"):
        XRTransformerConfig.from_mapping({"final": {"features": "tfidf"}})
    with pytest.raises(XRTransformerConfigError, match=r"unknown key.*xrtransformer\.depth"):
        XRTransformerConfig.from_mapping({"depth": 3})


def test_level_plan_matches_the_built_tree():
    from xtransformer.indexing import ClusterChain, IndexingConfig
    from xtransformer.methods.xrtransformer.model import level_plan as xr_plan

    icfg = IndexingConfig(n_clusters=64)
    xcfg = XRTransformerConfig(nr_splits=4)
    sizes = xr_plan(300, icfg, xcfg, MatcherConfig())
    # the binary tree 2, 4, ..., 64 seen 4-way: 4, 16, 64, then the 300 labels
    assert sizes == [4, 16, 64, 300]
    codes = np.arange(300) % 64
    chain = ClusterChain([sp.csr_matrix(m) for m in _binary_chain(codes, 64)])
    assert [lv.n_nodes for lv in tree_levels(list(chain.subsample(4)))] == sizes
    with pytest.raises(XRTransformerConfigError, match=r"xrtransformer\.max_match_clusters=2"):
        xr_plan(300, icfg, XRTransformerConfig(nr_splits=4, max_match_clusters=2), MatcherConfig())
    with pytest.raises(MatcherConfigError, match=r"matcher\.level_steps"):
        xr_plan(300, icfg, xcfg, MatcherConfig(level_steps=[1, 2]))
    assert xr_plan(300, icfg, XRTransformerConfig(nr_splits=4, max_match_clusters=100), MatcherConfig()) == [4, 16, 64]


def _binary_chain(codes: np.ndarray, k: int) -> list[sp.csr_matrix]:
    """A complete binary tree over k leaves (k a power of two) with labels assigned by ``codes``."""
    mats, n = [], 2
    mats.append(sp.csr_matrix(np.ones((2, 1), np.float32)))
    while n < k:
        mats.append(
            sp.csr_matrix(
                (np.ones(2 * n, np.float32), np.repeat(np.arange(n), 2), np.arange(2 * n + 1)), shape=(2 * n, n)
            )
        )
        n *= 2
    mats.append(
        sp.csr_matrix((np.ones(len(codes), np.float32), codes, np.arange(len(codes) + 1)), shape=(len(codes), k))
    )
    return mats


# ----------------------------------------------------------------------------- the level loop


def _toy():
    from tiny_models import toy_xmc

    texts, Y_splits, C = toy_xmc()
    return texts, Y_splits, C


class _Crash(RuntimeError):
    pass


def _fine_tune(
    tmp_path: Path,
    cache_dir: Path,
    crash_at: tuple[int, int] | None = None,
    steps=(3, 4, 5),
    pooling_declared: str | None = None,
    **xr_settings,
):
    import lightning.pytorch as pl
    from tiny_models import build_tiny

    from xtransformer.cache import StageCache
    from xtransformer.context import TrainContext
    from xtransformer.data.inputs import LabeledData
    from xtransformer.methods.xrtransformer.finetune import fine_tune
    from xtransformer.utils.io import settings_key

    class CrashAt(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if crash_at and pl_module.level == crash_at[0] and trainer.global_step == crash_at[1]:
                raise _Crash(f"killed at level {crash_at[0]}, step {crash_at[1]}")

    texts, Ys, C = _toy()
    codes = C.indices
    chain = _binary_chain(codes, C.shape[1])
    model = build_tiny("bert", tmp_path / "tiny")
    if pooling_declared:  # as a sentence-transformers folder declares its pooling (MiniLM: mean)
        (model / "1_Pooling").mkdir(exist_ok=True)
        (model / "1_Pooling" / "config.json").write_text(json.dumps({f"pooling_mode_{pooling_declared}_tokens": True}))
    mcfg = MatcherConfig(
        model_name_or_path=str(model),
        max_length=32,
        batch_size=8,
        lr=1e-3,
        level_steps=list(steps),
        checkpoint_every_n_steps=2,
        progress=False,
        cache_dir=str(tmp_path / "tok"),
    )
    lightning = {
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "num_sanity_val_steps": 0,
        "log_every_n_steps": 1,
    }
    xcfg = XRTransformerConfig(**{"nr_splits": 2, "eval_docs": None, "only_topk": 1, **xr_settings})
    cache = StageCache(cache_dir)
    n_levels = 1 if xcfg.levels == "last" else len(steps)
    keys = [settings_key("level", t, sched) for t, sched in enumerate(mcfg.level_schedule(n_levels))]
    ctx = TrainContext(cache=cache, lightning=lightning, callbacks=[CrashAt()])
    ids = [f"L{j}" for j in range(C.shape[0])]
    train, test = (LabeledData.build(texts[s], Ys[s], ids) for s in ("train", "test"))
    tuned = fine_tune(ctx, train, chain, mcfg, xcfg, keys, test)
    return tuned, cache


def _embed(tuned, split: str) -> np.ndarray:
    from xtransformer.matcher import EncodeOptions, LoadedMatcher

    return LoadedMatcher.load(tuned.model_dir).encode(_toy()[0][split], EncodeOptions(progress=False)).embeddings


@pytest.mark.slow
def test_killed_during_level_two_resumes_there_and_ends_the_same(tmp_path):
    from tiny_models import toy_xmc  # noqa: F401  (skip early if the helper is missing)

    with pytest.raises(_Crash):
        _fine_tune(tmp_path, tmp_path / "cache", crash_at=(1, 3))
    resumed, cache = _fine_tune(tmp_path, tmp_path / "cache")
    # level 0 was finished before the crash and is reused; level 1 resumes from its checkpoint
    assert [e[2] for e in cache.events if e[0] == "xrlevel"] == ["reused", "ran", "ran"]
    assert resumed.levels[1]["steps"] == 4
    fresh, _ = _fine_tune(tmp_path, tmp_path / "fresh")
    assert [lv["clusters"] for lv in fresh.levels] == [lv["clusters"] for lv in resumed.levels]
    for split in ("train", "test"):
        np.testing.assert_allclose(_embed(resumed, split), _embed(fresh, split), atol=1e-5)
    assert [lv.get("eval_recall@1") for lv in resumed.levels] == [lv.get("eval_recall@1") for lv in fresh.levels]


@pytest.mark.slow
def test_every_level_pools_as_the_pretrained_model_declares(tmp_path):
    # `auto` resolves once, on the pretrained model; every level pools the same way, and its saved
    # encoder folder declares it, so `auto` on that folder (a warm start from it) pools the same too
    from xtransformer.encoders import default_pooling

    _fine_tune(tmp_path, tmp_path / "cache", steps=(2, 2, 2), pooling_declared="mean")
    metas = sorted((tmp_path / "cache" / "stages" / "xrlevel").glob("*/matcher/matcher_config.json"))
    assert [json.loads(m.read_text())["pooling_resolved"] for m in metas] == ["mean"] * 3
    assert [default_pooling("bert", m.parent / "encoder") for m in metas] == ["mean"] * 3  # BERT's own: cls


@pytest.mark.slow
@pytest.mark.parametrize(
    "settings, steps",
    [
        ({"bootstrap": "weighted-linear", "bootstrap_docs": 40}, (2, 2, 2)),
        ({"bootstrap": "fresh", "shortlist": False, "importance": "normalized"}, (2, 2, 2)),
        ({"levels": "last"}, (3,)),
    ],
)
def test_ablation_settings_train(tmp_path, settings, steps):
    tuned, cache = _fine_tune(tmp_path, tmp_path / "cache", steps=steps, **settings)
    assert [lv["steps"] for lv in tuned.levels] == list(steps)
    assert len(tuned.levels) == (1 if settings.get("levels") == "last" else 3)
    from xtransformer.matcher import LoadedMatcher

    assert (
        tuned.levels[-1]["clusters"] == LoadedMatcher.load(tuned.model_dir).head.out_features
    )  # the finest level last
    if settings.get("bootstrap") == "weighted-linear":
        assert [lv["bootstrap"] for lv in tuned.levels] == ["fresh", "weighted-linear", "weighted-linear"]
    emb = _embed(tuned, "test")
    assert np.isfinite(emb).all() and emb.shape[0] == len(_toy()[0]["test"])


# ----------------------------------------------------------------------------- the whole method

TINY = [
    "data.max_docs=600",
    "matcher=tiny_bert",
    "matcher.level_steps=[20,30]",
    "matcher.batch_size=16",
    "matcher.max_length=32",
    "matcher.progress=false",
    "indexing.n_clusters=8",
    "tfidf.max_features=5000",
    "logger=csv",
    "method=xrtransformer",
    "xrtransformer.nr_splits=8",
    "xrtransformer.eval_docs=200",
]


def _train(tmp_path: Path, *overrides: str, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "WANDB_MODE": "offline",
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "PYTHONWARNINGS": "ignore",
        **(env or {}),
    }
    env.pop("LOCAL_RANK", None)
    return subprocess.run(
        [
            sys.executable,
            str(ROOT / "train.py"),
            *overrides,
            f"paths.cache_dir={tmp_path / 'cache'}",
            f"paths.output_dir={tmp_path / 'run'}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow
def test_tiny_xrtransformer_on_reuters_beats_popularity(tmp_path):
    proc = _train(tmp_path, *TINY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["method"] == "xrtransformer"
    levels = metrics["levels"]
    assert [lv["clusters"] for lv in levels] == [8, 90] and [lv["steps"] for lv in levels] == [20, 30]
    assert all(lv["seconds"] > 0 and 0 <= lv["eval_recall@5"] <= 100 for lv in levels)
    res = metrics["results"]
    assert {"xrtransformer", "xrlinear", "xrtransformer+xrlinear"} <= set(res)
    # popularity: always predict the most frequent training labels
    from xtransformer.utils.io import load_csr

    truth = load_csr(tmp_path / "run" / "truth" / "test.npz")
    pred = load_csr(tmp_path / "run" / "predictions" / "xrtransformer" / "test.npz")
    assert pred.shape == truth.shape
    from xtransformer.data import DataConfig, load_dataset

    ds = load_dataset(DataConfig(name="reuters21578", max_docs=600), cache_dir=tmp_path / "cache")
    top = int(np.asarray(ds.splits["train"].Y.sum(axis=0)).ravel().argmax())
    popularity_p1 = 100 * float(truth[:, top].sum()) / truth.shape[0]
    assert res["xrtransformer"]["P@1"] > popularity_p1 + 5
    # a rerun reuses every stage
    again = _train(tmp_path, *TINY)
    assert again.returncode == 0, again.stderr[-3000:]
    rerun = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert rerun["results"]["xrtransformer"] == res["xrtransformer"]
    assert "xrlevel" not in rerun["stages"]["ran"] and "xrfinal" not in rerun["stages"]["ran"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "override, key",
    [
        ("matcher.level_steps=[5]", "matcher.level_steps"),
        ("xrtransformer.max_match_clusters=4", "xrtransformer.max_match_clusters"),
        ("xrtransformer.final.features=tfidf", "xrtransformer.final.features"),
    ],
)
def test_bad_settings_fail_before_any_data_work(tmp_path, override, key):
    proc = _train(tmp_path, *TINY, override, timeout=120)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and key in last, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "cache" / "tfidf").exists() and not (tmp_path / "cache" / "stages").exists()


@pytest.mark.slow
def test_compose_with_every_group_and_ddp(tmp_path):
    """`method=xrtransformer matcher=xlnet indexing=pifa_neural` with the tiny stand-ins, under DDP."""
    proc = _train(
        tmp_path,
        *TINY,
        "matcher=tiny_xlnet",
        "matcher.level_steps=[4,4]",
        "matcher.max_length=32",
        "matcher.batch_size=8",
        "indexing=pifa_neural",
        "indexing.n_clusters=8",
        "trainer=ddp_cpu",
        "train_xrlinear=false",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Starting with 2 processes" in proc.stdout + proc.stderr
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert [lv["steps"] for lv in metrics["levels"]] == [4, 4]
    assert metrics["results"]["xrtransformer"]["P@1"] > 0
