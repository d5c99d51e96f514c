"""The errors of a run's server: a federation that cannot start, a node or a reply it refuses.

Defined apart from the Flower code that raises them, so that :mod:`fairclip.errors` gathers every
error without importing Flower.
"""

from __future__ import annotations

from fairclip.strategies.errors import FairclipError


class FederationError(FairclipError, RuntimeError):
    """The connected nodes do not form the configured federation."""


class IdentityError(FairclipError, ValueError):
    """An identity answer the server refuses (the node is left out, the reason logged)."""


class ReplyError(FairclipError, ValueError):
    """A client reply that the server must drop (the reason recorded server-internally)."""
