"""What Flower's own strategy code logs that a DP run must not publish.

* Flower's ``Strategy.start`` logs ``Strategy execution finished in <seconds>s`` at INFO, a line
  ``flwr log`` and ``flwr run --stream`` pass on. That time is the sum of each round's wait for
  its slowest sampled node: it depends on who took part and on their data, and no noise covers it
  (fairclip keeps a deployment's ``wall_seconds`` internal for the same reason). fairclip's
  strategies run Flower's loop inside :func:`wall_time_hidden` (:class:`WallTimeHidden`).
* An inner strategy's configure and aggregate steps (the ``DifferentialPrivacy`` wrapper's FedAvg)
  log how many nodes it sampled and how many replied, counts DP does not cover: they run inside
  :func:`inner_strategy_quiet`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

from flwr.common.logger import FLOWER_LOGGER

WALL_TIME_LINE = "Strategy execution finished in"
"""The start of Flower's log line that holds the loop's wall time."""


@contextlib.contextmanager
def _dropped(drop: Callable[[logging.LogRecord], bool]) -> Iterator[None]:
    """Drop the records that Flower's logger receives from this thread for the duration where
    ``drop(record)``."""
    thread = threading.get_ident()

    def keep(record: logging.LogRecord) -> bool:
        return record.thread != thread or not drop(record)

    FLOWER_LOGGER.addFilter(keep)
    try:
        yield
    finally:
        FLOWER_LOGGER.removeFilter(keep)


def wall_time_hidden() -> contextlib.AbstractContextManager[None]:
    """Drop Flower's wall-time line (module docstring) for the duration."""
    return _dropped(lambda record: str(record.msg).startswith(WALL_TIME_LINE))


def inner_strategy_quiet() -> contextlib.AbstractContextManager[None]:
    """Drop every record below WARNING for the duration (module docstring)."""
    return _dropped(lambda record: record.levelno < logging.WARNING)


class WallTimeHidden:
    """A Flower strategy mix-in: Flower's loop (``start``) without its wall-time line."""

    def start(self, *args: Any, **kwargs: Any) -> Any:
        with wall_time_hidden():
            return super().start(*args, **kwargs)  # type: ignore[misc]
