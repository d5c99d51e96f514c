"""What Flower's own strategy loop logs that a DP run must not publish.

Flower's ``Strategy.start`` logs ``Strategy execution finished in <seconds>s`` at INFO, a line
``flwr log`` and ``flwr run --stream`` pass on. That time is the sum of each round's wait for its
slowest sampled node: it depends on who took part and on their data, and no noise covers it
(fairclip keeps a deployment's ``wall_seconds`` internal for the same reason). fairclip's
strategies run Flower's loop inside :func:`wall_time_hidden`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

from flwr.common.logger import FLOWER_LOGGER

WALL_TIME_LINE = "Strategy execution finished in"
"""The start of Flower's log line that holds the loop's wall time."""


@contextlib.contextmanager
def wall_time_hidden() -> Iterator[None]:
    """Drop the wall-time line that Flower's logger receives from this thread for the duration."""
    thread = threading.get_ident()

    def keep(record: logging.LogRecord) -> bool:
        return record.thread != thread or not str(record.msg).startswith(WALL_TIME_LINE)

    FLOWER_LOGGER.addFilter(keep)
    try:
        yield
    finally:
        FLOWER_LOGGER.removeFilter(keep)
