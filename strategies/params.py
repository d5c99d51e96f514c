"""A policy's parameters as a typed schema: what a scenario's ``[policy]`` table may hold.

Every policy class names its schema in ``Params``, a subclass of :class:`PolicyParams` (a frozen,
strict pydantic model that forbids unknown keys). The registry validates a configuration against
it before building the policy, so a plug-in policy gets the same one-line errors as a built-in
one, and its defaults live in one place::

    class HardSchedule(Policy):
        name = "hard-schedule"

        class Params(PolicyParams):
            initial_bound: PositiveFinite = 1.0
            decay: Fraction = 0.9
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fairclip.strategies.errors import PolicyConfigError

PositiveFinite = Annotated[float, Field(gt=0, allow_inf_nan=False)]
"""A finite number > 0 (a bound, a multiplier)."""
NonNegativeFinite = Annotated[float, Field(ge=0, allow_inf_nan=False)]
"""A finite number >= 0 (a learning rate, a floor that may be 0)."""
Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
"""A number in [0, 1] (a target quantile)."""


class PolicyParams(BaseModel):
    """Base of every policy's parameter schema. ``normalize`` (De et al. 2022: divide the noisy
    sum by m̂ · s_t instead of m̂) applies to every policy."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    normalize: bool = False

    @classmethod
    def parse(cls, values: Mapping[str, Any], policy: str) -> PolicyParams:
        """``values`` checked against this schema; the first problem raises one
        :class:`PolicyConfigError` line that names the parameter."""
        try:
            return cls.model_validate(dict(values))
        except ValidationError as error:
            raise PolicyConfigError(_first_problem(error.errors(), cls, policy)) from None

    @classmethod
    def check_values(cls, values: Mapping[str, Any], policy: str) -> None:
        """Check the parameters ``values`` gives, each against its type and range, where the rest
        may be missing (a scenario's table of a policy that does not run: a value it holds is
        refused now, not when the policy is chosen); one :class:`PolicyConfigError` line."""
        try:
            cls.model_validate(dict(values))
        except ValidationError as error:
            problems = [problem for problem in error.errors() if problem["type"] != "missing"]
            if problems:
                raise PolicyConfigError(_first_problem(problems, cls, policy)) from None

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Every parameter with its default (``None`` where the parameter is required)."""
        return {
            key: (None if field.is_required() else field.get_default(call_default_factory=True))
            for key, field in sorted(cls.model_fields.items(), key=lambda item: item[0] == "normalize")
        }


def first_problem(problems: list[Any]) -> tuple[dict[str, Any], str, str]:
    """The problem of a failed pydantic validation to report, its dotted key and its message (the
    one reading of pydantic's errors, for policy parameters and the configuration alike). An
    unknown key comes first: a misspelled key (``[federaton]``) also leaves the real one missing,
    and the misspelling is what to fix."""
    first = next((p for p in problems if p["type"] == "extra_forbidden"), problems[0])
    return first, ".".join(str(part) for part in first["loc"]), first["msg"].removeprefix("Value error, ")


def _first_problem(problems: list[Any], schema: type[PolicyParams], policy: str) -> str:
    first, key, message = first_problem(problems)
    if first["type"] == "extra_forbidden":
        return f"policy {policy!r} has no parameter {key!r} (it takes: {', '.join(schema.defaults())})"
    if first["type"] == "missing":
        return f"policy {policy!r} needs {key}"
    if not key:  # a check across parameters (a model validator) names them in its message
        return message
    given = first.get("input")
    limits = {k: f"{v:g}" if isinstance(v, int | float) else v for k, v in first.get("ctx", {}).items()}
    phrase = _PHRASES[first["type"]].format(**limits) if first["type"] in _PHRASES else f": {message}"
    return f"{key} {phrase} (got {given!r})".replace(" : ", ": ")


_PHRASES = {
    "greater_than": "must be > {gt}",
    "greater_than_equal": "must be >= {ge}",
    "less_than": "must be < {lt}",
    "less_than_equal": "must be <= {le}",
    "finite_number": "must be finite",
    "float_type": "must be a number",
    "int_type": "must be an integer",
    "bool_type": "must be true or false",
    "string_type": "must be a string",
}
"""Short wording of pydantic's most common errors (the rest keep pydantic's message)."""


def lower_bound_within(lower_bound: float, initial_bound: float) -> float:
    """C_LB may not exceed C_0: the bound would start below its own floor (for a schema's
    ``model_validator``; the message becomes the error's one line)."""
    if lower_bound > initial_bound:
        raise PolicyConfigError(
            f"lower_bound ({lower_bound:g}) must not exceed initial_bound ({initial_bound:g})"
        )
    return lower_bound
