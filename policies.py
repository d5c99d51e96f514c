"""Clipping policies for users and plug-in authors: the contract, the registry, the checks.

A policy is a subclass of :class:`Policy` (the contract, documented in full in
:mod:`fairclip.strategies.base` and in ``docs/plugins.md``) with a ``name``, a parameter schema
``Params`` (a subclass of :class:`PolicyParams`) and the methods that clip on the client and
move the bound on the server. Make it available to scenarios in one of three ways:

* ``fairclip.policies.register(MyPolicy)`` in the process that runs (or starts) the simulations;
* ``policy.name = "mypkg.policies:MyPolicy"`` in a scenario TOML or with ``--set``;
* an entry point of the group ``fairclip.policies`` in the package that ships it.

From Python, every entry point (:func:`fairclip.compare`, :func:`fairclip.simulate`,
:class:`fairclip.flower.DifferentialPrivacy`) takes a policy the same way: a name, a class or an
instance (which carries its parameters), resolved by :func:`resolve_policy`; every output shows
it under one name, :func:`display_name`.

:func:`check_policy` runs the properties every policy must keep (contributions never exceed
the noised sensitivity, bounds stay finite and positive, reports have norm at most 1) on any
policy, built-in or not; it needs ``hypothesis``.
"""

from __future__ import annotations

from typing import Any

from fairclip.strategies.base import (
    Broadcast,
    ClientReports,
    NoiseMultipliers,
    Policy,
    RowScales,
    ScaledReports,
    ServerRound,
    State,
    exponential_step,
    geometric_update,
    noisy_fraction,
)
from fairclip.strategies.clipping import clip_rows, hard_clip, row_norms
from fairclip.strategies.errors import PolicyConfigError
from fairclip.strategies.params import Fraction, NonNegativeFinite, PolicyParams, PositiveFinite
from fairclip.strategies.registry import (
    BUILTIN,
    ResolvedPolicy,
    build_policy,
    display_name,
    plugin_names,
    policy_class,
    policy_name,
    policy_parameters,
    register,
    resolve_policy,
)


def check_policy(policy: type[Policy] | str, params: Any = None, **options: Any) -> None:
    """The property checks of :mod:`fairclip.strategies.testing` on ``policy`` (a class or a
    policy name) with ``params`` (a mapping or a hypothesis strategy of mappings)."""
    from fairclip.strategies.testing import check_policy as check  # hypothesis: a test extra

    check(policy, params, **options)


__all__ = [
    "BUILTIN",
    "Broadcast",
    "ClientReports",
    "Fraction",
    "NoiseMultipliers",
    "NonNegativeFinite",
    "Policy",
    "PolicyConfigError",
    "PolicyParams",
    "PositiveFinite",
    "ResolvedPolicy",
    "RowScales",
    "ScaledReports",
    "ServerRound",
    "State",
    "build_policy",
    "check_policy",
    "clip_rows",
    "display_name",
    "exponential_step",
    "geometric_update",
    "hard_clip",
    "noisy_fraction",
    "plugin_names",
    "policy_class",
    "policy_name",
    "policy_parameters",
    "register",
    "resolve_policy",
    "row_norms",
]
