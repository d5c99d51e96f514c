"""Ctrl-C and SIGTERM are held while a round is committed and delivered right after it."""

from __future__ import annotations

import signal
import threading

import pytest

from fairclip.sims.interrupts import interrupts_deferred


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
