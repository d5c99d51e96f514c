"""A reproduction's runs: sample-level settings, the grid, the per-run ε, and their execution.

:class:`Planner` turns a setup into the runs of every policy, target ε and seed (a grid's
validation runs first, the chosen point's final runs on the test split after them,
:class:`FinalsAfterGrid`); :func:`execute` runs them as a sweep does (:mod:`fairclip.sims.executors.jobs`),
writing each into ``DIR/runs/<key>/`` as it finishes.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fairclip.scenarios import dataset_registry
from fairclip.scenarios.config import (
    ClassificationSpec,
    apply_overrides,
    canonical_assignments,
    check_overrides_used,
    parse_override,
    scenario_source,
    set_value,
    validate,
)
from fairclip.scenarios.data.real_data import training_examples
from fairclip.scenarios.errors import ConfigError
from fairclip.sims.executors.jobs import simulate_jobs
from fairclip.sims.reproduce.claims import (
    epsilon_text,
)
from fairclip.sims.reproduce.setups import SELECTION_METRICS, PolicySetup, Run, Setup, per_run_keys
from fairclip.sims.sweeps.runs import discard_checkpoints, finished_summary, run_checkpoint, save_run
from fairclip.strategies import accounting
from fairclip.strategies.errors import PolicyConfigError


def sample_level_settings(
    setup: Setup,
    num_examples: int,
    max_rounds: int | None,
    max_batch: int | None = None,
    policy: PolicySetup | None = None,
) -> dict[str, Any]:
    """The settings (typed, by dotted key) that make every training example a client of a
    DP-SGD step, with the setup's epochs and batch size, or ``policy``'s own where it has them.
    ``max_rounds`` and ``max_batch`` (smoke runs only) cap the number of steps and the expected
    batch (the sampling rate)."""
    epochs = setup.epochs if policy is None or policy.epochs is None else policy.epochs
    batch_size = setup.batch_size if policy is None or policy.batch_size is None else policy.batch_size
    if batch_size is None:
        rate, rounds = 1.0, epochs
    else:
        rate = min(1.0, batch_size / num_examples)
        rounds = math.ceil(epochs * num_examples / batch_size)
    if max_rounds is not None:
        rounds = min(rounds, max_rounds)
    if max_batch is not None:
        rate = min(rate, max_batch / num_examples)
    return {
        "federation.num_clients": num_examples,
        "federation.sample_rate": float(rate),
        "training.rounds": rounds,
    }


def _apply(raw: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    for key, value in settings.items():
        raw = set_value(raw, key, value)
    return raw


def _policy_raw(
    base: dict[str, Any], policy: PolicySetup, point: dict[str, Any], overrides: dict[str, Any]
) -> dict[str, Any]:
    """``base`` with the policy's settings, then its grid point, then the user's ``--set``
    ``overrides`` (which win over the setup's per-policy settings, as the report says)."""
    raw = _apply(set_value(base, "policy.name", policy.policy_name), {**policy.settings, **point})
    raw = _apply(raw, overrides)
    # Zhao et al.'s grid puts C_LB up to 50; fairclip requires C_0 >= C_LB, so the bound starts there.
    lower = raw["policy"].get("lower_bound")
    if lower is not None and lower > raw["policy"].get("initial_bound", 1.0):
        raw = set_value(raw, "policy.initial_bound", lower)
    return raw


def grid_axes(setup: Setup, policy: PolicySetup, full: bool) -> dict[str, list[Any]]:
    """The setup's and the policy's grid axes (``full``: the paper grids), by key."""
    return {**(setup.full_grid if full else setup.grid), **(policy.full_grid if full else policy.grid)}


def grid_points(setup: Setup, policy: PolicySetup, full: bool, limit: int | None) -> list[dict[str, Any]]:
    """Every combination of the setup's and the policy's grid axes (first ``limit`` values each)."""
    axes = grid_axes(setup, policy, full)
    if limit is not None:
        axes = {key: values[:limit] for key, values in axes.items()}
    keys = list(axes)
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*axes.values())]


def per_run_epsilon(
    target: float, runs: int, sample_rate: float, rounds: int, delta: float, accountant: str
) -> float:
    """The ε of each of ``runs`` equal runs (T = ``rounds`` rounds at rate q) whose composition
    spends ``target``: σ_eff calibrated for ``runs`` · T rounds, then the ε of T rounds at it.

    k runs of T rounds at one (σ_eff, q) compose exactly as one run of k·T rounds (RDP adds per
    step; PRV composes the same mechanism k·T times): seed 002's per-grid budget ("the moment
    accountant to distribute the privacy budget among the configurations", after Mohapatra et
    al. 2022). A run calibrated to this ε gets σ_eff' >= σ_eff, so its k runs spend at most
    ``target``. One run: ``target`` itself."""
    if runs == 1:
        return target
    try:
        sigma = accounting.calibrate_effective(target, sample_rate, runs * rounds, delta, accountant)
        return accounting.epsilon(sigma, sample_rate, rounds, delta, accountant)
    except PolicyConfigError as error:
        raise ConfigError(f"privacy of a search of {runs} runs: {error}") from None


def checked_overrides(setup: Setup, overrides: list[str]) -> dict[str, Any]:
    """The ``--set`` assignments by dotted key, less ``seed`` (the first seed); a
    :class:`ConfigError` for a key the reproduction sets per run or one of its grids varies,
    which an override would silently fix (or be overwritten by)."""
    varied = dict.fromkeys([*setup.grid, *setup.full_grid], "the setup's grid")
    for policy in setup.policies:
        for key in [*policy.grid, *policy.full_grid]:
            varied.setdefault(key, f"policy {policy.name}'s grid")
    refused = per_run_keys(setup)
    checked = {}
    for assignment in canonical_assignments(overrides):
        path, value = parse_override(assignment)
        key = ".".join(path)
        if key in refused:
            raise ConfigError(f"--set {key}: a reproduction sets it for each run ({refused[key]})")
        if key in ("privacy.target_epsilon", "privacy.noise_multiplier") and any(
            e is not None for e in setup.epsilons
        ):  # each run's target ε is set, and it calibrates the noise multiplier
            raise ConfigError(
                f"--set {key}: the setup's target epsilons ({setup.epsilons}) set it for each run"
            )
        if key in varied:
            raise ConfigError(f"--set {key}: {varied[key]} varies it, so each grid point sets it")
        if key != "seed":
            checked[key] = value
    return checked


class Planner:
    """Configurations of a setup's runs; N per seed is read from the data once."""

    def __init__(
        self,
        setup: Setup,
        data_dir: Path | None,
        overrides: list[str],
        max_rounds: int | None,
        examples: Callable[[Any, Path | None, int], int] | None = None,
        max_batch: int | None = None,
    ):

        self.setup = setup
        self.data_dir = data_dir
        self.max_rounds = max_rounds
        self.max_batch = max_batch
        self.examples = examples or training_examples
        self.overrides = checked_overrides(setup, overrides)
        """``--set`` by dotted key, applied over every run's policy settings and grid point (the
        first seed, ``seed``, stays in :attr:`base`)."""
        self.base = apply_overrides(_apply(scenario_source(setup.scenario, None), setup.settings), overrides)
        self._counts: dict[tuple[int, bool], int] = {}
        self._searched: tuple[bool, int | None] = (False, None)
        """(full, limit) of the grid last planned (:meth:`grid_runs`): the search a final run
        stands for; before any, the default reduced grid."""

    def search_runs(self, policy: PolicySetup) -> int:
        """k of ``policy``'s runs (:attr:`Run.search_runs`): under a ``per-grid`` budget, its
        points in the grid last planned, else 1."""
        if self.setup.budget != "per-grid" or not self.setup.has_grid:
            return 1
        full, limit = self._searched
        return len(grid_points(self.setup, policy, full, limit))

    def raw(
        self,
        policy: PolicySetup,
        point,
        epsilon: float | None,
        seed: int,
        validation: bool,
        search_runs: int = 1,
    ):
        base = set_value(self.base, "seed", seed)
        if validation:
            base = set_value(base, "scenario.evaluate_on", "validation")
        if epsilon is not None:
            base = set_value(base, "privacy.target_epsilon", epsilon)
        raw = _policy_raw(base, policy, point, self.overrides)
        scenario = validate(raw).scenario
        if (
            self.setup.selects
            and isinstance(scenario, ClassificationSpec)
            and scenario.dataset in dataset_registry.row_split_datasets()
        ):
            first = int(self.base.get("seed", 0))
            raw = set_value(raw, "scenario.split_seed", first)
            scenario = scenario.model_copy(update={"split_seed": first})
        check_overrides_used(raw, self.overrides)
        marker = (seed, validation)
        if marker not in self._counts:
            self._counts[marker] = self.examples(scenario, self.data_dir, seed)
        count = self._counts[marker]
        sample_level = sample_level_settings(self.setup, count, self.max_rounds, self.max_batch, policy)
        raw = _apply(raw, sample_level)
        if epsilon is not None and search_runs > 1:  # this run's share of its search's ε
            privacy = validate(raw).privacy
            share = per_run_epsilon(
                epsilon,
                search_runs,
                sample_level["federation.sample_rate"],
                sample_level["training.rounds"],
                privacy.delta,
                privacy.accountant,
            )
            raw = set_value(raw, "privacy.target_epsilon", share)
        if validation and "eval_every" not in raw.get("training", {}):
            # a grid run yields one number, its final validation metric: evaluating only after its
            # last round leaves that number, and the training, as they are (tests/test_eval_every.py),
            # and saves the ~100 evaluations of the validation rows a long run otherwise makes
            raw = set_value(raw, "training.eval_every", sample_level["training.rounds"])
        validate(raw)  # fail before any work
        return raw

    def check_first_runs(self, full: bool, limit: int | None) -> None:
        """Plan, and drop, the first run of every policy: its first grid point (or none), at the
        first target ε, for the first seed. A ``--set`` value that no run would take (a wrong
        type, an unknown choice, a combination the configuration refuses) then fails here, with
        the error the real plan would give, before the output folder is written;
        :func:`checked_overrides` checks only the keys."""
        searched = self._searched
        self._searched = (full, limit)
        try:
            seed = int(self.base.get("seed", 0))
            for policy in self.setup.policies:
                point = grid_points(self.setup, policy, full, limit)[0]  # {} without grid axes
                self.raw(
                    policy,
                    point,
                    self.setup.epsilons[0],
                    seed,
                    validation=bool(point),  # a grid's runs evaluate on the validation split
                    search_runs=self.search_runs(policy),
                )
        finally:
            self._searched = searched

    def grid_runs(self, full: bool, limit: int | None) -> list[Run]:
        """The validation runs of every policy with grid axes (one with none has nothing to
        choose: its final runs start at once, :meth:`ungridded_runs`)."""
        runs = []
        seed = int(self.base.get("seed", 0))
        self._searched = (full, limit)
        for policy in self.setup.policies:
            if not grid_axes(self.setup, policy, full):
                continue
            k = self.search_runs(policy)
            for epsilon in self.setup.epsilons:
                for index, point in enumerate(grid_points(self.setup, policy, full, limit)):
                    key = f"grid__{policy.name}__eps-{epsilon_text(epsilon) or 'none'}__{index:03d}"
                    raw = self.raw(policy, point, epsilon, seed, validation=True, search_runs=k)
                    runs.append(Run(key, policy.name, epsilon, seed, raw, point, search_runs=k))
        return runs

    def ungridded_runs(self, seeds: int, full: bool) -> list[Run]:
        """The final runs of the policies without grid axes, which need no grid run first."""
        return [
            run
            for policy in self.setup.policies
            if not grid_axes(self.setup, policy, full)
            for epsilon in self.setup.epsilons
            for run in self.final_runs_of(policy, epsilon, seeds, {})
        ]

    def final_runs(self, seeds: int, chosen: dict[tuple[str, float | None], dict[str, Any]]) -> list[Run]:
        """Every policy's and target ε's runs on the test set, ``seeds`` each, at the grid point
        ``chosen`` for it (none where it has no entry)."""
        return [
            run
            for policy in self.setup.policies
            for epsilon in self.setup.epsilons
            for run in self.final_runs_of(policy, epsilon, seeds, chosen.get((policy.name, epsilon), {}))
        ]

    def final_runs_of(
        self, policy: PolicySetup, epsilon: float | None, seeds: int, point: dict[str, Any]
    ) -> list[Run]:
        """One policy's runs at one target ε on the test set, ``seeds`` of them, at ``point``."""
        first = int(self.base.get("seed", 0))
        k = self.search_runs(policy)
        runs = []
        for seed in range(first, first + seeds):
            key = f"{policy.name}__eps-{epsilon_text(epsilon) or 'none'}__seed-{seed}"
            raw = self.raw(policy, point, epsilon, seed, validation=False, search_runs=k)
            runs.append(Run(key, policy.name, epsilon, seed, raw, point, search_runs=k))
        return runs


def finished(runs: list[Run], out: Path) -> dict[str, dict[str, Any]]:
    """Summaries of the ``runs`` already finished in ``out`` with the same configuration, by key
    (``--resume``; :func:`fairclip.sims.sweeps.runs.finished_summary`)."""

    summaries = {}
    for run in runs:
        summary = finished_summary(out / "runs" / run.key, validate(run.raw))
        if summary is not None:
            summaries[run.key] = summary
    return summaries


def execute(
    runs: list[Run],
    out: Path,
    *,
    data_dir: Path | None,
    address: str | None = None,
    workers: int = 1,
    resume: bool = False,
    ray: bool = True,
    on_finished: Callable[[Run, dict[str, Any]], None] | None = None,
    on_reused: Callable[[Run, dict[str, Any]], None] | None = None,
    then: Callable[[Run, dict[str, Any]], list[Run]] | None = None,
) -> dict[str, dict[str, Any]]:
    """Run every run as a Ray task of ``workers`` threads (as ``fairclip compare``), or, without
    ``ray``, one after the other in this process (a local executor of ``workers`` threads: the same
    numbers); write each as it finishes; return the summaries by key.

    With ``resume``, a run finished in ``out`` with the same configuration is reused, not run
    again (:func:`finished`), and an unfinished one continues from the progress it kept in its
    folder (:mod:`fairclip.server.checkpoint`); without, those checkpoints are deleted first and
    every run starts from its first round. ``on_finished(run, summary)`` is called for each run
    computed, once it is written, and for each reused run unless ``on_reused`` is given, which
    is called instead. Then ``then(run, summary)``, for every run, returns the runs that can
    start now that it has finished (a setup's final runs, once the grid runs they choose between
    have): they are run, or reused, in the same way, while the rest still runs."""

    summaries: dict[str, dict[str, Any]] = {}
    jobs: list[tuple[Run, dict[str, Any]]] = []

    def add(new: list[Run]) -> None:
        reuse = finished(new, out) if resume else {}
        if not resume:
            discard_checkpoints(out, (run.key for run in new))
        # first the runs to compute, then the reused ones, whose follow-ups queue behind them:
        # grid runs still to compute free more final runs than a final run frees
        jobs.extend((run, run.raw) for run in new if run.key not in reuse)
        for run in new:
            if run.key in reuse:
                done(run, reuse[run.key], reused=True)

    def done(run: Run, summary: dict[str, Any], reused: bool) -> None:
        summaries[run.key] = summary
        announce = (on_reused or on_finished) if reused else on_finished
        if announce is not None:
            announce(run, summary)
        if then is not None:
            add(then(run, summary))

    add(runs)
    results = simulate_jobs(
        jobs,  # add() appends to it while it runs
        data_dir=data_dir,
        ray=ray,
        address=address,
        workers=workers,
        checkpoints=lambda run: run_checkpoint(out, run.key),
    )
    with contextlib.closing(results):  # stopped here, the runs still going stop too
        for run, result in results:
            save_run(out / "runs" / run.key, result)
            done(run, result["summary"], reused=False)
    return summaries


class FinalsAfterGrid:
    """``then`` of :func:`execute` for a setup with a grid: once the last grid run of a policy
    at a target ε has finished, choose its grid point (:func:`choose`, into ``chosen``) and
    return that policy's final runs at that ε, which start while the rest of the grid runs."""

    def __init__(
        self,
        planner: Planner,
        grid: list[Run],
        seeds: int,
        metric: str,
        chosen: dict[tuple[str, float | None], dict[str, Any]],
    ):
        self.planner = planner
        self.seeds = seeds
        self.metric = metric
        self.chosen = chosen
        self.groups: dict[tuple[str, float | None], list[Run]] = {}
        for run in grid:
            self.groups.setdefault((run.policy, run.target_epsilon), []).append(run)
        self.grid_keys = {run.key for run in grid}
        self.summaries: dict[str, dict[str, Any]] = {}

    def __call__(self, run: Run, summary: dict[str, Any]) -> list[Run]:
        if run.key not in self.grid_keys:
            return []  # a final run
        self.summaries[run.key] = summary
        group = (run.policy, run.target_epsilon)
        if any(other.key not in self.summaries for other in self.groups[group]):
            return []
        self.chosen.update(choose(self.groups[group], self.summaries, self.metric))
        policy = next(s for s in self.planner.setup.policies if s.name == run.policy)
        return self.planner.final_runs_of(policy, run.target_epsilon, self.seeds, self.chosen[group])


def overall_metric(summary: dict[str, Any], metric: str = "accuracy") -> float:
    value = summary.get("overall", {}).get(metric, math.nan)
    return float(value) if value is not None else math.nan


def choose(
    grid: list[Run], summaries: dict[str, dict[str, Any]], metric: str = "accuracy"
) -> dict[tuple[str, float | None], dict]:
    """Per (policy, ε): the grid point of the best overall validation ``metric``, its highest or,
    for a loss, its lowest value (:data:`fairclip.sims.reproduce.setups.SELECTION_METRICS`; first
    on ties; a diverged run, NaN, never wins unless all did)."""
    sign = -1.0 if SELECTION_METRICS.get(metric) == "min" else 1.0
    best: dict[tuple[str, float | None], tuple[float, dict[str, Any]]] = {}
    for run in grid:
        score = sign * overall_metric(summaries[run.key], metric)
        score = -math.inf if not math.isfinite(score) else score
        cell = (run.policy, run.target_epsilon)
        if cell not in best or score > best[cell][0]:
            best[cell] = (score, run.grid_point)
    return {cell: point for cell, (_, point) in best.items()}
