"""Ctrl-C and SIGTERM are held while a round is committed and delivered right after it; a
handler that Ray replaces is put back, and an ignored SIGINT is made to interrupt."""

from __future__ import annotations

import signal
import threading

import pytest

from fairclip.server.interrupts import (
    interrupts_deferred,
    sigint_raises_keyboard_interrupt,
    sigterm_handler_kept,
)


def test_ctrl_c_inside_the_block_lands_after_it():
    # Python's own Ctrl-C handler (a process started in the background inherits SIGINT ignored)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        finished = []
        with pytest.raises(KeyboardInterrupt), interrupts_deferred():
            signal.raise_signal(signal.SIGINT)
            finished.append("rest of the block")
        assert finished == ["rest of the block"]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_signal_the_process_ignores_stays_ignored():
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with interrupts_deferred():
            signal.raise_signal(signal.SIGTERM)
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_outside_the_main_thread_nothing_changes():
    handlers = []

    def body():
        with interrupts_deferred():
            handlers.append(signal.getsignal(signal.SIGINT))

    before = signal.getsignal(signal.SIGINT)
    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert handlers == [before]


def _handler(signum, frame):  # a handler the caller chose
    raise KeyboardInterrupt


@pytest.mark.parametrize(("before", "kept"), [(_handler, True), (signal.SIG_DFL, False)])
def test_a_sigterm_handler_set_in_python_is_put_back_after_the_block(before, kept):
    previous = signal.signal(signal.SIGTERM, before)
    try:
        with sigterm_handler_kept():
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # what ray.init does, in kind
        assert signal.getsignal(signal.SIGTERM) == (before if kept else signal.SIG_IGN)
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (signal.SIG_IGN, signal.default_int_handler),  # inherited from `cmd &` in a script
        (signal.SIG_DFL, signal.default_int_handler),
        (_handler, _handler),  # chosen in Python: stays
    ],
)
def test_an_ignored_sigint_is_made_to_raise_keyboard_interrupt(before, after):
    previous = signal.signal(signal.SIGINT, before)
    try:
        sigint_raises_keyboard_interrupt()
        assert signal.getsignal(signal.SIGINT) is after
        if after is signal.default_int_handler:
            with pytest.raises(KeyboardInterrupt):
                signal.raise_signal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, previous)
