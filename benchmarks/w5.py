"""W5, scale-out: W1 (:mod:`benchmarks.w1`) on fairclip's Ray executor with 1 Ray actor and with 2
actors, on one local Ray and on a Ray cluster of single-CPU nodes started on this machine with
``ray start`` (:func:`fairclip.benchmarks.local_cluster.local_cluster`).

Client updates per second of the rounds (as W1). Target: 2 workers at least 1.6× as fast as 1
(on one 2-core machine).

The speed-up is the median of paired repeats, as W4's overhead is: one W1 run lasts 3-6 s, and
this 2-core machine drifts by more than the target's margin within minutes (one single-thread
process ran at 71 to 111 client updates/s; the same commit's 2 actors / 1 actor read 1.47 and
1.81 when each contender ran in a process of its own, one after the other). So the 1-actor and
the 2-actor runs share one process and one Ray session, and each of :data:`PAIRS` pairs runs
the two back to back, in alternating order; an executor's first run is unmeasured:

- ``local``: one local Ray with 3 logical CPUs gives ``actors-1`` and ``actors-2``; the two
  executors stay started side by side (the idle one holds its data and takes no CPU);
- ``cluster``: a cluster of 2 single-CPU nodes (the head and one ``ray start`` node) gives
  ``node-1`` and ``nodes-2``; it has no CPU for both executors at once, so each run starts its
  executor (the 1 actor lands on the driver's node, the 2 actors on both) and stops it after.

The fixed summation blocks make every one of these runs the same run: each child checks that
every repeat of both executors ends with the 1-actor run's accuracy, ε and client updates
(``same_run``).

The physical anchor, as plain SGD is W2's: W1's compute floor (plain PyTorch, one thread,
:func:`benchmarks.w1.run_floor`), one process alone (``floor-1``) and two at once (``floors-2``),
paired and alternated the same way (``floors``: every run a fresh process, as the two-process one
must be). The two processes wait for each other before their measured phases
(:func:`benchmarks.common.wait_for_peers`), and ``floors-2`` counts both processes' client updates
over the wall time from the first phase's start to the last one's end. Its paired ratio is what
two cores give this training with no framework between them, the ceiling of the actors' speed-up.

Each contender's throughput in the table is its fastest repeat (as W2's); the ratios use the
pairs. A contender's peak memory is its child's whole process tree (both executors and their Ray
processes); ``actors_peak_rss_mib`` is the sum of one executor's actors' own peaks.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from typing import Any

from .common import BARRIER_ENV, Measurement, TreeMemorySampler, alternate, self_peak_rss_bytes

UNIT = "client updates/s"
PAIRS = 7
"""Paired repeats in a full run (1 in ``--quick``)."""


def pairs(quick: bool) -> int:
    return 1 if quick else PAIRS


def paired_speedups(one: list[float], two: list[float]) -> list[float]:
    """Per pair, the 2-worker run's throughput over the 1-worker run's."""
    return [b / a for a, b in zip(one, two, strict=True)]


def _actor_pids(executor) -> list[int]:
    import ray

    return ray.get([actor.__ray_call__.remote(lambda _: os.getpid()) for actor in executor.actors])


def _actors_beside_driver(executor) -> int:
    """How many of the executor's actors run on the driver's own Ray node (whose results reach
    the driver without a transfer between nodes)."""
    import ray

    here = ray.get_runtime_context().get_node_id()
    return sum(node == here for node in ray.get([actor.node_id.remote() for actor in executor.actors]))


def _paired_executors(
    quick: bool, names: tuple[str, str], address: str | None, side_by_side: bool
) -> dict[str, Measurement]:
    """``names[0]`` on 1 actor and ``names[1]`` on 2 actors of one Ray session (``address``, or
    a local Ray of 3 logical CPUs), in alternating pairs. ``side_by_side``: each executor starts
    at its first run and stays (the second on the CPUs the first left free); otherwise each run
    starts its executor and stops it after. A started executor's first run is unmeasured: it pays
    the actors' one-time costs (lazy imports, torch's first kernels, the allocator's growth)."""
    # in the workload's own child process only (torch, ray, flwr: not in `fairclip bench`'s)
    from fairclip.sims.executors.ray import ensure_ray

    from .imagetask import build_task, image_config, ray_executor
    from .timing import timed_rounds
    from .w1 import settings

    started = time.perf_counter()
    runs: dict[str, list[tuple[float, dict[str, Any]]]] = {name: [] for name in names}
    warm_up_s: dict[str, list[float]] = {name: [] for name in names}
    actors_peak = dict.fromkeys(names, 0)
    placement: dict[str, dict[str, Any]] = {}
    held: dict[str, Any] = {}
    with TreeMemorySampler() as sampler:
        ensure_ray(address, None if address else 3)
        config = image_config(settings(quick))
        task = build_task(config)

        def run(name: str) -> None:
            executor = held.get(name) or ray_executor(config, 1 if name == names[0] else 2)
            samplers = [TreeMemorySampler(root=pid).__enter__() for pid in _actor_pids(executor)]
            try:
                if name not in held:
                    warm_up_s[name].append(timed_rounds(config, task, executor)[0])
                runs[name].append(timed_rounds(config, task, executor))
                placement[name] = {**executor.execution, "beside_driver": _actors_beside_driver(executor)}
            finally:
                for actor_sampler in samplers:
                    actor_sampler.__exit__(None, None, None)
                actors_peak[name] = max(actors_peak[name], sum(s.peak for s in samplers))
                if side_by_side:
                    held[name] = executor
                else:
                    executor.stop()

        try:
            for repeat in range(pairs(quick)):
                for name in alternate(names, repeat):
                    run(name)
        finally:
            for executor in held.values():
                executor.stop()
    total = time.perf_counter() - started
    peak = max(sampler.peak, self_peak_rss_bytes())
    outcome = {(d["final_accuracy"], d["epsilon"], d["client_updates"]) for n in names for _, d in runs[n]}
    throughputs = {name: [d["client_updates"] / s for s, d in runs[name]] for name in names}
    speedups = paired_speedups(throughputs[names[0]], throughputs[names[1]])
    results = {}
    for name in names:
        seconds, details = min(runs[name], key=lambda run: run[0] / run[1]["client_updates"])
        details = {
            **details,
            "executor": "ray",
            **placement[name],
            "executors": "side by side" if side_by_side else "started for each run",
            "pairs": len(runs[name]),
            "all_throughputs": throughputs[name],
            "warm_up_wall_s": warm_up_s[name],
            "same_run": len(outcome) == 1,
            "actors_peak_rss_mib": actors_peak[name] / 2**20,
            "total_s_note": f"total_s and peak memory: the whole child ({' and '.join(names)})",
        }
        if name == names[1]:
            details.update(paired_speedups=speedups, speedup=statistics.median(speedups))
        work = details["client_updates"]
        results[name] = Measurement(work / seconds, UNIT, seconds, total, work, peak, details)
    return results


def run_local(quick: bool) -> dict[str, Measurement]:
    """``actors-1`` and ``actors-2``, paired, on one local Ray (the executors side by side)."""
    return _paired_executors(quick, ("actors-1", "actors-2"), None, side_by_side=True)


def run_cluster(quick: bool) -> dict[str, Measurement]:
    """``node-1`` and ``nodes-2``, paired, on a ``ray start`` cluster of 2 single-CPU nodes,
    each run on executors of its own."""
    # in the workload's own child process only (torch, ray, flwr: not in `fairclip bench`'s)
    from fairclip.benchmarks.local_cluster import local_cluster

    with local_cluster(nodes=2, cpus_per_node=1) as address:
        return _paired_executors(quick, ("node-1", "nodes-2"), address, side_by_side=False)


def _floor_processes(quick: bool, count: int) -> list[dict]:
    """W1's compute floor in ``count`` child processes started together (the runner's own
    :func:`benchmarks.run.run_contender`, from threads) whose measured phases start together."""
    from concurrent.futures import ThreadPoolExecutor

    from .run import run_contender

    with tempfile.TemporaryDirectory(prefix="fc-w5-") as ready, ThreadPoolExecutor(count) as pool:
        barrier = {BARRIER_ENV: f"{ready}:{count}"}
        results = [
            found["floor"]
            for found in pool.map(lambda _: run_contender("w1", "floor", quick, barrier), range(count))
        ]
    failed = [result["status"] for result in results if result["status"] != "ok"]
    if failed:
        raise RuntimeError(f"a floor process did not finish: {failed[0]}")
    return results


def _span(results: list[dict]) -> float:
    """Wall time from the first measured phase's start to the last one's end."""
    phases = [result["phase_epoch_s"] for result in results]
    return max(end for _, end in phases) - min(start for start, _ in phases)


def _together(results: list[dict]) -> float:
    return sum(result["work"] for result in results) / _span(results)


def run_floors(quick: bool) -> dict[str, Measurement]:
    """``floor-1`` (one floor process) and ``floors-2`` (two at once), paired and alternated:
    both processes' client updates over their common span for ``floors-2``."""
    names = ("floor-1", "floors-2")
    started = time.perf_counter()
    runs: dict[str, list[list[dict]]] = {name: [] for name in names}
    for repeat in range(pairs(quick)):
        for name in alternate(names, repeat):
            runs[name].append(_floor_processes(quick, 1 if name == "floor-1" else 2))
    total = time.perf_counter() - started
    throughputs = {name: [_together(found) for found in runs[name]] for name in names}
    speedups = paired_speedups(throughputs["floor-1"], throughputs["floors-2"])
    results = {}
    for name in names:
        best = max(runs[name], key=_together)
        details: dict[str, Any] = {
            "processes": len(best),
            "pairs": len(runs[name]),
            "all_throughputs": throughputs[name],
            "throughputs": [result["throughput"] for result in best],
            "total_s_note": "total_s: the whole child (floor-1 and floors-2)",
        }
        if name == "floors-2":
            details.update(paired_speedups=speedups, speedup=statistics.median(speedups))
        results[name] = Measurement(
            throughput=_together(best),
            unit=UNIT,
            wall_s=_span(best),
            total_s=total,
            work=sum(result["work"] for result in best),
            peak_rss_bytes=max(sum(r["peak_rss_bytes"] for r in found) for found in runs[name]),
            details=details,
        )
    return results


CONTENDERS = {"local": run_local, "cluster": run_cluster, "floors": run_floors}
