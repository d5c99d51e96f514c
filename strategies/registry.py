"""Build a policy from its name and a mapping of parameters (config keys).

The built-in policies are listed in :data:`POLICIES`; any other name is resolved as a plug-in
(:mod:`fairclip.plugins`). Parameters are checked by the policy's own schema, ``Params``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fairclip.plugins import ENTRY_POINT_GROUPS, PluginError, is_import_path, registered, resolve
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


def build_policy(
    policy: str | type[Policy], params: Mapping[str, Any] | None = None, *, num_cohorts: int = 1
) -> Policy:
    """Instantiate the policy ``policy`` (a name or a class, :func:`resolve_policy`) with
    ``params``; unknown or out-of-range parameters raise one clear error."""
    if isinstance(policy, str):
        cls = policy_class(policy)
    else:
        cls = resolve_policy(policy, register_class=False).cls
    return cls(num_cohorts=num_cohorts, **dict(params or {}))


# ----- one way to hand fairclip a policy -------------------------------------------------------

ACCEPTED = (
    "a policy name (a built-in such as 'bounded', a registered plug-in's name, or an import path "
    "'package.module:Class'), a subclass of fairclip.policies.Policy, or an instance of one"
)
"""What every entry point accepts as a policy (:func:`resolve_policy`)."""


@dataclass(frozen=True)
class ResolvedPolicy:
    """A policy as :func:`resolve_policy` resolved it: what a run needs, and its one name."""

    cls: type[Policy]
    """The policy class."""
    name: str
    """The one name shown for it in every output (:func:`display_name`)."""
    reference: str
    """The string a configuration holds (``policy.name``) to find the class, in this process
    and in the ones it starts: the name given, or the name the class is registered under."""
    params: dict[str, Any] | None = None
    """An instance's parameters (it carries its own), else ``None``."""
    instance: Policy | None = None
    """The instance given, else ``None``."""


def resolve_policy(policy: object, *, register_class: bool = True) -> ResolvedPolicy:
    """The one resolver of a policy handed to fairclip: ``compare``, ``simulate``,
    :class:`fairclip.flower.DifferentialPrivacy` and configuration files all use it.

    ``policy`` is (a) a name: a built-in (``"bounded"``), a name registered with
    :func:`register` or by an entry point, or an import path ``"package.module:Class"``; (b) a
    subclass of :class:`Policy`; or (c) an instance of one, which carries its own parameters
    (:attr:`ResolvedPolicy.params`). A class or an instance that no name reaches yet is
    registered under its display name (``register_class``), so that the processes a run starts
    (Ray workers) find it too, as :func:`fairclip.plugins.snapshot` carries registrations there;
    without ``register_class`` nothing is registered (what builds the policy in this process only).

    Anything else -- another type, an empty string, an unknown name, a class that breaks the
    contract -- raises one :class:`PolicyConfigError` line naming what was given and what is
    accepted."""
    if isinstance(policy, str):
        if not policy.strip():
            raise PolicyConfigError(f"a policy must be {ACCEPTED} (got {policy!r})")
        cls = policy_class(policy)
        return ResolvedPolicy(cls, _name_of_reference(policy, cls), policy)
    instance = None
    if isinstance(policy, Policy):
        instance, cls = policy, type(policy)
    elif isinstance(policy, type) and issubclass(policy, Policy):
        cls = policy
    else:
        shown = f"the class {policy.__qualname__}" if isinstance(policy, type) else f"{policy!r}"
        raise PolicyConfigError(f"a policy must be {ACCEPTED} (got {shown})")
    check_policy_class(cls, f"{cls.__module__}:{cls.__qualname__}")
    name = display_name(cls)
    if is_import_path(name):  # its own name is taken by another policy: no name reaches it
        raise PolicyConfigError(
            f"policy class {cls.__qualname__}: its name {cls.name!r} is taken by another policy; give "
            "the class a name of its own, or register it under one (fairclip.policies.register(cls, name))"
        )
    if register_class and _reaches(name) is not cls:
        register(cls, name, replace=True)  # at most a redefinition of the same class (display_name)
    params = None if instance is None else {key: value for key, value in instance.params}
    return ResolvedPolicy(cls, name, name, params, instance)


def display_name(cls: type[Policy]) -> str:
    """The one name of the policy class ``cls`` in every output (CLI report, tables, summaries,
    plots, the Flower wrapper's log), whichever way it was handed over:

    1. a built-in's name;
    2. else the name it is registered under in this process (:func:`register`; its own ``name``
       if it is registered under several names, one of them);
    3. else the name of an entry point that declares it (``fairclip.policies`` group);
    4. else its ``name`` attribute, unless a built-in or another registered policy holds that
       name (an earlier definition of the same ``module:Class``, as a notebook cell run again
       makes, does not count): then its import path ``module:Class``.

    A name a user registered or declared is shown as given: ``"hard-schedule"`` and
    ``"my_research:HardSchedule"`` (whose class says ``name = "hard-schedule"``) are the same
    policy and show the same name."""
    own = getattr(cls, "name", None)
    if isinstance(own, str) and POLICIES.get(own) is cls:
        return own
    names = [name for name, obj in registered("policy").items() if obj is cls]
    if names:
        return own if own in names else names[0]
    path = f"{cls.__module__}:{cls.__qualname__}"
    from importlib.metadata import entry_points

    for entry in entry_points(group=ENTRY_POINT_GROUPS["policy"]):
        if entry.value.replace(" ", "") == path:
            return entry.name
    if isinstance(own, str) and own and ":" not in own:
        taken = POLICIES.get(own) or registered("policy").get(own)
        if taken is None or taken is cls or _redefinition(taken, cls):
            return own
    return path


def _redefinition(old: object, cls: type) -> bool:
    """Whether ``old`` is an earlier definition of ``cls`` (the same module and name: a notebook
    cell or a module run again), whose registration ``cls`` takes over."""
    return (
        isinstance(old, type)
        and old.__module__ == cls.__module__
        and old.__qualname__ == cls.__qualname__
        and POLICIES.get(getattr(old, "name", None)) is not old
    )


def policy_name(reference: str) -> str:
    """The display name (:func:`display_name`) of the policy a configuration's ``policy.name``
    refers to: a built-in, registered or declared name as it is, an import path by its class."""
    if not is_import_path(reference):
        return reference
    return display_name(policy_class(reference))


def _name_of_reference(reference: str, cls: type[Policy]) -> str:
    """A registered or declared name stays as given; an import path shows its class's name."""
    return display_name(cls) if is_import_path(reference) else reference


def _reaches(name: str) -> object:
    """The object ``name`` resolves to in this process (built-in or registered), else ``None``."""
    return POLICIES.get(name) or registered("policy").get(name)
