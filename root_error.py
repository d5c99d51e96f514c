"""fairclip's root error type, :class:`FairclipError`, and how an error is put in one line.

A leaf (it imports nothing of fairclip), so that every room and the top-level leaves
(:mod:`fairclip.plugins`) can derive their errors from it. :mod:`fairclip.errors` gathers every
error a user may see; all of them derive from :class:`FairclipError`.
"""

from __future__ import annotations


class FairclipError(Exception):
    """An error fairclip reports to its user in one line: an invalid configuration, policy, data
    file or command-line value, a plug-in that cannot be loaded, a federation that cannot start,
    or a run that cannot learn."""


def describe(error: BaseException) -> str:
    """``error`` as one line: its type, then its message with every run of whitespace made one
    space (the type alone where it has no message)."""
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def one_line(error: BaseException) -> str:
    """``error`` as one line for a user: an OS error names its file and reason (not ``[Errno 28]
    ...``), any other error is :func:`describe`'s."""
    if isinstance(error, OSError) and error.strerror:
        where = f"{error.filename}: " if error.filename else ""
        return f"{where}{error.strerror}"
    return describe(error)
