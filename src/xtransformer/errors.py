"""The errors a user can fix: a bad setting or bad input, reported as one line (``cli``).

Every package's own error class derives from :class:`UserError`, so the entry point can print
the message alone instead of a traceback (``HYDRA_FULL_ERROR=1`` shows the traceback).
"""


class UserError(ValueError):
    """Bad settings or input; the message names the config key, or the file and line."""
