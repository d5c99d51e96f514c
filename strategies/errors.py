"""The errors raised for invalid policies and parameters.

Every error fairclip raises for a user to read derives from :class:`FairclipError` (defined in the
leaf module :mod:`fairclip.root_error`, re-exported here; :mod:`fairclip.errors` gathers them all):
its message is one line naming the problem.
"""

from __future__ import annotations

from fairclip.root_error import FairclipError, describe, one_line

__all__ = ["FairclipError", "NotFiniteError", "PolicyConfigError", "PolicyError", "describe", "one_line"]


class PolicyError(FairclipError, ValueError):
    """A policy that cannot run with differential privacy: a plug-in that breaks the contract of
    :class:`fairclip.strategies.base.Policy` (for example a client bound above the sensitivity its
    noise is calibrated to, or an override of the steps the base class guards). The message names
    the policy and the numbers or methods at fault."""


class PolicyConfigError(PolicyError):
    """A policy, noise or accounting parameter is out of range; the message names it."""


class NotFiniteError(FairclipError, ArithmeticError):
    """A run cannot learn: the released model, or the state a policy reached, is not finite (a
    learning rate that overflows the model, a plug-in whose next state is NaN). The message
    names the round and what is not finite; the run stops there."""


def did_you_mean(word: str, choices: object) -> str:
    """`` (did you mean 'x'?)`` for the choice closest to a misspelled ``word`` (difflib's ratio
    of at least 0.6), else ``""``: appended to an "unknown ..." error line."""
    import difflib

    close = difflib.get_close_matches(str(word), [str(choice) for choice in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
