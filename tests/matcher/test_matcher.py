"""Matcher units: targets, tokens, sampler, loss, module, configs."""

from __future__ import annotations

import inspect
from dataclasses import fields
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import scipy.sparse as sp
import torch
from tiny_models import FAMILIES, tiny_model_dir, toy_xmc
from transformers import AutoTokenizer

from xtransformer.encoders import tokens as tokens_mod
from xtransformer.matcher import MatcherConfig, MatcherConfigError
from xtransformer.matcher.datamodule import (
    EpochSampler,
    MatcherDataModule,
    TokenizedTexts,
    instance_cluster_targets,
    tokenize_texts,
)
from xtransformer.matcher.loss import cluster_recall_at_b, squared_hinge_loss
from xtransformer.matcher.module import MatcherModule, TrainOptions
from xtransformer.matcher.train import topb_recall
from xtransformer.training import LinearWarmupDecay

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


# --------------------------------------------------------------------------- targets and tokens


def test_instance_cluster_targets() -> None:
    Y = sp.csr_matrix(np.array([[1, 0, 1, 0], [0, 0, 0, 0], [0, 1, 1, 1]], dtype=np.float32))
    C = sp.csr_matrix(np.array([[1, 0], [0, 1], [1, 0], [1, 0]], dtype=np.float32))
    M = instance_cluster_targets(Y, C)
    assert sp.isspmatrix_csr(M) and M.dtype == np.float32
    np.testing.assert_array_equal(M.toarray(), [[1, 0], [0, 0], [1, 1]])  # binarised, not counts
    with pytest.raises(ValueError, match="label"):
        instance_cluster_targets(Y, C[:3])


@pytest.mark.parametrize("family", FAMILIES)
def test_tokenized_batches_match_tokenizer_padding(family: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir(family))
    texts, _, _ = toy_xmc()
    docs = texts["dev"][:6]
    tokens = tokenize_texts(tokenizer, docs, max_length=24, progress=False)
    rows = np.array([4, 0, 2])
    batch = tokens.batch(rows)
    ref = tokenizer([docs[i] for i in rows], padding=True, truncation=True, max_length=24, return_tensors="pt")
    assert torch.equal(batch["input_ids"], ref["input_ids"])
    assert torch.equal(batch["attention_mask"], ref["attention_mask"])
    assert tokens.left_pad == (family == "xlnet")
    # XLNet marks its <cls> as segment 2 (kept); BERT's all-zero segments are the default (dropped).
    assert (tokens.type_ids is not None) == (family == "xlnet")
    if tokens.type_ids is not None:
        real = ref["attention_mask"].bool()
        assert torch.equal(batch["token_type_ids"][real], ref["token_type_ids"][real])
    assert int(tokens.lengths.max()) <= 24


def test_tokenize_cache_and_char_truncation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir("bert"))
    texts = toy_xmc()[0]["train"][:20]
    first = tokenize_texts(tokenizer, texts, 16, cache_dir=tmp_path, progress=False)
    assert len(list((tmp_path / "tokens").glob("*.npz"))) == 1

    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("tokenised again despite the cache")

    monkeypatch.setattr(tokens_mod, "_tokenize", boom)
    again = tokenize_texts(tokenizer, texts, 16, cache_dir=tmp_path, progress=False)
    np.testing.assert_array_equal(first.ids, again.ids)
    np.testing.assert_array_equal(first.offsets, again.offsets)
    with pytest.raises(AssertionError, match="despite"):
        tokenize_texts(tokenizer, texts, 17, cache_dir=tmp_path, progress=False)  # other key
    monkeypatch.undo()
    short = tokenize_texts(tokenizer, texts, 64, truncate_chars=12, progress=False)
    ref = tokenize_texts(tokenizer, [t[:12] for t in texts], 64, progress=False)
    np.testing.assert_array_equal(short.ids, ref.ids)


@pytest.mark.parametrize("family", FAMILIES)
def test_first_tokens_equal_the_tokenizers_own_truncation(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cut before tokenising never changes the ids: words cut in half or dropped at the cut,
    whitespace runs and line breaks there, long unknown words (one token each: the window runs into
    the cut), texts without whitespace, short texts, a user cut."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir(family))
    encode, redone = tokens_mod._encode, []
    monkeypatch.setattr(
        tokens_mod,
        "_encode",
        lambda tok, texts, *a, **k: (redone.append(len(texts)) if not k.get("offsets") else None)
        or encode(tok, texts, *a, **k),
    )
    words = " ".join(toy_xmc()[0]["train"][:40]).split()
    rng = np.random.default_rng(0)
    texts = []
    for n in range(60):
        seps = rng.choice([" ", "  ", "\n", " \n\t ", "-", ", "], size=len(words))
        texts.append("".join(w + s for w, s in zip(words[n:], seps))[: 40 + 23 * n])
    texts += [
        "".join(words)[:500],
        "short text",
        "",
        " leading and trailing spaces  " * 9,
        " ".join(["ωμεγαλογράμματα" * 2] * 60),
    ]
    for max_length in (8, 16, 33):
        redone.clear()
        got = tokens_mod.first_tokens(tokenizer, texts, max_length)
        ref = tokenizer(texts, truncation=True, max_length=max_length, return_attention_mask=False)
        assert got["input_ids"] == ref["input_ids"]
        assert got.get("token_type_ids") == ref.get("token_type_ids")
        assert 1 <= sum(redone) < len(texts) // 2  # most texts from the cut, a few (no whitespace) whole
    cut = tokens_mod.first_tokens(tokenizer, texts, 64, truncate_chars=50)
    assert cut["input_ids"] == tokenizer([t[:50] for t in texts], truncation=True, max_length=64)["input_ids"]


def test_tokens_roundtrip(tmp_path: Path) -> None:
    tokens = TokenizedTexts(
        ids=np.arange(7, dtype=np.int32),
        offsets=np.array([0, 3, 7]),
        pad_id=0,
        left_pad=True,
        type_ids=np.array([0, 0, 2, 0, 0, 0, 2], dtype=np.int8),
    )
    tokens.save(tmp_path / "t.npz")
    back = TokenizedTexts.load(tmp_path / "t.npz")
    assert back.left_pad and back.pad_id == 0
    batch = back.batch(np.array([0, 1]))
    assert batch["input_ids"].tolist() == [[0, 0, 1, 2], [3, 4, 5, 6]]
    assert batch["attention_mask"].tolist() == [[0, 1, 1, 1], [1, 1, 1, 1]]
    assert batch["token_type_ids"].tolist() == [[0, 0, 0, 2], [0, 0, 0, 2]]


def test_epoch_sampler_shards_and_resumes() -> None:
    shards = [list(EpochSampler(10, True, seed=3, rank=r, world_size=3)) for r in range(3)]
    assert all(len(s) == 4 for s in shards)  # padded to equal length
    assert set().union(*shards) == set(range(10))
    one = EpochSampler(10, True, seed=3)
    one.set_epoch(1)
    full = list(one)
    assert full != list(range(10)) and sorted(full) == list(range(10))
    assert list(one) == full  # same (seed, epoch), same order
    one.resume(epoch=1, skip_rows=4)
    assert list(one) == full[4:]
    assert list(one) == full  # the skip applies once
    evaluation = [list(EpochSampler(5, False, 0, rank=r, world_size=2, pad=False)) for r in range(2)]
    assert evaluation == [[0, 2, 4], [1, 3]]


# --------------------------------------------------------------------------- loss


def test_squared_hinge_loss_matches_equation_3() -> None:
    logits = torch.tensor([[2.0, -0.5], [0.25, 0.0]])
    targets = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    # M̃ = [[1, -1], [-1, 1]]: margins 1 - M̃ g = [[-1, 0.5], [1.25, 1]]
    expected = (0.0 + 0.25 + 1.5625 + 1.0) / 4
    assert squared_hinge_loss(logits, targets).item() == pytest.approx(expected)
    with pytest.raises(ValueError, match="shape"):
        squared_hinge_loss(logits, targets[:1])


def test_cluster_recall_at_b() -> None:
    logits = torch.tensor([[0.9, 0.1, 0.5, 0.0], [0.0, 0.2, 0.1, 0.3], [1.0, 0.0, 0.0, 0.0]])
    targets = torch.tensor([[1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]], dtype=torch.float32)
    recall, has = cluster_recall_at_b(logits, targets, b=2)
    assert recall[:2].tolist() == [0.5, 0.0]
    assert has.tolist() == [True, True, False]
    topb = sp.csr_matrix(np.array([[0.9, 0, 0.5, 0], [0, 0.2, 0, 0.3], [1.0, 0, 0, 0]], dtype=np.float32))
    assert topb_recall(topb, sp.csr_matrix(targets.numpy())) == pytest.approx(0.25)


def test_linear_warmup_decay() -> None:
    schedule = LinearWarmupDecay(warmup=4, total=10)
    values = [schedule(s) for s in range(11)]
    assert values[0] > 0 and values[:4] == sorted(values[:4])
    assert max(values) == 1.0 and values[4] == 1.0
    assert values[10] == 0.0 and values[4:] == sorted(values[4:], reverse=True)


# --------------------------------------------------------------------------- module


@pytest.mark.parametrize("family,pooling", [("bert", "cls"), ("roberta", "cls"), ("xlnet", "last")])
def test_one_training_step_per_family(family: str, pooling: str, tmp_path: Path) -> None:
    texts, Y, C = toy_xmc()
    cfg = MatcherConfig(
        model_name_or_path=str(tiny_model_dir(family)),
        max_length=32,
        batch_size=8,
        cache_dir=str(tmp_path),
        progress=False,
        seed=1,
    )
    dm = MatcherDataModule(tiny_model_dir(family), texts, Y, C, cfg, val_split="dev")
    dm.setup("fit")
    module = MatcherModule(
        str(tiny_model_dir(family)),
        num_clusters=C.shape[1],
        options=TrainOptions(lr=1e-3),
        with_token_types=dm.tokens["train"].type_ids is not None,
    )
    assert module.pooling == pooling
    frozen = {n for n, p in module.encoder.named_parameters() if not p.requires_grad}
    # Unused parameters are frozen so that DDP needs no per-step unused-parameter search.
    expected_frozen = {
        "bert": {"pooler.dense.weight", "pooler.dense.bias"},
        "roberta": {"pooler.dense.weight", "pooler.dense.bias"},
        "xlnet": {"mask_emb"},
    }[family]
    assert frozen == expected_frozen  # XLNet's segment parameters train: its batches carry segment ids
    before = {n: p.detach().clone() for n, p in module.named_parameters() if p.requires_grad}
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        use_distributed_sampler=False,
    )
    trainer.fit(module, datamodule=dm)
    assert trainer.global_step == 1 and int(module.trained_steps) == 1
    loss = trainer.callback_metrics["train/loss"]
    assert torch.isfinite(loss) and 0.5 < loss.item() < 5.0
    changed = [n for n, p in module.named_parameters() if p.requires_grad and not torch.equal(p, before[n])]
    assert "head.weight" in changed and any(n.startswith("encoder.") for n in changed)
    batch = next(iter(dm.val_dataloader()))
    emb, logits = module(batch)
    assert emb.shape == (len(batch["rows"]), module.encoder.config.hidden_size)
    assert logits.shape == (len(batch["rows"]), C.shape[1])
    assert batch["targets"].shape == logits.shape and set(batch["targets"].unique().tolist()) <= {0.0, 1.0}


def test_validation_logs_cluster_precision_equal_to_evaluate(tmp_path: Path) -> None:
    """The matcher's validation P@k (torchmetrics XMCMetrics) is what ``metrics.evaluate`` gives on
    the same dev predictions."""
    from xtransformer.metrics import evaluate

    texts, Y, C = toy_xmc()
    cfg = MatcherConfig(
        model_name_or_path=str(tiny_model_dir("bert")),
        max_length=32,
        batch_size=8,
        eval_batch_size=5,
        cache_dir=str(tmp_path),
        progress=False,
        seed=1,
    )
    dm = MatcherDataModule(tiny_model_dir("bert"), texts, Y, C, cfg, val_split="dev")
    dm.setup("fit")
    module = MatcherModule(str(tiny_model_dir("bert")), num_clusters=C.shape[1], options=TrainOptions(lr=1e-3))
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        use_distributed_sampler=False,
    )
    trainer.fit(module, datamodule=dm)
    trainer.validate(module, datamodule=dm, verbose=False)
    module.eval()
    with torch.no_grad():
        batches = list(dm.val_dataloader())
        logits = torch.cat([module(b)[1] for b in batches]).numpy()
        targets = torch.cat([b["targets"] for b in batches]).numpy()
    want = evaluate(sp.csr_matrix(targets > 0), sp.csr_matrix(logits + 10.0), ks=(1,))  # shifted: all stored
    assert abs(float(trainer.callback_metrics["val/cluster_P@1"]) - want["P@1"]) < 1e-4


def test_no_weight_decay_on_bias_and_layernorm(tiny_bert) -> None:
    module = MatcherModule(str(tiny_bert), num_clusters=3, options=TrainOptions(weight_decay=0.1, head_lr=1e-2))
    names = {id(p): n for n, p in module.named_parameters()}
    groups = module.param_groups()
    trainable = [p for p in module.parameters() if p.requires_grad]
    assert sum(len(g["params"]) for g in groups) == len(trainable)
    for group in groups:
        group_names = [names[id(p)] for p in group["params"]]
        if group["weight_decay"] == 0.0:
            assert all("bias" in n or "LayerNorm" in n for n in group_names)
        else:
            assert not any("bias" in n or "LayerNorm" in n for n in group_names)
    assert {g["lr"] for g in groups if any(names[id(p)].startswith("head") for p in g["params"])} == {1e-2}


@pytest.mark.parametrize("family", ["bert", "xlnet"])
def test_dropout_setting_reaches_every_dropout(family: str) -> None:
    """``matcher.dropout=0`` turns off hidden and attention dropout (any family): two forward passes
    in training mode agree; the model's own rates (None) keep them apart. The config records it."""
    path = str(tiny_model_dir(family))
    ids = torch.randint(5, 50, (4, 16))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    def two_passes(module: MatcherModule) -> tuple[torch.Tensor, torch.Tensor]:
        assert module.encoder.training
        torch.manual_seed(0)
        first = module(batch)[0]
        return first, module(batch)[0]

    a, b = two_passes(MatcherModule(path, num_clusters=3))
    assert not torch.allclose(a, b)
    off = MatcherModule(path, num_clusters=3, options=TrainOptions(dropout=0.0))
    a, b = two_passes(off)
    assert torch.equal(a, b)
    assert all(m.p == 0.0 for m in off.encoder.modules() if isinstance(m, torch.nn.Dropout))
    config = off.encoder.config
    assert all(
        getattr(config, k) == 0.0
        for k in ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout")
        if isinstance(getattr(config, k, None), float)
    )


@pytest.mark.parametrize("algorithm", ["norm", "value"])
def test_fused_adamw_still_clips_gradients(algorithm: str) -> None:
    """On CPU the optimizer is the fused AdamW, which Lightning's AMP plugin will not clip for:
    the module clips itself, as torch's own clipping would."""
    module = MatcherModule(str(tiny_model_dir("bert")), num_clusters=3)
    groups = module.param_groups()
    assert module._fused(groups)  # CPU, no loss scaler
    optimizer = torch.optim.AdamW(groups, fused=True)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for i, p in enumerate(params):
        p.grad = torch.full_like(p, 1.0 + i)
    module.configure_gradient_clipping(optimizer, 0.5, algorithm)
    if algorithm == "norm":
        assert abs(float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params]))) - 0.5) < 1e-4
    else:
        assert max(float(p.grad.abs().max()) for p in params) == pytest.approx(0.5)


# --------------------------------------------------------------------------- configs


def _compose(group: str, name: str) -> dict:
    """The ``group=name`` node as the main config composes it (root interpolations resolved)."""
    from omegaconf import OmegaConf

    from xtransformer.configuration import compose

    return OmegaConf.to_container(compose([f"{group}={name}"])[group], resolve=True)


def test_matcher_options_compose_into_the_record() -> None:
    names = sorted(p.stem for p in (CONFIGS / "matcher").glob("*.yaml") if not p.stem.startswith("_"))
    expected = {
        "minilm",
        "mpnet",
        "bert",
        "roberta",
        "xlnet",
        "bert_base",
        "roberta_base",
        "xlnet_base",
        "tiny_bert",
        "tiny_roberta",
        "tiny_xlnet",
    }
    assert expected <= set(names)
    field_names = {f.name for f in fields(MatcherConfig)}
    models = {}
    for name in names:
        values = _compose("matcher", name)
        assert set(values) == field_names | {"_target_"}, name
        assert values["name"] == name and values["_target_"] == "xtransformer.matcher.MatcherConfig"
        models[name] = MatcherConfig.from_mapping(values).model_name_or_path
    assert models["bert"] == "bert-large-cased" and models["roberta"] == "roberta-large"
    assert models["xlnet"] == "xlnet-large-cased" and models["tiny_xlnet"] == "tiny:xlnet"
    assert models["minilm"] == "minilm" and models["mpnet"] == "mpnet"


def test_trainer_yaml_are_trainer_kwargs() -> None:
    from xtransformer.matcher.train import _OWNED_TRAINER_KEYS

    params = set(inspect.signature(pl.Trainer.__init__).parameters)
    for path in (CONFIGS / "trainer").glob("*.yaml"):
        values = _compose("trainer", path.stem)
        assert set(values) <= params, path.name
        assert not set(values) & set(_OWNED_TRAINER_KEYS), path.name
    assert _compose("trainer", "ddp")["strategy"] == "ddp"
    assert _compose("trainer", "cpu")["precision"] == "32-true"


@pytest.mark.parametrize(
    "key,value",
    [
        ("pooling", "max"),
        ("max_length", 0),
        ("warmup_ratio", 1.0),
        ("save_embeddings_dtype", "int8"),
        ("max_steps", 0),
        ("dropout", 1.0),
    ],
)
def test_config_errors_name_the_key(key: str, value: object) -> None:
    with pytest.raises(MatcherConfigError, match=f"matcher.{key}"):
        MatcherConfig(**{key: value})
    with pytest.raises(MatcherConfigError, match="unknown"):
        MatcherConfig.from_dict({"nope": 1})
