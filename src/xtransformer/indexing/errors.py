"""One error type for bad indexing input, so callers can catch it apart from bugs."""

from __future__ import annotations

from xtransformer.errors import UserError


class IndexingError(UserError):
    """Bad input to label indexing: the message names the argument, config key or file at fault."""
