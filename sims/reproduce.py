"""``fairclip reproduce``: the seed papers' centralised experiments as sample-level fairclip runs.

A setup file (``sims/reproductions/<name>.toml``) names a built-in scenario, the settings that
turn it into the paper's experiment, the strategies with their own settings (learning rate,
bounds) and the paper's numbers. DP-SGD with Poisson batches of expected size b over N training
examples is the special case of user-level DP-FedAvg where every example is a client
(``scenario.partition = "per-example"``) that takes one step with client learning rate 1, so
that its update is Δ_i = −∇ℓ_i and the paper's learning rate is the server learning rate
(docs/design.md, section 2). So a setup runs with

    federation.num_clients = N (of that seed's data),  q = b / N (q = 1 for "full" batches),
    training.rounds = ceil(epochs · N / b),

with the setup's epochs and b, or a strategy's own (``epochs``, ``batch_size`` in its table: a
paper that trains its non-private model with other epochs and batches than its private ones).

Setups with a ``[grid]`` (Zhao et al.) choose, per strategy and target ε, the grid point with the
best overall accuracy on a *validation split* of the training rows (``scenario.evaluate_on =
"validation"``, the first seed); the test rows are never used to select: where a seed splits
the rows into training and test rows (Adult, Dutch), every run of such a setup splits them as the
first seed does (``scenario.split_seed``), and the other seeds vary the rest (initialisation,
batches, noise). The chosen settings then run on
the test split with every seed: a strategy's final runs at an ε start as soon as its own grid runs
there have finished, while the rest of the grid still runs. Every run is one Ray task (like
``fairclip compare``), written atomically into ``DIR/runs/<key>/`` as it finishes;
``DIR/reproduction.csv`` and ``DIR/reproduction.md`` are written at the end.

A setup with ``budget = "per-grid"`` (seed 002) spends each target ε on a strategy's whole grid
search rather than on each run: every run of a strategy with k grid points, final runs included,
is calibrated so that k such runs compose to ε (:func:`per_run_epsilon`), and the table gives the
ε of the k runs composed.

A fairclip mean is flagged when it lies outside the paper's mean ± 2 combined standard errors,
2·sqrt(se_paper² + se_fairclip²), where both give one, and outside ± 2 points (0.02) otherwise.

Each run's metrics are kept by seed (``per_seed.csv``), and the paper's qualitative claims
(``[[claims]]`` of the setup file) are tested on them with paired tests (``claims.csv``), beside
the setup's answer to which policy makes its worst group pay least (``fairest.csv``;
:mod:`fairclip.sims.claims`).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from fairclip.sims.claims import (
    CLAIM_COLUMNS,
    COHORT_ACCURACY,
    FAIREST_COLUMNS,
    Claim,
    claim_rows,
    claims_markdown,
    epsilon_text,
    fairest_markdown,
    fairest_rows,
    parse_claims,
)
from fairclip.sims.config import (
    ROW_SPLIT_DATASETS,
    ClassificationSpec,
    apply_overrides,
    check_overrides_used,
    parse_override,
    read_toml,
    scenario_source,
    set_value,
    validate,
)
from fairclip.sims.errors import ConfigError
from fairclip.sims.outputs import atomic_write_text, write_csv, write_json
from fairclip.strategies import accounting
from fairclip.strategies.errors import PolicyConfigError, did_you_mean

SETUP_DIR = Path(__file__).parent / "reproductions"
PAIRED_COLUMNS = [
    "target_epsilon",
    "quantity",
    "first",
    "second",
    "seeds",
    "mean_difference",
    "interval_low",
    "interval_high",
    "p_value",
    "significant",
]
"""The columns of ``paired_tests.csv``."""
COLUMNS = [
    "setup",
    "strategy",
    "epsilon",
    "epsilon_rdp",
    "epsilon_prv",
    "metric",
    "paper",
    "paper_stderr",
    "fairclip_mean",
    "fairclip_stderr",
    "seeds",
    "outside",
]
SELECTION_METRICS = ("accuracy", "macro_accuracy", "f1")
"""Overall validation metrics a grid search may choose by (``f1``: the positive class's F1 of a
binary task, seed 001's validation criterion)."""
POINTS = 0.02
"""Tolerance where the paper gives no standard error: ± 2 accuracy points."""


@dataclass(frozen=True)
class StrategySetup:
    name: str
    """The label of the setup's rows and runs: the policy's name, or a variant's own name."""
    settings: dict[str, Any]
    paper: dict[str, dict[str, float]]
    """{target ε as text, or "" when the setup has none: {metric: value}}."""
    paper_stderr: dict[str, dict[str, float]]
    grid: dict[str, list[Any]]
    full_grid: dict[str, list[Any]]
    policy: str = ""
    """The policy it runs (``strategy.name``): ``policy = "..."`` in the setup file, for a variant
    of a policy under its own label (seed 003's Table 1 runs ``constant`` three ways); default
    the label."""
    epochs: int | None = None
    """This strategy's own number of epochs (``epochs = ...``), where its paper trains it longer or
    shorter than the setup's ``epochs`` (seed 001's non-private model: 15 epochs, the private
    ones 30); None: the setup's."""
    batch_size: int | None = None
    """This strategy's own expected batch size (``batch_size = ...``; seed 001's non-private
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
    """{metric name: (cohort, cohort metric)}."""
    settings: dict[str, Any]
    strategies: list[StrategySetup]
    epsilons: list[float | None]
    grid: dict[str, list[Any]]
    full_grid: dict[str, list[Any]]
    paper_epsilon: float | None = None
    notes: str = ""
    select_by: str = "accuracy"
    """The overall validation metric a grid point is chosen by (``accuracy``, or ``macro_accuracy``:
    the mean of the per-class accuracies, as seed 000 selects)."""
    relative_to: str | None = None
    """A strategy of the setup (``none``) whose metrics every other strategy is reported against:
    the mean over seeds of the paired difference run − reference run of the same seed (same data
    and sampling), as seed 004 reports accuracy change against non-private SGD. The reference's
    own rows hold its absolute values, named ``COHORT/METRIC``."""

    budget: str = "per-run"
    """How a target ε is spent (:data:`BUDGETS`): ``per-run``, each run spends it; ``per-grid``,
    a strategy's whole grid search spends it (seed 002 after Mohapatra et al. 2022): each of
    its k runs is calibrated so that k such runs compose to ε (:func:`per_run_epsilon`), and
    its rows report the ε of the k runs composed (:func:`both_accountants`)."""

    selects: bool = False
    """Whether the setup, with all its strategies, has a grid (reduced or full) to select from:
    then every run splits Adult's and Dutch's rows as the first seed does, whichever strategies
    an invocation runs (:func:`per_run_keys`)."""
    claims: tuple[Claim, ...] = ()
    """The paper's qualitative claims its runs test (``[[claims]]``, :mod:`fairclip.sims.claims`)."""

    @property
    def has_grid(self) -> bool:
        return bool(self.grid) or any(s.grid for s in self.strategies)


@dataclass(frozen=True)
class Run:
    key: str
    strategy: str
    target_epsilon: float | None
    seed: int
    raw: dict[str, Any] = field(compare=False)
    grid_point: dict[str, Any] = field(default_factory=dict, compare=False)
    search_runs: int = field(default=1, compare=False)
    """k: the runs of the search whose composition the target ε covers (``per-grid``: the
    strategy's grid points; 1 otherwise)."""


# ----- setup files ----------------------------------------------------------------------------


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
        for metric, source in head["metrics"].items():
            cohort, _, value = source.partition("/")
            if not cohort or not value:
                raise ConfigError(
                    f"{where}: metric {metric} must read COHORT/METRIC or overall/METRIC (got {source!r})"
                )
            metrics[metric] = (cohort, value)
        strategies = [_strategy(key, table, where) for key, table in raw["strategies"].items()]
        grid, full_grid = _axes(raw.get("grid", {})), _axes(raw.get("full_grid", {}))
        setup = Setup(
            name=name,
            title=head["title"],
            scenario=head["scenario"],
            epochs=int(head["epochs"]),
            batch_size=None if batch == "full" else batch,
            metrics=metrics,
            settings=dict(raw.get("settings", {})),
            strategies=strategies,
            epsilons=[float(e) for e in head.get("epsilons", [])] or [None],
            grid=grid,
            full_grid=full_grid,
            paper_epsilon=head.get("paper_epsilon"),
            notes=head.get("notes", ""),
            select_by=head.get("select_by", "accuracy"),
            relative_to=head.get("relative_to"),
            budget=_budget(head, where),
            selects=any([grid, full_grid, *(t for s in strategies for t in (s.grid, s.full_grid))]),
        )
        if setup.select_by not in SELECTION_METRICS:
            raise ConfigError(f"{where}: setup.select_by must be one of {', '.join(SELECTION_METRICS)}")
        _refuse_per_run_keys(setup, where)
        if setup.relative_to is not None and setup.relative_to not in {s.name for s in strategies}:
            raise ConfigError(f"{where}: setup.relative_to names no strategy of the setup")
        claims = parse_claims(
            raw.get("claims", []),
            strategies=[strategy.name for strategy in strategies],
            metrics=list(metrics),
            epsilons=[_epsilon_text(epsilon) for epsilon in setup.epsilons],
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
    """A :class:`ConfigError` where the setup's settings, a strategy's settings or a grid set a
    key the reproduction sets for each run (:func:`per_run_keys`): it would be overwritten, or
    would win where it must not (a final run evaluated on the validation split)."""
    refused = per_run_keys(setup)
    tables = {"settings": setup.settings, "grid": setup.grid, "full_grid": setup.full_grid}
    for strategy in setup.strategies:
        for part in ("settings", "grid", "full_grid"):
            tables[f"strategies.{strategy.name}.{part}"] = getattr(strategy, part)
    for place, table in tables.items():
        for key in table:
            if key in refused:
                why = refused[key]
                raise ConfigError(
                    f"{where}: {place} sets {key}, which a reproduction sets for each run ({why})"
                )


def _strategy(name: str, table: dict[str, Any], where: str) -> StrategySetup:
    known = {"policy", "settings", "paper", "paper_stderr", "grid", "full_grid", "epochs", "batch_size"}
    unknown = set(table) - known
    if unknown:
        raise ConfigError(f"{where}: strategies.{name}.{sorted(unknown)[0]}: unknown key")
    if "__" in name:
        raise ConfigError(f"{where}: strategies.{name}: a label may not contain '__' (it separates run keys)")
    policy = table.get("policy", name)
    if not isinstance(policy, str) or not policy:
        raise ConfigError(f"{where}: strategies.{name}.policy must name a strategy")
    for key in ("epochs", "batch_size"):
        value = table.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"{where}: strategies.{name}.{key} must be a positive integer")
    return StrategySetup(
        name=name,
        policy=policy,
        settings=dict(table.get("settings", {})),
        paper=_by_epsilon(table.get("paper", {})),
        paper_stderr=_by_epsilon(table.get("paper_stderr", {})),
        grid=_axes(table.get("grid", {})),
        full_grid=_axes(table.get("full_grid", {})),
        epochs=table.get("epochs"),
        batch_size=table.get("batch_size"),
    )


def _by_epsilon(table: dict[str, Any]) -> dict[str, dict[str, float]]:
    """``{metric: v}`` (one setting) or ``{"0.5": {metric: v}}`` (per target ε) -> by ε text."""
    if table and all(isinstance(v, dict) for v in table.values()):
        return {_epsilon_text(float(k)): {m: float(v) for m, v in t.items()} for k, t in table.items()}
    return {"": {m: float(v) for m, v in table.items()}}


def _axes(table: dict[str, Any]) -> dict[str, list[Any]]:
    axes = {}
    for key, values in table.items():
        if isinstance(values, dict):
            low, high, count = values["logspace"]
            values = [float(f"{v:.4g}") for v in np.geomspace(low, high, int(count))]
        axes[key] = list(values)
    return axes


_epsilon_text = epsilon_text


# ----- planning ---------------------------------------------------------------------------------


def sample_level_settings(
    setup: Setup,
    num_examples: int,
    max_rounds: int | None,
    max_batch: int | None = None,
    strategy: StrategySetup | None = None,
) -> dict[str, Any]:
    """The settings (typed, by dotted key) that make every training example a client of a
    DP-SGD step, with the setup's epochs and batch size, or ``strategy``'s own where it has them.
    ``max_rounds`` and ``max_batch`` (smoke runs only) cap the number of steps and the expected
    batch (the sampling rate)."""
    epochs = setup.epochs if strategy is None or strategy.epochs is None else strategy.epochs
    batch_size = setup.batch_size if strategy is None or strategy.batch_size is None else strategy.batch_size
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


def _strategy_raw(
    base: dict[str, Any], strategy: StrategySetup, point: dict[str, Any], overrides: dict[str, Any]
) -> dict[str, Any]:
    """``base`` with the strategy's settings, then its grid point, then the user's ``--set``
    ``overrides`` (which win over the setup's per-strategy settings, as the report says)."""
    raw = _apply(set_value(base, "strategy.name", strategy.policy_name), {**strategy.settings, **point})
    raw = _apply(raw, overrides)
    # Zhao et al.'s grid puts C_LB up to 50; fairclip requires C_0 >= C_LB, so the bound starts there.
    lower = raw["strategy"].get("lower_bound")
    if lower is not None and lower > raw["strategy"].get("initial_bound", 1.0):
        raw = set_value(raw, "strategy.initial_bound", lower)
    return raw


def grid_axes(setup: Setup, strategy: StrategySetup, full: bool) -> dict[str, list[Any]]:
    """The setup's and the strategy's grid axes (``full``: the paper grids), by key."""
    return {**(setup.full_grid if full else setup.grid), **(strategy.full_grid if full else strategy.grid)}


def grid_points(setup: Setup, strategy: StrategySetup, full: bool, limit: int | None) -> list[dict[str, Any]]:
    """Every combination of the setup's and the strategy's grid axes (first ``limit`` values each)."""
    axes = grid_axes(setup, strategy, full)
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


_PER_RUN_KEYS = {
    "strategy.name": "--strategies picks the strategies",
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


def checked_overrides(setup: Setup, overrides: list[str]) -> dict[str, Any]:
    """The ``--set`` assignments by dotted key, less ``seed`` (the first seed); a
    :class:`ConfigError` for a key the reproduction sets per run or one of its grids varies,
    which an override would silently fix (or be overwritten by)."""
    varied = dict.fromkeys([*setup.grid, *setup.full_grid], "the setup's grid")
    for strategy in setup.strategies:
        for key in [*strategy.grid, *strategy.full_grid]:
            varied.setdefault(key, f"strategy {strategy.name}'s grid")
    refused = per_run_keys(setup)
    checked = {}
    for assignment in overrides:
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
        from fairclip.sims.real_data import training_examples

        self.setup = setup
        self.data_dir = data_dir
        self.max_rounds = max_rounds
        self.max_batch = max_batch
        self.examples = examples or training_examples
        self.overrides = checked_overrides(setup, overrides)
        """``--set`` by dotted key, applied over every run's strategy settings and grid point (the
        first seed, ``seed``, stays in :attr:`base`)."""
        self.base = apply_overrides(_apply(scenario_source(setup.scenario, None), setup.settings), overrides)
        self._counts: dict[tuple[int, bool], int] = {}
        self._searched: tuple[bool, int | None] = (False, None)
        """(full, limit) of the grid last planned (:meth:`grid_runs`): the search a final run
        stands for; before any, the default reduced grid."""

    def search_runs(self, strategy: StrategySetup) -> int:
        """k of ``strategy``'s runs (:attr:`Run.search_runs`): under a ``per-grid`` budget, its
        points in the grid last planned, else 1."""
        if self.setup.budget != "per-grid" or not self.setup.has_grid:
            return 1
        full, limit = self._searched
        return len(grid_points(self.setup, strategy, full, limit))

    def raw(
        self,
        strategy: StrategySetup,
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
        raw = _strategy_raw(base, strategy, point, self.overrides)
        scenario = validate(raw).scenario
        if (
            self.setup.selects
            and isinstance(scenario, ClassificationSpec)
            and scenario.dataset in ROW_SPLIT_DATASETS
        ):
            first = int(self.base.get("seed", 0))
            raw = set_value(raw, "scenario.split_seed", first)
            scenario = scenario.model_copy(update={"split_seed": first})
        check_overrides_used(raw, self.overrides)
        marker = (seed, validation)
        if marker not in self._counts:
            self._counts[marker] = self.examples(scenario, self.data_dir, seed)
        count = self._counts[marker]
        sample_level = sample_level_settings(self.setup, count, self.max_rounds, self.max_batch, strategy)
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

    def grid_runs(self, full: bool, limit: int | None) -> list[Run]:
        """The validation runs of every strategy with grid axes (one with none has nothing to
        choose: its final runs start at once, :meth:`ungridded_runs`)."""
        runs = []
        seed = int(self.base.get("seed", 0))
        self._searched = (full, limit)
        for strategy in self.setup.strategies:
            if not grid_axes(self.setup, strategy, full):
                continue
            k = self.search_runs(strategy)
            for epsilon in self.setup.epsilons:
                for index, point in enumerate(grid_points(self.setup, strategy, full, limit)):
                    key = f"grid__{strategy.name}__eps-{_epsilon_text(epsilon) or 'none'}__{index:03d}"
                    raw = self.raw(strategy, point, epsilon, seed, validation=True, search_runs=k)
                    runs.append(Run(key, strategy.name, epsilon, seed, raw, point, search_runs=k))
        return runs

    def ungridded_runs(self, seeds: int, full: bool) -> list[Run]:
        """The final runs of the strategies without grid axes, which need no grid run first."""
        return [
            run
            for strategy in self.setup.strategies
            if not grid_axes(self.setup, strategy, full)
            for epsilon in self.setup.epsilons
            for run in self.final_runs_of(strategy, epsilon, seeds, {})
        ]

    def final_runs(self, seeds: int, chosen: dict[tuple[str, float | None], dict[str, Any]]) -> list[Run]:
        """Every strategy's and target ε's runs on the test set, ``seeds`` each, at the grid point
        ``chosen`` for it (none where it has no entry)."""
        return [
            run
            for strategy in self.setup.strategies
            for epsilon in self.setup.epsilons
            for run in self.final_runs_of(strategy, epsilon, seeds, chosen.get((strategy.name, epsilon), {}))
        ]

    def final_runs_of(
        self, strategy: StrategySetup, epsilon: float | None, seeds: int, point: dict[str, Any]
    ) -> list[Run]:
        """One strategy's runs at one target ε on the test set, ``seeds`` of them, at ``point``."""
        first = int(self.base.get("seed", 0))
        k = self.search_runs(strategy)
        runs = []
        for seed in range(first, first + seeds):
            key = f"{strategy.name}__eps-{_epsilon_text(epsilon) or 'none'}__seed-{seed}"
            raw = self.raw(strategy, point, epsilon, seed, validation=False, search_runs=k)
            runs.append(Run(key, strategy.name, epsilon, seed, raw, point, search_runs=k))
        return runs


# ----- execution --------------------------------------------------------------------------------


def finished(runs: list[Run], out: Path) -> dict[str, dict[str, Any]]:
    """Summaries of the ``runs`` already finished in ``out`` with the same configuration, by key
    (``--resume``; :func:`fairclip.sims.compare.finished_summary`)."""
    from fairclip.sims.compare import finished_summary

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
    ``ray``, one after the other in this process (a local engine of ``workers`` threads: the same
    numbers); write each as it finishes; return the summaries by key.

    With ``resume``, a run finished in ``out`` with the same configuration is reused, not run
    again (:func:`finished`), and an unfinished one continues from the progress it kept in its
    folder (:mod:`fairclip.sims.checkpoint`); without, those checkpoints are deleted first and
    every run starts from its first round. ``on_finished(run, summary)`` is called for each run
    computed, once it is written, and for each reused run unless ``on_reused`` is given, which
    is called instead. Then ``then(run, summary)``, for every run, returns the runs that can
    start now that it has finished (a setup's final runs, once the grid runs they choose between
    have): they are run, or reused, in the same way, while the rest still runs."""
    from fairclip.sims.compare import discard_checkpoints, run_checkpoint, save_run, simulate_jobs

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
    """``then`` of :func:`execute` for a setup with a grid: once the last grid run of a strategy
    at a target ε has finished, choose its grid point (:func:`choose`, into ``chosen``) and
    return that strategy's final runs at that ε, which start while the rest of the grid runs."""

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
            self.groups.setdefault((run.strategy, run.target_epsilon), []).append(run)
        self.grid_keys = {run.key for run in grid}
        self.summaries: dict[str, dict[str, Any]] = {}

    def __call__(self, run: Run, summary: dict[str, Any]) -> list[Run]:
        if run.key not in self.grid_keys:
            return []  # a final run
        self.summaries[run.key] = summary
        group = (run.strategy, run.target_epsilon)
        if any(other.key not in self.summaries for other in self.groups[group]):
            return []
        self.chosen.update(choose(self.groups[group], self.summaries, self.metric))
        strategy = next(s for s in self.planner.setup.strategies if s.name == run.strategy)
        return self.planner.final_runs_of(strategy, run.target_epsilon, self.seeds, self.chosen[group])


def overall_metric(summary: dict[str, Any], metric: str = "accuracy") -> float:
    value = summary.get("overall", {}).get(metric, math.nan)
    return float(value) if value is not None else math.nan


def choose(
    grid: list[Run], summaries: dict[str, dict[str, Any]], metric: str = "accuracy"
) -> dict[tuple[str, float | None], dict]:
    """Per (strategy, ε): the grid point of the best overall validation ``metric`` (first on ties;
    a diverged run, NaN, never wins unless all did)."""
    best: dict[tuple[str, float | None], tuple[float, dict[str, Any]]] = {}
    for run in grid:
        score = overall_metric(summaries[run.key], metric)
        score = -math.inf if not math.isfinite(score) else score
        cell = (run.strategy, run.target_epsilon)
        if cell not in best or score > best[cell][0]:
            best[cell] = (score, run.grid_point)
    return {cell: point for cell, (_, point) in best.items()}


# ----- the table --------------------------------------------------------------------------------


OVERALL = "overall"
"""The "cohort" of a setup metric read from the whole test set (``overall/accuracy``)."""


def metric_value(summary: dict[str, Any], cohort: str, metric: str) -> float:
    source = summary["overall"] if cohort == OVERALL else summary["cohorts"].get(cohort, {})
    value = source.get(metric)
    if value is None:
        raise ConfigError(f"summary has no {cohort}/{metric}")
    return float(value)


def mean_stderr(values: list[float]) -> tuple[float, float]:
    array = np.asarray(values, dtype=np.float64)
    mean = float(array.mean())
    stderr = float(array.std(ddof=1) / math.sqrt(len(array))) if len(array) > 1 else math.nan
    return mean, stderr


def outside(paper: float | None, paper_stderr: float | None, mean: float, stderr: float = math.nan) -> bool:
    """True when ``mean`` (with its standard error ``stderr`` over seeds) lies outside the paper's
    mean ± 2 combined standard errors, 2·sqrt(paper_stderr² + stderr²), where both are known, and
    outside ± 2 points otherwise. No paper number: never flagged."""
    if paper is None or math.isnan(paper):
        return False
    return not (math.isfinite(mean) and abs(mean - paper) <= tolerance(paper_stderr, stderr))


def tolerance(paper_stderr: float | None, stderr: float = math.nan) -> float:
    """How far a fairclip mean may lie from the paper's before it is flagged (:func:`outside`)."""
    both = paper_stderr is not None and paper_stderr > 0 and math.isfinite(stderr) and stderr >= 0
    return 2.0 * math.hypot(paper_stderr, stderr) if both else POINTS


def table_rows(setup: Setup, runs: list[Run], summaries: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (strategy, ε, metric): the columns of ``reproduction.csv`` plus ``outside``."""
    rows = []
    for strategy in setup.strategies:
        for epsilon in setup.epsilons:
            mine = [run for run in runs if run.strategy == strategy.name and run.target_epsilon == epsilon]
            if not mine:
                continue
            found = [summaries[run.key] for run in mine]
            spent = [float(s["epsilon"]) if s["epsilon"] != "inf" else math.inf for s in found]
            if any(math.isinf(value) for value in spent):  # not private, whatever the target
                shown = math.inf
            else:
                shown = epsilon if epsilon is not None else float(np.mean(spent))
            text = _epsilon_text(epsilon)
            reference = None
            if setup.relative_to is not None and strategy.name != setup.relative_to:
                reference = _paired_reference(setup.relative_to, epsilon, mine, runs, summaries)
            for metric, (cohort, name) in setup.metrics.items():
                values = [metric_value(s, cohort, name) for s in found]
                if reference is not None:  # the paired change against the same seed's reference
                    values = [
                        v - metric_value(r, cohort, name) for v, r in zip(values, reference, strict=True)
                    ]
                elif setup.relative_to is not None:  # the reference itself: absolute values
                    metric = f"{cohort}/{name}"
                mean, stderr = mean_stderr(values)
                paper = strategy.paper.get(text, {}).get(metric)
                paper_se = strategy.paper_stderr.get(text, {}).get(metric)
                rows.append(
                    {
                        "setup": setup.name,
                        "strategy": strategy.name,
                        "epsilon": "inf" if math.isinf(shown) else float(f"{shown:.4g}"),
                        **{
                            f"epsilon_{name}": both_accountants(found, name, mine[0].search_runs)
                            for name in ("rdp", "prv")
                        },
                        "metric": metric,
                        "paper": "" if paper is None else paper,
                        "paper_stderr": "" if paper_se is None else paper_se,
                        "fairclip_mean": round(mean, 6),
                        "fairclip_stderr": "" if math.isnan(stderr) else round(stderr, 6),
                        "seeds": len(found),
                        "outside": outside(paper, paper_se, mean, stderr),
                        "grid_point": mine[0].grid_point,
                    }
                )
    return rows


def _paired_reference(
    name: str, epsilon: float | None, mine: list[Run], runs: list[Run], summaries: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """The summaries of reference strategy ``name``'s runs with the seeds of ``mine``, in order
    (its runs at the same target ε, or its only runs where it has none)."""
    by_seed: dict[int, dict[str, Any]] = {}
    for run in runs:
        if run.strategy == name and (run.target_epsilon == epsilon or run.target_epsilon is None):
            by_seed[run.seed] = summaries[run.key]
    missing = sorted({run.seed for run in mine} - set(by_seed))
    if missing:
        raise ConfigError(f"changes against {name!r} need its runs of seeds {missing}: run it too")
    return [by_seed[run.seed] for run in mine]


def both_accountants(summaries: list[dict[str, Any]], accountant: str, runs: int = 1) -> float | str:
    """The mean ε of runs under ``accountant`` (``rdp`` or ``prv``), whichever accountant they ran
    with: both seed papers report Opacus' RDP ε, and fairclip defaults to PRV; every run's claim
    holds the parameters (σ_eff, q, T, δ) to compute either. With ``runs`` = k > 1 (a ``per-grid``
    budget), each run's ε is that of its search: k such runs composed, k·T rounds. "inf" without
    noise; "" where the accountant refuses the parameters (PRV beyond its rounds), or where a
    run's rounds had different multipliers (``per-cohort`` with ``noise_bound = "initial"``): its
    claim holds only the last one, so only the run's own accountant (RDP) knows its ε, and that
    ε is taken."""
    values = []
    for summary in summaries:
        claim = summary["privacy"]
        if claim.get("noise_multiplier_varies"):
            if claim["accountant"] != accountant:
                return ""
            values.append(float(summary["epsilon"]) if summary["epsilon"] != "inf" else math.inf)
            continue
        try:
            values.append(
                accounting.epsilon(
                    float(claim["effective_noise_multiplier"]),
                    float(claim["sample_rate"]),
                    int(claim["rounds"]) * runs,
                    float(claim["delta"]),
                    accountant,
                )
            )
        except PolicyConfigError:
            return ""
    mean = float(np.mean(values))
    return "inf" if math.isinf(mean) else float(f"{mean:.4g}")


def paired_rows(setup: Setup, runs: list[Run], summaries: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Paired tests between the strategies run at one target ε, per metric of the setup, over the
    seeds both ran (:func:`fairclip.sims.statistics.paired_test_rows`: a seed fixes the data
    and the sampling, so two strategies' runs of one seed form a pair). The values compared are
    the metrics themselves, so for a ``relative_to`` setup the difference of two strategies'
    changes is the same number."""
    import pandas as pd

    from fairclip.sims.statistics import paired_test_rows

    records = []
    for run in runs:
        summary = summaries[run.key]
        record: dict[str, Any] = {
            "strategy": run.strategy,
            "seed": run.seed,
            "target_epsilon": _epsilon_text(run.target_epsilon) or "—",
        }
        for metric, (cohort, name) in setup.metrics.items():
            record[metric] = metric_value(summary, cohort, name)
        records.append(record)
    if not records:
        return []
    return paired_test_rows(pd.DataFrame(records), list(setup.metrics), ["target_epsilon"])


def per_seed_rows(
    setup: Setup, runs: list[Run], summaries: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """One row per final run (``per_seed.csv``): its strategy, target ε (as text), seed, each of
    the setup's metrics as the table reads it -- the change against the reference's run of the
    same seed where the setup has ``relative_to`` (0 for the reference itself) -- and each
    cohort's accuracy (absolute, ``COHORT/accuracy``), the quantities the claims and the
    fairest-policy ranking are paired tests of (:mod:`fairclip.sims.claims`)."""
    rows = []
    for strategy in setup.strategies:
        for epsilon in setup.epsilons:
            mine = [run for run in runs if run.strategy == strategy.name and run.target_epsilon == epsilon]
            if not mine:
                continue
            reference = None
            if setup.relative_to is not None:
                reference = _paired_reference(setup.relative_to, epsilon, mine, runs, summaries)
            for index, run in enumerate(mine):
                summary = summaries[run.key]
                row: dict[str, Any] = {
                    "strategy": run.strategy,
                    "target_epsilon": _epsilon_text(epsilon),
                    "seed": run.seed,
                }
                for metric, (cohort, name) in setup.metrics.items():
                    value = metric_value(summary, cohort, name)
                    if reference is not None:
                        value -= metric_value(reference[index], cohort, name)
                    row[metric] = value
                for cohort, values in summary.get("cohorts", {}).items():
                    if values.get("accuracy") is not None:
                        row[COHORT_ACCURACY.format(cohort=cohort)] = float(values["accuracy"])
                rows.append(row)
    return rows


def reference_strategy(setup: Setup) -> str | None:
    """The setup's non-private reference, against which privacy costs are measured: its
    ``relative_to``, else its strategy that runs ``none``, else None."""
    if setup.relative_to is not None:
        return setup.relative_to
    return next((s.name for s in setup.strategies if s.policy_name == "none"), None)


def claim_and_fairest_rows(
    setup: Setup, per_seed: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The setup's claims tested on ``per_seed`` (those whose strategies all ran), and its
    strategies ranked by worst-group privacy cost (:mod:`fairclip.sims.claims`)."""
    import pandas as pd

    table = pd.DataFrame(per_seed)
    if table.empty:
        return [], []
    ran = set(table["strategy"])
    claims = [c for c in setup.claims if {c.first.strategy, c.second.strategy} <= ran]
    suffix = COHORT_ACCURACY.format(cohort="")
    cohorts = [column[: -len(suffix)] for column in table.columns if column.endswith(suffix)]
    reference = reference_strategy(setup)
    fairest = fairest_rows(setup.name, table, reference if reference in ran else None, cohorts)
    return claim_rows(setup.name, claims, table), fairest


def paired_lines(tests: list[dict[str, Any]]) -> list[str]:
    """The paired tests as a Markdown section (nothing where fewer than two seeds ran)."""
    shown = [t for t in tests if t["seeds"] >= 2]
    if not shown:
        return []
    lines = [
        "## Paired tests between strategies (same seeds)",
        "",
        "Mean over seeds of A − B with the 95 % t interval and p of the two-sided paired t-test "
        "(`paired_tests.csv`): the interval leaves out 0 exactly where p < 0.05, **significant**. "
        "With 2-3 seeds these tests have little power: a difference that is not significant is "
        "not shown to be zero.",
        "",
        "| ε | metric | A − B | seeds | mean difference [95 % interval] | p | |",
        "|---|---|---|---|---|---|---|",
    ]
    for test in shown:
        low, high = test["interval_low"], test["interval_high"]
        interval = "[—]" if math.isnan(low) else f"[{low:+.4f}, {high:+.4f}]"
        lines.append(
            f"| {test['target_epsilon']} | {test['quantity']} | `{test['first']}` − `{test['second']}` | "
            f"{test['seeds']} | {test['mean_difference']:+.4f} {interval} | {test['p_value']:.3g} | "
            f"{'**significant**' if test['significant'] else ''} |"
        )
    return [*lines, ""]


def markdown(
    setup: Setup,
    rows: list[dict[str, Any]],
    wall_seconds: float,
    extra: list[str],
    tests: list[dict[str, Any]] | None = None,
    claims: list[dict[str, Any]] | None = None,
    fairest: list[dict[str, Any]] | None = None,
) -> str:
    lines = [f"# fairclip reproduce: {setup.name}", "", setup.title, ""]
    if setup.paper_epsilon is not None:
        lines += [f"Paper's ε: {setup.paper_epsilon:g}.", ""]
    lines += [
        "| strategy | ε | ε RDP / PRV | metric | paper | fairclip (mean ± s.e.) | seeds | chosen | |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        se = "" if row["fairclip_stderr"] == "" else f" ± {row['fairclip_stderr']:.4f}"
        paper = "—" if row["paper"] == "" else f"{row['paper']:.4f}"
        chosen = ", ".join(f"{k.split('.')[-1]}={v:g}" for k, v in row["grid_point"].items())
        flag = "**outside**" if row["outside"] else ""
        lines.append(
            f"| `{row['strategy']}` | {row['epsilon']} | {row['epsilon_rdp']} / {row['epsilon_prv']} | "
            f"{row['metric']} | {paper} | "
            f"{row['fairclip_mean']:.4f}{se} | {row['seeds']} | {chosen} | {flag} |"
        )
    flagged = [row for row in rows if row["outside"]]
    compared = sum(row["paper"] != "" for row in rows)
    lines += [""]
    if compared == 0:
        lines.append("No number in this table has a paper value to compare with, so nothing is flagged.")
    elif flagged:
        lines.append(
            f"{len(flagged)} of {compared} numbers with a paper value lie "
            "outside the paper's mean ± 2 combined standard errors (± 2 points where either has "
            "none): "
            + ", ".join(f"`{r['strategy']}` {r['metric']} (ε {r['epsilon']})" for r in flagged)
            + ". Likely causes are in the notes below; nothing was tuned to hit a number."
        )
    else:
        lines.append(
            f"Every number with a paper value ({compared}) lies within the paper's mean ± 2 combined "
            "s.e. (or ± 2 points)."
        )
    lines += [""]
    if claims:
        lines += [
            "## The paper's claims",
            "",
            "Each claim is a difference first − second measured on the same seeds, tested with a "
            "two-sided paired t-test: **holds** where p < 0.05 with the sign the paper claims, "
            "**reverses** where p < 0.05 with the other, **inconclusive** otherwise (`claims.csv`).",
            "",
            *claims_markdown(claims),
            "",
        ]
    if fairest:
        lines += [
            "## Which policy makes its worst group pay least",
            "",
            "Worst-group privacy cost: max over cohorts of the accuracy lost against the non-private "
            "reference of the same seed, mean over seeds with its 95 % t interval; p tests rank 1 "
            "against rank 2 on the same seeds (`fairest.csv`).",
            "",
            *fairest_markdown(fairest),
            "",
        ]
    lines += paired_lines(tests or [])
    lines += [
        notes_line(setup),
        *extra,
        "",
        f"Wall time: {wall_seconds:.1f} s.",
        "",
    ]
    return "\n".join(lines)


def budget_line(setup: Setup, planner: Planner) -> str:
    """The report's line on a ``per-grid`` budget: each strategy's k and what the ε columns are."""
    sizes = ", ".join(f"`{s.name}` {planner.search_runs(s)}" for s in setup.strategies)
    return (
        "Privacy budget per grid (`setup.budget = per-grid`): each target ε covers a strategy's whole "
        f"search of k runs ({sizes}); each run is calibrated so that k such runs compose to it, and "
        "the ε RDP / PRV columns are those of the k runs composed. The selection on the validation "
        "split and the seeds are not accounted, as in the paper."
    )


def notes_line(setup: Setup) -> str:
    """The report's line with the setup's notes (where the flags' likely causes are)."""
    return "Notes: " + " ".join(setup.notes.split())


def write_outputs(
    out: Path,
    setup: Setup,
    rows: list[dict[str, Any]],
    wall: float,
    extra: list[str],
    tests: list[dict[str, Any]] | None = None,
    per_seed: list[dict[str, Any]] | None = None,
) -> None:
    """The tables of a finished reproduction: ``reproduction.csv``, ``paired_tests.csv``,
    ``per_seed.csv``, ``claims.csv``, ``fairest.csv`` and ``reproduction.md``."""
    claims, fairest = claim_and_fairest_rows(setup, per_seed or [])
    write_csv(out / "reproduction.csv", [{column: row[column] for column in COLUMNS} for row in rows])
    write_csv(out / "paired_tests.csv", tests or [], columns=PAIRED_COLUMNS)
    write_csv(out / "per_seed.csv", per_seed or [])
    write_csv(out / "claims.csv", claims, columns=CLAIM_COLUMNS)
    write_csv(out / "fairest.csv", fairest, columns=FAIREST_COLUMNS)
    atomic_write_text(out / "reproduction.md", markdown(setup, rows, wall, extra, tests, claims, fairest))


def select_strategies(setup: Setup, names: list[str] | None) -> Setup:
    """The setup with only the strategies ``names`` (all of them for ``None``); a name the
    setup does not have is a :class:`ConfigError` naming the ones it has. A setup that reports
    changes against a reference strategy keeps that strategy."""
    if names is None:
        return setup
    known = [strategy.name for strategy in setup.strategies]
    if not names:
        raise ConfigError("--strategies names no strategy")
    for name in names:
        if name not in known:
            raise ConfigError(
                f"--strategies: setup {setup.name!r} has no strategy {name!r} (it has: {', '.join(known)})"
            )
    if setup.relative_to is not None:  # changes need the reference's runs of the same seeds
        names = [*names, setup.relative_to]
    return replace(setup, strategies=[s for s in setup.strategies if s.name in names])


def reproduce(
    name: str,
    seeds: int,
    out: Path,
    *,
    strategies: list[str] | None = None,
    data_dir: Path | None,
    full_grid: bool = False,
    grid_limit: int | None = None,
    max_rounds: int | None = None,
    max_batch: int | None = None,
    overrides: list[str] | None = None,
    address: str | None = None,
    workers: int = 1,
    resume: bool = False,
    on_finished: Callable[[Run, dict[str, Any]], None] | None = None,
    on_plan: Callable[[int], None] | None = None,
    ray: bool = True,
    on_reused: Callable[[Run, dict[str, Any]], None] | None = None,
) -> tuple[list[dict[str, Any]], float]:
    """Plan, run and tabulate one setup (only its ``strategies``, where given); returns the
    rows and the wall time in seconds. With ``resume``, runs already finished in ``out`` with
    the same configuration are reused and unfinished ones continue from their checkpoints;
    without, every run is computed from its first round. Runs are Ray tasks, or (not ``ray``)
    run one after the other in this process (:func:`execute`); with a grid, a strategy's final
    runs at an ε start once its grid runs there have finished (:class:`FinalsAfterGrid`)."""
    started = time.perf_counter()
    full_setup = load_setup(name)
    setup = select_strategies(full_setup, strategies)
    if seeds < 1:
        raise ConfigError(f"--seeds must be >= 1 (got {seeds})")
    planner = Planner(setup, data_dir, overrides or [], max_rounds, max_batch=max_batch)
    extra = []
    reused = 0
    chosen: dict[tuple[str, float | None], dict[str, Any]] = {}

    def count_reused(run: Run, summary: dict[str, Any]) -> None:
        nonlocal reused
        reused += 1
        announce = on_reused or on_finished
        if announce is not None:
            announce(run, summary)

    grid = planner.grid_runs(full_grid, grid_limit) if setup.has_grid else []
    final_count = len(setup.strategies) * len(setup.epsilons) * seeds
    if on_plan is not None:
        on_plan(len(grid) + final_count)
    # with a grid, each strategy's final runs at an ε start once its grid runs there have finished
    # (at once for a strategy without grid axes)
    first = grid + planner.ungridded_runs(seeds, full_grid) if grid else planner.final_runs(seeds, chosen)
    summaries = execute(
        first,
        out,
        data_dir=data_dir,
        address=address,
        workers=workers,
        resume=resume,
        ray=ray,
        on_finished=on_finished,
        on_reused=count_reused,
        then=FinalsAfterGrid(planner, grid, seeds, setup.select_by, chosen) if grid else None,
    )
    final = planner.final_runs(seeds, chosen) if grid else first  # in the setup's order
    missing = [run.key for run in final if run.key not in summaries]
    if missing:  # cannot happen: every grid group finishes, or execute raises
        raise RuntimeError(f"reproduce {name}: final runs that never ran: {', '.join(missing)}")
    if grid:
        extra.append(
            f"Grid search: {'the paper grid' if full_grid else 'the reduced default grid'}, "
            f"{len(grid)} runs on the validation split (seed {grid[0].seed})."
        )
    if setup.budget == "per-grid":
        extra.append(budget_line(setup, planner))
    rows = table_rows(setup, final, summaries)
    wall = time.perf_counter() - started
    if reused:
        extra.append(
            f"Resumed: {reused} finished runs in this folder were reused (`--resume`); "
            "the wall time counts this invocation only."
        )
    if len(setup.strategies) < len(full_setup.strategies):
        extra.append(
            "Strategies: "
            + ", ".join(s.name for s in setup.strategies)
            + " of the setup's "
            + ", ".join(s.name for s in full_setup.strategies)
            + " (`--strategies`)."
        )
    if overrides:
        extra.append(
            "Overrides (`--set`), applied to every run on top of the setup: "
            + ", ".join(f"`{override}`" for override in overrides)
            + "."
        )
    limits = []
    if max_rounds is not None:
        limits.append(f"at most {max_rounds} rounds per run")
    if max_batch is not None:
        limits.append(f"expected batches of at most {max_batch} examples")
    if grid_limit is not None and setup.has_grid:
        limits.append(f"only the first {grid_limit} values of each grid axis")
    if limits:
        extra.append(f"Smoke run (not a reproduction): {'; '.join(limits)}.")
    tests = paired_rows(setup, final, summaries)
    write_outputs(out, setup, rows, wall, extra, tests, per_seed_rows(setup, final, summaries))
    write_json(out / RUN_KEYS_FILE, {"grid": [run.key for run in grid], "final": [run.key for run in final]})
    in_order = [(s.name, e) for s in setup.strategies for e in setup.epsilons if (s.name, e) in chosen]
    write_json(out / "chosen.json", {f"{s}@{_epsilon_text(e) or 'none'}": chosen[s, e] for s, e in in_order})
    return rows, wall


DEFAULT_SEEDS = 2

RUN_KEYS_FILE = "runs.json"
"""The keys of a finished reproduction's grid and final runs (``runs/<key>/``), written with its
tables: other runs in the folder (a grid the setup had before, say) are not its runs."""


def reproduce_spec(
    name: str,
    seeds: int | None,
    full_grid: bool | None,
    grid_limit: int | None,
    max_rounds: int | None,
    overrides: list[str] | None,
    *,
    strategies: list[str] | None = None,
    explicit_only: bool = False,
    max_batch: int | None = None,
) -> dict[str, Any]:
    """The specification of a reproduction (what :mod:`fairclip.sims.sweep_folder` stores), with
    the defaults filled in -- or, ``explicit_only`` (``--resume``), only what was given. The
    strategies are checked against the setup here, before any work; the specification names
    them only when they are a subset (absent: all of the setup's)."""
    from fairclip.sims.sweep_folder import specification

    if strategies is not None:
        select_strategies(load_setup(name), strategies)
    options = {
        "strategies": (strategies, None),
        "seeds": (seeds, DEFAULT_SEEDS),
        "full_grid": (full_grid, False),
        "grid_limit": (grid_limit, None),
        "max_rounds": (max_rounds, None),
        "max_batch": (max_batch, None),
        "overrides": (overrides or None, []),
    }
    spec = specification("reproduce", {"name": name}, options, explicit_only)
    if spec.get("strategies", ...) is None:
        del spec["strategies"]  # all of the setup's, as in folders stored before --strategies
    if spec.get("max_batch", ...) is None:
        spec.pop("max_batch", None)  # uncapped, as in folders stored before --max-batch
    return spec


def merge_specs(stored: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """``--extend``: the stored reproduction with more seeds or more strategies (everything
    else the same)."""
    from fairclip.sims.sweep_folder import union

    extendable = ("seeds", "strategies")
    differ = sorted(
        key for key in {*stored, *given} if key not in extendable and stored.get(key) != given.get(key)
    )
    if differ:
        raise ConfigError(
            f"--extend adds seeds or strategies to the same reproduction; {', '.join(differ)} differ"
        )
    merged = {**stored, "seeds": max(stored["seeds"], given["seeds"])}
    if "strategies" in stored and "strategies" in given:
        merged["strategies"] = union(stored["strategies"], given["strategies"])
    else:
        merged.pop("strategies", None)  # one of them runs them all
    return merged


def setup_titles() -> dict[str, str]:
    return {name: read_toml(path)["setup"]["title"] for name, path in builtin_setups().items()}


__all__ = ["COLUMNS", "builtin_setups", "load_setup", "outside", "reproduce", "table_rows"]
