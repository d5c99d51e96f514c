"""Time fairclip's rounds: the one simulation loop (:func:`fairclip.sims.executors.loop.simulate`)
with a clock as its observer.

The measured phase starts before the run (:class:`fairclip.server.run.Run`) exists, so it covers
the privacy accounting the run starts in the background, and ends after the last round's server
step and evaluation; building the task and the actors is start-up.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from .common import usable_cores


def start_ray(cores: int | None = None) -> int:
    """Start a local Ray cluster with ``cores`` CPUs (default: the usable cores)."""
    from fairclip.sims.executors.ray import ensure_ray  # ray: only in the workloads that use it

    cores = cores or usable_cores()
    ensure_ray(None, cores)
    return cores


@dataclass
class RoundClock:
    """An observer of a run that times each round: from the end of the previous one (or the
    start of the first round's sampling) to the end of its server step and evaluation."""

    started: float = field(default_factory=time.perf_counter)
    round_seconds: list[float] = field(default_factory=list)
    client_updates: int = 0
    last_round_end: float | None = None

    def on_start(self, run: Any) -> None:
        self.last_round_end = time.perf_counter()

    def on_round(self, row: dict[str, Any], run: Any) -> None:
        now = time.perf_counter()
        self.round_seconds.append(now - (self.last_round_end or self.started))
        self.last_round_end = now
        self.client_updates += int(row["sampled_clients"])

    def on_finish(self, run: Any) -> None:
        return None


def timed_rounds(config, task, executor) -> tuple[float, dict[str, Any]]:
    """Run every round; return (seconds from before the run's start to the last round's end,
    details)."""
    # torch and Opacus: each workload's child process imports them when it runs
    from fairclip.sims.executors.loop import simulate

    clock = RoundClock()
    result = simulate(config, task, lambda _task, _policy: executor, observers=[clock])
    summary = result.summary
    return (clock.last_round_end or clock.started) - clock.started, {
        "rounds": len(clock.round_seconds),
        "client_updates": clock.client_updates,
        "round_seconds": clock.round_seconds,
        "final_accuracy": summary.get("overall", {}).get("accuracy"),
        "epsilon": summary.get("epsilon"),
    }
