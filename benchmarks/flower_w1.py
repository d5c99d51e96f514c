"""fairclip's Flower apps for the W1 benchmark on Flower's simulation runtime.

Imported by the throw-away Flower project that :func:`benchmarks.w1.run_flower` writes. The
ClientApp is fairclip's own (the scenario names the benchmark's image loader and model by import
path, so the nodes build the same task as fairclip's executors). The ServerApp is fairclip's
:func:`~fairclip.server.app.run_federation` with one observer, :class:`RoundTimer`, which
records when the first round starts and when each round ends, with its accepted and dropped
replies (``bench_timing.json`` next to ``rounds.csv``): Flower's throughput is then measured over
the same phase as fairclip's executor, from the first round's sampling to the last round's server
step and evaluation.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid

from fairclip.client.app import client_app
from fairclip.server.app import REFUSALS, make_server_app, run_federation

TIMING_FILE = "bench_timing.json"


class RoundTimer:
    """An observer (:class:`fairclip.server.observers.RunObserver`) of the rounds' wall-clock times."""

    def __init__(self) -> None:
        self.timing: dict[str, Any] = {"rounds_start": None, "rounds_end": None, "updates": [], "dropped": []}

    def on_start(self, run: Any) -> None:
        self.timing["rounds_start"] = time.time()

    def on_round(self, row: dict[str, Any], run: Any) -> None:
        self.timing["rounds_end"] = time.time()
        self.timing["updates"].append(int(row["accepted_replies"]))
        self.timing["dropped"].append(int(row["dropped_replies"]))

    def on_finish(self, run: Any) -> None:
        return None


def timed_federation(grid: Grid, context: Context) -> None:
    """fairclip's federation, with its round times written to ``bench_timing.json`` in ``out``."""
    timer = RoundTimer()
    try:
        run_federation(grid, context, observers=[timer])
    finally:
        out = Path(str(context.run_config["out"]))
        out.mkdir(parents=True, exist_ok=True)
        (out / TIMING_FILE).write_text(json.dumps(timer.timing))


clientapp = client_app
serverapp = make_server_app(timed_federation, REFUSALS)

__all__ = ["clientapp", "serverapp"]
