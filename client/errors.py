"""The errors of the client side, defined apart from the Flower code that raises them (so that
:mod:`fairclip.errors` gathers every error without importing Flower)."""

from __future__ import annotations

from fairclip.strategies.errors import FairclipError


class ModError(FairclipError, ValueError):
    """A train message or reply :func:`fairclip.client.mod.fairclip_mod` cannot clip; it becomes the
    node's error reply."""
