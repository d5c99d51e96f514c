"""Build a policy from its registry name and a mapping of parameters (config keys)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from fairclip.strategies.adaptive import AdaptiveClipping
from fairclip.strategies.base import Policy
from fairclip.strategies.bounded import BoundedAdaptiveClipping
from fairclip.strategies.constant import ConstantClipping
from fairclip.strategies.errors import PolicyConfigError
from fairclip.strategies.global_adapt import GlobalAdaptiveScaling
from fairclip.strategies.global_scaling import GlobalScaling
from fairclip.strategies.none import NoClipping
from fairclip.strategies.online import OnlineSensitivityClipping
from fairclip.strategies.per_cohort import PerCohortClipping
from fairclip.strategies.reweight import CohortReweighting
from fairclip.strategies.soft import SoftClipping

POLICIES: dict[str, type[Policy]] = {
    cls.name: cls
    for cls in (
        NoClipping,
        ConstantClipping,
        AdaptiveClipping,
        BoundedAdaptiveClipping,
        SoftClipping,
        GlobalScaling,
        GlobalAdaptiveScaling,
        PerCohortClipping,
        CohortReweighting,
        OnlineSensitivityClipping,
    )
}

_ENGINE_ARGUMENTS = frozenset({"num_cohorts"})


def policy_parameters(name: str) -> dict[str, Any]:
    """The parameters a policy accepts, with their defaults (``None`` where one is required)."""
    cls = policy_class(name)
    signature = inspect.signature(cls.__init__)
    return {
        key: (None if param.default is inspect.Parameter.empty else param.default)
        for key, param in signature.parameters.items()
        if key != "self" and key not in _ENGINE_ARGUMENTS
    }


def policy_class(name: str) -> type[Policy]:
    """The policy class registered under ``name``."""
    try:
        return POLICIES[name]
    except KeyError:
        known = ", ".join(POLICIES)
        raise PolicyConfigError(f"unknown strategy {name!r} (known: {known})") from None


def build_policy(name: str, params: Mapping[str, Any] | None = None, *, num_cohorts: int = 1) -> Policy:
    """Instantiate the policy ``name``; unknown or out-of-range parameters raise one clear error."""
    params = dict(params or {})
    known = policy_parameters(name)
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise PolicyConfigError(
            f"strategy {name!r} has no parameter {unknown[0]!r} (it takes: {', '.join(known)})"
        )
    return policy_class(name)(num_cohorts=num_cohorts, **params)
