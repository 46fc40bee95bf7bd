"""The error of a model that cannot be found or fetched, worded with what the user can do."""

from __future__ import annotations

from xtransformer.errors import UserError


class ModelNotFoundError(UserError):
    """A model name or path that cannot be resolved to a local model folder (a ValueError too): the
    user fixes it, so the entry point prints its instructions as one line, not a traceback."""


def not_found(name: str, why: str) -> ModelNotFoundError:
    return ModelNotFoundError(
        f"model {name!r} cannot be found ({why}): copy the model folder (config.json, weights, tokenizer "
        "files) to this machine and set matcher.model_name_or_path=<local folder>, give a Hugging Face id, "
        "or use a packaged model (matcher=minilm, matcher=mpnet) or a tiny random one (matcher=tiny_bert)."
    )


def not_downloadable(name: str, why: str, cache: str) -> ModelNotFoundError:
    """A Hugging Face id that is not in the cache ``cache`` and cannot be downloaded now (``why``)."""
    return ModelNotFoundError(
        f"model {name!r} is not in the Hugging Face cache {cache} and cannot be downloaded ({why}): download "
        f"it on a machine with network (`hf download {name}`) and copy that machine's Hugging Face cache "
        "(HF_HUB_CACHE) here, or set matcher.model_name_or_path=<local folder>."
    )
