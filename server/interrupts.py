"""How a run stops on Ctrl-C or SIGTERM: whole, with its finished work written.

Ctrl-C raises KeyboardInterrupt, and ``fairclip``'s CLI makes SIGTERM do the same
(:func:`fairclip.cli.main`); the run takes it as an interruption and writes what is
finished. Three things here keep that true:

* :func:`interrupts_deferred` holds both signals while a round is committed. A round changes
  the model, the policy state and the count of finished rounds, evaluates the new model and
  appends its row; an interrupt in the middle (SIGTERM during the evaluation, say) would leave a
  model and a summary one round ahead of ``rounds.csv``. Inside the block the signals are only
  recorded; when it ends, the previous handlers are restored and each recorded signal is
  delivered to them, so the interrupt lands between rounds.
* :func:`sigterm_handler_kept` puts back the SIGTERM handler that ``ray.init`` replaces.
* :func:`sigint_raises_keyboard_interrupt` lets ``ray.cancel`` interrupt a Ray task in a worker
  that inherited an ignored SIGINT.
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


@contextlib.contextmanager
def sigterm_handler_kept() -> Iterator[None]:
    """Put back, after the block, the SIGTERM handler this process had set in Python before it.

    ``ray.init`` replaces it: its own Python handler exits at once, and its core worker's failure
    handler (``logging.cc: *** SIGTERM received``) then aborts the process outright. A caller that
    had chosen what SIGTERM does -- ``fairclip``'s CLI raises KeyboardInterrupt, so that finished
    results and the runs' checkpoints are written -- keeps its choice. Without a Python handler
    before (the default action), Ray's stays: it stops the Ray processes it started."""
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if in_main_thread else None
    try:
        yield
    finally:
        if callable(previous):
            signal.signal(signal.SIGTERM, previous)


def sigint_raises_keyboard_interrupt() -> None:
    """Give this process Python's default SIGINT handler (KeyboardInterrupt) where SIGINT is
    ignored or left to the operating system; a handler set in Python stays.

    ``ray.cancel`` interrupts a running task as a SIGINT would (``_thread.interrupt_main``), which
    does nothing where the worker ignores SIGINT -- and it does whenever the driver was started in
    the background by a shell without job control (``cmd &`` in a script): Ray's workers inherit
    that, and Python leaves an ignored SIGINT ignored. Such a run would be killed at the driver's
    exit without writing its checkpoint. Only the main thread can set a handler: elsewhere a
    no-op."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, signal.SIG_DFL, None):
        signal.signal(signal.SIGINT, signal.default_int_handler)
