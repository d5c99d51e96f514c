"""``fairclip compare``: strategies × target ε × seeds as Ray tasks, and the `none` reference.

Each run is one Ray task that simulates a whole federation in its worker process (the
in-process engine: parallelism comes from running many runs at once). The driver writes every
finished run at once and atomically into ``DIR/runs/<key>/`` (``rounds.csv``, then
``summary.json``, whose presence marks the run finished), so an interrupted sweep keeps all
finished runs and ``--resume`` recomputes none of them. When every run is done the driver
writes ``summary.csv``, ``report.md`` and the plots (:mod:`fairclip.sims.report`).
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd

from fairclip.sims.config import RunConfig, set_value, validate
from fairclip.sims.errors import ConfigError
from fairclip.sims.interrupts import sigint_raises_keyboard_interrupt
from fairclip.sims.outputs import json_normalised, write_csv, write_json

REFERENCE = "none"
T = TypeVar("T")


@dataclass(frozen=True)
class RunSpec:
    """One cell of the sweep."""

    strategy: str
    target_epsilon: float | None
    seed: int

    @property
    def key(self) -> str:
        epsilon = "none" if self.target_epsilon is None else f"{self.target_epsilon:g}"
        return f"{self.strategy}__eps-{epsilon}__seed-{self.seed}"

    def config(self, raw: dict[str, Any]) -> RunConfig:
        """The configuration of this run: the scenario with strategy, ε and seed set."""
        raw = set_value(set_value(raw, "strategy.name", self.strategy), "seed", self.seed)
        if self.target_epsilon is not None and self.strategy != REFERENCE:
            raw = set_value(raw, "privacy.target_epsilon", float(self.target_epsilon))
        return validate(raw)


def plan_runs(
    raw: dict[str, Any], strategies: list[str], epsilons: list[float | None], seeds: int
) -> list[RunSpec]:
    """Every run of the sweep, the `none` reference once per seed first. Validates them all."""
    base = validate(raw)
    if seeds < 1:
        raise ConfigError(f"--seeds must be >= 1 (got {seeds})")
    seed_values = [base.seed + offset for offset in range(seeds)]
    runs = [RunSpec(REFERENCE, None, seed) for seed in seed_values]
    runs += [
        RunSpec(strategy, epsilon, seed)
        for strategy in strategies
        if strategy != REFERENCE
        for epsilon in epsilons
        for seed in seed_values
    ]
    from fairclip.sims.privacy_plan import check_accountable

    for run in runs:  # fail fast, before any work, on a strategy, ε or size the scenario rejects
        config = run.config(raw)
        if run.strategy != REFERENCE:
            check_accountable(config)
    return runs


DEFAULT_STRATEGIES = "constant,adaptive,bounded"
DEFAULT_SEEDS = 1


def compare_spec(
    raw: dict[str, Any] | None,
    strategies: list[str] | None,
    epsilons: list[float | None] | None,
    seeds: int | None,
    *,
    explicit_only: bool = False,
) -> dict[str, Any]:
    """The specification of a sweep (what :mod:`fairclip.sims.sweep_folder` stores): the
    scenario's raw configuration and the strategies, target ε and number of seeds, with the
    defaults filled in -- or, ``explicit_only`` (``--resume``), only what was given."""
    from fairclip.sims.sweep_folder import specification

    options = {
        "strategies": (strategies, [name.strip() for name in DEFAULT_STRATEGIES.split(",")]),
        "epsilons": (epsilons, parse_epsilons(None)),
        "seeds": (seeds, DEFAULT_SEEDS),
    }
    fixed = {} if raw is None else {"config": raw}
    return specification("compare", fixed, options, explicit_only)


def plan_from_spec(spec: dict[str, Any]) -> tuple[dict[str, Any], list[RunSpec]]:
    """(raw configuration, runs) of a complete sweep specification; validates every run."""
    raw = spec["config"]
    return raw, plan_runs(raw, list(spec["strategies"]), list(spec["epsilons"]), int(spec["seeds"]))


def merge_specs(stored: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """``--extend``: the stored sweep with the given strategies, ε and seeds added (same scenario)."""
    from fairclip.sims.sweep_folder import union

    if stored.get("config") != given.get("config"):
        raise ConfigError(
            "--extend adds strategies, ε or seeds over the same scenario settings, and these differ; "
            "use --replace or another --out"
        )
    return {
        **stored,
        "strategies": union(stored["strategies"], given["strategies"]),
        "epsilons": union(stored["epsilons"], given["epsilons"]),
        "seeds": max(stored["seeds"], given["seeds"]),
    }


def finished_summary(folder: Path, config: RunConfig) -> dict[str, Any] | None:
    """The summary of the run finished in ``folder`` (its ``summary.json`` is written last,
    atomically), or None when it is not finished (where its checkpoint, if it has one, is
    checked as this one's: :func:`fairclip.sims.checkpoint.read`).

    A finished run made with another configuration (other ``--set`` values, say) is an error:
    reusing it would mix two experiments in one table. The stored configuration is resolved as
    today's code would resolve it, so a key added to fairclip since (at its default) does not
    make an old run look different; nor does a default that now depends on the machine, where
    it resolves here to the value the old run stored (:func:`as_run_here`).
    """
    path = folder / "summary.json"
    if not path.is_file():
        from fairclip.sims.checkpoint import CHECKPOINT_FILE, rounds_done

        rounds_done(folder / CHECKPOINT_FILE, config)  # refuses, before any work, another run's
        return None
    try:
        summary = json.loads(path.read_text())
        stored = summary["config"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigError(f"--resume: {path} is unreadable ({error!r}); delete that run folder") from None
    if not same_configuration(stored, config):
        raise ConfigError(
            f"--resume: {folder} was computed with another configuration; "
            "use a new --out folder or run without --resume"
        )
    return summary


def same_configuration(stored: dict[str, Any], config: RunConfig) -> bool:
    """Whether the stored configuration ``stored`` (a run's, as its summary or checkpoint keeps
    it) is ``config``: resolved as today's code resolves it, so that a key added to fairclip
    since (at its default) does not make it another, nor does a default that now depends on the
    machine, where it resolves here to the stored value (:func:`as_run_here`). A key fairclip no
    longer knows makes it another. ``training.eval_every`` is not compared: it decides which
    rows of ``rounds.csv`` are evaluated, never the training or the summary
    (``tests/test_eval_every.py``), so a run differs only in how densely its curve was sampled."""
    wanted = _without_evaluation_schedule(as_run_here(json_normalised(config.as_dict())))
    if _without_evaluation_schedule(stored) == wanted:
        return True
    try:
        resolved = as_run_here(json_normalised(validate(stored).as_dict()))
    except ConfigError:
        return False
    return _without_evaluation_schedule(resolved) == wanted


def _without_evaluation_schedule(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` without ``training.eval_every`` (see :func:`same_configuration`)."""
    training = config.get("training")
    if not isinstance(training, dict) or "eval_every" not in training:
        return config
    return {**config, "training": {k: v for k, v in training.items() if k != "eval_every"}}


def as_run_here(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` (a normalised run configuration) with its machine-dependent defaults filled in
    as this machine would run it: an unset ``training.one_step_rows`` becomes 32 on the CPU and
    1,024 on a GPU (:func:`fairclip.sims.classification.rows_per_one_step_call`). A run stored
    with ``one_step_rows`` 32, from before that default depended on the device, is then the same
    configuration as an unset one on a CPU -- the same value, so the same run."""
    training = config.get("training")
    if not isinstance(training, dict) or training.get("one_step_rows") is not None:
        return config
    from fairclip.client.models import resolve_device
    from fairclip.sims.classification import rows_per_one_step_call

    rows = rows_per_one_step_call(resolve_device(training.get("device", "auto")))
    return {**config, "training": {**training, "one_step_rows": rows}}


def pending_runs(raw: dict[str, Any], runs: list[RunSpec], out: Path, resume: bool) -> list[RunSpec]:
    """The runs still to compute: all of them, or with ``resume`` those not finished in ``out``
    (:func:`finished_summary`)."""
    if not resume:
        return list(runs)
    return [run for run in runs if finished_summary(out / "runs" / run.key, run.config(raw)) is None]


def run_simulation(
    raw_config: dict[str, Any],
    data_dir: str | None,
    workers: int = 1,
    plugins: dict[str, Any] | None = None,
    checkpoint: str | None = None,
) -> dict[str, Any]:
    """Simulate one run in this process (the local engine with ``workers`` threads); returns its
    rows and summary. ``plugins`` is the starting process's :func:`fairclip.plugins.snapshot`
    (its registered policies, models and datasets, and its import path). With ``checkpoint`` (a
    file path) the run continues from the checkpoint there, if any, and keeps its progress
    there (:mod:`fairclip.sims.checkpoint`)."""
    from fairclip.sims.checkpoint import Checkpointing
    from fairclip.sims.engine import simulate
    from fairclip.sims.local_engine import LocalExecutor
    from fairclip.sims.tasks import build_task

    if plugins is not None:
        from fairclip.plugins import restore

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
    (:func:`fairclip.sims.interrupts.sigint_raises_keyboard_interrupt`)."""
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
    engine with as many threads (the same result for any ``workers``); yield (item, result) as
    they finish. Many one-CPU tasks use the cores best when there are many runs; give the
    threads to the few runs of a long reproduction. ``checkpoints(item)`` is the file where an
    item's run keeps its progress (:func:`run_simulation`): on a cluster, a folder every node
    sees. Jobs the caller appends to ``jobs`` between two results are submitted before the
    next wait."""
    import ray

    from fairclip.sims.ray_engine import ensure_ray

    if not jobs:
        return
    ensure_ray(address)
    cpus = workers_fit_ray(workers)
    from fairclip.plugins import snapshot
    from fairclip.sims.ray_engine import gpu_share

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
    ``--resume`` continues after its last finished round (:func:`fairclip.sims.engine.simulate`),
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
    continues from (:mod:`fairclip.sims.checkpoint`)."""
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


def save_run(folder: Path, result: dict[str, Any]) -> None:
    """Write a finished run: ``rounds.csv``, then ``summary.json`` (which marks it finished); then
    delete the run's checkpoint, which they supersede (:mod:`fairclip.sims.checkpoint`)."""
    from fairclip.sims.checkpoint import CHECKPOINT_FILE

    write_csv(folder / "rounds.csv", result["rows"])
    write_json(folder / "summary.json", result["summary"])
    (folder / CHECKPOINT_FILE).unlink(missing_ok=True)


def run_checkpoint(out: Path, key: str) -> Path:
    """Where the run ``key`` of the sweep or reproduction in ``out`` keeps its progress."""
    from fairclip.sims.checkpoint import CHECKPOINT_FILE

    return out / "runs" / key / CHECKPOINT_FILE


def discard_checkpoints(out: Path, keys: Iterable[str]) -> None:
    """Delete the checkpoints of the runs ``keys`` in ``out``: a sweep run again without
    ``--resume`` computes them again from their first round (with today's code), as asked."""
    for key in keys:
        run_checkpoint(out, key).unlink(missing_ok=True)


def execute(
    raw: dict[str, Any],
    pending: list[RunSpec],
    out: Path | None,
    *,
    data_dir: Path | None,
    ray: bool = True,
    address: str | None = None,
    workers: int = 1,
    on_result: Callable[[RunSpec, dict[str, Any]], None] | None = None,
) -> dict[str, dict[str, Any]]:
    """Run ``pending`` -- as parallel Ray tasks (``ray``), or one after the other in this process
    -- writing each into ``out/runs/<key>/`` as it finishes (when ``out`` is given) before
    ``on_result(run, {"rows": ..., "summary": ...})``; returns the results by run key."""
    jobs = [(run, run.config(raw).as_dict()) for run in pending]
    checkpoints = (lambda run: run_checkpoint(out, run.key)) if out is not None else None
    finished = simulate_jobs(
        jobs, data_dir=data_dir, ray=ray, address=address, workers=workers, checkpoints=checkpoints
    )
    results = {}
    with contextlib.closing(finished):  # stopped here, the runs still going stop too
        for run, result in finished:
            if out is not None:
                save_run(out / "runs" / run.key, result)
            results[run.key] = result
            if on_result is not None:
                on_result(run, result)
    return results


def check_sweep_memory(raw: dict[str, Any], runs: list[RunSpec], parallel: int, address: str | None) -> None:
    """Without a cluster, the runs held at once on this machine (``parallel`` processes, one
    task each) must fit in its memory; refused in one line before any work."""
    if address is None:
        from fairclip.sims.memory import check_memory

        check_memory(validate(raw), copies=max(1, min(len(runs), parallel)))


def run_sweep(
    out: Path,
    given: dict[str, Any],
    mode: Any,
    *,
    data_dir: Path | None,
    ray: bool,
    address: str | None,
    workers: int,
    parallel: int,
    on_start: Callable[[int, int], None] | None = None,
    on_result: Callable[[RunSpec, dict[str, Any]], None] | None = None,
    explicit: dict[str, Any] | None = None,
) -> tuple[list[RunSpec], pd.DataFrame, dict[str, pd.DataFrame], list[str]]:
    """A sweep in its folder ``out`` (:mod:`fairclip.sims.sweep_folder`): hold the folder, settle
    the specification ``given`` with the stored one by ``mode`` (new, resume, extend, replace),
    run what is not finished, then write ``summary.csv``, ``report.md`` and the plots.
    ``on_start(runs, to_run)`` is called once the runs are known; ``explicit``: the options the
    user gave, which ``extend`` puts over the stored ones (:func:`fairclip.sims.sweep_folder.settle`).
    Returns (runs, summary table, rounds by key, plots drawn)."""
    from fairclip.sims import sweep_folder
    from fairclip.sims.plots import PLOTS
    from fairclip.sims.report import STATISTICS_FILES, write_report

    with sweep_folder.locked(out):
        spec = sweep_folder.settle(
            out,
            given,
            mode,
            merge=merge_specs,
            results=("runs", "summary.csv", "report.md", *STATISTICS_FILES, *PLOTS),
            explicit=explicit,
        )
        raw, runs = plan_from_spec(spec)
        check_sweep_memory(raw, runs, parallel, address)
        base = validate(raw)
        if base.scenario.task == "classification" and base.scenario.dataset != "synthetic":
            from fairclip.sims.data import resolve_data_dir

            data_dir = resolve_data_dir(data_dir)  # fail before starting Ray
        resuming = mode in (sweep_folder.Mode.RESUME, sweep_folder.Mode.EXTEND)
        todo = pending_runs(raw, runs, out, resuming)
        if not resuming:
            discard_checkpoints(out, (run.key for run in todo))
        if on_start is not None:
            on_start(len(runs), len(todo))
        execute(
            raw, todo, out, data_dir=data_dir, ray=ray, address=address, workers=workers, on_result=on_result
        )
        table, rounds, keys = load_results(out, runs)
        write_summary(out, table)
        drawn = write_report(out, table, rounds, keys, f"fairclip compare: {base.scenario.name}")
    return runs, table, rounds, drawn


def load_results(
    out: Path, runs: Iterable[RunSpec]
) -> tuple[pd.DataFrame, dict[str, pd.DataFrame], dict[str, tuple[str, float]]]:
    """``summary.csv`` rows (per run and cohort, with privacy cost against `none`), each run's
    rounds, and each run's (strategy, target ε) by key, read from the run folders in ``out``."""
    runs = list(runs)
    summaries = {run.key: json.loads((out / "runs" / run.key / "summary.json").read_text()) for run in runs}
    rounds = {run.key: pd.read_csv(out / "runs" / run.key / "rounds.csv") for run in runs}
    return results_table(runs, summaries, rounds)


def results_table(
    runs: list[RunSpec], summaries: dict[str, dict[str, Any]], rounds: dict[str, pd.DataFrame]
) -> tuple[pd.DataFrame, dict[str, pd.DataFrame], dict[str, tuple[str, float]]]:
    """As :func:`load_results`, from each run's summary and rounds by key (held in memory)."""
    references = {run.seed: summaries[run.key] for run in runs if run.strategy == REFERENCE}
    rows = []
    keys = {run.key: (run.strategy, _target(run, summaries[run.key])) for run in runs}
    for run in runs:
        summary = summaries[run.key]
        reference = references[run.seed]["cohorts"]
        overall = summary.get("overall", {})
        for cohort, metrics in summary["cohorts"].items():
            accuracy = metrics.get("accuracy", math.nan)
            loss = metrics.get("loss", math.nan)
            rows.append(
                {
                    "strategy": run.strategy,
                    "target_epsilon": keys[run.key][1],
                    "epsilon": float(summary["epsilon"]),
                    "seed": run.seed,
                    "cohort": cohort,
                    "accuracy": accuracy,
                    "loss": loss,
                    "privacy_cost": reference[cohort].get("accuracy", math.nan) - accuracy,
                    "final_clip_bound": float(summary["final_clip_bound"]),
                    "excessive_risk": loss - reference[cohort].get("loss", math.nan),
                    **{metric: metrics.get(metric, math.nan) for metric in COHORT_RATES},
                    **{metric: overall.get(metric, math.nan) for metric in RUN_METRICS},
                    "delta": summary["delta"],
                    "accountant": summary["privacy"]["accountant"],
                    "noise_multiplier": summary["privacy"]["noise_multiplier"],
                    "count_noise_multiplier": summary["privacy"]["count_noise_multiplier"],
                    "rounds_completed": summary["rounds_completed"],
                }
            )
    return pd.DataFrame(rows), rounds, keys


COHORT_RATES = ("tpr", "fpr", "selection_rate")
"""Per-cohort rates of a binary task's final model (Fairlearn, :mod:`fairclip.server.fairness`);
NaN where the task has none."""
RUN_METRICS = ("worst_class_accuracy", "demographic_parity_difference", "equalized_odds_difference")
"""Whole-run metrics of the final model, repeated on each of the run's cohort rows; NaN where
the task has none."""


def _target(run: RunSpec, summary: dict[str, Any]) -> float:
    """The run's target ε: ∞ for the reference, the scenario's own target (or NaN) without one."""
    if run.strategy == REFERENCE:
        return math.inf
    if run.target_epsilon is not None:
        return run.target_epsilon
    configured = summary["config"]["privacy"]["target_epsilon"]
    return math.nan if configured is None else float(configured)


def write_summary(out: Path, table: pd.DataFrame) -> None:
    """``summary.csv``, atomically."""
    write_csv(out / "summary.csv", table.to_dict("records"))


def parse_epsilons(text: str | None) -> list[float | None]:
    """``"1,2.5,8"`` -> [1.0, 2.5, 8.0]; ``None`` -> [None] (the scenario's own privacy settings)."""
    if text is None:
        return [None]
    values = []
    for part in text.split(","):
        try:
            value = float(part)
        except ValueError:
            raise ConfigError(f"--epsilons: {part.strip()!r} is not a number") from None
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(f"--epsilons: every ε must be a finite number > 0 (got {part.strip()})")
        values.append(value)
    return values
