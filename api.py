"""fairclip from Python: one simulation in a call, its results as pandas tables.

A first step of the public API (issue 19): :func:`simulate` runs a built-in scenario or a
scenario file with typed overrides, in this process, and returns a :class:`Simulation` --
``rounds`` (one row per round, the columns of ``rounds.csv``), ``cohorts`` (one row per
cohort, the final metrics), the privacy claim and the final model. ``fairclip run`` writes the
same numbers for the same configuration and seed::

    import fairclip
    result = fairclip.simulate("demo", overrides={"policy.name": "adaptive", "training.rounds": 20})
    result.cohorts["accuracy"]       # per cohort
    result.epsilon, result.privacy   # ε, and δ, the accountant, q, T and the noise multipliers

Nothing is written to disk; pass ``on_round`` (for example a logger of
:mod:`fairclip.sims.sweeps.tracking`) to see each round as it finishes. Progress shows as the
command line's bar where standard error is a terminal, as INFO records of the ``"fairclip"``
logger elsewhere, and not at all with ``progress=False``.

Bring your own data, model and policy: a :class:`Scenario` holds a
:class:`fairclip.FederatedDataset` (or a loader of one) and a model factory; a policy is a name,
a :class:`fairclip.policies.Policy` class or an instance, the same for :func:`simulate`
(``policy=``), :func:`compare` (``policies=``) and the Flower wrapper
(:func:`fairclip.policies.resolve_policy`), and shows under one name in every output
(:func:`fairclip.policies.display_name`). :func:`compare` runs policies against the
non-private reference, per target ε and seed, and returns the table of ``fairclip compare``::

    scenario = fairclip.Scenario("mine", dataset=data, model=make_mlp, sample_rate=0.2, rounds=30)
    comparison = fairclip.compare(scenario, policies=["constant", "bounded", MyPolicy], epsilons=[2.0])
    comparison.table          # per run and cohort: accuracy, privacy cost, excessive risk, ε
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import json
import math
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fairclip import progress as progress_module
from fairclip.atomic import json_normalised, write_json
from fairclip.benchmarks import failed_contenders, run_bench
from fairclip.plugins import register as register_plugin
from fairclip.progress import ApiProgress
from fairclip.root_error import one_line
from fairclip.scenarios.config import (
    OldNameNote,
    builtin_scenarios,
    canonical_mapping,
    check_overrides_used,
    load_config,
    parse_override,
    read_toml,
    scenario_source,
    set_value,
    validate,
)
from fairclip.scenarios.data import DATASET_FILES, fetch, resolve_data_dir, verified_path
from fairclip.scenarios.data.federated_dataset import FederatedDataset
from fairclip.scenarios.errors import ConfigError
from fairclip.scenarios.tasks import build_task
from fairclip.server.checkpoint import DEFAULT_EVERY_SECONDS, Checkpointing, share_computed_earlier
from fairclip.server.flower_status import check_app, flwr_command, run_flower_app
from fairclip.server.observers import RoundCallback
from fairclip.server.outputs import RunWriter, check_output_folder
from fairclip.sims.compare import sweep
from fairclip.sims.executors import jobs as jobs_
from fairclip.sims.executors import registry as executors
from fairclip.sims.executors.memory import check_memory
from fairclip.sims.sweeps import folder as sweep_folder
from fairclip.sims.sweeps.tracking import LoggerObserver, log_finished_run, require_packages, round_loggers
from fairclip.strategies import NoiseMultipliers, Policy
from fairclip.strategies.errors import PolicyConfigError
from fairclip.strategies.registry import ResolvedPolicy, policy_name, resolve_policy

__all__ = [
    "MODES",
    "Comparison",
    "LoggerObserver",
    "OldNameNote",
    "Reproduction",
    "RoundCallback",
    "RunWriter",
    "Scenario",
    "Simulation",
    "bench",
    "check_cluster",
    "check_memory",
    "check_output_folder",
    "compare",
    "cpu_count",
    "executor_names",
    "fetch_datasets",
    "load_config",
    "locked",
    "log_finished_run",
    "one_line",
    "parse_epsilons",
    "parse_grid",
    "parse_overrides",
    "policy_name",
    "privacy_claim",
    "reproduce",
    "reproduction_setups",
    "require_packages",
    "round_loggers",
    "run_flower",
    "scenario_name",
    "scenarios",
    "share_computed_earlier",
    "simulate",
    "simulate_config",
    "stored_tune_curve",
    "sweep_mode",
    "tune",
    "tune_curve",
    "tune_internal_folder",
]


def executor_names() -> tuple[str, ...]:
    """The executors a run's clients can train on (``fairclip run --executor``), by name: the
    registry :mod:`fairclip.sims.executors.registry` (reading it imports no executor)."""
    return executors.names()


@dataclass(frozen=True)
class Simulation:
    """What one simulated run produced."""

    rounds: pd.DataFrame
    """One row per finished round, indexed by ``round`` (the columns of ``rounds.csv``)."""
    cohorts: pd.DataFrame
    """One row per cohort, indexed by its name: the final model's metrics."""
    summary: dict[str, Any]
    """Everything ``summary.json`` holds: the resolved configuration, ε, provenance, status."""
    model: np.ndarray
    """The final model (flattened parameters), the one ``summary`` and ``cohorts`` describe."""

    @property
    def epsilon(self) -> float:
        """ε spent at ``privacy["delta"]`` (∞ for the non-private ``none``)."""
        value = self.summary["epsilon"]
        return math.inf if value == "inf" else float(value)

    @property
    def privacy(self) -> dict[str, Any]:
        """The privacy claim: ε with δ, the accountant, q, T and the noise multipliers."""
        return dict(self.summary["privacy"])


@dataclass(frozen=True)
class Scenario:
    """A scenario of the user's own: their data, model and population, in Python.

    ``dataset``: a :class:`fairclip.FederatedDataset`, a loader ``(num_clients, seed, **options)
    -> FederatedDataset``, or a plug-in reference (:mod:`fairclip.plugins`). ``model``: a built-in
    model name, a factory ``(input_shape, num_classes) -> torch.nn.Module``, or a reference.
    ``num_clients`` defaults to the dataset's. ``settings`` holds any other configuration key
    (dotted, typed: ``{"training.client_lr": 0.5, "privacy.target_epsilon": 2.0}``); keys not
    given take their defaults (the Configuration keys page of the docs; policy ``none`` until one
    is chosen).

    Python objects are registered (:func:`fairclip.plugins.register`) under the scenario's name
    when it runs, so comparisons on Ray find them in their worker processes too.
    """

    name: str
    dataset: Any
    model: Any = "logistic"
    sample_rate: float = 1.0
    rounds: int = 10
    num_clients: int | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments of a dataset loader."""
    settings: Mapping[str, Any] = field(default_factory=dict)

    def raw_config(self) -> dict[str, Any]:
        """The scenario as a raw configuration (as a TOML file would give it), registering the
        Python objects it holds."""
        dataset, model = self.dataset, self.model
        if not isinstance(dataset, str):
            register_plugin("dataset", self.name, dataset, replace=True)
            dataset = self.name
        if not isinstance(model, str):
            register_plugin("model", self.name, model, replace=True)
            model = self.name
        clients = self.num_clients
        if clients is None:
            if not isinstance(self.dataset, FederatedDataset):
                raise ConfigError(f"scenario {self.name!r}: give num_clients (the dataset is a loader)")
            clients = self.dataset.num_clients
        raw: dict[str, Any] = {
            "scenario": {
                "name": self.name,
                "task": "federated-dataset",
                "dataset": dataset,
                "model": model,
                "options": dict(self.options),
            },
            "federation": {"num_clients": clients, "sample_rate": self.sample_rate},
            "training": {"rounds": self.rounds},
            "policy": {"name": "none"},
            "privacy": {},
        }
        for key, value in canonical_mapping(self.settings, f"scenario {self.name!r}: settings").items():
            raw = set_value(raw, key, value)
        return raw


def simulate(
    scenario: str | Scenario | None = None,
    *,
    policy: Any = None,
    config_file: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    data_dir: str | Path | None = None,
    workers: int = 1,
    on_round: Callable[[dict[str, Any]], None] | None = None,
    observers: Sequence[Any] = (),
    checkpoint: str | Path | None = None,
    checkpoint_every: float = DEFAULT_EVERY_SECONDS,
    progress: bool | None = None,
) -> Simulation:
    """Run one simulation in this process and return its results.

    ``scenario`` names a built-in scenario (``fairclip scenarios``) or is a :class:`Scenario`
    of your own, and ``config_file`` a scenario TOML (one of the two); ``policy`` is the run's
    clipping policy -- a name (``"bounded"``, a plug-in's registered name, ``"package.module:Class"``),
    a :class:`fairclip.policies.Policy` subclass or an instance, which carries its parameters
    (:func:`fairclip.policies.resolve_policy`; the same as ``policy.name`` in ``overrides``,
    which may also hold a class or an instance; give it one way); ``overrides`` sets
    dotted configuration keys to typed values (``{"policy.name": "bounded",
    "privacy.target_epsilon": 2.0}``), validated like ``--set``; ``data_dir`` holds the real
    datasets (default: ``FAIRCLIP_DATA``); ``workers`` threads train the sampled clients (the
    same result for any number); ``on_round(row)`` and ``observers`` see every round
    (:func:`simulate_config`). An invalid configuration raises
    :class:`fairclip.scenarios.errors.ConfigError` naming the problem.

    ``checkpoint``: a file where the run keeps its progress every ``checkpoint_every`` seconds,
    when interrupted and at the end; called again with the same file, the run continues after
    its last saved round, with the same result as a run never stopped
    (:mod:`fairclip.server.checkpoint`).

    ``progress``: ``None`` (default) shows a bar of the rounds where standard error is a terminal
    (or in Jupyter) and logs progress at INFO to the ``"fairclip"`` logger elsewhere; ``True``
    always shows it (plain lines on standard error off a terminal); ``False`` shows nothing
    (:class:`fairclip.progress.ApiProgress`).
    """
    config = validate(_raw_config(scenario, config_file, overrides, policy))
    shown = ApiProgress(
        progress,
        f"[bold]{policy_name(config.policy.name)}[/bold] on {config.scenario.name}",
        unit="rounds",
        every=progress_module.API_ROUND_SECONDS,
    )
    shown.start(config.training.rounds, "rounds")
    try:
        result = simulate_config(
            config,
            data_dir=data_dir,
            workers=workers,
            on_round=on_round,
            observers=[*observers, RoundCallback(lambda _row: shown.advance())],
            checkpoint=checkpoint,
            checkpoint_every=checkpoint_every,
        )
    finally:
        shown.close()
    rounds = pd.DataFrame(result.rows)
    if not rounds.empty:
        rounds = rounds.set_index("round")
    cohorts = pd.DataFrame.from_dict(result.summary["cohorts"], orient="index")
    cohorts.index.name = "cohort"
    return Simulation(rounds=rounds, cohorts=cohorts, summary=result.summary, model=np.asarray(result.model))


def simulate_config(
    config: Any,
    *,
    data_dir: str | Path | None = None,
    executor: str = "local",
    workers: int = 1,
    actors: int | None = None,
    address: str | None = None,
    on_round: Callable[[dict[str, Any]], None] | None = None,
    observers: Sequence[Any] = (),
    checkpoint: str | Path | None = None,
    checkpoint_every: float = DEFAULT_EVERY_SECONDS,
    backend: str | None = None,
) -> Any:
    """Run the validated configuration ``config`` (a :class:`fairclip.scenarios.config.RunConfig`) and
    return its :class:`fairclip.server.observers.RunResult`; what ``fairclip run`` does.

    ``executor`` (where the clients train; ``backend`` is its old name): ``local`` (this process,
    ``workers`` threads) or ``ray`` (``actors`` Ray actors,
    default one per core, on the cluster at ``address`` or a local one); the same seed gives the
    same run on both. ``observers`` (:class:`fairclip.server.observers.RunObserver`: a file writer, a
    progress bar, a tracker) see every round and the end, also after an interruption.
    ``checkpoint`` and ``checkpoint_every``: as :func:`simulate`'s; the observers see the
    rounds computed in this call.
    """
    # torch and Opacus: kept out of the command line's start
    from fairclip.sims.executors.loop import simulate as run_rounds

    executor = _renamed("executor", executor, "backend", backend, default="local")
    _check_workers(workers)
    try:
        executors.check(executor)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    folder = Path(data_dir) if data_dir is not None else None
    saving = Checkpointing(Path(checkpoint), checkpoint_every) if checkpoint is not None else None
    task = build_task(config, folder)
    with executors.session(executor)(
        config, task, folder, workers=workers, actors=actors, address=address
    ) as factory:
        return run_rounds(config, task, factory, on_round=on_round, observers=observers, checkpoint=saving)


def _renamed(new: str, new_value: Any, old: str, old_value: Any, default: Any = None) -> Any:
    """The value of keyword ``new``, or of ``old`` (its old name, with a :class:`DeprecationWarning`);
    a :class:`ConfigError` where both are given."""
    if old_value is None:
        return new_value
    if new_value is not default:
        raise ConfigError(f"give {new}= or {old}= (its old name), not both")
    warnings.warn(f"{old}= is the old name of {new}=", DeprecationWarning, stacklevel=3)
    return old_value


def _check_workers(workers: int) -> None:
    if workers < 1:
        raise ConfigError(f"workers must be >= 1 (got {workers})")


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ConfigError(f"mode must be one of {', '.join(MODES)} (got {mode!r})")


def _checked_targets(epsilons: Sequence[float]) -> list[float]:
    """Target ε values as floats: each finite and > 0, none twice."""
    targets = [float(e) for e in epsilons]
    for target in targets:
        if not (math.isfinite(target) and target > 0):
            raise ConfigError(f"every target ε must be a finite number > 0 (got {target})")
    _refuse_repeats(targets, "epsilons")
    return targets


def _refuse_repeats(values: Sequence[Any], what: str) -> None:
    """One :class:`ConfigError` line where ``values`` names something twice (a run planned twice)."""
    seen: set[Any] = set()
    for value in values:
        if value in seen:
            shown = f"{value:g}" if isinstance(value, float) else value
            raise ConfigError(f"{what} names {shown} twice")
        seen.add(value)


def _raw_config(
    scenario: str | Scenario | None,
    config_file: str | Path | None,
    overrides: Mapping[str, Any] | None,
    policy: Any = None,
) -> dict[str, Any]:
    """The raw configuration of a built-in scenario, a :class:`Scenario` or a TOML file, with
    ``overrides`` set (typed dotted keys) and the run's ``policy`` (:func:`_with_policy`)."""
    if isinstance(scenario, Scenario):
        if config_file is not None:
            raise ConfigError("give a Scenario or a config_file, not both")
        raw = scenario.raw_config()
    else:
        raw = scenario_source(scenario, Path(config_file) if config_file is not None else None)
    overrides = canonical_mapping(overrides)
    for key, value in overrides.items():
        raw = set_value(raw, key, value)
    check_overrides_used(raw, list(overrides))
    keys = _given_keys(scenario, overrides)
    named = raw.get("policy", {}).get("name") if isinstance(raw.get("policy"), dict) else None
    if policy is not None:
        if "policy.name" in keys:
            raise ConfigError("the policy is given twice (policy= and policy.name): give it once")
        raw = _with_policy(raw, policy, keys)
    elif named is not None and not isinstance(named, str):  # a class or an instance as policy.name
        raw = _with_policy(raw, named, keys)
    return raw


def _given_keys(scenario: str | Scenario | None, overrides: Mapping[str, Any] | None) -> list[str]:
    """The dotted keys the caller sets: ``overrides`` and a :class:`Scenario`'s ``settings``
    (old ``strategy.*`` names read as ``policy.*``)."""
    own = list(canonical_mapping(scenario.settings)) if isinstance(scenario, Scenario) else []
    return [*own, *(overrides or {})]


def _with_policy(raw: dict[str, Any], policy: Any, given: Sequence[str]) -> dict[str, Any]:
    """``raw`` with the run's policy set (:func:`fairclip.policies.resolve_policy`: a name, a class
    or an instance): ``policy.name`` names it, and an instance's parameters are its
    (:func:`_with_instance_params`)."""
    resolved = resolve_policy(policy)
    raw = set_value(raw, "policy.name", resolved.reference)
    return _with_instance_params(raw, resolved, given)


def _instance_settings(resolved: ResolvedPolicy, given: Sequence[str]) -> dict[str, Any]:
    """An instance's parameters as settings of its runs (``policy.<param>``; none for a name or
    a class); a key in ``given`` (the overrides, a grid) that sets one of them too is one
    :class:`ConfigError` line, as in :func:`_with_instance_params`."""
    if resolved.params is None:
        return {}
    for key in given:
        parts = key.split(".")
        own = len(parts) == 2 or (len(parts) == 3 and parts[1] == resolved.reference)
        if parts[0] == "policy" and parts[-1] in resolved.params and own:
            raise ConfigError(
                f"{key}: policy {resolved.name!r} is given as an instance, which carries its own "
                "parameters, and the settings or the grid set one too: give them one way (the "
                "instance, or its name or class with the settings)"
            )
    # keys directly under [policy]: they replace the scenario's own and win over its table
    # [policy.<name>] (scenarios.config.policy_spec), so the instance's values are the ones that run
    return {f"policy.{key}": value for key, value in resolved.params.items()}


def _with_instance_params(
    raw: dict[str, Any], resolved: ResolvedPolicy, given: Sequence[str]
) -> dict[str, Any]:
    """``raw`` with an instance's parameters as its policy's (unchanged for a name or a class):
    they replace what the scenario itself sets for that policy (its table ``[policy.<name>]``
    and the keys directly under ``[policy]`` that the policy takes), and the keys ``given`` by
    the caller (``overrides``, a :class:`Scenario`'s ``settings``) may not set any: one
    :class:`ConfigError` line, not a silent pick of one of the two."""
    if resolved.params is None:
        return raw
    for key in given:
        parts = key.split(".")
        if parts[0] == "policy" and (
            (len(parts) == 2 and parts[1] != "name") or (len(parts) > 2 and parts[1] == resolved.reference)
        ):
            raise ConfigError(
                f"{key}: policy {resolved.name!r} is given as an instance, which carries its own "
                "parameters, and the settings set them too: give them one way (the instance, or its "
                "name or class with the settings)"
            )
    raw = copy.deepcopy(raw)
    section = raw.setdefault("policy", {})
    for key in resolved.params:  # the scenario's own values for the policy: the instance's replace them
        if not isinstance(section.get(key), dict):
            section.pop(key, None)
    section[resolved.reference] = dict(resolved.params)
    return raw


@dataclass(frozen=True)
class Comparison:
    """What :func:`compare` produced: the rows of ``summary.csv`` and every run's rounds."""

    table: pd.DataFrame
    """One row per run and cohort: policy, target ε, ε spent, seed, cohort, accuracy, loss,
    privacy cost and excessive risk against the `none` reference of the same seed, and more."""
    rounds: dict[str, pd.DataFrame]
    """Each run's rounds (the columns of ``rounds.csv``), by run key ``<policy>__eps-<ε>__seed-<s>``."""
    summaries: dict[str, dict[str, Any]]
    """Each run's ``summary.json`` content, by run key."""
    folder: Path | None = None
    """Where the sweep was written (``out``), or ``None``."""
    plots: tuple[str, ...] = ()
    """The plots drawn into ``folder``."""


MODES = ("new", "resume", "extend", "replace")


def compare(
    scenario: str | Scenario | None = None,
    *,
    policies: Sequence[str | type] | None = None,
    epsilons: Sequence[float] | None = None,
    seeds: int | None = None,
    config_file: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    data_dir: str | Path | None = None,
    out: str | Path | None = None,
    mode: str = "new",
    ray: bool = False,
    address: str | None = None,
    workers: int = 1,
    on_start: Callable[[int, int], None] | None = None,
    on_run: Callable[[str, dict[str, Any]], None] | None = None,
    progress: bool | None = None,
    strategies: Sequence[str | type] | None = None,
) -> Comparison:
    """Compare clipping policies on a scenario; what ``fairclip compare`` does.

    ``policies`` (``strategies``, its old name; default constant, adaptive, bounded): names of
    built-in policies, plug-in
    references, or :class:`Policy` subclasses (registered under their ``name``); the
    non-private ``none`` reference always runs once per seed. ``epsilons``: target ε values
    (default: the scenario's own privacy settings). ``seeds`` (default 1): the scenario's seed,
    +1, ... Every run is validated, and the runs held at once checked against the memory, before
    any work.

    Runs simulate one after the other in this process, or, with ``ray`` (or the ``address`` of a
    Ray cluster), as parallel Ray tasks of ``workers`` CPUs. ``out``: the sweep's folder, which
    receives each run as it finishes (``runs/<key>/``), then ``summary.csv``, ``report.md`` and
    the plots, and stores the sweep's specification: ``mode`` says what to do with a folder that
    holds one -- ``new`` (refuse a different sweep), ``resume`` (continue it; ``scenario`` and the
    options may be left out), ``extend`` (add policies, ε or seeds; an option left out keeps
    the stored value) or ``replace``.
    ``on_start(runs, to_run)`` is called when the runs are known, ``on_run(key, {"rows": ...,
    "summary": ...})`` per finished run. ``progress``: the runs done, as :func:`simulate`'s rounds
    (``None``: a bar on a terminal, else log records of the ``"fairclip"`` logger; ``False``: off).

    Every policy of ``policies`` is one of :func:`fairclip.policies.resolve_policy`'s: a name, a
    class (registered under its display name, so Ray workers find it) or an instance, whose
    parameters replace the scenario's own for its policy (setting them in ``overrides`` too is an
    error). Each shows under one name, :func:`fairclip.policies.display_name`, in the run keys,
    ``table``, ``summary.json``, ``report.md`` and the plots.
    """
    _check_workers(workers)
    _check_mode(mode)
    if out is None and mode != "new":
        raise ConfigError(f"mode {mode} continues a sweep stored in a folder: give out")
    policies = _renamed("policies", policies, "strategies", strategies)
    names = None
    resolved: list[ResolvedPolicy] = []
    if policies is not None:
        if isinstance(policies, str) or not isinstance(policies, Sequence):
            raise ConfigError(f"policies must be a list of policies (got {policies!r})")
        resolved = [resolve_policy(policy) for policy in policies]
        names = [policy.reference for policy in resolved]
        if not names:
            raise ConfigError("policies names no policy (none runs anyway, as the reference): give one")
        _refuse_repeats([policy.name for policy in resolved], "policies")
    targets: list[float | None] | None = None
    if epsilons is not None:
        targets = _checked_targets(epsilons)
        if not targets:
            raise ConfigError("epsilons names no target ε: give one, or leave it out for the scenario's")
    if out is not None:
        check_output_folder(Path(out))
    if overrides is not None:
        overrides = canonical_mapping(overrides)
    if "policy.name" in (overrides or {}):
        raise ConfigError("--set policy.name: compare sets it for each run (--policies)")
    for key in ("privacy.target_epsilon", "privacy.noise_multiplier"):  # a target calibrates σ
        if targets is not None and key in (overrides or {}):
            raise ConfigError(f"--set {key}: --epsilons sets it for each run")
    given_nothing = scenario is None and config_file is None and not overrides
    raw = None if mode == "resume" and given_nothing else _raw_config(scenario, config_file, overrides)
    for policy in resolved:  # an instance's parameters, in its policy's table
        if policy.params is not None:
            if raw is None:
                raise ConfigError(
                    f"policy {policy.name!r} is an instance: its parameters go into the scenario's "
                    "settings, so give the scenario too"
                )
            raw = _with_instance_params(raw, policy, _given_keys(scenario, overrides))
    given = sweep.compare_spec(raw, names, targets, seeds, explicit_only=mode == "resume")
    explicit = sweep.compare_spec(raw, names, targets, seeds, explicit_only=True)
    parallel = (os.cpu_count() or 1) // workers if ray or address else 1
    if mode != "resume":  # every run validated, and the memory checked, before the folder is touched
        sweep.check_sweep_memory(*sweep.plan_from_spec(given), parallel, address)
    folder_data = Path(data_dir) if data_dir is not None else None
    shown = ApiProgress(progress, "[bold]compare[/bold] {task.description}", unit="runs")

    def started(total: int, to_run: int) -> None:
        shown.start(to_run, Path(out).name if out is not None else "runs")
        if on_start is not None:
            on_start(total, to_run)

    def on_result(run: Any, result: dict[str, Any]) -> None:
        shown.advance(note=run.key, reused=share_computed_earlier(result["summary"]))
        if on_run is not None:
            on_run(run.key, result)

    try:
        if out is None:
            raw, runs = sweep.plan_from_spec(given)
            started(len(runs), len(runs))
            results = sweep.execute(
                raw, runs, None, data_dir=folder_data, ray=ray or address is not None, address=address,
                workers=workers, on_result=on_result,
            )  # fmt: skip
            summaries = {run.key: results[run.key]["summary"] for run in runs}
            rounds = {run.key: pd.DataFrame(results[run.key]["rows"]) for run in runs}
            table, rounds, _ = sweep.results_table(runs, summaries, rounds)
            return Comparison(table=table, rounds=rounds, summaries=summaries)
        folder = Path(out)
        runs, table, rounds, drawn = sweep.run_sweep(
            folder, given, sweep_folder.Mode(mode), data_dir=folder_data, ray=ray or address is not None,
            address=address, workers=workers, parallel=parallel, on_start=started, on_result=on_result,
            explicit=explicit,
        )  # fmt: skip
    finally:
        shown.close()
    summaries = {
        run.key: json.loads((folder / "runs" / run.key / "summary.json").read_text()) for run in runs
    }
    return Comparison(table=table, rounds=rounds, summaries=summaries, folder=folder, plots=tuple(drawn))


def tune(
    scenario: str | Scenario | None = None,
    *,
    grid: Mapping[str, Sequence[Any]] | None = None,
    metric: str = "macro_accuracy",
    distribution: str = "tnb",
    eta: float = 1.0,
    gamma: float = 0.2,
    mu: float = 5.0,
    seed: int = 0,
    search_index: int = 0,
    grid_baseline: bool = True,
    config_file: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    data_dir: str | Path | None = None,
    out: str | Path | None = None,
    resume: bool = False,
    ray: bool = False,
    address: str | None = None,
    workers: int = 1,
    on_start: Callable[[int, int], None] | None = None,
    on_run: Callable[[str, dict[str, Any]], None] | None = None,
    progress: bool | None = None,
) -> Any:
    """Tune hyperparameters with a DP random search, and (``grid_baseline``) also by the
    non-private selection over the whole grid; what ``fairclip tune`` does.

    ``grid`` maps dotted configuration keys to the values to search (``{"training.client_lr":
    [0.1, 0.5], "policy.bounded.lower_bound": [0.1, 0.5]}``); the search draws its number of
    trials from a truncated negative binomial (``eta``, ``gamma``) or a Poisson (``mu``)
    distribution (``distribution``) with the tuning ``seed`` (and ``search_index``, which of several
    searches on that seed this is), and selects by ``metric`` (one of
    :data:`fairclip.sims.tune.search.METRICS`). Returns a :class:`fairclip.sims.tune.search.Tuning`: every
    trial, the released best, and ε of the whole search (Papernot & Steinke 2022, see
    :mod:`fairclip.strategies.tuning`). That ε covers only the release
    (:meth:`~fairclip.sims.tune.search.Tuning.release`: the chosen configuration and its metrics); the
    rest of the returned object -- every trial, their number, the non-private selection -- is
    not DP-protected. ``out`` receives the specification and the release at its top
    (``tuning.json``, ``report.md``) and the rest in ``not-dp-protected/`` (each run as it
    finishes); ``resume`` continues such a folder. Runs go one after the other in this process,
    or as parallel Ray tasks with ``ray`` (or a cluster's ``address``). With ``resume``, ``out`` and
    neither a scenario, a config file nor a ``grid``, the search stored in ``out`` continues as it
    was asked. ``progress``: the runs done, as :func:`compare`'s (``False``: off).
    """
    # torch and Opacus (the search's accountant): kept out of the command line's start
    from fairclip.sims.tune import search
    from fairclip.strategies.tuning import TrialCount

    _check_workers(workers)
    if grid is None:
        if not (resume and out is not None and scenario is None and config_file is None and not overrides):
            raise ConfigError("give the grid to search (or resume a stored search: resume=True and out)")
        spec = search.stored_search(Path(out))
    else:
        overrides, grid = canonical_mapping(overrides), canonical_mapping(grid, "--grid")
        both = sorted(set(overrides) & set(grid))
        if both:  # each grid point sets its key, so the override would be silently replaced
            raise ConfigError(f"{both[0]} is both set (--set) and searched (--grid): give it one way")
        try:
            trials = TrialCount(distribution, float(eta), float(gamma), float(mu))
        except PolicyConfigError as error:
            raise ConfigError(str(error)) from None
        spec = search.TuneSpec(
            raw=_raw_config(scenario, config_file, overrides),
            grid={key: list(values) for key, values in grid.items()},
            metric=metric,
            trials=trials,
            seed=int(seed),
            grid_baseline=grid_baseline,
            search_index=int(search_index),
        )
    folder_data = Path(data_dir) if data_dir is not None else None

    def run(jobs: list[tuple[Any, dict[str, Any]]]) -> Any:
        return jobs_.simulate_jobs(
            jobs, data_dir=folder_data, ray=ray or address is not None, address=address, workers=workers
        )

    shown = ApiProgress(progress, "[bold]tune[/bold] {task.description}", unit="runs")

    def started(total: int, to_run: int) -> None:
        shown.start(to_run, Path(out).name if out is not None else "runs")
        if on_start is not None:
            on_start(total, to_run)

    def finished(key: str, result: dict[str, Any]) -> None:
        shown.advance(note=key)
        if on_run is not None:
            on_run(key, result)

    try:
        return search.run_search(
            spec,
            out=Path(out) if out is not None else None,
            resume=resume,
            data_dir=folder_data,
            run=run,
            on_start=started,
            on_run=finished,
        )
    finally:
        shown.close()


CURVE_OPTIONS = ("metric", "distribution", "eta", "gamma", "mu", "seed", "grid_baseline")
"""The options of :func:`tune_curve` a curve stores, to be continued with the same ones."""


def tune_curve(
    scenario: str | Scenario | None = None,
    *,
    policies: Sequence[str | type | Policy] | None = None,
    epsilons: Sequence[float],
    grid: Mapping[str, Sequence[Any]],
    out: str | Path,
    resume: bool = False,
    overrides: Mapping[str, Any] | None = None,
    on_search: Callable[[str], None] | None = None,
    strategies: Sequence[str | type | Policy] | None = None,
    **options: Any,
) -> pd.DataFrame:
    """One :func:`tune` search per policy and target ε of a run (seed 000's Figure 4: best
    result against the ε of the whole search); what ``fairclip tune --policies ... --epsilons
    ...`` does. A grid key of another policy's table (``policy.<other>.*``) is left out of a
    policy's search. Each search goes to ``out/<policy>__eps-<ε>/``; ``curve.csv`` (one row
    per finished search, written as each finishes), ``tuning_curve.png`` and ``report.md`` to
    ``out``, of each search's release only (:func:`fairclip.sims.tune.curve.curve_public_columns`);
    the same with each search's number of trials and non-private selection to
    ``out/not-dp-protected/``. ``options`` are :func:`tune`'s (metric, the trial law, seed,
    data_dir, ray, ...); the i-th search (policies outer, ε inner) draws its trials as
    ``search_index`` i. Returns the full table (``not-dp-protected/curve.csv``: its ``trials``
    and ``grid_*`` columns are not DP-protected).

    Every policy of ``policies`` is one of :func:`fairclip.policies.resolve_policy`'s, as in
    :func:`compare`: a name, a class or an instance, whose parameters are fixed in every run of
    its searches (a grid or ``overrides`` key that sets one of them too is an error).
    """
    # torch and Opacus (the searches' accountant): kept out of the command line's start
    from fairclip.sims.tune import curve as curve_
    from fairclip.sims.tune import search
    from fairclip.strategies.tuning import TrialCount

    given = _renamed("policies", policies, "strategies", strategies)
    if given is not None and (isinstance(given, str) or not isinstance(given, Sequence)):
        raise ConfigError(f"policies must be a list of policies (got {given!r})")
    if not given or not epsilons:
        raise ConfigError("a tuning curve needs at least one policy and one target ε")
    resolved = [resolve_policy(policy) for policy in given]  # a name, a class or an instance
    _refuse_repeats([policy.name for policy in resolved], "policies")
    policies = [policy.reference for policy in resolved]
    targets = _checked_targets(epsilons)
    overrides, grid = canonical_mapping(overrides), canonical_mapping(grid, "--grid")
    for key in ("policy.name", "privacy.target_epsilon", "privacy.noise_multiplier"):
        if key in overrides:
            raise ConfigError(f"--set {key}: the curve sets it for each search (--policies, --epsilons)")
    fixed = {policy.reference: _instance_settings(policy, [*overrides, *grid]) for policy in resolved}
    folder = Path(out)
    sweep_folder.refuse_another_commands_folder(folder, curve_.CURVE_FILE)
    metric = options.get("metric", "macro_accuracy")
    try:
        law = TrialCount(options.get("distribution", "tnb"), float(options.get("eta", 1.0)),
                         float(options.get("gamma", 0.2)), float(options.get("mu", 5.0)))  # fmt: skip
    except PolicyConfigError as error:
        raise ConfigError(str(error)) from None

    def settings(policy: str, target: float) -> dict[str, Any]:
        return {**overrides, **fixed[policy], "policy.name": policy, "privacy.target_epsilon": target}

    for policy in policies:  # every search's grid and metric checked before any work
        for target in targets:
            raw = _raw_config(scenario, options.get("config_file"), settings(policy, target))
            search.check_spec(search.TuneSpec(raw, curve_.policy_grid(grid, policy), metric, law, 0))
    with sweep_folder.locked(folder):  # one process per curve folder
        if isinstance(scenario, str | None):  # what --resume --out alone continues with
            stored = {
                "scenario": scenario,
                "config_file": None if options.get("config_file") is None else str(options["config_file"]),
                "policies": list(policies),
                **({"instances": {k: v for k, v in fixed.items() if v}} if any(fixed.values()) else {}),
                "epsilons": targets,
                "grid": {key: list(values) for key, values in grid.items()},
                "overrides": dict(overrides or {}),
                "options": {key: options[key] for key in CURVE_OPTIONS if key in options},
            }
            path = folder / curve_.CURVE_SPEC_FILE
            if not path.is_file():
                write_json(path, stored)
            elif curve_.stored_curve(folder) != json_normalised(stored):
                raise ConfigError(f"{folder} holds another tuning curve; use a new --out folder")
        if resume:
            curve_.move_old_curve(folder, metric)
        rows = []
        for index, (policy, target) in enumerate(itertools.product(policies, targets)):
            key = curve_.search_key(policy, target)
            if on_search is not None:
                on_search(key)
            sub = folder / key
            tuning = tune(
                scenario,
                grid=curve_.policy_grid(grid, policy),
                overrides=settings(policy, target),
                out=sub,
                resume=resume and (sub / search.SPEC_FILE).exists(),
                search_index=index,
                **options,
            )
            rows.append(curve_.curve_row(policy, target, tuning))
            curve_.write_curve_rows(folder, rows, metric)
        table = pd.DataFrame(rows)
        curve_.write_curve_report(folder, table, metric, law)
    return table


@dataclass(frozen=True)
class Reproduction:
    """What :func:`reproduce` produced: the rows of ``reproduction.csv`` and where they lie."""

    name: str
    """The setup reproduced."""
    table: pd.DataFrame
    """One row per policy, ε and metric: the paper's value, fairclip's mean and standard error
    over the seeds, both accountants' ε, and whether the mean lies outside the paper's error."""
    wall_seconds: float
    """Wall time of this call (runs reused from the folder cost nothing)."""
    folder: Path
    """The reproduction's folder: ``reproduction.md``, ``reproduction.csv``, ``paired_tests.csv``,
    ``chosen.json``, ``runs.json`` (the keys of its runs), the stored specification and
    ``runs/<key>/`` of every run."""


def reproduce(
    name: str | None = None,
    *,
    seeds: int | None = None,
    out: str | Path | None = None,
    mode: str = "new",
    policies: Sequence[str] | None = None,
    full_grid: bool | None = None,
    grid_limit: int | None = None,
    max_rounds: int | None = None,
    max_batch: int | None = None,
    overrides: Sequence[str] | None = None,
    data_dir: str | Path | None = None,
    ray: bool = False,
    address: str | None = None,
    workers: int = 1,
    on_plan: Callable[[int], None] | None = None,
    on_run: Callable[[str], None] | None = None,
    on_reused: Callable[[str], None] | None = None,
    on_continued: Callable[[str, float], None] | None = None,
    progress: bool | None = None,
    strategies: Sequence[str] | None = None,
) -> Reproduction:
    """Reproduce a seed paper's experiment (a built-in setup, see ``fairclip reproduce --list``);
    what ``fairclip reproduce`` does.

    ``seeds`` (default 2): the setup's seed, +1, ...; ``policies`` (``strategies``, its old name):
    a subset of the setup's policies, by their labels;
    ``full_grid``: the paper's hyperparameter grid instead of the reduced one; ``overrides``:
    ``KEY=VALUE`` settings applied to every run (``training.device=cuda``, say); ``grid_limit``,
    ``max_rounds`` and ``max_batch`` shrink the runs for smoke tests. Every run is written to
    ``out/runs/<key>/`` as it finishes (default folder ``runs/reproduce-<name>``), then the
    tables; ``mode`` says what to do with a folder that already holds a reproduction -- ``new``
    (refuse another one), ``resume`` (continue it, its finished runs kept), ``extend`` (more
    seeds or policies; an option left out keeps the stored value) or ``replace``; to resume or
    extend, ``name`` may be left out.

    Runs go one after the other in this process (a local executor of ``workers`` threads), or,
    with ``ray`` (or the ``address`` of a Ray cluster), as parallel Ray tasks of ``workers`` CPUs:
    the same numbers either way. A setup with a grid runs a policy's final runs at an ε as
    soon as its own grid runs there have finished, while the rest of the grid runs.
    ``on_plan(runs)`` is called when the number of runs is known, ``on_run(key)`` per finished
    (or reused) run, in the order they finish; ``on_reused(key)``, where given, is called
    instead of ``on_run`` for a run found finished in the folder (``resume``, ``extend``);
    ``on_continued(key, share)``, before ``on_run``, for a run this call finished from the
    checkpoint of an earlier one, with the share of its rounds computed before (0 < share <= 1:
    a progress display counts it as done earlier, not towards its pace). ``progress``: the runs
    done, as :func:`compare`'s (``None``: a bar on a terminal, else log records of the
    ``"fairclip"`` logger; ``False``: off).
    """
    # torch and Opacus (planning calibrates noise), scipy (the setups' statistics): kept out of
    # the command line's start
    from fairclip.sims.reproduce import planning, setups
    from fairclip.sims.reproduce import reproduction as repro
    from fairclip.sims.reproduce import tables as tables_

    policies = _renamed("policies", policies, "strategies", strategies)  # the setup's labels
    _check_workers(workers)
    _check_mode(mode)
    folder = Path(out) if out is not None else None
    if folder is not None:  # a tune search or curve there: named first, not a missing NAME or data
        sweep_folder.refuse_another_commands_folder(folder, sweep_folder.SPEC_FILE)
    if name is None and mode in ("resume", "extend") and folder is not None:  # the folder names its setup
        stored = sweep_folder.stored_spec(folder)
        if stored is not None and stored.get("command") == "reproduce":
            name = stored.get("name")
    if name is None:
        raise ConfigError("give a reproduction NAME (see `fairclip reproduce --list`)")
    setup = setups.load_setup(name)  # an unknown name fails before the data are read
    chosen = setups.select_policies(setup, policies)  # and so do unknown policies
    if overrides:  # and a --set key the runs would not take, before the folder is written
        planning.checked_overrides(chosen, list(overrides))

    def spec_of(explicit_only: bool) -> dict[str, Any]:
        return repro.reproduce_spec(
            name,
            seeds,
            full_grid,
            grid_limit,
            max_rounds,
            list(overrides) if overrides else None,
            policies=None if policies is None else list(policies),
            explicit_only=explicit_only,
            max_batch=max_batch,
        )

    given = spec_of(explicit_only=mode == "resume")
    explicit = spec_of(explicit_only=True)  # what --extend puts over the stored options
    resolved_data = resolve_data_dir(data_dir)
    if overrides:  # a --set value the runs would refuse, before the folder is written
        planner = planning.Planner(chosen, resolved_data, list(overrides), max_rounds, max_batch=max_batch)
        planner.check_first_runs(bool(full_grid), grid_limit)
    folder = folder or Path("runs") / f"reproduce-{name}"
    check_output_folder(folder)

    shown = ApiProgress(progress, "[bold]reproduce[/bold] {task.description}", unit="runs")

    def planned(total: int) -> None:
        shown.total(total)
        if on_plan is not None:
            on_plan(total)

    def finished(run: setups.Run, summary: dict[str, Any]) -> None:
        share = share_computed_earlier(summary)
        shown.advance(note=run.key, reused=share)
        if on_continued is not None and share > 0:
            on_continued(run.key, share)
        if on_run is not None:
            on_run(run.key)

    def reused(run: setups.Run, _summary: dict[str, Any]) -> None:
        shown.advance(note=run.key, reused=1)
        announce = on_reused or on_run
        if announce is not None:
            announce(run.key)

    shown.start(None, name)
    with contextlib.closing(shown), sweep_folder.locked(folder):
        spec = sweep_folder.settle(
            folder,
            given,
            sweep_folder.Mode(mode),
            merge=repro.merge_specs,
            results=("runs", "reproduction.csv", "reproduction.md", "chosen.json", repro.RUN_KEYS_FILE),
            explicit=explicit,
        )
        rows, wall = repro.reproduce(
            spec["name"],
            spec["seeds"],
            folder,
            policies=spec.get("policies"),
            data_dir=resolved_data,
            full_grid=spec["full_grid"],
            grid_limit=spec["grid_limit"],
            max_rounds=spec["max_rounds"],
            max_batch=spec.get("max_batch"),
            overrides=spec["overrides"],
            address=address,
            workers=workers,
            resume=mode in ("resume", "extend"),
            on_finished=finished,
            on_reused=reused,
            on_plan=planned,
            ray=ray or address is not None,
        )
    table = pd.DataFrame(rows, columns=tables_.COLUMNS)
    return Reproduction(name=spec["name"], table=table, wall_seconds=wall, folder=folder)


# The command line's building blocks: everything ``fairclip`` (:mod:`fairclip.cli`) needs beyond
# the functions above, so that it imports nothing but this API.

parse_epsilons = sweep.parse_epsilons
"""``"1,2.5,8"`` -> [1.0, 2.5, 8.0]; ``None`` -> [None] (the scenario's own privacy settings)."""
locked = sweep_folder.locked
"""A context manager that holds ``out``'s lock: one process writes a run's or a sweep's folder."""

# Re-exported as they are (see __all__): observers of a run (RoundCallback, RunWriter,
# LoggerObserver with round_loggers and log_finished_run, require_packages), the checks made
# before any work (check_output_folder, check_memory), a configuration resolved from a scenario
# and --set values (load_config), the share of a run an earlier process computed
# (share_computed_earlier) and an error as one line (one_line).


def scenarios() -> dict[str, str]:
    """The built-in scenarios, name -> description (``fairclip scenarios``)."""
    return {
        name: read_toml(path).get("scenario", {}).get("description", "")
        for name, path in builtin_scenarios().items()
    }


def reproduction_setups() -> dict[str, str]:
    """The built-in reproduction setups, name -> title (``fairclip reproduce --list``)."""
    from fairclip.sims.reproduce import setups  # scipy: kept out of the command line's start

    return setups.setup_titles()


def parse_overrides(entries: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` settings (``--set``) as typed dotted keys, in order."""
    return dict((".".join(path), value) for path, value in map(parse_override, entries))


def parse_grid(entries: Sequence[str]) -> dict[str, list[Any]]:
    """``KEY=V1,V2,...`` entries (``tune --grid``) as typed values per dotted key."""
    searched: dict[str, list[Any]] = {}
    for entry in entries:
        key, separator, values = entry.partition("=")
        if not separator or not values.strip():
            raise ConfigError(f"--grid expects KEY=V1,V2,... (got {entry!r})")
        searched[key.strip()] = [parse_override(f"{key}={value.strip()}")[1] for value in values.split(",")]
    return searched


def scenario_name(scenario: str | None, config_file: Path | None, overrides: Mapping[str, Any]) -> str:
    """The name of a scenario as configured (``--set scenario.name=...`` included), validated."""
    raw = scenario_source(scenario, config_file)
    for key, value in overrides.items():
        raw = set_value(raw, key, value)
    return validate(raw).scenario.name


def sweep_mode(resume: bool, extend: bool, replace: bool) -> str:
    """The ``mode`` (:data:`MODES`) of the flags ``--resume``, ``--extend`` and ``--replace``
    (at most one)."""
    return sweep_folder.mode_of(resume, extend, replace).value


def cpu_count() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0))


def check_cluster(address: str | None, workers: int) -> None:
    """Before any work: a cluster ``address`` must answer (in seconds, not Ray's minutes of
    retries), and without one ``workers`` must fit the CPUs of the Ray this process already
    runs, or else of the Ray it would start here."""
    if address:
        from fairclip.sims.executors.ray import check_reachable  # ray: only where asked for

        check_reachable(address)
        return
    import ray  # only where asked for

    if ray.is_initialized():
        jobs_.workers_fit_ray(workers)
    elif workers > cpu_count():
        raise ConfigError(
            f"--workers {workers} is more than the {cpu_count()} CPUs Ray would start with here"
        )


def stored_tune_curve(folder: Path) -> dict[str, Any] | None:
    """What the tuning curve stored in ``folder`` was asked (scenario, config file, policies,
    target ε, grid, overrides, options), or ``None`` where ``folder`` holds no curve."""
    from fairclip.sims.tune import curve as curve_  # torch: kept out of the command line's start

    if (folder / sweep_folder.TUNE_CURVE_FILE).is_file() or (folder / curve_.CURVE_SPEC_FILE).is_file():
        return curve_.stored_curve(folder)
    return None


def tune_internal_folder(out: Path) -> Path:
    """Where a search in ``out`` keeps what is not DP-protected (never publish it)."""
    from fairclip.sims.tune.search import INTERNAL  # torch: kept out of the command line's start

    return out / INTERNAL


def fetch_datasets(
    data_dir: str | Path | None, datasets: Sequence[str] | None = None, verify_only: bool = False
) -> list[tuple[str, Path]]:
    """Fetch the real ``datasets`` (default all; where the network allows, unless
    ``verify_only``) into ``data_dir`` (default ``FAIRCLIP_DATA``) and verify their SHA-256
    checksums; returns ``("downloaded" | "verified", path)`` per file (``fairclip data``)."""
    directory = resolve_data_dir(data_dir)
    names = list(datasets) if datasets else list(DATASET_FILES)
    for name in names:
        if name not in DATASET_FILES:
            raise ConfigError(f"--datasets: unknown dataset {name!r} (known: {', '.join(DATASET_FILES)})")
    downloaded = [] if verify_only else fetch(directory, names)
    checked = []
    for name in names:
        for relative in DATASET_FILES[name]:
            verified_path(directory, relative)
            checked.append(("downloaded" if relative in downloaded else "verified", directory / relative))
    return checked


def privacy_claim(
    sample_rate: float,
    rounds: int,
    delta: float,
    *,
    noise_multiplier: float | None = None,
    count_noise_multiplier: float | None = None,
    target_epsilon: float | None = None,
    count_noise_ratio: float | None = None,
    accountant: str = "prv",
) -> Any:
    """ε of ``rounds`` rounds of user-level DP-FedAvg at ``sample_rate`` and ``noise_multiplier``
    (with a count release at ``count_noise_multiplier``, if given), or the noise multipliers that
    reach ``target_epsilon`` (σ_b = k σ_Δ, k = ``count_noise_ratio``, default 10): a
    :class:`fairclip.strategies.accounting.PrivacyClaim` (``fairclip privacy``)."""
    # Opacus: kept out of the command line's start
    from fairclip.strategies.accounting import (
        DEFAULT_COUNT_RATIO,
        PrivacyClaim,
        calibrate,
        check_privacy_parameters,
    )

    if (noise_multiplier is None) == (target_epsilon is None):
        raise ConfigError("give exactly one of --noise-multiplier or --target-epsilon")
    check_privacy_parameters(sample_rate, rounds, delta, accountant)
    if count_noise_ratio is not None and target_epsilon is None:
        raise ConfigError(
            "--count-noise-ratio goes with --target-epsilon; else give --count-noise-multiplier"
        )
    if target_epsilon is not None:
        releases_reports = True  # calibrate for a policy with a count release, split σ_b = k σ_Δ
        if count_noise_multiplier is not None:
            raise ConfigError(
                "--count-noise-multiplier is derived (k x sigma, --count-noise-ratio k, default 10) "
                "when --target-epsilon is given"
            )
        noise = calibrate(
            target_epsilon,
            sample_rate,
            rounds,
            delta,
            accountant,
            releases_reports=releases_reports,
            count_ratio=DEFAULT_COUNT_RATIO if count_noise_ratio is None else count_noise_ratio,
        )
    else:
        releases_reports = count_noise_multiplier is not None
        noise = NoiseMultipliers(noise_multiplier, count_noise_multiplier or 0.0)
    return PrivacyClaim.of(
        noise,
        releases_reports=releases_reports,
        sample_rate=sample_rate,
        rounds=rounds,
        delta=delta,
        accountant=accountant,
    )


def run_flower(arguments: Sequence[str]) -> Any:
    """``flwr run ARGUMENTS --stream``, its output passed through, then how the run ended (a
    :class:`fairclip.server.flower_status.FlowerRunStatus`; ``fairclip flower``). An app folder
    without an app, or no ``flwr`` at all, is a :class:`ConfigError` before anything starts."""
    try:
        check_app(list(arguments))
        flwr = flwr_command()
    except ValueError as error:
        raise ConfigError(str(error)) from None
    return run_flower_app(list(arguments), flwr=flwr)


def bench(
    workloads: Sequence[str] = (), quick: bool = False, json_path: Path | None = None, device: str = "cpu"
) -> tuple[dict[str, Any], list[str]]:
    """Run the benchmark suite (:mod:`fairclip.benchmarks`; all workloads where ``workloads`` is
    empty) and return its report and the contenders that failed (``fairclip bench``)."""
    report = run_bench(list(workloads), quick, json_path, device)
    return report, failed_contenders(report)
