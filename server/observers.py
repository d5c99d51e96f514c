"""What a run produced, and who watches it: :class:`RunResult` and the run's observers.

An observer sees a run (:class:`fairclip.server.run.Run`) as it goes: the file writer
(:class:`fairclip.server.outputs.RunWriter`), a progress bar, the trackers, a user's callback
(:class:`RoundCallback`), a benchmark's clock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np


@dataclass
class RunResult:
    """What a run produced: rows of ``rounds.csv`` and the content of ``summary.json``."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    stop_reason: str | None = None
    model: np.ndarray | None = None
    """θ after the last finished round."""
    public_columns: set[str] = field(default_factory=set)
    """Columns of ``rows`` that DP covers (or that are public anyway) and may be published; every
    other column -- exact counts, simulation diagnostics, what an executor adds -- is internal
    to the server (:func:`fairclip.server.outputs.split_rows`)."""


class RunObserver(Protocol):
    """Sees a run as it goes: ``on_round`` after each finished round (with its row), ``on_finish``
    once at the end -- also after an interruption, when ``run.status`` is ``interrupted``. The
    file writer, the progress bar, the trackers and a user's callback are observers.

    An observer may also define ``on_start(run)``, called once just before the first round's
    sampling (after the run's setup: the task, the actors, on Flower the nodes' identification).

    A row holds server-internal values too (exact counts, simulation diagnostics): only the
    columns in ``run.public_columns`` are covered by DP or public, and an observer that publishes
    anything must keep to them (as the file writer does, :func:`fairclip.server.outputs.split_rows`).
    """

    def on_round(self, row: dict[str, Any], run: Any) -> None: ...

    def on_finish(self, run: Any) -> None: ...


@dataclass(frozen=True)
class RoundCallback:
    """An observer that calls ``function(row)`` after every round."""

    function: Callable[[dict[str, Any]], None]

    def on_round(self, row: dict[str, Any], run: Any) -> None:
        self.function(row)

    def on_finish(self, run: Any) -> None:
        return None


def notify_start(observers: Sequence[RunObserver], run: Any) -> None:
    """Call ``on_start(run)`` of the observers that define it (:class:`RunObserver`)."""
    for observer in observers:
        start = getattr(observer, "on_start", None)
        if start is not None:
            start(run)
