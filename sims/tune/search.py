"""Hyperparameter tuning by random search, with and without privacy for the search itself.

``fairclip tune`` (:func:`fairclip.api.tune`) does two selections over one grid of settings
(dotted configuration keys, each with a list of values; the grid is their product):

* **DP random search** (seed 000, section 4.3; Papernot & Steinke 2022). The number of trials K
  is drawn from a :class:`fairclip.strategies.tuning.TrialCount`; trial i runs a grid point drawn
  uniformly (with replacement) with the seed ``seed + 1 + i``; the best trial by the metric is
  released with the ε of the *whole search* (:func:`fairclip.strategies.tuning.tuning_epsilon`).
* **Non-private selection** (what ``reproduce`` does today): every grid point once with the
  scenario's seed, the best by the metric, with the ε of that one run -- which does not cover
  the selection.

The ε of the DP search covers the release of its chosen trial only: not the other trials, not
how many ran (the bound needs K to stay secret), not the non-private selection. A search's
folder therefore holds, at its top, only the search's specification and that release
(``tuning.json``, ``report.md``), and everything else in :data:`INTERNAL` (not DP-protected,
see :data:`SEARCH_NOTE`): ``trials.csv`` and ``grid.csv``, written as each run finishes,
``search.json`` (the draw of K and of the trials' grid points, which comes from the tuning seed
alone and is fixed before any run) and a report of every run. ``resume`` continues a folder from
the runs it holds (one written before this layout is moved into it first). The metric is read
from the run's final evaluation (its ``overall`` block), which the bound treats as public, as
the paper's experiments do.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fairclip.atomic import atomic_write_text, json_normalised, write_csv, write_json, write_note
from fairclip.scenarios.config import (
    canonical_mapping,
    canonical_raw,
    check_overrides_used,
    set_value,
    validate,
)
from fairclip.scenarios.errors import ConfigError
from fairclip.scenarios.tasks import build_task
from fairclip.server.privacy_plan import plan_privacy
from fairclip.sims.sweeps.folder import (
    TUNE_SPEC_FILE,
    locked,
    refuse_another_commands_folder,
)
from fairclip.strategies.accountants import rdp_epsilon
from fairclip.strategies.errors import PolicyConfigError
from fairclip.strategies.registry import build_policy
from fairclip.strategies.tuning import TrialCount, trial_rdp, tuning_epsilon

METRICS = {
    "accuracy": "max",
    "macro_accuracy": "max",
    "worst_class_accuracy": "max",
    "worst_cohort_accuracy": "max",
    "loss": "min",
    "cohort_accuracy_gap": "min",
    "demographic_parity_difference": "min",
    "equalized_odds_difference": "min",
}
"""Metrics a search can select by (keys of a run's ``overall`` results), and their direction."""

REPORTED = ("accuracy", "macro_accuracy", "worst_cohort_accuracy", "cohort_accuracy_gap")
TUNING_STREAM = 0x74756E65
"""Seeds the draw of K and of the trials' grid points apart from every run's own streams."""
SPEC_FILE = TUNE_SPEC_FILE
INTERNAL = "not-dp-protected"
"""Folder, inside a search's or a curve's, of what the DP search's ε does not cover."""
PLAN_FILE = "search.json"
"""In :data:`INTERNAL`: the trials' grid points (so K) and the full result of both selections."""
RUN_TABLES = {"trial": "trials.csv", "grid": "grid.csv"}
"""The table of each kind of a search's runs (DP trials, grid points), in :data:`INTERNAL`."""
EPSILON_COVERS = "the whole DP search: the chosen configuration and its metrics, nothing else"
SEARCH_NOTE = """NOT DP-PROTECTED: keep these files to yourself, never publish them.

The ε of a DP random search (Papernot & Steinke 2022) covers the release of its chosen trial
only: the configuration and metrics in ../report.md and in the result of ../tuning.json. It does
not cover what is here: every trial's settings, seed and metrics (trials.csv); how many trials
were drawn and which grid point each ran (search.json) -- the bound holds only while the number
of trials stays secret; and the runs of the non-private selection over the whole grid
(grid.csv), whose ε covers one run, not the choice. report.md here shows them all. The tuning
seed in ../tuning.json draws the number of trials again: where the search itself must be
private, keep that seed secret too.
"""


@dataclass(frozen=True)
class TuneSpec:
    """Everything that decides a search's runs."""

    raw: dict[str, Any]
    grid: dict[str, list[Any]]
    metric: str
    trials: TrialCount
    seed: int
    grid_baseline: bool = True
    search_index: int = 0
    """Which of several searches sharing the tuning seed this is (:func:`fairclip.api.tune_curve`
    numbers its searches): each draws its trials independently."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "raw": self.raw,
            "grid": self.grid,
            "metric": self.metric,
            "trials": asdict(self.trials),
            "seed": self.seed,
            "grid_baseline": self.grid_baseline,
            "search_index": self.search_index,
        }


def stored_search(out: Path) -> TuneSpec:
    """The search stored in ``out`` (its ``tuning.json``), to continue it from the folder alone;
    :class:`ConfigError` where there is none or it cannot be read."""
    path = Path(out) / SPEC_FILE
    if not path.is_file():
        raise ConfigError(f"{out} holds no search to resume ({SPEC_FILE} is missing)")
    try:
        stored = json.loads(path.read_text())
        return TuneSpec(
            raw=canonical_raw(stored["raw"], quiet=True),
            grid={key: list(values) for key, values in canonical_mapping(stored["grid"], quiet=True).items()},
            metric=stored["metric"],
            trials=TrialCount(**stored["trials"]),
            seed=int(stored["seed"]),
            grid_baseline=bool(stored.get("grid_baseline", True)),
            search_index=int(stored.get("search_index", 0)),
        )
    except (OSError, ValueError, KeyError, TypeError, PolicyConfigError) as error:
        raise ConfigError(f"{path} is unreadable ({error!r}); use a new --out folder") from None


def grid_points(grid: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """The product of the grid's values, one settings dict per point (keys in the given order);
    an empty grid is one point, the configuration as given (the search then picks among seeds)."""
    keys = list(grid)
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*(grid[k] for k in keys))]


def check_spec(spec: TuneSpec) -> list[dict[str, Any]]:
    """Refuse, before any work, a grid or metric no search can use; return every grid point's
    raw configuration (each validated)."""
    if spec.metric not in METRICS:
        raise ConfigError(f"metric must be one of {', '.join(METRICS)} (got {spec.metric!r})")
    for key, values in spec.grid.items():
        if not values:
            raise ConfigError(f"grid key {key} has no values")
        if key == "seed" or key.startswith("scenario."):
            raise ConfigError(f"grid key {key}: tune searches training, policy and privacy settings only")
    configs = []
    deltas = set()
    for point in grid_points(spec.grid):
        raw = spec.raw
        for key, value in point.items():
            raw = set_value(raw, key, value)
        config = validate(raw)
        if config.policy.name == "none":
            raise ConfigError("tune needs a private policy (policy none has no privacy to account)")
        check_overrides_used(raw, point)  # a point whose key the configuration drops
        deltas.add(config.privacy.delta)
        configs.append(raw)
    if len(deltas) > 1:
        raise ConfigError("every grid point must share one privacy.delta: the search's ε is stated at one δ")
    return configs


def draw_trials(spec: TuneSpec, points: int) -> list[int]:
    """The grid point of each trial: K ~ the trial distribution, then K uniform draws."""
    rng = np.random.default_rng([spec.seed, TUNING_STREAM, spec.search_index])
    count = spec.trials.sample(rng)
    return [int(i) for i in rng.integers(points, size=count)]


def trial_plans(
    configs: list[dict[str, Any]], data_dir: Path | None
) -> tuple[list[tuple[float, float, int]], set[str]]:
    """(σ_eff, q, rounds) of each grid point's run, as its executor will plan it; and the overall
    results a run of this scenario gives (read from one evaluation of its initial model), so a
    metric no run reports is refused before any run."""

    first = validate(configs[0])
    task = build_task(first, data_dir)
    model = task.initial_model()
    dimension = model.shape[0]
    reported = set(task.evaluate(model)[0])
    group_metrics = getattr(task, "group_metrics", None)
    grouped = group_metrics(model) if group_metrics is not None else None
    if grouped is not None:
        reported |= set(grouped[0])
    plans = []
    for raw in configs:
        config = validate(raw)
        policy = build_policy(config.policy.name, config.policy.params, num_cohorts=len(task.cohort_names))
        # a trial's RDP is its planned (σ_eff, q, T): refuse runs whose releases that does not describe
        if policy.noises_below_sensitivity:
            raise ConfigError(
                f"tune: policy {config.policy.name!r} noises below its sensitivity (each round's "
                "multiplier follows its own counts), so no trial's privacy can be planned: use "
                "policy.noise_bound = max"
            )
        if config.evaluation.clients:
            raise ConfigError(
                "tune: evaluation.clients releases the clients' evaluations beside the training, "
                "which a trial's planned privacy does not count: set evaluation.clients = false"
            )
        plan = plan_privacy(config, policy, dimension)
        plans.append((plan.effective_noise_multiplier, plan.sample_rate, plan.rounds_allowed))
    return plans, reported


def better(metric: str, a: float, b: float) -> bool:
    """Whether value ``a`` beats ``b`` (NaN never does)."""
    if math.isnan(a):
        return False
    if math.isnan(b):
        return True
    return a > b if METRICS[metric] == "max" else a < b


def best_row(table: pd.DataFrame, metric: str) -> pd.Series | None:
    """The first row with the best ``metric`` (None for an empty table)."""
    best = None
    for _, row in table.iterrows():
        if best is None or better(metric, float(row[metric]), float(best[metric])):
            best = row
    return best


def result_row(
    kind: str, index: int, point: dict[str, Any], seed: int, summary: dict[str, Any]
) -> dict[str, Any]:
    """One finished run as a row of ``trials.csv`` or ``grid.csv``."""
    overall = summary.get("overall", {})
    epsilon = summary["epsilon"]
    row: dict[str, Any] = {kind: index, "seed": seed, **point}
    for name in dict.fromkeys((*REPORTED, *METRICS)):
        row[name] = float(overall.get(name, math.nan))
    row["epsilon_run"] = math.inf if epsilon == "inf" else float(epsilon)
    row["rounds_completed"] = summary.get("rounds_completed")
    return row


@dataclass(frozen=True)
class Tuning:
    """What a search produced, all of it, for the process that ran the search.

    The ε of the search covers only :meth:`release` (``best`` without its ``trial`` index and
    ``seed``, which tell how many trials ran) with ``epsilon``, ``delta`` and the public
    ``epsilon_trial_rdp`` and ``trial_count``; :meth:`dp_summary` is that release as a table.
    Not DP-protected, never to publish: ``trials`` (every trial, and K = their number),
    ``grid`` and ``grid_best`` (the non-private selection), :meth:`summary`.
    """

    trials: pd.DataFrame
    """One row per DP-search trial: its grid point, seed, metrics and its own run's ε (not
    DP-protected)."""
    grid: pd.DataFrame | None
    """One row per grid point run once (the non-private selection), or None (not DP-protected)."""
    best: pd.Series | None
    """The DP search's released trial (None when K = 0); its ``trial`` and ``seed`` are not
    released (:meth:`release`)."""
    grid_best: pd.Series | None
    """The non-private selection's best grid point (not DP-protected)."""
    epsilon: float
    """ε of the whole DP search at ``delta`` (Papernot & Steinke, converted from RDP)."""
    epsilon_trial_rdp: float
    """ε of one trial alone by RDP (what the search's ε is compared with)."""
    delta: float
    run_accountant: str
    """The accountant of each run's own ε (``epsilon_run``; the search's ε is RDP's)."""
    trial_count: TrialCount
    metric: str

    def summary(self) -> pd.DataFrame:
        """The two selections side by side: chosen settings, metrics and the ε each covers (not
        DP-protected: the non-private selection is not covered by the search's ε)."""
        rows = []
        if self.grid_best is not None:
            rows.append(
                _selection(
                    "non-private selection (every grid point)",
                    self.grid_best,
                    self.grid_best["epsilon_run"],
                    self.run_accountant,
                    "the chosen run only",
                )
            )
        return pd.DataFrame(rows + self._dp_rows())

    def dp_summary(self) -> pd.DataFrame:
        """The DP search's release alone as :meth:`summary` shows it (no row when nothing was
        released): what the search's ε covers."""
        return pd.DataFrame(self._dp_rows())

    def _dp_rows(self) -> list[dict[str, Any]]:
        if self.best is None:
            return []
        return [_selection("DP random search", self.best, self.epsilon, "rdp", "the whole search")]

    def release(self) -> dict[str, Any]:
        """What the search publishes, all covered by its ε: the chosen trial's settings,
        metrics, own run's ε and rounds (``best`` None when nothing was released), and the ε of
        the whole search with its δ and accountant; E[K] and one trial's ε are public."""
        best = None
        if self.best is not None:
            best = _plain(self.best.drop(labels=["trial", "seed"], errors="ignore"))
        return {
            "best": best,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "accountant": "rdp",
            "epsilon_covers": EPSILON_COVERS,
            "epsilon_trial_rdp": self.epsilon_trial_rdp,
            "expected_trials": self.trial_count.expected,
        }


def _plain(row: pd.Series | None) -> dict[str, Any] | None:
    """A table row as a JSON-ready dict (numpy scalars as Python ones)."""
    if row is None:
        return None
    return {str(k): (v.item() if hasattr(v, "item") else v) for k, v in row.items()}


def _selection(name: str, row: pd.Series, epsilon: float, accountant: str, covers: str) -> dict[str, Any]:
    keys = [k for k in row.index if "." in str(k)]
    return {
        "selection": name,
        "settings": ", ".join(f"{k}={row[k]}" for k in keys),
        **{m: row[m] for m in REPORTED},
        "epsilon": epsilon,
        "accountant": accountant,
        "epsilon_covers": covers,
    }


def run_search(
    spec: TuneSpec,
    *,
    out: Path | None,
    resume: bool,
    data_dir: Path | None,
    run: Callable[[list[tuple[tuple[str, int], dict[str, Any]]]], Generator[Any, None, None]],
    on_start: Callable[[int, int], None] | None = None,
    on_run: Callable[[str, dict[str, Any]], None] | None = None,
) -> Tuning:
    """Plan, run and select (module docstring). ``run(jobs)`` yields ((kind, index), result)
    for each (item, raw configuration) job as it finishes -- in this process or on Ray; it is
    closed when the search stops early (an error, Ctrl-C), so that runs still going stop too."""
    configs = check_spec(spec)
    points = grid_points(spec.grid)
    try:
        plans, reported = trial_plans(configs, data_dir)
        rdp = trial_rdp(plans)
        delta = validate(configs[0]).privacy.delta
        epsilon = tuning_epsilon(rdp, spec.trials, delta)
    except PolicyConfigError as error:
        raise ConfigError(f"privacy: {error}") from None
    if spec.metric not in reported:
        raise ConfigError(
            f"metric {spec.metric} is not among this scenario's results ({', '.join(sorted(reported))})"
        )

    epsilon_trial = rdp_epsilon(rdp, delta) if not np.all(np.isinf(rdp)) else math.inf
    drawn = draw_trials(spec, len(points))
    base_seed = validate(spec.raw).seed
    stored = spec.as_dict()
    with locked(out) if out is not None else contextlib.nullcontext():  # one process per folder
        done: dict[str, list[dict[str, Any]]] = {"trial": [], "grid": []}
        if out is not None:
            done = _settle_folder(out, stored, drawn, resume)
        finished = {(kind, int(row[kind])) for kind in done for row in done[kind]}
        jobs = []
        for i, point_index in enumerate(drawn):
            if ("trial", i) not in finished:
                jobs.append((("trial", i), set_value(configs[point_index], "seed", base_seed + 1 + i)))
        if spec.grid_baseline:
            for j in range(len(points)):
                if ("grid", j) not in finished:
                    jobs.append((("grid", j), set_value(configs[j], "seed", base_seed)))
        if on_start is not None:
            on_start(len(drawn) + (len(points) if spec.grid_baseline else 0), len(jobs))
        finished = run(jobs)
        with contextlib.closing(finished):  # stopped here, the runs still going stop too
            for (kind, index), result in finished:
                summary = result["summary"]
                point = points[drawn[index]] if kind == "trial" else points[index]
                seed = base_seed + 1 + index if kind == "trial" else base_seed
                if spec.metric not in summary.get("overall", {}):
                    raise ConfigError(f"metric {spec.metric} is not among this scenario's results")
                done[kind].append(result_row(kind, index, point, seed, summary))
                if out is not None:
                    write_csv(out / INTERNAL / RUN_TABLES[kind], sorted(done[kind], key=lambda r: r[kind]))
                if on_run is not None:
                    on_run(f"{kind}-{index}", result)
        trials = pd.DataFrame(sorted(done["trial"], key=lambda r: r["trial"]))
        grid = pd.DataFrame(sorted(done["grid"], key=lambda r: r["grid"])) if spec.grid_baseline else None
        tuning = Tuning(
            trials=trials,
            grid=grid,
            best=best_row(trials, spec.metric) if not trials.empty else None,
            grid_best=best_row(grid, spec.metric) if grid is not None and not grid.empty else None,
            epsilon=epsilon,
            epsilon_trial_rdp=epsilon_trial,
            delta=delta,
            run_accountant=validate(configs[0]).privacy.accountant,
            trial_count=spec.trials,
            metric=spec.metric,
        )
        if out is not None:
            write_results(out, stored, drawn, tuning)
    return tuning


def write_results(out: Path, stored: dict[str, Any], drawn: list[int], tuning: Tuning) -> None:
    """A finished search's files: its specification and DP release at the top of ``out``
    (``tuning.json``, ``report.md``), the rest in :data:`INTERNAL`."""
    write_json(out / INTERNAL / PLAN_FILE, {"trial_points": drawn, "result": _internal_record(tuning)})
    atomic_write_text(out / INTERNAL / "report.md", internal_report(tuning))
    write_json(out / SPEC_FILE, stored | {"result": tuning.release()})
    atomic_write_text(out / "report.md", report(tuning))


def _settle_folder(
    out: Path, stored: dict[str, Any], drawn: list[int], resume: bool
) -> dict[str, list[dict[str, Any]]]:
    """Store the search's plan in ``out`` (a new folder), or with ``resume`` check it is the one
    stored (moving a folder of the layout before :data:`INTERNAL` into it) and return the runs
    already there."""
    spec_file = out / SPEC_FILE
    refuse_another_commands_folder(out, SPEC_FILE)
    if not spec_file.exists():
        if resume:
            raise ConfigError(f"{out} holds no search to resume ({SPEC_FILE} is missing)")
        _store_plan(out, drawn)
        write_json(spec_file, stored)
        return {"trial": [], "grid": []}
    if not resume:
        raise ConfigError(f"{out} already holds a search: resume it (--resume) or use a new --out folder")
    previous = json.loads(spec_file.read_text())
    if isinstance(previous.get("raw"), dict):  # written before policy.* was named so: strategy.*
        previous["raw"] = canonical_raw(previous["raw"], quiet=True)
    if isinstance(previous.get("grid"), dict):
        previous["grid"] = canonical_mapping(previous["grid"], quiet=True)
    old_points = previous.pop("trial_points", None)  # the layout before INTERNAL stored them here
    previous.pop("result", None)
    plan = out / INTERNAL / PLAN_FILE
    planned = old_points
    if planned is None and plan.exists():
        planned = _stored_points(plan)
    if json_normalised(stored) != previous or planned not in (None, drawn):
        raise ConfigError(f"{out} holds a different search; use a new --out folder")
    _store_plan(out, drawn)
    if old_points is not None or any((out / name).exists() for name in RUN_TABLES.values()):
        _move_old_layout(out, stored)
    done: dict[str, list[dict[str, Any]]] = {"trial": [], "grid": []}
    for kind, name in RUN_TABLES.items():
        if (out / INTERNAL / name).exists():
            done[kind] = pd.read_csv(out / INTERNAL / name).to_dict("records")
    return done


def _stored_points(plan: Path) -> list[int] | None:
    """The trials' grid points stored in :data:`PLAN_FILE`."""
    return json.loads(plan.read_text()).get("trial_points")


def _store_plan(out: Path, drawn: list[int]) -> None:
    """:data:`INTERNAL` with its note and the trials' grid points, unless there already."""
    write_note(out / INTERNAL, SEARCH_NOTE)
    if not (out / INTERNAL / PLAN_FILE).exists():
        write_json(out / INTERNAL / PLAN_FILE, {"trial_points": drawn})


def _move_old_layout(out: Path, stored: dict[str, Any]) -> None:
    """Move a search folder of the layout before :data:`INTERNAL` (every run's table, K and the
    full report at its top) into this one: the tables and the report into :data:`INTERNAL`, then
    ``tuning.json`` rewritten without the trials' grid points and the old result. Each step can
    be repeated, so a move cut short is finished by the next resume."""
    for name in (*RUN_TABLES.values(), "report.md"):
        if (out / name).exists():
            os.replace(out / name, out / INTERNAL / name)
    write_json(out / SPEC_FILE, stored)


def _internal_record(tuning: Tuning) -> dict[str, Any]:
    """The full result of both selections (not DP-protected)."""
    return {
        "epsilon": tuning.epsilon,
        "epsilon_trial_rdp": tuning.epsilon_trial_rdp,
        "delta": tuning.delta,
        "trials_run": len(tuning.trials),
        "expected_trials": tuning.trial_count.expected,
        "best": _plain(tuning.best),
        "grid_best": _plain(tuning.grid_best),
    }


def _epsilon_line(tuning: Tuning) -> str:
    return (
        f"ε of the whole DP search: **{tuning.epsilon:.4g}** at δ = {tuning.delta:g} (RDP, Papernot & "
        f"Steinke 2022); one trial alone: {tuning.epsilon_trial_rdp:.4g} (RDP)."
    )


def report(tuning: Tuning) -> str:
    """``report.md``: the DP search's release only (what its ε covers), and where the rest is."""
    released = tuning.dp_summary()
    lines = [
        "# fairclip tune: the DP random search's result",
        "",
        f"Selected by **{tuning.metric}** ({METRICS[tuning.metric]}imise) among a random number of "
        f"trials ({tuning.trial_count.describe()}).",
        "",
        markdown_table(released) if not released.empty else "The search released no result.",
        "",
        f"{_epsilon_line(tuning)} It covers this result -- the chosen configuration and its metrics "
        "-- and nothing else.",
        "",
        "Like every fairclip simulation, the search is reproducible: the number of trials and their "
        "grid points follow the tuning seed, and each trial's sampling (and its noise, unless "
        "privacy.secure_noise) follows the run's seed, both in tuning.json. The ε holds against "
        "whoever does not know those seeds; it is a property of the mechanism, not a guarantee to "
        "anyone holding tuning.json.",
        "",
        f"Every trial, how many ran and the non-private selection over the grid are in `{INTERNAL}/`: "
        "not DP-protected, never publish them (see its README.txt).",
        "",
    ]
    return "\n".join(lines)


def internal_report(tuning: Tuning) -> str:
    """:data:`INTERNAL`'s ``report.md``: the two selections, every trial, every grid point."""
    lines = [
        "# fairclip tune: every run (NOT DP-PROTECTED, never publish)",
        "",
        f"Selected by **{tuning.metric}** ({METRICS[tuning.metric]}imise). Number of trials: "
        f"{tuning.trial_count.describe()}; drawn: {len(tuning.trials)}.",
        "",
        f"{_epsilon_line(tuning)} It covers the DP search's chosen result only (../report.md), not "
        "this file. The non-private selection's ε covers its chosen run only, not the choice.",
        "",
        markdown_table(tuning.summary()),
        "",
        "## DP search trials",
        "",
        markdown_table(tuning.trials) if not tuning.trials.empty else "(K = 0: no trial ran)",
        "",
    ]
    if tuning.grid is not None and not tuning.grid.empty:
        lines += ["## Grid points (non-private selection)", "", markdown_table(tuning.grid), ""]
    return "\n".join(lines)


def markdown_table(table: pd.DataFrame) -> str:
    """A table as Markdown, numbers to 4 significant digits."""

    def cell(value: Any) -> str:
        if isinstance(value, float | np.floating):
            return f"{value:.4g}"
        return str(value)

    lines = ["| " + " | ".join(map(str, table.columns)) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines)
