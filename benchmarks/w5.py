"""W5, scale-out: W1 (:mod:`benchmarks.w1`) on fairclip's Ray engine with 1 Ray actor, with 2
actors on one local Ray, and with 2 actors on a 2-node Ray cluster started on this machine with
``ray start`` (one CPU per node, :func:`fairclip.sims.local_cluster.local_cluster`).

Client updates per second of the rounds (as W1). Target: 2 workers at least 1.7× as fast as 1
(the fixed summation blocks make all three runs the same run, which each contender checks
against the 1-actor model where it ran in the same process; here each runs in its own process,
so the report keeps each run's final accuracy and ε to compare).
"""

from __future__ import annotations

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


CONTENDERS = {"actors-1": run_one_actor, "actors-2": run_two_actors, "nodes-2": run_two_nodes}
