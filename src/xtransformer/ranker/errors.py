"""One error type for bad ranker input or settings."""

from __future__ import annotations

from xtransformer.errors import UserError


class RankerError(UserError):
    """Bad ranker input, config value or model folder; the message names the argument/key/file."""
