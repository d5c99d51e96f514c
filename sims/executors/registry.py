"""The executors by name: where a simulated run's clients train (``fairclip run --executor``).

Each executor's module offers ``session(config, task, data_dir, *, workers, actors, address)``,
a context manager that starts what the run needs (threads, Ray actors), yields the factory
``(task, policy) -> executor`` that :func:`fairclip.sims.executors.loop.simulate` calls, and
frees it all at the end. A new executor is its module and one line in :data:`EXECUTORS`.

The table names modules by their import path, so reading it imports nothing: torch and Ray are
imported when a run starts on the executor that needs them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from fairclip.strategies.errors import did_you_mean

EXECUTORS: dict[str, str] = {
    "local": "fairclip.sims.executors.local:session",  # this process, ``workers`` threads
    "ray": "fairclip.sims.executors.ray:session",  # Ray actors, on a cluster or a local Ray
}
"""Each executor's name and its ``session`` function (``module:function``)."""


def names() -> tuple[str, ...]:
    """The executors' names."""
    return tuple(EXECUTORS)


def check(name: str) -> str:
    """``name`` when an executor has it, else :class:`ValueError` (one line, "did you mean")."""
    if name not in EXECUTORS:
        known = " or ".join(EXECUTORS)
        raise ValueError(f"executor must be {known} (got {name!r}){did_you_mean(name, EXECUTORS)}")
    return name


def session(name: str) -> Callable[..., Any]:
    """The ``session`` context manager of executor ``name`` (its module imported now)."""
    module, _, function = EXECUTORS[check(name)].partition(":")
    return getattr(importlib.import_module(module), function)
