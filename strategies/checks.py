"""Parameter checks shared by the policies; each raises one :class:`PolicyConfigError` line."""

from __future__ import annotations

import math

from fairclip.strategies.errors import PolicyConfigError


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PolicyConfigError(f"{name} must be a number (got {value!r})")
    if not math.isfinite(value):
        raise PolicyConfigError(f"{name} must be finite (got {value})")
    return float(value)


def positive(name: str, value: object) -> float:
    """A finite number > 0."""
    number = _number(name, value)
    if number <= 0:
        raise PolicyConfigError(f"{name} must be > 0 (got {number:g})")
    return number


def non_negative(name: str, value: object) -> float:
    """A finite number >= 0."""
    number = _number(name, value)
    if number < 0:
        raise PolicyConfigError(f"{name} must be >= 0 (got {number:g})")
    return number


def fraction(name: str, value: object) -> float:
    """A number in [0, 1]."""
    number = _number(name, value)
    if not 0.0 <= number <= 1.0:
        raise PolicyConfigError(f"{name} must be in [0, 1] (got {number:g})")
    return number


def flag(name: str, value: object) -> bool:
    """A boolean."""
    if not isinstance(value, bool):
        raise PolicyConfigError(f"{name} must be true or false (got {value!r})")
    return value


def lower_bound_within(lower_bound: float, initial_bound: float) -> float:
    """C_LB may not exceed C_0: the bound would start below its own floor."""
    if lower_bound > initial_bound:
        raise PolicyConfigError(
            f"lower_bound ({lower_bound:g}) must not exceed initial_bound ({initial_bound:g})"
        )
    return lower_bound
