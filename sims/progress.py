"""The progress display of the long commands (``run``, ``compare``, ``reproduce``, ``tune``).

On a terminal it is rich's live bar: done of total, time so far and an ETA. Where standard error
is not a terminal (a log file, a pipe, a run under ``nohup``) rich draws nothing until the end, so
a run of hours would be silent: there the display writes plain lines instead, one as work
finishes (for a run's rounds: none in its first ``every`` seconds, then at most one every
``every`` seconds, and the last), each with what finished, done of total, the time so far and
the ETA.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

SPEED_WINDOW_SECONDS = 7 * 24 * 3600.0
"""rich estimates the bar's ETA from the steps of this window (its default, 30 s, holds at most
one step of a reproduction whose runs take minutes, and then shows no ETA at all)."""


def _clock(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-:--:--"
    return str(timedelta(seconds=int(max(0.0, seconds))))


def pace_eta(elapsed: float | None, completed: float, total: float | None) -> float | None:
    """Seconds left at the pace so far, elapsed / completed per step (None before the first
    step or without a total). rich's own estimate needs two steps within its window."""
    if not elapsed or not completed or total is None:
        return None
    return elapsed / completed * max(0.0, total - completed)


class WatchedProgress(Progress):
    """rich's :class:`~rich.progress.Progress` that also reports in plain lines where its
    console is not a terminal (see the module's docstring)."""

    def __init__(self, *columns: Any, title: str, unit: str, every: float, **options: Any):
        super().__init__(*columns, **options)
        self.title = title
        """The bar's title, rich markup and ``{task.description}`` allowed."""
        self.unit = unit
        """What one step of the bar is ("runs", "rounds")."""
        self.every = every
        """With ``every`` > 0 (a run's rounds), the first plain line comes ``every`` seconds after
        the start and the next ones at least ``every`` seconds apart, the last one only where an
        earlier one was written: a short run stays silent. With 0, one line per step."""
        self._last_line = self.get_time() if every > 0 else -math.inf
        self._wrote = False

    def advance(self, task_id: TaskID, advance: float = 1, note: str | None = None) -> None:
        """Advance ``task_id`` by ``advance`` steps; ``note`` names what finished (a run's key)."""
        super().advance(task_id, advance)
        if self.console.is_terminal:
            return
        with self._lock:
            task = self._tasks[task_id]
        now = self.get_time()
        due = now - self._last_line >= self.every
        if not (due or (task.finished and (self._wrote or not self.every))):
            return
        self._last_line = now
        self._wrote = True
        name = Text.from_markup(self.title.format(task=task)).plain
        done = f"{task.completed:g}/{task.total:g}" if task.total is not None else f"{task.completed:g}"
        finished = f" ({note})" if note else ""
        remaining = 0.0 if task.finished else pace_eta(task.elapsed, task.completed, task.total)
        times = f"{_clock(task.elapsed)} elapsed, eta {_clock(remaining)}"
        self.console.print(
            f"{name}: {done} {self.unit} done{finished}, {times}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )


def progress_bar(
    title: str,
    *,
    console: Console,
    transient: bool,
    unit: str = "runs",
    every: float = 0.0,
    clock: Callable[[], float] | None = None,
) -> WatchedProgress:
    """The progress display of a long command on ``console`` (standard error): rich's bar with
    done of total, time so far and an ETA (from the pace of the finished steps) on a terminal,
    plain lines elsewhere (:class:`WatchedProgress`). ``clock``: seconds, monotonic (default
    :func:`time.monotonic`)."""
    return WatchedProgress(
        TextColumn(title),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=console,
        transient=transient,
        speed_estimate_period=SPEED_WINDOW_SECONDS,
        get_time=clock,
        title=title,
        unit=unit,
        every=every,
    )
