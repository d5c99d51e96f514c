"""``fairclip reproduce``: the seed papers' centralised experiments as sample-level fairclip runs.

A setup file (``sims/reproduce/builtin/<name>.toml``) names a built-in scenario, the settings that
turn it into the paper's experiment, the policies with their own settings (learning rate,
bounds) and the paper's numbers. DP-SGD with Poisson batches of expected size b over N training
examples is the special case of user-level DP-FedAvg where every example is a client
(``scenario.partition = "per-example"``) that takes one step with client learning rate 1, so
that its update is Δ_i = −∇ℓ_i and the paper's learning rate is the server learning rate
(docs/design.md, section 2). So a setup runs with

    federation.num_clients = N (of that seed's data),  q = b / N (q = 1 for "full" batches),
    training.rounds = ceil(epochs · N / b),

with the setup's epochs and b, or a policy's own (``epochs``, ``batch_size`` in its table: a
paper that trains its non-private model with other epochs and batches than its private ones).

Setups with a ``[grid]`` (Zhao et al.) choose, per policy and target ε, the grid point with the
best overall accuracy on a *validation split* of the training rows (``scenario.evaluate_on =
"validation"``, the first seed); the test rows are never used to select: where a seed splits
the rows into training and test rows (Adult, Dutch), every run of such a setup splits them as the
first seed does (``scenario.split_seed``), and the other seeds vary the rest (initialisation,
batches, noise). The chosen settings then run on
the test split with every seed: a policy's final runs at an ε start as soon as its own grid runs
there have finished, while the rest of the grid still runs. Every run is one Ray task (like
``fairclip compare``), written atomically into ``DIR/runs/<key>/`` as it finishes;
``DIR/reproduction.csv`` and ``DIR/reproduction.md`` are written at the end.

A setup with ``budget = "per-grid"`` (seed 002) spends each target ε on a policy's whole grid
search rather than on each run: every run of a policy with k grid points, final runs included,
is calibrated so that k such runs compose to ε (:func:`per_run_epsilon`), and the table gives the
ε of the k runs composed.

A fairclip mean is flagged when it lies outside the paper's mean ± 2 combined standard errors,
2·sqrt(se_paper² + se_fairclip²), where both give one, and outside ± 2 points (0.02) otherwise.

Each run's metrics are kept by seed (``per_seed.csv``), and the paper's qualitative claims
(``[[claims]]`` of the setup file) are tested on them with paired tests (``claims.csv``), beside
the setup's answer to which policy makes its worst group pay least (``fairest.csv``;
:mod:`fairclip.sims.reproduce.claims`). A paper that reports a policy's costs against the
non-private run of the same seed (seed 003's privacy costs and excessive risks, and their gaps)
has them as paired metrics (``[setup.paired_metrics]``,
:mod:`fairclip.sims.reproduce.paired_metrics`): rows of the table and columns of
``per_seed.csv`` like any metric.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fairclip.atomic import write_json
from fairclip.scenarios.config import canonical_assignments
from fairclip.scenarios.errors import ConfigError
from fairclip.sims.reproduce.claims import (
    epsilon_text,
)
from fairclip.sims.reproduce.planning import FinalsAfterGrid, Planner, execute
from fairclip.sims.reproduce.setups import Run, load_setup, select_policies
from fairclip.sims.reproduce.tables import budget_line, paired_rows, per_seed_rows, table_rows, write_outputs
from fairclip.sims.sweeps.folder import specification, union


def reproduce(
    name: str,
    seeds: int,
    out: Path,
    *,
    policies: list[str] | None = None,
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
    """Plan, run and tabulate one setup (only its ``policies``, where given); returns the
    rows and the wall time in seconds. With ``resume``, runs already finished in ``out`` with
    the same configuration are reused and unfinished ones continue from their checkpoints;
    without, every run is computed from its first round. Runs are Ray tasks, or (not ``ray``)
    run one after the other in this process (:func:`execute`); with a grid, a policy's final
    runs at an ε start once its grid runs there have finished (:class:`FinalsAfterGrid`)."""
    started = time.perf_counter()
    full_setup = load_setup(name)
    setup = select_policies(full_setup, policies)
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
    final_count = len(setup.policies) * len(setup.epsilons) * seeds
    if on_plan is not None:
        on_plan(len(grid) + final_count)
    # with a grid, each policy's final runs at an ε start once its grid runs there have finished
    # (at once for a policy without grid axes)
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
    per_seed = per_seed_rows(setup, final, summaries)
    rows = table_rows(setup, final, summaries, per_seed)
    wall = time.perf_counter() - started
    if reused:
        extra.append(
            f"Resumed: {reused} finished runs in this folder were reused (`--resume`); "
            "the wall time counts this invocation only."
        )
    if len(setup.policies) < len(full_setup.policies):
        extra.append(
            "Policies: "
            + ", ".join(s.name for s in setup.policies)
            + " of the setup's "
            + ", ".join(s.name for s in full_setup.policies)
            + " (`--policies`)."
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
    write_outputs(out, setup, rows, wall, extra, tests, per_seed)
    write_json(out / RUN_KEYS_FILE, {"grid": [run.key for run in grid], "final": [run.key for run in final]})
    in_order = [(s.name, e) for s in setup.policies for e in setup.epsilons if (s.name, e) in chosen]
    write_json(out / "chosen.json", {f"{s}@{epsilon_text(e) or 'none'}": chosen[s, e] for s, e in in_order})
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
    policies: list[str] | None = None,
    explicit_only: bool = False,
    max_batch: int | None = None,
) -> dict[str, Any]:
    """The specification of a reproduction (what :mod:`fairclip.sims.sweeps.folder` stores), with
    the defaults filled in -- or, ``explicit_only`` (``--resume``), only what was given. The
    policies are checked against the setup here, before any work; the specification names
    them only when they are a subset (absent: all of the setup's)."""

    if policies is not None:
        select_policies(load_setup(name), policies)
    options = {
        "policies": (policies, None),
        "seeds": (seeds, DEFAULT_SEEDS),
        "full_grid": (full_grid, False),
        "grid_limit": (grid_limit, None),
        "max_rounds": (max_rounds, None),
        "max_batch": (max_batch, None),
        "overrides": (canonical_assignments(overrides) if overrides else None, []),
    }
    spec = specification("reproduce", {"name": name}, options, explicit_only)
    if spec.get("policies", ...) is None:
        del spec["policies"]  # all of the setup's, as in folders stored before --policies
    if spec.get("max_batch", ...) is None:
        spec.pop("max_batch", None)  # uncapped, as in folders stored before --max-batch
    return spec


def merge_specs(stored: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """``--extend``: the stored reproduction with more seeds or more policies (everything
    else the same)."""

    extendable = ("seeds", "policies")
    differ = sorted(
        key for key in {*stored, *given} if key not in extendable and stored.get(key) != given.get(key)
    )
    if differ:
        raise ConfigError(
            f"--extend adds seeds or policies to the same reproduction; {', '.join(differ)} differ"
        )
    merged = {**stored, "seeds": max(stored["seeds"], given["seeds"])}
    if "policies" in stored and "policies" in given:
        merged["policies"] = union(stored["policies"], given["policies"])
    else:
        merged.pop("policies", None)  # one of them runs them all
    return merged
