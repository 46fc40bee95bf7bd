"""The CNN baselines (Kim-CNN, XML-CNN): pooling and shapes by hand, the configs mirror the
published recipes, a tiny run on Reuters learns, its folder round-trips, a killed run resumes."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from matcher_helpers import TRAINER, Crash, LossRecorder

from xtransformer.methods.cnn import XMLCNN, KimCNN, KimCNNSettings, XMLCNNSettings
from xtransformer.methods.cnn.network import TextCNN, dynamic_max_pool

# ------------------------------------------------------------------------------ the network


@pytest.mark.parametrize(
    "chunks, expected",
    [
        (1, [5, 9]),  # max pooling: one value per map
        (2, [5, 4, 9, 2]),  # positions 0-2 and 3-5 of map 0, then of map 1
        (3, [5, 2, 4, 0, 9, 2]),  # pairs of positions
    ],
)
def test_dynamic_max_pool_keeps_each_chunks_maximum(chunks, expected):
    # one document, two feature maps over six positions
    h = torch.tensor([[[1.0, 5, 2, 0, 3, 4], [0, 0, 9, 1, 1, 2]]])
    assert dynamic_max_pool(h, chunks).tolist() == [expected]


def _shape(**kw: Any) -> SimpleNamespace:
    base = {"filter_widths": [3], "feature_maps": 4, "pooling_chunks": 1, "bottleneck": 0}
    return SimpleNamespace(**{**base, "embed_dropout": 0.0, "dropout": 0.0, **kw})


@pytest.mark.parametrize(
    "shape, pooled, out_in",
    [
        (_shape(), 4, 4),  # Kim-CNN: maps x widths, straight to the output
        (_shape(filter_widths=[2, 3, 5], feature_maps=4, pooling_chunks=2, bottleneck=7), 24, 7),  # XML-CNN
    ],
)
def test_layers_follow_the_config(shape, pooled, out_in):
    net = TextCNN((50, 6), 11, shape)
    assert [tuple(c.weight.shape) for c in net.convs] == [(shape.feature_maps, 6, w) for w in shape.filter_widths]
    if shape.bottleneck:
        assert (net.bottleneck.in_features, net.bottleneck.out_features) == (pooled, shape.bottleneck)
    else:
        assert net.bottleneck is None
    assert (net.output.in_features, net.output.out_features) == (out_in, 11)
    for length in (1, 4, 30):  # a one-token text is padded up to the widest filter
        ids = torch.randint(0, 50, (3, length))
        logits = net(ids, torch.ones_like(ids))
        assert logits.shape == (3, 11) and torch.isfinite(logits).all()


# ------------------------------------------------------------------------------ the configs


def test_configs_hold_the_published_recipes():
    from xtransformer.pipeline.settings import compose_settings

    kim, xml = KimCNNSettings().cnn, XMLCNNSettings().cnn
    assert (kim.filter_widths, kim.feature_maps, kim.pooling_chunks, kim.bottleneck) == ([8], 1024, 1, 0)
    assert (kim.dropout, kim.lr, kim.batch_size, kim.max_epochs, kim.max_length) == (0.4, 3e-4, 16, 50, 500)
    assert (xml.filter_widths, xml.feature_maps, xml.pooling_chunks, xml.bottleneck) == ([2, 4, 8], 256, 2, 512)
    assert (xml.dropout, xml.lr, xml.batch_size) == (0.2, 5e-4, 64)
    reuters = {"max_length", "max_epochs", "lr"}  # train.yaml's budget for the default data
    for method, record in (("kimcnn", kim), ("xmlcnn", xml)):  # each recipe written once, in code
        composed = compose_settings(f"method={method}").main.cnn
        for f in dataclasses.fields(record):
            if f.name not in reuters:
                assert getattr(composed, f.name) == getattr(record, f.name), (method, f.name)
    assert compose_settings("matcher=xmlcnn").main.cnn.bottleneck == 512  # the option, for X-Transformer's matcher


def test_fit_sections_merge_over_the_methods_defaults():
    s = XMLCNN.make_settings(None, {"cnn": {"feature_maps": 8}})
    assert s.cnn.feature_maps == 8 and s.cnn.bottleneck == 512 and s.cnn.filter_widths == [2, 4, 8]


# ------------------------------------------------------------------------------ training


TINY = {
    "encoder": "tiny:bert",
    "max_length": 64,
    "filter_widths": [2, 3],
    "feature_maps": 32,
    "batch_size": 32,
    "lr": 5e-3,
    "max_epochs": None,
    "max_steps": 120,
    "checkpoint_every_n_steps": 40,
    "progress": False,
}


@pytest.fixture(scope="module")
def reuters():
    from xtransformer.data import load_dataset

    return load_dataset("reuters21578", max_docs=1500, eval_split="dev")


def _fit(cls: type, reuters: Any, cache: Path, callbacks: list[Any], **cnn: Any):
    from xtransformer.cache import StageCache
    from xtransformer.context import TrainContext
    from xtransformer.data.inputs import LabeledData

    ctx = TrainContext(cache=StageCache(cache), lightning=TRAINER, callbacks=callbacks)
    cnn = {**TINY, "cache_dir": str(cache / "tok"), **cnn}
    return cls.fit(LabeledData.from_split(reuters, "train"), context=ctx, cnn=cnn)


def _popularity_p1(reuters: Any) -> float:
    train, dev = reuters.splits["train"], reuters.splits["dev"]
    top = int(np.asarray(train.Y.sum(axis=0)).ravel().argmax())
    return 100 * float(dev.Y[:, top].sum()) / dev.Y.shape[0]


@pytest.mark.slow
@pytest.mark.parametrize(
    "cls, cnn",
    [(KimCNN, {}), (XMLCNN, {"pooling_chunks": 2, "bottleneck": 32, "embed_dropout": 0.0, "dropout": 0.1, "lr": 1e-2})],
)
def test_a_tiny_run_on_reuters_learns_and_round_trips(tmp_path, reuters, cls, cnn):
    losses = LossRecorder()
    model = _fit(cls, reuters, tmp_path, [losses], **cnn)
    assert len(losses.losses) == TINY["max_steps"]
    assert np.mean(losses.losses[-20:]) < 0.5 * np.mean(losses.losses[:5])
    dev = reuters.splits["dev"]
    p1 = model.evaluate(dev.texts, dev.Y).metrics["P@1"]
    assert p1 > _popularity_p1(reuters) + 10, (p1, _popularity_p1(reuters))

    loaded = type(model).load(model.save(tmp_path / "model"))
    assert isinstance(loaded, cls) and loaded.label_ids == model.label_ids
    texts = [*dev.texts[:40], ""]
    a, b = model.predict_csr(texts), loaded.predict_csr(texts)
    assert (a != b).nnz == 0 and a.shape == (41, reuters.n_labels)
    assert len(loaded.predict(["grain exports rose"], k=3)[0]["labels"]) == 3


@pytest.mark.slow
def test_a_killed_run_resumes_and_ends_as_an_uninterrupted_one(tmp_path, reuters):
    short = {"max_steps": 30, "checkpoint_every_n_steps": 10, "dropout": 0.3}
    straight = LossRecorder()
    first = _fit(KimCNN, reuters, tmp_path / "straight", [straight], **short)
    with pytest.raises(RuntimeError, match="simulated crash"):
        _fit(KimCNN, reuters, tmp_path / "resumed", [Crash(15)], **short)
    resumed = LossRecorder()
    second = _fit(KimCNN, reuters, tmp_path / "resumed", [resumed], **short)
    assert len(resumed.losses) == 20  # from the checkpoint at step 10
    assert resumed.losses == pytest.approx(straight.losses[10:], abs=1e-5)
    a, b = first.network.state_dict(), second.network.state_dict()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-5, rtol=1e-5, msg=name)


@pytest.mark.parametrize("shape", [_shape(), _shape(filter_widths=[2, 3], pooling_chunks=2, bottleneck=5)])
def test_a_documents_scores_do_not_depend_on_its_batch(shape):
    from xtransformer.encoders.tokens import TokenizedTexts
    from xtransformer.methods.cnn.network import run_batches

    torch.manual_seed(0)
    net = TextCNN((50, 6), 7, shape)
    with torch.no_grad():  # windows over padding then score high: a batch's padding would show
        for conv in net.convs:
            conv.bias.fill_(3.0)
    lengths = [5, 30, 12]  # a short document batched with a long one is padded to the long one's length
    ids = np.concatenate([np.random.default_rng(n).integers(1, 50, n) for n in lengths]).astype(np.int32)
    tokens = TokenizedTexts(ids, np.cumsum([0, *lengths]), 0, False)
    together = {
        int(r): lg for rows, _, logits in run_batches(net, tokens, 3, "32-true", 32) for r, lg in zip(rows, logits)
    }
    for i in range(3):
        alone = TokenizedTexts(
            tokens.ids[tokens.offsets[i] : tokens.offsets[i + 1]], np.array([0, lengths[i]]), 0, False
        )
        (_, _, logits), *_ = run_batches(net, alone, 1, "32-true", 32)
        torch.testing.assert_close(logits[0], together[i])
