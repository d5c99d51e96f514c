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


def did_you_mean(word: str, choices: object) -> str:
    """`` (did you mean 'x'?)`` for the choice closest to a misspelled ``word`` (difflib's ratio
    of at least 0.6), else ``""``: appended to an "unknown ..." error line."""
    import difflib

    close = difflib.get_close_matches(str(word), [str(choice) for choice in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
