"""The errors of scenarios: an invalid configuration, and data that cannot be read.

Both are ``ValueError``s (and :class:`fairclip.errors.FairclipError`) whose message is one line
naming the problem, so that the command line can print it as is and exit with status 2.
"""

from __future__ import annotations

from fairclip.strategies.errors import FairclipError


class ConfigError(FairclipError, ValueError):
    """A configuration, scenario file or command-line value is invalid; the message names it."""


class DataError(FairclipError, ValueError):
    """A data file is missing, corrupt or malformed, or no data directory is configured: the
    message names the missing, corrupt or malformed file (or the missing setting) and says how to
    obtain it."""

    def __init__(self, message: str) -> None:
        # Keep the promise of one line even when a message embeds text from elsewhere.
        super().__init__(" ".join(str(message).splitlines()))
