"""The progress display of the command line (``run``, ``compare``, ``reproduce``, ``tune``) and of
the Python API (:class:`ApiProgress`: ``simulate``, ``compare``, ``tune``, ``reproduce``).

On a terminal it is rich's live bar: done of total, time so far and an ETA. Where standard error
is not a terminal (a log file, a pipe, a run under ``nohup``) rich draws nothing until the end, so
a run of hours would be silent: there the display writes plain lines instead, one as work
finishes (for a run's rounds: none in its first ``every`` seconds, then at most one every
``every`` seconds, and the last), each with what finished, done of total, the time so far and
the ETA.

Both ETAs come from the pace of the steps this process did: steps found already done (a resumed
reproduction's finished runs) count as done but not towards the pace, since they took no time; so
does the share of a run's rounds that an earlier process computed before this one continued it
from its checkpoint (:func:`fairclip.server.checkpoint.share_computed_earlier`). Without that, a
run resumed one round before its end would set a pace of seconds a run.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

REUSED = "reused"
"""The task field that counts its steps found already done (:meth:`WatchedProgress.advance`)."""


def _clock(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-:--:--"
    return str(timedelta(seconds=int(max(0.0, seconds))))


def pace_eta(
    elapsed: float | None, completed: float, total: float | None, reused: float = 0.0
) -> float | None:
    """Seconds left at the pace so far: elapsed / (completed - reused) per step for the
    total - completed steps left, where ``reused`` of the completed steps were found already
    done and took no time (None before the first timed step or without a total)."""
    timed = completed - reused
    if not elapsed or timed <= 0 or total is None:
        return None
    return elapsed / timed * max(0.0, total - completed)


def task_eta(task: Task) -> float | None:
    """:func:`pace_eta` of a bar's task (0 once it is finished)."""
    if task.finished:
        return 0.0
    return pace_eta(task.elapsed, task.completed, task.total, task.fields.get(REUSED, 0))


class PaceRemainingColumn(ProgressColumn):
    """The bar's ETA, :func:`task_eta` (rich's own estimate counts every step, the reused ones
    too, and needs two steps within its speed window)."""

    def render(self, task: Task) -> Text:
        return Text(_clock(task_eta(task)), style="progress.remaining")


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

    def stop(self) -> None:
        """Stop the display; a disabled one writes nothing (rich before 14.3 still ended it with
        an empty line off a terminal, before an error's one line)."""
        if not self.disable:
            super().stop()

    def advance(
        self, task_id: TaskID, advance: float = 1, note: str | None = None, reused: float = 0.0
    ) -> None:
        """Advance ``task_id`` by ``advance`` steps; ``note`` names what finished (a run's key).
        ``reused``: how much of those steps was found already done (all of a run finished
        earlier; the share an earlier process computed of a run continued from its checkpoint):
        it counts as done, not towards the ETA's pace. Steps found done whole write no line."""
        if not 0 <= reused <= advance:
            raise ValueError(f"reused must lie in [0, {advance:g}] (got {reused:g})")
        with self._lock:
            task = self._tasks[task_id]
            if reused:
                task.fields[REUSED] = task.fields.get(REUSED, 0) + reused
        super().advance(task_id, advance)
        if self.console.is_terminal or reused == advance:
            return
        now = self.get_time()
        due = now - self._last_line >= self.every
        if not (due or (task.finished and (self._wrote or not self.every))):
            return
        self._last_line = now
        self._wrote = True
        name = Text.from_markup(self.title.format(task=task)).plain
        done = f"{task.completed:g}/{task.total:g}" if task.total is not None else f"{task.completed:g}"
        finished = f" ({note})" if note else ""
        times = f"{_clock(task.elapsed)} elapsed, eta {_clock(task_eta(task))}"
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
    done of total, time so far and an ETA (:func:`task_eta`) on a terminal,
    plain lines elsewhere (:class:`WatchedProgress`). ``clock``: seconds, monotonic (default
    :func:`time.monotonic`).

    A ``transient`` bar leaves nothing behind. Off a terminal, rich would still end it with an
    empty line, so an error raised inside it would be the second line on standard error, not the
    only one: there the bar is not drawn at all (``disable``), and only the plain lines are written."""
    return WatchedProgress(
        TextColumn(title),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        PaceRemainingColumn(),
        console=console,
        transient=transient,
        disable=transient and not console.is_terminal,
        get_time=clock,
        title=title,
        unit=unit,
        every=every,
    )


API_ROUND_SECONDS = 30.0
"""Off a terminal, the API's progress of a run's rounds comes at most this often (the first after
this many seconds; as the command line's ``run``); runs of a sweep are reported one line each."""

LOGGER = logging.getLogger("fairclip")
"""Where the API's progress goes off a terminal (records at INFO), unless ``progress=True``."""


class _LogLines:
    """A text stream that hands each complete line written to it to :data:`LOGGER` at INFO."""

    def __init__(self) -> None:
        self._pending = ""

    def write(self, text: str) -> int:
        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            if line.strip():
                LOGGER.info("%s", line)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


class ApiProgress:
    """The progress of a Python API call (``progress`` of :func:`fairclip.simulate`,
    :func:`fairclip.compare`, ...), one of three:

    * ``None`` (the default): where standard error is a terminal (or a Jupyter notebook), rich's
      bar, as the command line draws it; elsewhere log records at INFO of the logger
      ``"fairclip"`` (:data:`LOGGER`), one per finished run, or for a run's rounds at most one
      every :data:`API_ROUND_SECONDS` -- silent unless the program configures logging
      (``logging.basicConfig(level=logging.INFO)``);
    * ``True``: the bar on a terminal, else the command line's plain lines on standard error;
    * ``False``: nothing.
    """

    def __init__(self, progress: bool | None, title: str, *, unit: str, every: float = 0.0) -> None:
        if progress not in (None, True, False):
            raise TypeError(f"progress must be True, False or None (got {progress!r})")
        self.display: WatchedProgress | None = None
        if progress is False:
            return
        console = Console(stderr=True)
        interactive = console.is_terminal or console.is_jupyter
        if not interactive and progress is None:
            console = Console(file=_LogLines(), force_terminal=False, force_jupyter=False, width=240)
        self.display = progress_bar(title, console=console, transient=not interactive, unit=unit, every=every)

    def start(self, total: float | None, description: str = "") -> None:
        """Begin the display with ``total`` steps (``None``: not known yet)."""
        if self.display is not None:
            self.display.start()
            self.display.add_task(description, total=total)

    def total(self, total: float) -> None:
        """The number of steps, once known."""
        if self.display is not None and self.display.task_ids:
            self.display.update(self.display.task_ids[-1], total=total)

    def advance(self, note: str | None = None, reused: float = 0.0) -> None:
        """One more step done (:meth:`WatchedProgress.advance`)."""
        if self.display is not None and self.display.task_ids:
            self.display.advance(self.display.task_ids[-1], note=note, reused=reused)

    def close(self) -> None:
        """End the display (also after an error)."""
        if self.display is not None and self.display.live.is_started:
            self.display.stop()
