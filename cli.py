"""The ``fairclip`` command line (docs/design.md, section 5).

Every invalid input (configuration, scenario file, command-line value) ends with one line on
standard error naming the problem and exit status 2; no traceback.
"""

from __future__ import annotations

import json
import math
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import click
import typer
from rich.console import Console
from rich.table import Table

from fairclip import api
from fairclip.errors import ConfigError, FairclipError, NotFiniteError, one_line
from fairclip.progress import progress_bar

app = typer.Typer(
    name="fairclip",
    help="Who pays for differentially private clipping in federated learning.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
console = Console(stderr=True)
stdout = Console(soft_wrap=True)
"""Standard output never wraps lines: piped into a file, a markdown table must stay a table."""
ROUND_LINE_SECONDS = 30.0
"""Where stderr is not a terminal, ``run`` writes its first progress line after this many seconds
and the next ones at most this often (a run has thousands of rounds; ``compare``, ``reproduce``
and ``tune`` write one line per finished run)."""


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"fairclip {version('fairclip')}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Who pays for differentially private clipping in federated learning.

    The command line imports torch, Opacus and Ray only in the commands that need them, so
    ``--help``, ``--version`` and ``scenarios`` answer at once.
    """


Executor = StrEnum("Executor", {name: name for name in api.executor_names()})
"""Where a run's clients train (``run --executor``): the executors' registry, by name."""


class Scheduler(StrEnum):
    """How a sweep's runs are scheduled (``compare``/``reproduce``/``tune --scheduler``): one after
    the other in this process, or as parallel Ray tasks."""

    here = "here"
    ray = "ray"


OLD_SCHEDULERS = {"local": Scheduler.here, "here": Scheduler.here, "ray": Scheduler.ray}
"""``--backend``, the old name of ``--scheduler``, and its values (``local`` is ``here``)."""

SchedulerOption = Annotated[
    Scheduler | None,
    typer.Option(
        "--scheduler", help="Run the runs one after the other here, or as parallel Ray tasks \\[ray]."
    ),
]
OldSchedulerOption = Annotated[
    str | None, typer.Option("--backend", hidden=True, help="The old name of --scheduler (local = here).")
]
PoliciesHelp = "Comma-separated policies \\[constant,adaptive,bounded]; `none` always runs."


def _scheduler(scheduler: Scheduler | None, backend: str | None) -> Scheduler:
    """``--scheduler``, or ``--backend`` (its old name, whose ``local`` is ``here``); default ray."""
    if scheduler is not None and backend is not None:
        raise ConfigError("give --scheduler or --backend (its old name), not both")
    if backend is not None:
        if backend not in OLD_SCHEDULERS:
            raise ConfigError(f"--backend (the old name of --scheduler) takes local or ray (got {backend!r})")
        return OLD_SCHEDULERS[backend]
    return scheduler or Scheduler.ray


class Accountant(StrEnum):
    prv = "prv"
    rdp = "rdp"


ScenarioOption = Annotated[
    str | None, typer.Option("--scenario", help="A built-in scenario (see `fairclip scenarios`).")
]
ConfigOption = Annotated[Path | None, typer.Option("--config", help="A scenario TOML file.")]
SetOption = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a configuration key: KEY=VALUE (repeatable)."),
]


DataDirOption = Annotated[
    Path | None, typer.Option("--data-dir", help="Folder of the real datasets \\[env FAIRCLIP_DATA].")
]


TensorBoardOption = Annotated[
    Path | None,
    typer.Option(
        "--tensorboard",
        help="Also log every round to TensorBoard event files in this folder (one subfolder a run).",
    ),
]
MLflowOption = Annotated[
    str | None,
    typer.Option(
        "--mlflow",
        help="Also log every round to this MLflow experiment (MLflow's tracking URI; needs mlflow).",
    ),
]


RunWorkersOption = Annotated[
    int,
    typer.Option(
        "--workers",
        min=1,
        help="CPUs (local-executor threads) per run; runs at once = cores / this. Same results.",
    ),
]


@app.command()
def run(
    scenario: ScenarioOption = None,
    config: ConfigOption = None,
    overrides: SetOption = None,
    out: Annotated[
        Path | None, typer.Option("--out", help="Output folder \\[runs/<scenario>-<policy>].")
    ] = None,
    executor: Annotated[
        Executor,
        typer.Option(
            "--executor", "--backend", help="Where clients train: in this process, or on Ray actors."
        ),
    ] = Executor.local,
    data_dir: DataDirOption = None,
    address: Annotated[
        str | None, typer.Option("--address", help="Ray cluster address (ray executor).")
    ] = None,
    actors: Annotated[
        int | None, typer.Option("--actors", min=1, help="Ray actors (ray executor) \\[cores].")
    ] = None,
    workers: Annotated[
        int, typer.Option("--workers", min=1, help="Threads of the local executor (same result).")
    ] = 1,
    tensorboard: TensorBoardOption = None,
    mlflow: MLflowOption = None,
) -> None:
    """Run one simulation; write rounds.csv, summary.json and model.npy."""
    if workers > 1 and executor is not Executor.local:
        raise ConfigError("--workers applies to the local executor; the ray executor takes --actors")
    if address and executor is Executor.ray:
        api.check_cluster(address, 1)
    run_config = api.load_config(scenario, config, overrides or [])
    api.require_packages(tensorboard is not None, mlflow is not None)
    if tensorboard is not None:
        api.check_output_folder(tensorboard)  # the event files' folder, before any work
    policy = api.policy_name(run_config.policy.name)  # its one name (a plug-in's, not its import path)
    out = out or Path("runs") / f"{run_config.scenario.name}-{policy}"
    api.check_output_folder(out)
    local_actors = (actors or api.cpu_count()) if executor is Executor.ray and not address else 0
    api.check_memory(run_config, copies=1 + local_actors)  # the driver's task and each local actor's
    progress = progress_bar(
        f"[bold]{policy}[/bold] on {run_config.scenario.name}",
        console=console,
        transient=True,
        unit="rounds",
        every=ROUND_LINE_SECONDS,
    )
    loggers = api.round_loggers(tensorboard, mlflow, out.name, run_config.as_dict())
    with api.locked(out), progress:  # one process writes a run's folder
        bar = progress.add_task("rounds", total=run_config.training.rounds)
        observers = [
            api.RoundCallback(lambda _row: progress.advance(bar)),
            *(api.LoggerObserver(logger) for logger in loggers),
            api.RunWriter(out),  # last: an interrupted run's files are written after the others' ends
        ]
        result = api.simulate_config(
            run_config,
            data_dir=data_dir,
            executor=executor.value,
            workers=workers,
            actors=actors or api.cpu_count(),
            address=address,
            observers=observers,
        )
    if result.stop_reason:
        console.print(f"[yellow]{result.stop_reason}[/yellow]")
    _print_run_summary(result.summary, out)


ResumeOption = Annotated[
    bool, typer.Option("--resume", help="Continue the sweep stored in --out, keeping its finished runs.")
]
ExtendOption = Annotated[
    bool,
    typer.Option(
        "--extend",
        help="Add these runs to the sweep stored in --out (keeps its runs; options left out keep "
        "its values).",
    ),
]
ReplaceOption = Annotated[
    bool, typer.Option("--replace", help="Delete the sweep stored in --out and run this one instead.")
]


@app.command()
def compare(
    scenario: ScenarioOption = None,
    config: ConfigOption = None,
    overrides: SetOption = None,
    policies: Annotated[str | None, typer.Option("--policies", "--strategies", help=PoliciesHelp)] = None,
    epsilons: Annotated[
        str | None,
        typer.Option("--epsilons", help="Comma-separated target ε \\[the scenario's privacy settings]."),
    ] = None,
    seeds: Annotated[
        int | None, typer.Option("--seeds", min=1, help="Number of seeds: scenario seed, +1, ... \\[1].")
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", help="Output folder \\[runs/compare-<scenario>].")
    ] = None,
    resume: ResumeOption = False,
    extend: ExtendOption = False,
    replace: ReplaceOption = False,
    address: Annotated[
        str | None, typer.Option("--address", help="An existing Ray cluster to run on.")
    ] = None,
    workers: RunWorkersOption = 1,
    scheduler: SchedulerOption = None,
    old_scheduler: OldSchedulerOption = None,
    data_dir: DataDirOption = None,
    tensorboard: TensorBoardOption = None,
    mlflow: MLflowOption = None,
) -> None:
    """Compare policies across target ε and seeds (on Ray by default); write summary.csv, report.md, plots.

    The sweep's specification is stored in --out: --resume alone continues it.
    """
    started = time.perf_counter()
    mode = api.sweep_mode(resume, extend, replace)
    on_ray = _scheduler(scheduler, old_scheduler) is Scheduler.ray
    if address and not on_ray:
        raise ConfigError("--address is a Ray cluster's: it goes with --scheduler ray")
    if on_ray:
        api.check_cluster(address, workers)
    api.require_packages(tensorboard is not None, mlflow is not None)
    if tensorboard is not None:
        api.check_output_folder(tensorboard)  # the event files' folder, before any work
    typed = api.parse_overrides(overrides or [])
    if out is None:
        if mode == "resume" and not (scenario or config):
            raise ConfigError("--resume without --scenario or --config needs --out")
        out = Path("runs") / f"compare-{api.scenario_name(scenario, config, typed)}"
    api.check_output_folder(out)
    progress = progress_bar("[bold]compare[/bold] {task.description}", console=console, transient=False)

    def started_runs(total: int, to_run: int) -> None:
        console.print(f"{total} runs, {total - to_run} already finished; results in {out}")
        progress.start()
        progress.add_task(str(out.name), total=to_run)

    def finished_run(key: str, result: dict) -> None:
        api.log_finished_run(tensorboard, mlflow, key, result)
        progress.advance(progress.task_ids[0], note=key, reused=api.share_computed_earlier(result["summary"]))

    try:
        comparison = api.compare(
            scenario,
            policies=None if policies is None else [s.strip() for s in policies.split(",") if s.strip()],
            epsilons=None if epsilons is None else api.parse_epsilons(epsilons),
            seeds=seeds,
            config_file=config,
            overrides=typed,
            data_dir=data_dir,
            out=out,
            mode=mode,
            ray=on_ray,
            address=address,
            workers=workers,
            on_start=started_runs,
            on_run=finished_run,
            progress=False,  # the command's own display, above
        )
    finally:
        if progress.live.is_started:
            progress.stop()
    drawn = list(comparison.plots)
    stdout.print((out / "report.md").read_text(), markup=False, highlight=False)
    stdout.print(f"wall time {time.perf_counter() - started:.1f} s")
    stdout.print(f"report: {out / 'report.md'}")
    stdout.print(f"table:  {out / 'summary.csv'}")
    stdout.print("plots:  " + (", ".join(str(out / name) for name in drawn) or "none (see report.md)"))


@app.command()
def reproduce(
    name: Annotated[str | None, typer.Argument(help="A reproduction setup (see --list).")] = None,
    seeds: Annotated[
        int | None, typer.Option("--seeds", min=1, help="Number of seeds: setup seed, +1, ... \\[2].")
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", help="Output folder \\[runs/reproduce-<name>].")
    ] = None,
    list_setups: Annotated[bool, typer.Option("--list", help="Name the setups and exit.")] = False,
    policies: Annotated[
        str | None,
        typer.Option(
            "--policies",
            "--strategies",
            help="Comma-separated subset of the setup's policies (labels) \\[all].",
        ),
    ] = None,
    full_grid: Annotated[
        bool | None,
        typer.Option("--full-grid/--reduced-grid", help="The paper's hyper-parameter grid \\[reduced]."),
    ] = None,
    overrides: SetOption = None,
    max_rounds: Annotated[
        int | None, typer.Option("--max-rounds", min=1, help="Cap every run's rounds (smoke tests only).")
    ] = None,
    grid_limit: Annotated[
        int | None,
        typer.Option("--grid-limit", min=1, help="First K values of each grid axis (smoke tests)."),
    ] = None,
    max_batch: Annotated[
        int | None,
        typer.Option("--max-batch", min=1, help="Cap every run's expected batch (smoke tests only)."),
    ] = None,
    scheduler: SchedulerOption = None,
    old_scheduler: OldSchedulerOption = None,
    address: Annotated[
        str | None, typer.Option("--address", help="An existing Ray cluster to run on.")
    ] = None,
    resume: ResumeOption = False,
    extend: Annotated[
        bool,
        typer.Option(
            "--extend",
            help="Add seeds or policies to the reproduction stored in --out (keeps its runs; "
            "options left out keep its values).",
        ),
    ] = False,
    replace: ReplaceOption = False,
    workers: RunWorkersOption = 1,
    data_dir: DataDirOption = None,
) -> None:
    """Reproduce a seed paper's centralised experiment; write reproduction.csv and reproduction.md.

    The reproduction's specification is stored in --out: --resume alone continues it.
    """
    if list_setups:
        for setup_name, title in api.reproduction_setups().items():
            typer.echo(f"{setup_name:<24} {title}")
        return
    on_ray = _scheduler(scheduler, old_scheduler) is Scheduler.ray
    if not on_ray and address:
        raise ConfigError("--address is a Ray cluster's: it goes with --scheduler ray")
    if on_ray:
        api.check_cluster(address, workers)
    mode = api.sweep_mode(resume, extend, replace)
    subset = None if policies is None else [s.strip() for s in policies.split(",") if s.strip()]
    title = name or (out.name if out is not None else "")
    continued: dict[str, float] = {}  # run key: the share of its rounds an earlier invocation computed
    # transient: an error (a --resume conflict, say) stays the only line on stderr
    with progress_bar(f"[bold]reproduce[/bold] {title}", console=console, transient=True) as progress:
        bar = progress.add_task(title, total=None)
        reproduction = api.reproduce(
            name,
            seeds=seeds,
            out=out,
            mode=mode,
            policies=subset,
            full_grid=full_grid,
            grid_limit=grid_limit,
            max_rounds=max_rounds,
            max_batch=max_batch,
            overrides=overrides,
            data_dir=data_dir,
            ray=on_ray,
            address=address,
            workers=workers,
            on_plan=lambda total: progress.update(bar, total=total),
            on_run=lambda key: progress.advance(bar, note=key, reused=continued.pop(key, 0.0)),
            on_reused=lambda key: progress.advance(bar, note=key, reused=1),
            on_continued=continued.__setitem__,
            progress=False,  # the command's own display, above
        )
    typer.echo((reproduction.folder / "reproduction.md").read_text())
    typer.echo(f"wall time {reproduction.wall_seconds:.1f} s ({reproduction.name})")
    stdout.print(f"table:  {reproduction.folder / 'reproduction.csv'}")


@app.command()
def tune(
    scenario: ScenarioOption = None,
    config: ConfigOption = None,
    overrides: SetOption = None,
    grid: Annotated[
        list[str] | None,
        typer.Option("--grid", help="A key to search and its values: KEY=V1,V2,... (repeatable)."),
    ] = None,
    metric: Annotated[
        str,
        typer.Option("--metric", help="Select by this result (macro_accuracy, worst_cohort_accuracy, ...)."),
    ] = "macro_accuracy",
    distribution: Annotated[
        str,
        typer.Option(
            "--distribution", help="Number of trials: tnb (truncated negative binomial) or poisson."
        ),
    ] = "tnb",
    eta: Annotated[float, typer.Option("--eta", help="tnb: η >= 0 (0 logarithmic, 1 geometric).")] = 1.0,
    gamma: Annotated[float, typer.Option("--gamma", help="tnb: γ in (0, 1).")] = 0.2,
    mu: Annotated[float, typer.Option("--mu", help="poisson: the mean μ.")] = 5.0,
    tuning_seed: Annotated[
        int, typer.Option("--tuning-seed", min=0, help="Seeds the draw of the trials.")
    ] = 0,
    policies: Annotated[
        str | None,
        typer.Option(
            "--policies", "--strategies", help="Comma-separated: one search per policy and --epsilons value."
        ),
    ] = None,
    epsilons: Annotated[
        str | None, typer.Option("--epsilons", help="Comma-separated target ε of a run (with --policies).")
    ] = None,
    grid_baseline: Annotated[
        bool,
        typer.Option(
            "--grid-baseline/--no-grid-baseline",
            help="Also run every grid point once (non-private selection).",
        ),
    ] = True,
    out: Annotated[Path | None, typer.Option("--out", help="Output folder \\[runs/tune-<scenario>].")] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue the search stored in --out, keeping its finished runs.")
    ] = False,
    scheduler: SchedulerOption = None,
    old_scheduler: OldSchedulerOption = None,
    address: Annotated[
        str | None, typer.Option("--address", help="An existing Ray cluster to run on.")
    ] = None,
    workers: RunWorkersOption = 1,
    data_dir: DataDirOption = None,
) -> None:
    """Tune hyperparameters by DP random search (Papernot & Steinke 2022); ε covers the search.

    Also runs every grid point once (non-private selection); it and every trial go to not-dp-protected/.

    --policies with --epsilons: one search each, and the best result against ε (curve.csv).
    """
    typed = api.parse_overrides(overrides or [])
    searched: dict[str, list] | None = api.parse_grid(grid or [])
    on_ray = _scheduler(scheduler, old_scheduler) is Scheduler.ray
    if address and not on_ray:
        raise ConfigError("--address is a Ray cluster's: it goes with --scheduler ray")
    if on_ray:
        api.check_cluster(address, workers)
    bare_resume = resume and scenario is None and config is None and not searched and not typed
    stored_options: dict = {}
    if bare_resume and policies is None and epsilons is None:  # continue what --out holds
        if out is None:
            raise ConfigError("--resume without a scenario continues the search in --out: give --out")
        stored = api.stored_tune_curve(out)
        if stored is not None:
            scenario, config = stored["scenario"], stored["config_file"]
            policies, epsilons = ",".join(stored["policies"]), ",".join(map(str, stored["epsilons"]))
            searched, typed, stored_options = stored["grid"], stored["overrides"], stored["options"]
        else:
            searched = None  # the stored search, as it was asked
    if out is None:
        out = Path("runs") / f"tune-{api.scenario_name(scenario, config, typed)}"
    api.check_output_folder(out)
    progress = progress_bar("[bold]tune[/bold] {task.description}", console=console, transient=False)

    searches: list[str] = []

    def started_runs(total: int, to_run: int) -> None:
        console.print(f"{total} runs, {total - to_run} already finished")
        if not progress.live.is_started:
            progress.start()
        progress.add_task(searches[-1] if searches else str(out.name), total=to_run)

    if (policies is None) != (epsilons is None):
        raise ConfigError("--policies and --epsilons go together (one search per policy and ε)")
    options = dict(
        metric=metric,
        distribution=distribution,
        eta=eta,
        gamma=gamma,
        mu=mu,
        seed=tuning_seed,
        grid_baseline=grid_baseline,
        config_file=config,
        data_dir=data_dir,
        ray=on_ray,
        address=address,
        workers=workers,
        on_start=started_runs,
        on_run=lambda key, _result: progress.advance(progress.task_ids[-1], note=key),
        progress=False,  # the command's own display, above
    )
    options.update(stored_options)  # a curve continued from its folder keeps its own options
    try:
        if policies is None:
            api.tune(scenario, grid=searched, overrides=typed, out=out, resume=resume, **options)
        else:
            api.tune_curve(
                scenario,
                policies=[name.strip() for name in policies.split(",") if name.strip()],
                epsilons=api.parse_epsilons(epsilons or ""),
                grid=searched,
                out=out,
                resume=resume,
                overrides=typed,
                on_search=searches.append,
                **options,
            )
    finally:
        if progress.live.is_started:
            progress.stop()
    stdout.print((out / "report.md").read_text(), markup=False, highlight=False)
    stdout.print(f"report: {out / 'report.md'}")
    stdout.print(f"not DP-protected, never publish: {api.tune_internal_folder(out)}/")


@app.command()
def bench(
    workloads: Annotated[
        list[str] | None,
        typer.Argument(help="Workloads among w1 w2 w3 w4 w5 w6 \\[all].", show_default=False),
    ] = None,
    quick: Annotated[
        bool, typer.Option("--quick", help="Tiny sizes: a smoke test, no timing claims.")
    ] = False,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the JSON report here.")] = None,
    device: Annotated[
        str, typer.Option("--device", help="cpu, or cuda: W2's contenders on the GPU (w2 only).")
    ] = "cpu",
) -> None:
    """Benchmark fairclip against Flower, Opacus, pfl-research and the compute floor (W1-W5), and
    secure aggregation against the plain exchange (W6)."""
    _report, failed = api.bench(workloads or [], quick, json_path, device)
    if json_path is not None:
        stdout.print(f"report: {json_path}")
    if failed:
        console.print(f"failed: {', '.join(failed)}")
        raise typer.Exit(1)


@app.command()
def data(
    data_dir: DataDirOption = None,
    datasets: Annotated[
        str | None,
        typer.Option("--datasets", help="Comma-separated: mnist, fashion-mnist, adult, dutch \\[all]."),
    ] = None,
    verify_only: Annotated[
        bool, typer.Option("--verify-only", help="Check the files; download nothing.")
    ] = False,
) -> None:
    """Fetch the real datasets (where the network allows) and verify their SHA-256 checksums."""
    names = [n.strip() for n in datasets.split(",")] if datasets else None
    for state, path in api.fetch_datasets(data_dir, names, verify_only):
        stdout.print(f"{state:>10}  {path}")


def _number(value: object) -> str:
    """A number of the run summary with 4 significant digits (the files keep every digit)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


def _print_run_summary(summary: dict, out: Path) -> None:
    privacy = summary["privacy"]
    policy = summary.get("policy", summary.get("strategy"))  # "strategy": a summary written before
    table = Table(title=f"{policy} on {summary['scenario']} (seed {summary['seed']})")
    table.add_column("cohort")
    metrics = sorted({metric for values in summary["cohorts"].values() for metric in values})
    for metric in metrics:
        table.add_column(metric, justify="right")
    for cohort, values in summary["cohorts"].items():
        table.add_row(cohort, *(f"{values[m]:.4g}" for m in metrics))
    stdout.print(table)
    if "estimate" in summary:
        stdout.print(f"estimate: {', '.join(f'{v:.4f}' for v in summary['estimate'])}")
    stdout.print(
        f"epsilon = {_number(privacy['epsilon'])} at delta = {privacy['delta']:g} ({privacy['accountant']}, "
        f"q = {privacy['sample_rate']:g}, T = {privacy['rounds']}, "
        f"sigma = {_number(privacy['noise_multiplier'])}, "
        f"sigma_b = {_number(privacy['count_noise_multiplier'])}); "
        f"final clip bound {_number(summary['final_clip_bound'])}"
    )
    outside = summary.get("preprocessing", {}).get("outside_epsilon")
    if outside:
        stdout.print(f"outside epsilon (preprocessing): {'; '.join(outside)}")
    for flag in summary.get("flags", []):
        console.print(f"[yellow]warning: {flag}[/yellow]")
    stdout.print(f"wrote {out / 'rounds.csv'}, {out / 'summary.json'} and {out / 'model.npy'}")


@app.command()
def privacy(
    sample_rate: Annotated[float, typer.Option("--sample-rate", help="Client sampling rate q.")],
    rounds: Annotated[int, typer.Option("--rounds", min=1, help="Number of rounds T.")],
    delta: Annotated[float, typer.Option("--delta", help="δ of the (ε, δ) claim.")],
    noise_multiplier: Annotated[
        float | None,
        typer.Option("--noise-multiplier", help="σ_Δ, noise multiplier of the update sum."),
    ] = None,
    count_noise_multiplier: Annotated[
        float | None,
        typer.Option("--count-noise-multiplier", help="σ_b of a count release, if any."),
    ] = None,
    target_epsilon: Annotated[
        float | None,
        typer.Option("--target-epsilon", help="Print the noise multipliers that reach this ε."),
    ] = None,
    count_noise_ratio: Annotated[
        float | None,
        typer.Option(
            "--count-noise-ratio", help="With --target-epsilon: σ_b = k σ_Δ [10] (seed 002: 7.054)."
        ),
    ] = None,
    accountant: Annotated[Accountant, typer.Option("--accountant")] = Accountant.prv,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """ε of T rounds of user-level DP-FedAvg, or the noise for a target ε."""
    claim = api.privacy_claim(
        sample_rate,
        rounds,
        delta,
        noise_multiplier=noise_multiplier,
        count_noise_multiplier=count_noise_multiplier,
        target_epsilon=target_epsilon,
        count_noise_ratio=count_noise_ratio,
        accountant=accountant.value,
    )
    if as_json:
        stdout.print_json(json.dumps(claim.as_dict()))
        return
    epsilon_text = "inf" if math.isinf(claim.epsilon) else f"{claim.epsilon:.4f}"
    stdout.print(
        f"epsilon = {epsilon_text} at delta = {delta:g} ({accountant.value} accountant; q = {sample_rate:g}, "
        f"T = {rounds}, sigma = {claim.noise_multiplier:.4f}, sigma_b = "
        f"{'-' if claim.count_noise_multiplier is None else f'{claim.count_noise_multiplier:.4f}'}, "
        f"sigma_eff = {claim.effective_noise_multiplier:.4f})"
    )


FLOWER_HELP = (
    "`flwr run ARGS --stream` (ARGS exactly as `flwr run` takes them), exiting 1 unless the run "
    "completed.\n\nFlower's own `flwr run` exits 0 for every run it submitted, failed or not; this "
    "passes its output through, then asks `flwr ls` how the run ended and exits 0 only for "
    "`finished:completed`."
)


@app.command(
    help=FLOWER_HELP,
    context_settings={
        "allow_extra_args": True,
        "ignore_unknown_options": True,
        "help_option_names": ["--help"],
    },
)
def flower(context: typer.Context) -> int:
    """:func:`fairclip.api.run_flower` with the exit status of the run."""
    status = api.run_flower(list(context.args))
    if status.succeeded:
        stdout.print(status.message())
        return 0
    print(f"fairclip: error: {status.message()}", file=sys.stderr)
    return 1


@app.command()
def scenarios() -> None:
    """List the built-in scenarios."""
    table = Table(title="built-in scenarios")
    table.add_column("name")
    table.add_column("description")
    for name, description in api.scenarios().items():
        table.add_row(name, description)
    stdout.print(table)


_signals_received: list[int] = []
"""SIGTERMs seen by :func:`_terminate`: typer turns every KeyboardInterrupt into exit code 130,
so this is how :func:`main` tells a SIGTERM (143) from Ctrl-C (130)."""


def _terminate(signum: int, _frame: object) -> None:
    """SIGTERM (``kill``, ``timeout``, ``docker stop``, Slurm), handled like Ctrl-C."""
    _signals_received.append(signum)
    raise KeyboardInterrupt


OUTPUT_ERROR = 74
"""Exit status of a command stopped by a file it could not read or write mid-run (a full disk, a
folder turned read-only): sysexits' EX_IOERR. The results written so far stay, and a run's
``summary.json`` says ``failed`` with the reason where it could still be written."""


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app and turn every input error into one line and exit status 2.

    SIGTERM stops a command the way Ctrl-C does: finished results are written, and the exit
    status is 143 (130 for Ctrl-C). A file that cannot be read or written mid-run (a full disk)
    is one line naming it, and status :data:`OUTPUT_ERROR` (74).
    """
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if in_main_thread else None
    _signals_received.clear()
    show_warning = warnings.showwarning
    notes: list[str] = []
    warnings.showwarning = _note_old_names(show_warning, notes)
    try:
        # Without standalone mode click returns the exit status of --help, Ctrl-C and the like.
        status = app(args=argv, prog_name="fairclip", standalone_mode=False)
    except click.exceptions.Exit as done:
        sys.exit(done.exit_code)
    except click.ClickException as error:
        notes.clear()  # bad input: its one line only
        _fail(error.format_message())
    except NotFiniteError as error:  # the run stopped: its summary says failed, and why
        print(f"fairclip: error: {error}", file=sys.stderr)
        sys.exit(1)
    except FairclipError as error:  # every other error fairclip reports in one line
        notes.clear()  # bad input: its one line only
        _fail(str(error))
    except (click.exceptions.Abort, KeyboardInterrupt):
        status = 130
    except ConnectionError as error:  # an OSError, but a cluster or server refused us, not a file
        # Its message names what refused us ("Failed to connect to Ray cluster at ..."): no type.
        print(f"fairclip: error: {' '.join(str(error).split()) or one_line(error)}", file=sys.stderr)
        sys.exit(1)
    except OSError as error:  # a file that could not be written or read mid-run: a full disk, say
        print(f"fairclip: error: {one_line(error)}", file=sys.stderr)
        sys.exit(OUTPUT_ERROR)
    finally:
        warnings.showwarning = show_warning
        for note in notes:
            print(f"fairclip: note: {note}", file=sys.stderr)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if status == 130 and _signals_received:
        status = 143
    if status in (130, 143):
        console.print(f"{'terminated' if status == 143 else 'interrupted'}; finished results were written")
    if isinstance(status, int) and status != 0:
        sys.exit(status)


def _note_old_names(show: Callable[..., None], notes: list[str]) -> Callable[..., None]:
    """``warnings.showwarning`` that keeps :class:`fairclip.api.OldNameNote` (an old name, such as
    ``strategy.*`` for ``policy.*``, read as the new one) in ``notes``, once each, and shows every
    other warning as ``show`` does. :func:`main` prints the notes as ``fairclip: note: ...`` when the
    command ends, except after bad input, whose one line stays the only one."""

    def note(message, category, filename, lineno, file=None, line=None) -> None:
        if isinstance(category, type) and issubclass(category, api.OldNameNote):
            if str(message) not in notes:
                notes.append(str(message))
        else:
            show(message, category, filename, lineno, file, line)

    return note


def _fail(message: str) -> None:
    print(f"fairclip: error: {message}", file=sys.stderr)
    sys.exit(2)
