"""Hold Ctrl-C and SIGTERM while a round is committed, so that an interrupted run stays whole.

A round changes the model, the policy state and the count of finished rounds, evaluates the new
model and appends its row. An interrupt in the middle (SIGTERM arriving during the evaluation,
say) left a model and a summary one round ahead of ``rounds.csv``. Inside
:func:`interrupts_deferred` the two signals are only recorded; when the block ends, the previous
handlers are restored and each recorded signal is delivered to them, so the interrupt lands
between rounds.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Defer SIGINT and SIGTERM to the end of the block (in the main thread, the only one that
    receives signals; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[tuple[int, FrameType | None]] = []
    previous = {signum: signal.getsignal(signum) for signum in HELD_SIGNALS}
    # A handler installed outside Python (getsignal gives None) cannot be put back: leave it be.
    previous = {signum: handler for signum, handler in previous.items() if handler is not None}

    def hold(signum: int, frame: FrameType | None) -> None:
        received.append((signum, frame))

    for signum in previous:
        signal.signal(signum, hold)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum, frame in received:
            handler = previous[signum]
            if callable(handler):
                handler(signum, frame)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(signum)
