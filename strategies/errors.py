"""Errors raised for invalid policies and for invalid policy or privacy parameters."""


class PolicyError(ValueError):
    """A policy that cannot run with differential privacy: a plug-in that breaks the contract of
    :class:`fairclip.strategies.base.Policy` (for example a client bound above the sensitivity its
    noise is calibrated to, or an override of the steps the base class guards). The message names
    the policy and the numbers or methods at fault."""


class PolicyConfigError(PolicyError):
    """A policy, noise or accounting parameter is out of range; the message names it."""


class NotFiniteError(ArithmeticError):
    """A run cannot learn: the released model, or the state a policy reached, is not finite (a
    learning rate that overflows the model, a plug-in whose next state is NaN). The message
    names the round and what is not finite; the run stops there."""
