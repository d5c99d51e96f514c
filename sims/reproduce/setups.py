"""A reproduction's setup: its file (``sims/reproduce/builtin/<name>.toml``), read and checked.

A setup names a built-in scenario, the settings that turn it into a paper's experiment, the
policies with their own settings (learning rate, bounds, a grid), the paper's numbers and
claims (module docstring of :mod:`fairclip.sims.reproduce.reproduction`). :func:`load_setup`
refuses a setup that cannot run, before any data are read.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from fairclip.scenarios.config import (
    canonical_mapping,
    read_toml,
)
from fairclip.scenarios.errors import ConfigError
from fairclip.sims.reproduce.claims import (
    Claim,
    epsilon_text,
    parse_claims,
)
from fairclip.sims.reproduce.paired_metrics import PairedMetric, parse_paired_metrics
from fairclip.strategies.errors import did_you_mean

SETUP_DIR = Path(__file__).parent / "builtin"


SELECTION_METRICS = {"accuracy": "max", "macro_accuracy": "max", "f1": "max", "loss": "min"}
"""Overall validation metrics a grid search may choose by, and whether it keeps their highest or
lowest value (``f1``: the positive class's F1 of a binary task, seed 001's validation criterion;
``loss``: the evaluation loss, an autoencoder's mean squared reconstruction error, seed 002)."""


@dataclass(frozen=True)
class PolicySetup:
    name: str
    """The label of the setup's rows and runs: the policy's name, or a variant's own name."""
    settings: dict[str, Any]
    paper: dict[str, dict[str, float]]
    """{target ε as text, or "" when the setup has none: {metric: value}}."""
    paper_stderr: dict[str, dict[str, float]]
    grid: dict[str, list[Any]]
    full_grid: dict[str, list[Any]]
    policy: str = ""
    """The policy it runs (``policy.name``): ``policy = "..."`` in the setup file, for a variant
    of a policy under its own label (seed 003's Table 1 runs ``constant`` three ways); default
    the label."""
    epochs: int | None = None
    """This policy's own number of epochs (``epochs = ...``), where its paper trains it longer or
    shorter than the setup's ``epochs`` (seed 001's non-private model: 15 epochs, the private
    ones 30); None: the setup's."""
    batch_size: int | None = None
    """This policy's own expected batch size (``batch_size = ...``; seed 001's non-private
    model: 32, the private ones 128); None: the setup's."""

    @property
    def policy_name(self) -> str:
        return self.policy or self.name


@dataclass(frozen=True)
class Setup:
    name: str
    title: str
    scenario: str
    epochs: int
    batch_size: int | None
    """Expected batch size; None for full batches (q = 1)."""
    metrics: dict[str, tuple[str, str]]
    """{metric name: (cohort, cohort metric)}: ``[setup.metrics]``, then
    ``[setup.absolute_metrics]``."""
    settings: dict[str, Any]
    policies: list[PolicySetup]
    epsilons: list[float | None]
    grid: dict[str, list[Any]]
    full_grid: dict[str, list[Any]]
    paper_epsilon: float | None = None
    notes: str = ""
    select_by: str = "accuracy"
    """The overall validation metric a grid point is chosen by (``accuracy``; ``macro_accuracy``:
    the mean of the per-class accuracies, as seed 000 selects; any of :data:`SELECTION_METRICS`)."""
    relative_to: str | None = None
    """A policy of the setup (``none``) whose metrics every other policy is reported against:
    the mean over seeds of the paired difference run − reference run of the same seed (same data
    and sampling), as seed 004 reports accuracy change against non-private SGD. The reference's
    own rows hold its absolute values, named ``COHORT/METRIC``."""

    budget: str = "per-run"
    """How a target ε is spent (:data:`BUDGETS`): ``per-run``, each run spends it; ``per-grid``,
    a policy's whole grid search spends it (seed 002 after Mohapatra et al. 2022): each of
    its k runs is calibrated so that k such runs compose to ε (:func:`per_run_epsilon`), and
    its rows report the ε of the k runs composed (:func:`both_accountants`)."""

    selects: bool = False
    """Whether the setup, with all its policies, has a grid (reduced or full) to select from:
    then every run splits Adult's and Dutch's rows as the first seed does, whichever policies
    an invocation runs (:func:`per_run_keys`)."""
    claims: tuple[Claim, ...] = ()
    """The paper's qualitative claims its runs test (``[[claims]]``,
    :mod:`fairclip.sims.reproduce.claims`)."""
    paired_metrics: tuple[PairedMetric, ...] = ()
    """Metrics paired with the reference run of the same seed (``[setup.paired_metrics]``:
    privacy costs, excessive risks and their gaps, :mod:`fairclip.sims.reproduce.paired_metrics`)."""
    paper_values_from: str | None = None
    """Another setup whose published numbers this one repeats (``setup.paper_values_from``: a
    second grouping of the same runs, seed 001's age setups): its reports compare them as well,
    but the claims page counts each number once, where that setup has it
    (``tools.results.agreement``)."""
    absolute: frozenset[str] = frozenset()
    """Metrics of ``metrics`` that every policy reports as its own value, never as a change
    against ``relative_to`` (``[setup.absolute_metrics]``: seed 004's Table 2 gives each
    model's last-epoch loss and gradient norm, where its Tables 3-5 give accuracy changes)."""

    def changes(self, metric: str) -> bool:
        """Whether ``metric`` is reported as the paired change against ``relative_to``."""
        return self.relative_to is not None and metric not in self.absolute

    @property
    def metric_names(self) -> list[str]:
        """The setup's metrics, then its paired metrics: every name a paper value or a claim may use."""
        return [*self.metrics, *(metric.name for metric in self.paired_metrics)]

    @property
    def has_grid(self) -> bool:
        return bool(self.grid) or any(s.grid for s in self.policies)


@dataclass(frozen=True)
class Run:
    key: str
    policy: str
    target_epsilon: float | None
    seed: int
    raw: dict[str, Any] = field(compare=False)
    grid_point: dict[str, Any] = field(default_factory=dict, compare=False)
    search_runs: int = field(default=1, compare=False)
    """k: the runs of the search whose composition the target ε covers (``per-grid``: the
    policy's grid points; 1 otherwise)."""


def old_name(table: dict[str, Any], key: str, where: str) -> Any:
    """``table[key]``, or the same entry under its name before issue 66 (``strategies`` for
    ``policies``, ``strategy`` for ``policy``: :data:`OLD_SETUP_KEYS`); a :class:`ConfigError`
    where both are given, a :class:`KeyError` where neither is."""
    old = OLD_SETUP_KEYS[key]
    if key in table and old in table:
        raise ConfigError(f"{where}: give {key} or {old} (its old name), not both")
    return table[old] if old in table else table[key]


OLD_SETUP_KEYS = {"policies": "strategies", "policy": "strategy"}
"""A setup file's keys by their old names (``[strategies.<label>]`` tables, a claim's
``strategy = ...``), still read."""


def builtin_setups() -> dict[str, Path]:
    """Name -> file of every reproduction setup shipped inside the package."""
    return {path.stem: path for path in sorted(SETUP_DIR.glob("*.toml"))}


def load_setup(name: str) -> Setup:
    """Read and check a built-in setup; an unknown name or a malformed file is a ConfigError."""
    setups = builtin_setups()
    if name not in setups:
        hint = did_you_mean(name, setups)
        raise ConfigError(f"unknown reproduction {name!r}{hint} (known: {', '.join(setups)})")
    raw = read_toml(setups[name])
    where = f"reproduction {name}"
    try:
        head = raw["setup"]
        batch = head["batch_size"]
        if batch != "full" and not (isinstance(batch, int) and batch >= 1):
            raise ConfigError(f'{where}: setup.batch_size must be a positive integer or "full"')
        metrics = {}
        absolute = head.get("absolute_metrics", {})
        for metric, source in [*head["metrics"].items(), *absolute.items()]:
            cohort, _, value = source.partition("/")
            if not cohort or not value:
                raise ConfigError(
                    f"{where}: metric {metric} must read COHORT/METRIC or overall/METRIC (got {source!r})"
                )
            if metric in metrics:
                raise ConfigError(f"{where}: metric {metric} is named twice")
            metrics[metric] = (cohort, value)
        policies = [_policy(key, table, where) for key, table in old_name(raw, "policies", where).items()]
        grid, full_grid = (
            _axes(raw.get("grid", {}), f"{where}: grid"),
            _axes(raw.get("full_grid", {}), f"{where}: full_grid"),
        )
        setup = Setup(
            name=name,
            title=head["title"],
            scenario=head["scenario"],
            epochs=int(head["epochs"]),
            batch_size=None if batch == "full" else batch,
            metrics=metrics,
            settings=canonical_mapping(raw.get("settings", {}), f"{where}: settings"),
            policies=policies,
            epsilons=[float(e) for e in head.get("epsilons", [])] or [None],
            grid=grid,
            full_grid=full_grid,
            paper_epsilon=head.get("paper_epsilon"),
            notes=head.get("notes", ""),
            select_by=head.get("select_by", "accuracy"),
            relative_to=head.get("relative_to"),
            paper_values_from=head.get("paper_values_from"),
            absolute=frozenset(absolute),
            budget=_budget(head, where),
            selects=any([grid, full_grid, *(t for s in policies for t in (s.grid, s.full_grid))]),
        )
        if setup.select_by not in SELECTION_METRICS:
            raise ConfigError(f"{where}: setup.select_by must be one of {', '.join(SELECTION_METRICS)}")
        _refuse_per_run_keys(setup, where)
        if setup.relative_to is not None and setup.relative_to not in {s.name for s in policies}:
            raise ConfigError(f"{where}: setup.relative_to names no policy of the setup")
        if setup.paper_values_from is not None and setup.paper_values_from not in builtin_setups():
            raise ConfigError(f"{where}: setup.paper_values_from names no built-in setup")
        if "paired_metrics" in head:
            if setup.relative_to is not None:
                raise ConfigError(
                    f"{where}: setup.paired_metrics and setup.relative_to exclude each other "
                    "(relative_to's metrics are paired with the reference already)"
                )
            if not any(s.policy_name == "none" for s in policies):
                raise ConfigError(f"{where}: setup.paired_metrics needs a policy that runs none")
            paired = parse_paired_metrics(head["paired_metrics"], list(metrics), where)
            setup = replace(setup, paired_metrics=paired)
        claims = parse_claims(
            raw.get("claims", []),
            policies=[policy.name for policy in policies],
            metrics=setup.metric_names,
            epsilons=[epsilon_text(epsilon) for epsilon in setup.epsilons],
            where=where,
        )
        setup = replace(setup, claims=tuple(claims))
    except KeyError as error:
        raise ConfigError(f"{where}: required key {error.args[0]!r} is missing") from None
    return setup


BUDGETS = ("per-run", "per-grid")
"""The values of ``setup.budget``."""


def _budget(head: dict[str, Any], where: str) -> str:
    """``setup.budget`` (default ``per-run``); a :class:`ConfigError` for another value, or for
    ``per-grid`` in a setup without target epsilons (there is no ε to split)."""
    budget = head.get("budget", "per-run")
    if budget not in BUDGETS:
        raise ConfigError(f"{where}: setup.budget must be one of {', '.join(BUDGETS)} (got {budget!r})")
    if budget == "per-grid" and not head.get("epsilons"):
        raise ConfigError(f"{where}: setup.budget = per-grid needs setup.epsilons (the budgets it splits)")
    return budget


def _refuse_per_run_keys(setup: Setup, where: str) -> None:
    """A :class:`ConfigError` where the setup's settings, a policy's settings or a grid set a
    key the reproduction sets for each run (:func:`per_run_keys`): it would be overwritten, or
    would win where it must not (a final run evaluated on the validation split)."""
    refused = per_run_keys(setup)
    tables = {"settings": setup.settings, "grid": setup.grid, "full_grid": setup.full_grid}
    for policy in setup.policies:
        for part in ("settings", "grid", "full_grid"):
            tables[f"policies.{policy.name}.{part}"] = getattr(policy, part)
    for place, table in tables.items():
        for key in table:
            if key in refused:
                why = refused[key]
                raise ConfigError(
                    f"{where}: {place} sets {key}, which a reproduction sets for each run ({why})"
                )


def _policy(name: str, table: dict[str, Any], where: str) -> PolicySetup:
    known = {"policy", "settings", "paper", "paper_stderr", "grid", "full_grid", "epochs", "batch_size"}
    unknown = set(table) - known
    if unknown:
        raise ConfigError(f"{where}: policies.{name}.{sorted(unknown)[0]}: unknown key")
    if "__" in name:
        raise ConfigError(f"{where}: policies.{name}: a label may not contain '__' (it separates run keys)")
    policy = table.get("policy", name)
    if not isinstance(policy, str) or not policy:
        raise ConfigError(f"{where}: policies.{name}.policy must name a policy")
    for key in ("epochs", "batch_size"):
        value = table.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"{where}: policies.{name}.{key} must be a positive integer")
    paper_stderr = _by_epsilon(table.get("paper_stderr", {}))
    for errors in paper_stderr.values():
        for metric, error in errors.items():
            if not error > 0:  # 0 would count as no error: a window of ± 2 points
                raise ConfigError(
                    f"{where}: policies.{name}.paper_stderr.{metric} must be > 0 (got {error}): a "
                    "printed ± 0.000 means an error below half its last digit; store that bound (0.0005)"
                )
    return PolicySetup(
        name=name,
        policy=policy,
        settings=canonical_mapping(table.get("settings", {}), f"{where}: policies.{name}.settings"),
        paper=_by_epsilon(table.get("paper", {})),
        paper_stderr=paper_stderr,
        grid=_axes(table.get("grid", {}), f"{where}: policies.{name}.grid"),
        full_grid=_axes(table.get("full_grid", {}), f"{where}: policies.{name}.full_grid"),
        epochs=table.get("epochs"),
        batch_size=table.get("batch_size"),
    )


def _by_epsilon(table: dict[str, Any]) -> dict[str, dict[str, float]]:
    """``{metric: v}`` (one setting) or ``{"0.5": {metric: v}}`` (per target ε) -> by ε text."""
    if table and all(isinstance(v, dict) for v in table.values()):
        return {epsilon_text(float(k)): {m: float(v) for m, v in t.items()} for k, t in table.items()}
    return {"": {m: float(v) for m, v in table.items()}}


def _axes(table: dict[str, Any], where: str) -> dict[str, list[Any]]:
    """A grid's axes by key (``strategy.*`` keys, the old name, read as ``policy.*``)."""
    axes = {}
    for key, values in canonical_mapping(table, where).items():
        if isinstance(values, dict):
            low, high, count = values["logspace"]
            values = [float(f"{v:.4g}") for v in np.geomspace(low, high, int(count))]
        axes[key] = list(values)
    return axes


def select_policies(setup: Setup, names: list[str] | None) -> Setup:
    """The setup with only the policies ``names`` (all of them for ``None``); a name the
    setup does not have is a :class:`ConfigError` naming the ones it has. A setup that reports
    changes against a reference policy keeps that policy."""
    if names is None:
        return setup
    known = [policy.name for policy in setup.policies]
    if not names:
        raise ConfigError("--policies names no policy")
    for name in names:
        if name not in known:
            raise ConfigError(
                f"--policies: setup {setup.name!r} has no policy {name!r} (it has: {', '.join(known)})"
            )
    if setup.relative_to is not None:  # changes need the reference's runs of the same seeds
        names = [*names, setup.relative_to]
    return replace(setup, policies=[s for s in setup.policies if s.name in names])


def setup_titles() -> dict[str, str]:
    return {name: read_toml(path)["setup"]["title"] for name, path in builtin_setups().items()}


_PER_RUN_KEYS = {
    "policy.name": "--policies picks the policies",
    "scenario.evaluate_on": "grid runs evaluate on the validation split, final runs on the test set",
    "federation.num_clients": "every training example is a client",
    "federation.sample_rate": "the setup's batch size sets it (--max-batch caps it in smoke runs)",
    "training.rounds": "the setup's epochs set it (--max-rounds caps it in smoke runs)",
}
"""Keys a reproduction sets for each run itself, so a ``--set`` of them is refused, with why."""


SPLIT_SEED_REASON = "a setup with a grid splits every seed's rows as its first seed does"


def per_run_keys(setup: Setup) -> dict[str, str]:
    """:data:`_PER_RUN_KEYS`, and ``scenario.split_seed`` where the setup has a grid: its runs all
    share the first seed's test rows, which the selection on that seed never saw."""
    if setup.selects:
        return {**_PER_RUN_KEYS, "scenario.split_seed": SPLIT_SEED_REASON}
    return _PER_RUN_KEYS
