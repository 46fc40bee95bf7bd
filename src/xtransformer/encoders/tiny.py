"""Tiny randomly initialised BERT / RoBERTa / XLNet models with a tokenizer trained on the data, for
tests and quick runs; deterministic for a corpus across processes."""

from __future__ import annotations

import json
import os
import string
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from xtransformer.utils.io import build_once, settings_key, texts_fingerprint

TINY_PREFIX = "tiny:"
TINY_FAMILIES = ("bert", "roberta", "xlnet")


@dataclass(frozen=True)
class TinySpec:
    """Shape of a tiny random model; its tokenizer is trained on the fly."""

    family: str = "bert"
    hidden: int = 128
    layers: int = 2
    heads: int = 4
    intermediate: int = 256
    vocab_size: int = 4000
    max_positions: int = 512
    seed: int = 0


# Fallback corpus: one "word" per printable character, enough for a char-level vocabulary.
_DEFAULT_CORPUS = (" ".join(string.ascii_letters + string.digits + string.punctuation),)


def build_tiny_model(spec: TinySpec, out_dir: str | os.PathLike, corpus: Sequence[str] | None = None) -> Path:
    """Write a random ``spec.family`` model + trained tokenizer in HF layout to ``out_dir`` (atomic)."""
    if spec.family not in TINY_FAMILIES:
        raise ValueError(f"TinySpec.family must be one of {TINY_FAMILIES}, got {spec.family!r}")
    out = Path(out_dir)
    texts = list(corpus) if corpus else list(_DEFAULT_CORPUS)

    def build(tmp: Path) -> None:
        tokenizer = _train_tiny_tokenizer(spec, texts)
        tokenizer.save_pretrained(tmp)
        model = _tiny_model_from_config(spec, tokenizer)
        model.save_pretrained(tmp)

    build_once(out, build)
    return out


def _tiny_cached(spec: TinySpec, cache: Path, corpus: Sequence[str] | None) -> Path:
    texts = list(corpus) if corpus else list(_DEFAULT_CORPUS)
    # "canonical": models built before the tokenizers were made deterministic are not reused
    key = settings_key(asdict(spec), texts_fingerprint(texts), "canonical")
    return build_tiny_model(spec, cache / "models" / f"tiny-{spec.family}-{key}", texts)


def _train_tiny_tokenizer(spec: TinySpec, texts: Sequence[str]) -> Any:
    """A tokenizer of ``spec.family``'s kind trained on ``texts``."""
    return {"bert": _bert_tokenizer_trained, "roberta": _roberta_tokenizer_trained}.get(
        spec.family, _xlnet_tokenizer_trained
    )(spec, texts)


def _bert_tokenizer_trained(spec: TinySpec, texts: Sequence[str]) -> Any:
    """WordPiece with BERT's special tokens and template."""
    from tokenizers import Tokenizer, models, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    trained = _bert_tokenizer(Tokenizer(models.WordPiece(unk_token="[UNK]")))
    trained.train_from_iterator(
        texts,
        trainers.WordPieceTrainer(vocab_size=spec.vocab_size, special_tokens=[*specials, *_continuing_alphabet(texts)]),
    )
    # a fresh tokenizer on the trained vocabulary: the "##x" tokens must not stay special
    tok = _bert_tokenizer(Tokenizer(models.WordPiece(_model_state(trained.model)["vocab"], unk_token="[UNK]")))
    tok.add_special_tokens(specials)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    names = {
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "cls_token": "[CLS]",
        "sep_token": "[SEP]",
        "mask_token": "[MASK]",
    }
    return PreTrainedTokenizerFast(tokenizer_object=tok, **names)


def _roberta_tokenizer_trained(spec: TinySpec, texts: Sequence[str]) -> Any:
    """Byte-level BPE with RoBERTa's special tokens (<s>=0, <pad>=1, </s>=2)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    # Order fixes <s>=0, <pad>=1, </s>=2 as in RoBERTa (its position ids depend on pad id).
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=spec.vocab_size,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    names = {
        "bos_token": "<s>",
        "pad_token": "<pad>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "mask_token": "<mask>",
        "cls_token": "<s>",
        "sep_token": "</s>",
    }
    return PreTrainedTokenizerFast(tokenizer_object=tok, **names)


def _xlnet_tokenizer_trained(spec: TinySpec, texts: Sequence[str]) -> Any:
    """A unigram model as XLNet's sentencepiece, padded on the left."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    # XLNet: sentencepiece-like unigram, "<sep> <cls>" appended at the end, padding on the left.
    specials = ["<unk>", "<s>", "</s>", "<cls>", "<sep>", "<pad>", "<mask>"]
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(
        texts, trainers.UnigramTrainer(vocab_size=spec.vocab_size, special_tokens=specials, unk_token="<unk>")
    )
    tok.model = _canonical_unigram(tok.model, specials)
    sep, cls = tok.token_to_id("<sep>"), tok.token_to_id("<cls>")
    tok.post_processor = processors.TemplateProcessing(
        single="$A:0 <sep>:0 <cls>:2",
        pair="$A:0 <sep>:0 $B:1 <sep>:1 <cls>:2",
        special_tokens=[("<sep>", sep), ("<cls>", cls)],
    )
    names = {
        "unk_token": "<unk>",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "cls_token": "<cls>",
        "sep_token": "<sep>",
        "pad_token": "<pad>",
        "mask_token": "<mask>",
    }
    # Like XLNet's own tokenizer: segment ids are returned (0 for text and <sep>, 2 for <cls>).
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        padding_side="left",
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
        **names,
    )


def _bert_tokenizer(tok: Any) -> Any:
    from tokenizers import decoders, normalizers, pre_tokenizers

    tok.normalizer = normalizers.BertNormalizer(lowercase=False)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    return tok


# The `tokenizers` trainers walk hash maps whose order is seeded afresh in every process, so the
# same corpus gave other tiny models (the random embedding rows follow the token ids) and other
# predictions in every fresh cache:
# - WordPiece numbers the "##x" tokens (x a character that continues a word) in that order, and
#   ties between merges go to the lower ids, so even the vocabulary differed. Given up front as
#   special tokens, they get fixed ids, and the merges follow deterministically.
# - Unigram sums its scores in that order (they differ in the 11th digit): they are rounded; and
#   it scores the characters it adds back by their place in that order.
# (The byte-level BPE trainer of tiny:roberta numbers its alphabet by code point: deterministic.)
def _continuing_alphabet(texts: Sequence[str]) -> list[str]:
    return ["##" + c for c in sorted(set().union(*map(set, texts))) if not c.isspace()]


def _canonical_unigram(model: Any, specials: Sequence[str]) -> Any:
    from tokenizers import models

    state = _model_state(model)  # the trained pieces and scores
    # 4 decimals: far finer than segmentation needs, far coarser than the trainer's noise (~1e-11),
    # so two runs round alike except with odds of about 1e-3.
    pieces = [(p, round(score, 4)) for p, score in state["vocab"] if p not in specials]
    # The characters it had to add back get min score + k * 1e-4, k in hash order: all single
    # characters in that band get its lowest score.
    low = min(score for _, score in pieces)
    band = low + 1e-4 * sum(len(p) == 1 for p, _ in pieces)
    pieces = [(p, low if len(p) == 1 and score <= band else score) for p, score in pieces]
    pieces.sort(key=lambda ps: (-ps[1], ps[0]))
    return models.Unigram(
        [*((t, 0.0) for t in specials), *pieces],
        unk_id=list(specials).index("<unk>"),
        byte_fallback=state.get("byte_fallback", False),
    )


def _model_state(model: Any) -> dict[str, Any]:
    """A trained ``tokenizers`` model as its JSON form (the Python classes expose no vocab getter)."""
    return json.loads(model.__getstate__())


def _tiny_model_from_config(spec: TinySpec, tokenizer: Any) -> nn.Module:
    from transformers import AutoModel, BertConfig, RobertaConfig, XLNetConfig

    vocab = len(tokenizer)
    if spec.family == "bert":
        config = BertConfig(
            vocab_size=vocab,
            hidden_size=spec.hidden,
            num_hidden_layers=spec.layers,
            num_attention_heads=spec.heads,
            intermediate_size=spec.intermediate,
            max_position_embeddings=spec.max_positions,
            pad_token_id=tokenizer.pad_token_id,
        )
    elif spec.family == "roberta":
        config = RobertaConfig(
            vocab_size=vocab,
            hidden_size=spec.hidden,
            num_hidden_layers=spec.layers,
            num_attention_heads=spec.heads,
            intermediate_size=spec.intermediate,
            max_position_embeddings=spec.max_positions + 2,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    else:
        config = XLNetConfig(
            vocab_size=vocab,
            d_model=spec.hidden,
            n_layer=spec.layers,
            n_head=spec.heads,
            d_inner=spec.intermediate,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    with torch.random.fork_rng(devices=[]):  # deterministic weights, caller's RNG untouched
        torch.manual_seed(spec.seed)
        return AutoModel.from_config(config)
