"""The error of a model that cannot be found offline, worded with what the user can do."""

from __future__ import annotations

from xtransformer.errors import UserError


class ModelNotFoundError(UserError):
    """A model name or path that cannot be resolved to a local model folder (a ValueError too): the
    user fixes it, so the entry point prints its instructions as one line, not a traceback."""


def not_found(name: str, why: str) -> ModelNotFoundError:
    return ModelNotFoundError(
        f"model {name!r} cannot be found ({why}). Nothing can be downloaded from a model hub here: "
        "copy the model folder (config.json, weights, tokenizer files) to this machine and point at "
        "it with matcher.model_name_or_path=/path/to/model, or use one of the packaged models "
        "(matcher=minilm, matcher=mpnet) or a tiny random one (matcher=tiny_bert)."
    )
