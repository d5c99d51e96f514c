"""Build a policy from its name and a mapping of parameters (config keys).

The built-in policies are listed in :data:`POLICIES`; any other name is resolved as a plug-in
(:mod:`fairclip.plugins`). Parameters are checked by the policy's own schema, ``Params``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fairclip.plugins import ENTRY_POINT_GROUPS, PluginError, registered, resolve
from fairclip.plugins import register as register_plugin
from fairclip.strategies.adaptive import AdaptiveClipping
from fairclip.strategies.base import GUARDED_METHODS, Policy
from fairclip.strategies.bounded import BoundedAdaptiveClipping
from fairclip.strategies.constant import ConstantClipping
from fairclip.strategies.errors import PolicyConfigError, did_you_mean
from fairclip.strategies.global_adapt import GlobalAdaptiveScaling
from fairclip.strategies.global_scaling import GlobalScaling
from fairclip.strategies.none import NoClipping
from fairclip.strategies.online import OnlineSensitivityClipping
from fairclip.strategies.params import PolicyParams
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

BUILTIN = POLICIES
"""The policies shipped with fairclip (registered names of plug-ins cannot shadow them)."""


def policy_class(name: str) -> type[Policy]:
    """The policy class a policy name refers to: a built-in, a policy registered with
    :func:`register` or by an entry point, or an import path ``package.module:Class``
    (:mod:`fairclip.plugins`). Anything else raises one :class:`PolicyConfigError` line."""
    if name in POLICIES:
        return POLICIES[name]
    try:
        cls = resolve("policy", name)
    except PluginError as error:
        if str(error).startswith("unknown policy"):
            known = ", ".join([*POLICIES, *plugin_names()])
            hint = did_you_mean(name, [*POLICIES, *plugin_names()])
            raise PolicyConfigError(f"unknown policy {name!r}{hint} (known: {known})") from None
        raise PolicyConfigError(str(error)) from None
    return check_policy_class(cls, name)


def check_policy_class(cls: object, name: str) -> type[Policy]:
    """``cls`` if it is a concrete :class:`Policy` with a parameter schema that leaves the guarded
    steps of the base class alone (a private policy may not override :data:`GUARDED_METHODS`),
    else one error line."""
    if not (isinstance(cls, type) and issubclass(cls, Policy)):
        raise PolicyConfigError(f"policy {name!r} is {cls!r}, not a subclass of fairclip's Policy")
    if not (isinstance(cls.Params, type) and issubclass(cls.Params, PolicyParams)):
        raise PolicyConfigError(f"policy {name!r}: its Params must subclass PolicyParams")
    if not isinstance(getattr(cls, "name", None), str):
        raise PolicyConfigError(f"policy {name!r}: the class needs a `name` (a string)")
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if cls.scales is Policy.scales and cls.transform is Policy.transform:
        missing.append("scales (or transform)")
    if missing:
        raise PolicyConfigError(f"policy {name!r} does not implement {', '.join(missing)}")
    overridden = [method for method in GUARDED_METHODS if getattr(cls, method) is not getattr(Policy, method)]
    if cls.private and overridden:
        raise PolicyConfigError(
            f"policy {name!r} overrides {', '.join(overridden)}: the base class keeps these so that "
            "no contribution or report exceeds the sensitivity its noise uses; define scales() or "
            "transform(), contribution_bounds() and sensitivity() instead"
        )
    return cls


def register(cls: type[Policy], name: str | None = None, *, replace: bool = False) -> type[Policy]:
    """Register a policy class under ``name`` (default: its ``name``) for this process and the
    simulations it starts; returns the class, so it also serves as a class decorator."""

    key = cls.name if name is None and isinstance(getattr(cls, "name", None), str) else name
    check_policy_class(cls, str(key))
    if key in POLICIES:
        raise PolicyConfigError(f"{key!r} is a built-in policy; register the policy under another name")
    try:
        register_plugin("policy", key, cls, replace=replace)
    except PluginError as error:
        raise PolicyConfigError(str(error)) from None
    return cls


def plugin_names() -> list[str]:
    """Names of the policies registered in this process or declared by entry points."""
    from importlib.metadata import entry_points

    declared = [entry.name for entry in entry_points(group=ENTRY_POINT_GROUPS["policy"])]
    return sorted(set(registered("policy")) | set(declared))


def policy_parameters(name: str) -> dict[str, Any]:
    """The parameters a policy accepts, with their defaults (``None`` where one is required),
    read from its schema (:attr:`Policy.Params`)."""
    return policy_class(name).Params.defaults()


def build_policy(name: str, params: Mapping[str, Any] | None = None, *, num_cohorts: int = 1) -> Policy:
    """Instantiate the policy ``name``; unknown or out-of-range parameters raise one clear error."""
    return policy_class(name)(num_cohorts=num_cohorts, **dict(params or {}))
