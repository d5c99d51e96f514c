"""The one error type of the data layer.

A :class:`DataError` is a ``ValueError`` whose message is a single line that names the missing,
corrupt or malformed file (or the missing setting) and says how to obtain it, so that the command
line can print it as is and exit with status 2.
"""

from __future__ import annotations


class DataError(ValueError):
    """A data file is missing, corrupt or malformed, or no data directory is configured."""

    def __init__(self, message: str) -> None:
        # Keep the promise of one line even when a message embeds text from elsewhere.
        super().__init__(" ".join(str(message).splitlines()))
