"""Many runs, each simulated whole: one after the other in this process, or as Ray tasks.

``compare``, ``tune`` and ``reproduce`` hand their runs here as (item, raw configuration) jobs
(:func:`simulate_jobs`). Each run is the in-process executor's (:func:`run_simulation`): on Ray,
parallelism comes from running many runs at once, one task each, and the driver gets every
run's rows and summary as it finishes. A run keeps its progress in a checkpoint where the caller
names one (:mod:`fairclip.server.checkpoint`), and a run stopped by Ctrl-C or SIGTERM writes it
(:func:`stop_tasks`).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any, TypeVar

from fairclip.plugins import restore, snapshot
from fairclip.scenarios.config import validate
from fairclip.scenarios.errors import ConfigError
from fairclip.scenarios.tasks import build_task
from fairclip.server.checkpoint import Checkpointing
from fairclip.server.interrupts import sigint_raises_keyboard_interrupt

T = TypeVar("T")


def run_simulation(
    raw_config: dict[str, Any],
    data_dir: str | None,
    workers: int = 1,
    plugins: dict[str, Any] | None = None,
    checkpoint: str | None = None,
) -> dict[str, Any]:
    """Simulate one run in this process (the local executor with ``workers`` threads); returns its
    rows and summary. ``plugins`` is the starting process's :func:`fairclip.plugins.snapshot`
    (its registered policies, models and datasets, and its import path). With ``checkpoint`` (a
    file path) the run continues from the checkpoint there, if any, and keeps its progress
    there (:mod:`fairclip.server.checkpoint`)."""
    # torch and Opacus: kept out of the command line's start
    from fairclip.sims.executors.local import LocalExecutor
    from fairclip.sims.executors.loop import simulate

    if plugins is not None:
        restore(plugins)
    config = validate(raw_config)
    task = build_task(config, Path(data_dir) if data_dir else None)
    result = simulate(
        config,
        task,
        lambda task, policy: LocalExecutor(task, policy, workers),
        checkpoint=Checkpointing(Path(checkpoint)) if checkpoint else None,
    )
    return {"rows": result.rows, "summary": result.summary}


def run_simulation_task(*args: Any) -> dict[str, Any]:
    """:func:`run_simulation` as a Ray task that :func:`stop_tasks` can interrupt, also in a
    worker that inherited an ignored SIGINT
    (:func:`fairclip.server.interrupts.sigint_raises_keyboard_interrupt`)."""
    sigint_raises_keyboard_interrupt()
    return run_simulation(*args)


def workers_fit_ray(workers: int) -> float:
    """The CPUs of the Ray this process is connected to; a :class:`ConfigError` where a task of
    ``workers`` CPUs would not fit them (it would wait forever)."""
    import ray

    cpus = ray.cluster_resources().get("CPU", 0)
    if workers > cpus:
        raise ConfigError(f"--workers {workers} is more than the Ray cluster's {cpus:g} CPUs")
    return cpus


def simulate_on_ray(
    jobs: list[tuple[T, dict[str, Any]]],
    *,
    data_dir: Path | None,
    address: str | None,
    workers: int = 1,
    checkpoints: Callable[[T], Path] | None = None,
) -> Generator[tuple[T, dict[str, Any]], None, None]:
    """Simulate each (item, raw configuration) as one Ray task of ``workers`` CPUs, each a local
    executor with as many threads (the same result for any ``workers``); yield (item, result) as
    they finish. Many one-CPU tasks use the cores best when there are many runs; give the
    threads to the few runs of a long reproduction. ``checkpoints(item)`` is the file where an
    item's run keeps its progress (:func:`run_simulation`): on a cluster, a folder every node
    sees. Jobs the caller appends to ``jobs`` between two results are submitted before the
    next wait."""
    import ray  # ray: only where runs go to Ray

    from fairclip.sims.executors.ray import ensure_ray

    if not jobs:
        return
    ensure_ray(address)
    cpus = workers_fit_ray(workers)
    from fairclip.sims.executors.ray import gpu_share  # ray: only where runs go to Ray

    device = validate(jobs[0][1]).training.device
    share = gpu_share(device, int(cpus // workers))
    remote = ray.remote(num_cpus=workers, num_gpus=share)(run_simulation_task)
    plugins = ray.put(snapshot())  # once for all tasks: registered datasets may be large
    folder = str(data_dir) if data_dir else None
    futures: dict[Any, T] = {}
    remaining: list[Any] = []
    try:
        while True:
            for item, raw in jobs[len(futures) :]:  # all at first; later, those appended since
                future = remote.remote(raw, folder, workers, plugins, _checkpoint_of(item, checkpoints))
                futures[future] = item
                remaining.append(future)
            if not remaining:
                return
            done, remaining = ray.wait(remaining, num_returns=1)
            yield futures[done[0]], ray.get(done[0])
    except BaseException:  # Ctrl-C, SIGTERM (the CLI's KeyboardInterrupt), an error, close()
        stop_tasks(remaining)
        raise


CANCEL_GRACE_SECONDS = 60.0
"""How long :func:`stop_tasks` waits for cancelled runs to write their checkpoints: a run stops
at its next Python instruction, or after the round it is committing, then writes one file."""


def stop_tasks(futures: list[Any], grace: float = CANCEL_GRACE_SECONDS) -> None:
    """Cancel the Ray tasks ``futures`` and wait up to ``grace`` seconds for them to end.

    A run not started yet is dropped. A running one gets a KeyboardInterrupt (``ray.cancel``
    without ``force``), which it takes as an interruption: it writes its checkpoint, so that
    ``--resume`` continues after its last finished round (:func:`fairclip.sims.executors.loop.simulate`),
    rather than after its last periodic checkpoint. Without this the driver's exit would kill the
    tasks where they stand. A second Ctrl-C or SIGTERM cuts the wait short."""
    import ray

    for future in futures:
        ray.cancel(future)
    if futures:
        ray.wait(futures, num_returns=len(futures), timeout=grace)


def simulate_jobs(
    jobs: list[tuple[T, dict[str, Any]]],
    *,
    data_dir: Path | None,
    ray: bool,
    address: str | None = None,
    workers: int = 1,
    checkpoints: Callable[[T], Path] | None = None,
) -> Generator[tuple[T, dict[str, Any]], None, None]:
    """Simulate each (item, raw configuration) -- as Ray tasks (:func:`simulate_on_ray`) with
    ``ray``, else one after the other in this process -- and yield (item, result) as each
    finishes; the same numbers either way. Jobs the caller appends to ``jobs`` between two
    results are simulated too (a reproduction's final runs, once the grid runs they depend on
    have finished). ``checkpoints(item)``: the file where an item's run keeps its progress and
    continues from (:mod:`fairclip.server.checkpoint`)."""
    if ray:
        return simulate_on_ray(
            jobs, data_dir=data_dir, address=address, workers=workers, checkpoints=checkpoints
        )
    return _simulate_here(jobs, data_dir, workers, checkpoints)


def _simulate_here(
    jobs: list[tuple[T, dict[str, Any]]],
    data_dir: Path | None,
    workers: int,
    checkpoints: Callable[[T], Path] | None,
) -> Generator[tuple[T, dict[str, Any]], None, None]:
    folder = str(data_dir) if data_dir else None
    index = 0
    while index < len(jobs):  # len() each time: the caller may have appended jobs
        item, raw = jobs[index]
        index += 1
        yield item, run_simulation(raw, folder, workers, checkpoint=_checkpoint_of(item, checkpoints))


def _checkpoint_of(item: T, checkpoints: Callable[[T], Path] | None) -> str | None:
    return str(checkpoints(item)) if checkpoints is not None else None
