"""One error type for bad input data, always naming the file (and line) at fault."""

from __future__ import annotations

import os

from xtransformer.errors import UserError


class DataError(UserError):
    """Bad or missing input data. The message names the file and, where known, the line."""

    def __init__(self, message: str, path: str | os.PathLike | None = None, line: int | None = None):
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        super().__init__(where + message)
        self.path = None if path is None else str(path)
        self.line = line
