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
