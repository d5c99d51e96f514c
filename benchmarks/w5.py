"""W5, scale-out: W1 (:mod:`benchmarks.w1`) on fairclip's Ray engine with 1 Ray actor, with 2
actors on one local Ray, and with 2 actors on a 2-node Ray cluster started on this machine with
``ray start`` (one CPU per node, :func:`fairclip.sims.local_cluster.local_cluster`).

Client updates per second of the rounds (as W1). Target: 2 workers at least 1.7× as fast as 1
(the fixed summation blocks make all three runs the same run, which each contender checks
against the 1-actor model where it ran in the same process; here each runs in its own process,
so the report keeps each run's final accuracy and ε to compare).

The physical anchor, as plain SGD is W2's: W1's compute floor (plain PyTorch, one thread,
:func:`benchmarks.w1.run_floor`) alone and in two processes at once. Their ratio is what two
cores give this training with no framework between them, the ceiling of the actors' speed-up.
"""

from __future__ import annotations

import time

from .common import Measurement, measured

UNIT = "client updates/s"


def _run(quick: bool, actors: int, nodes: int) -> Measurement:
    from .engine import timed_rounds
    from .imagetask import build_task, image_config, ray_executor
    from .w1 import settings

    def on_ray(address: str | None) -> tuple[float, float, dict]:
        from fairclip.sims.ray_engine import ensure_ray

        ensure_ray(address, None if address else actors)
        config = image_config(settings(quick))
        task = build_task(config)
        executor = ray_executor(config, actors)
        try:
            seconds, details = timed_rounds(config, task, executor)
        finally:
            executor.stop()
        details.update(engine="ray", **executor.execution)
        return seconds, details["client_updates"], details

    def body():
        if nodes == 1:
            return on_ray(None)
        from fairclip.sims.local_cluster import local_cluster

        with local_cluster(nodes=nodes, cpus_per_node=actors // nodes) as address:
            return on_ray(address)

    return measured(UNIT, body)


def run_one_actor(quick: bool) -> Measurement:
    return _run(quick, actors=1, nodes=1)


def run_two_actors(quick: bool) -> Measurement:
    return _run(quick, actors=2, nodes=1)


def run_two_nodes(quick: bool) -> Measurement:
    return _run(quick, actors=2, nodes=2)


def run_one_floor(quick: bool) -> Measurement:
    """W1's compute floor alone (one process, one thread)."""
    from .w1 import run_floor

    return run_floor(quick)


def run_two_floors(quick: bool) -> Measurement:
    """W1's compute floor in two child processes started together (the runner's own
    :func:`benchmarks.run.run_contender`, from two threads): the sum of their throughputs, the
    longer of their measured phases, the sum of their peak memories."""
    from concurrent.futures import ThreadPoolExecutor

    from .run import run_contender

    started = time.perf_counter()
    with ThreadPoolExecutor(2) as pool:
        results = [
            found["floor"] for found in pool.map(lambda _: run_contender("w1", "floor", quick), range(2))
        ]
    failed = [result["status"] for result in results if result["status"] != "ok"]
    if failed:
        raise RuntimeError(f"a floor process did not finish: {failed[0]}")
    return Measurement(
        throughput=sum(result["throughput"] for result in results),
        unit=UNIT,
        wall_s=max(result["wall_s"] for result in results),
        total_s=time.perf_counter() - started,
        work=sum(result["work"] for result in results),
        peak_rss_bytes=sum(result["peak_rss_bytes"] for result in results),
        details={"processes": 2, "throughputs": [result["throughput"] for result in results]},
    )


CONTENDERS = {
    "actors-1": run_one_actor,
    "actors-2": run_two_actors,
    "nodes-2": run_two_nodes,
    "floor-1": run_one_floor,
    "floors-2": run_two_floors,
}
