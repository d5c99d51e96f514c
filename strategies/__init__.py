"""Clipping policies, noise and privacy accounting. Pure numpy: no Flower, no Ray (except that
secure aggregation's protocol, :mod:`fairclip.strategies.secagg_protocol`, calls Flower's
cryptographic primitives, imported when a stage runs).

``build_policy(name, params)`` returns a :class:`Policy`; its ``client_side`` and
``server_side`` are the only places where clipping, noise and bound updates happen.
"""

from fairclip.strategies.base import ClientReports, NoiseMultipliers, Policy, ServerRound
from fairclip.strategies.errors import PolicyConfigError
from fairclip.strategies.registry import POLICIES, build_policy, policy_parameters

__all__ = [
    "POLICIES",
    "ClientReports",
    "NoiseMultipliers",
    "Policy",
    "PolicyConfigError",
    "ServerRound",
    "build_policy",
    "policy_parameters",
]
