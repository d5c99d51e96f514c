"""Errors raised for invalid policy or privacy parameters."""


class PolicyConfigError(ValueError):
    """A policy, noise or accounting parameter is out of range; the message names it."""
