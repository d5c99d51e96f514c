"""``fairclip compare``: policies × target ε × seeds as Ray tasks, and the `none` reference.

Each run is one Ray task that simulates a whole federation in its worker process (the
in-process executor: parallelism comes from running many runs at once). The driver writes every
finished run at once and atomically into ``DIR/runs/<key>/`` (``rounds.csv``, then
``summary.json``, whose presence marks the run finished), so an interrupted sweep keeps all
finished runs and ``--resume`` recomputes none of them. When every run is done the driver
writes ``summary.csv``, ``report.md`` and the plots (:mod:`fairclip.sims.compare.report`).
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd

from fairclip.atomic import write_csv
from fairclip.scenarios.config import RunConfig, set_value, validate
from fairclip.scenarios.data import resolve_data_dir
from fairclip.scenarios.errors import ConfigError
from fairclip.sims.executors.jobs import simulate_jobs
from fairclip.sims.executors.memory import check_memory
from fairclip.sims.sweeps import folder as sweep_folder
from fairclip.sims.sweeps.folder import specification, union
from fairclip.sims.sweeps.runs import discard_checkpoints, finished_summary, run_checkpoint, save_run
from fairclip.strategies.registry import policy_name

REFERENCE = "none"
T = TypeVar("T")


@dataclass(frozen=True)
class RunSpec:
    """One cell of the sweep."""

    policy: str
    """The policy as the configuration names it (``policy.name``: a name or an import path)."""
    target_epsilon: float | None
    seed: int

    @property
    def name(self) -> str:
        """The policy's one name in every output (:func:`fairclip.policies.display_name`): the
        run's key, the table's ``policy`` column, the report and the plots."""
        return policy_name(self.policy)

    @property
    def key(self) -> str:
        epsilon = "none" if self.target_epsilon is None else f"{self.target_epsilon:g}"
        return f"{self.name}__eps-{epsilon}__seed-{self.seed}"

    def config(self, raw: dict[str, Any]) -> RunConfig:
        """The configuration of this run: the scenario with policy, ε and seed set."""
        raw = set_value(set_value(raw, "policy.name", self.policy), "seed", self.seed)
        if self.target_epsilon is not None and self.policy != REFERENCE:
            raw = set_value(raw, "privacy.target_epsilon", float(self.target_epsilon))
        return validate(raw)


def plan_runs(
    raw: dict[str, Any], policies: list[str], epsilons: list[float | None], seeds: int
) -> list[RunSpec]:
    """Every run of the sweep, the `none` reference once per seed first. Validates them all."""
    base = validate(raw)
    if seeds < 1:
        raise ConfigError(f"--seeds must be >= 1 (got {seeds})")
    seed_values = [base.seed + offset for offset in range(seeds)]
    runs = [RunSpec(REFERENCE, None, seed) for seed in seed_values]
    runs += [
        RunSpec(policy, epsilon, seed)
        for policy in policies
        if policy != REFERENCE
        for epsilon in epsilons
        for seed in seed_values
    ]
    from fairclip.server.privacy_plan import check_accountable  # Opacus: kept out of start-up

    for run in runs:  # fail fast, before any work, on a policy, ε or size the scenario rejects
        config = run.config(raw)
        if run.policy != REFERENCE:
            check_accountable(config)
    return runs


DEFAULT_POLICIES = "constant,adaptive,bounded"
DEFAULT_SEEDS = 1


def compare_spec(
    raw: dict[str, Any] | None,
    policies: list[str] | None,
    epsilons: list[float | None] | None,
    seeds: int | None,
    *,
    explicit_only: bool = False,
) -> dict[str, Any]:
    """The specification of a sweep (what :mod:`fairclip.sims.sweeps.folder` stores): the
    scenario's raw configuration and the policies, target ε and number of seeds, with the
    defaults filled in -- or, ``explicit_only`` (``--resume``), only what was given."""

    options = {
        "policies": (policies, [name.strip() for name in DEFAULT_POLICIES.split(",")]),
        "epsilons": (epsilons, parse_epsilons(None)),
        "seeds": (seeds, DEFAULT_SEEDS),
    }
    fixed = {} if raw is None else {"config": raw}
    return specification("compare", fixed, options, explicit_only)


def plan_from_spec(spec: dict[str, Any]) -> tuple[dict[str, Any], list[RunSpec]]:
    """(raw configuration, runs) of a complete sweep specification; validates every run."""
    raw = spec["config"]
    return raw, plan_runs(raw, list(spec["policies"]), list(spec["epsilons"]), int(spec["seeds"]))


def merge_specs(stored: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """``--extend``: the stored sweep with the given policies, ε and seeds added (same scenario)."""

    if stored.get("config") != given.get("config"):
        raise ConfigError(
            "--extend adds policies, ε or seeds over the same scenario settings, and these differ; "
            "use --replace or another --out"
        )
    return {
        **stored,
        "policies": union(stored["policies"], given["policies"]),
        "epsilons": union(stored["epsilons"], given["epsilons"]),
        "seeds": max(stored["seeds"], given["seeds"]),
    }


def pending_runs(raw: dict[str, Any], runs: list[RunSpec], out: Path, resume: bool) -> list[RunSpec]:
    """The runs still to compute: all of them, or with ``resume`` those not finished in ``out``
    (:func:`finished_summary`)."""
    if not resume:
        return list(runs)
    return [run for run in runs if finished_summary(out / "runs" / run.key, run.config(raw)) is None]


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
    """A sweep in its folder ``out`` (:mod:`fairclip.sims.sweeps.folder`): hold the folder, settle
    the specification ``given`` with the stored one by ``mode`` (new, resume, extend, replace),
    run what is not finished, then write ``summary.csv``, ``report.md`` and the plots.
    ``on_start(runs, to_run)`` is called once the runs are known; ``explicit``: the options the
    user gave, which ``extend`` puts over the stored ones (:func:`fairclip.sims.sweeps.folder.settle`).
    Returns (runs, summary table, rounds by key, plots drawn)."""
    # matplotlib: kept out of the command line's start
    from fairclip.sims.compare.report import STATISTICS_FILES, write_report
    from fairclip.sims.sweeps.plots import PLOTS

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
    rounds, and each run's (policy, target ε) by key, read from the run folders in ``out``."""
    runs = list(runs)
    summaries = {run.key: json.loads((out / "runs" / run.key / "summary.json").read_text()) for run in runs}
    rounds = {run.key: pd.read_csv(out / "runs" / run.key / "rounds.csv") for run in runs}
    return results_table(runs, summaries, rounds)


def results_table(
    runs: list[RunSpec], summaries: dict[str, dict[str, Any]], rounds: dict[str, pd.DataFrame]
) -> tuple[pd.DataFrame, dict[str, pd.DataFrame], dict[str, tuple[str, float]]]:
    """As :func:`load_results`, from each run's summary and rounds by key (held in memory)."""
    references = {run.seed: summaries[run.key] for run in runs if run.policy == REFERENCE}
    rows = []
    keys = {run.key: (run.name, _target(run, summaries[run.key])) for run in runs}
    for run in runs:
        summary = summaries[run.key]
        reference = references[run.seed]["cohorts"]
        overall = summary.get("overall", {})
        for cohort, metrics in summary["cohorts"].items():
            accuracy = metrics.get("accuracy", math.nan)
            loss = metrics.get("loss", math.nan)
            rows.append(
                {
                    "policy": run.name,
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
"""Per-cohort rates of a binary task's final model (Fairlearn, :mod:`fairclip.scenarios.tasks.fairness`);
NaN where the task has none."""
RUN_METRICS = ("worst_class_accuracy", "demographic_parity_difference", "equalized_odds_difference")
"""Whole-run metrics of the final model, repeated on each of the run's cohort rows; NaN where
the task has none."""


def _target(run: RunSpec, summary: dict[str, Any]) -> float:
    """The run's target ε: ∞ for the reference, the scenario's own target (or NaN) without one."""
    if run.policy == REFERENCE:
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
