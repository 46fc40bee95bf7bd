"""One error type for bad ranker input or settings."""

from __future__ import annotations


class RankerError(ValueError):
    """Bad ranker input, config value or model folder; the message names the argument/key/file."""
