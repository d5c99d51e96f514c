"""Drive fairclip's engine (:class:`fairclip.server.run.Run`) with round timing.

This is :func:`fairclip.sims.executors.loop.simulate` with a clock around the round loop: the measured
phase starts at the first round's sampling and ends after the last round's server step and
evaluation; building the task, the privacy plan and the actors is start-up.
"""

from __future__ import annotations

import time
from typing import Any

from .common import usable_cores


def start_ray(cores: int | None = None) -> int:
    """Start a local Ray cluster with ``cores`` CPUs (default: the usable cores)."""
    from fairclip.sims.executors.ray import ensure_ray

    cores = cores or usable_cores()
    ensure_ray(None, cores)
    return cores


def timed_rounds(config, task, executor) -> tuple[float, dict[str, Any]]:
    """Run every round; return (seconds from the server's start to the last round's end, details).
    The clock starts before the :class:`Run` exists, so it covers the privacy accounting
    that the server starts in the background."""
    from fairclip.server.run import Run

    started = time.perf_counter()
    server = Run(config, task)
    rounds = server.rounds_to_run
    updates = 0
    round_seconds = []
    for round_number in range(1, rounds + 1):
        round_start = time.perf_counter()
        client_ids = server.sample(round_number)
        sums = executor(server.model, client_ids, round_number, server.broadcast())
        server.finish_round(round_number, sums)
        updates += int(sums.num_reports)
        round_seconds.append(time.perf_counter() - round_start)
    seconds = time.perf_counter() - started
    result = server.finish()
    summary = result.summary
    return seconds, {
        "rounds": rounds,
        "client_updates": updates,
        "round_seconds": round_seconds,
        "final_accuracy": summary.get("overall", {}).get("accuracy"),
        "epsilon": summary.get("epsilon"),
    }
