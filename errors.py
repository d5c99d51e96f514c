"""Every error fairclip raises for its user, in one place; all derive from :class:`FairclipError`.

Each is defined in the room that raises it and gathered here, so a script catches them all with
``except fairclip.errors.FairclipError`` (``fairclip.FairclipError`` is the same class). Every
message is one line naming the problem; the command line prints it as ``fairclip: error: ...``
and exits with status 2 (1 for :class:`NotFiniteError`, a run that stopped learning).

- :class:`ConfigError`: a configuration, scenario file or command-line value is invalid;
- :class:`DataError`: a data file is missing, corrupt or malformed;
- :class:`PolicyError`, :class:`PolicyConfigError`: a policy that cannot run with DP, or a policy,
  noise or accounting parameter out of range;
- :class:`PluginError`: a plug-in reference that cannot be resolved;
- :class:`NotFiniteError`: a run's model or policy state is not finite;
- :class:`FederationError`, :class:`IdentityError`, :class:`ReplyError`: a federation that cannot
  start, a node or a reply fairclip's ServerApp refuses;
- :class:`ModError`: a train message or reply :func:`fairclip.flower.fairclip_mod` cannot clip.
"""

from __future__ import annotations

from fairclip.client.errors import ModError
from fairclip.plugins import PluginError
from fairclip.root_error import FairclipError, describe, one_line
from fairclip.scenarios.errors import ConfigError, DataError
from fairclip.server.errors import FederationError, IdentityError, ReplyError
from fairclip.strategies.errors import NotFiniteError, PolicyConfigError, PolicyError

__all__ = [
    "ConfigError",
    "DataError",
    "FairclipError",
    "FederationError",
    "IdentityError",
    "ModError",
    "NotFiniteError",
    "PluginError",
    "PolicyConfigError",
    "PolicyError",
    "ReplyError",
    "describe",
    "one_line",
]
