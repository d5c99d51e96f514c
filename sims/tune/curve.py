"""A tuning curve: one DP random search per policy and target ε (seed 000, Figure 4).

``fairclip tune --policies ... --epsilons ...`` (:func:`fairclip.api.tune_curve`) runs one search
(:mod:`fairclip.sims.tune.search`) per policy and target ε of a run, each into
``out/<policy>__eps-<ε>/``, and draws the best result of each against the ε of its whole search:
``curve.csv``, ``tuning_curve.png`` and ``report.md`` of each search's release only at the top of
``out``, every column in ``out/not-dp-protected/``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fairclip.atomic import atomic_write_text, write_csv, write_note
from fairclip.scenarios.config import canonical_mapping
from fairclip.scenarios.errors import ConfigError
from fairclip.sims.sweeps.folder import TUNE_CURVE_FILE, canonical_keys, read_table
from fairclip.sims.tune.search import INTERNAL, Tuning, markdown_table
from fairclip.strategies.tuning import TrialCount

CURVE_NOTE = """NOT DP-PROTECTED: keep these files to yourself, never publish them.

The public curve (../curve.csv, ../tuning_curve.png, ../report.md) holds each DP random search's
chosen result and the ε of its whole search (Papernot & Steinke 2022), nothing else. Those ε do
not cover what is here: how many trials each search drew (column trials), and the non-private
selection over the whole grid (columns grid_*), whose ε covers one run, not the choice; the plot
and report here draw both. Each search's own folder has its not-dp-protected/ too.
"""


CURVE_SPEC_FILE = "tuning-curve.json"
"""Where a tuning curve keeps what it was asked (scenario or config file, overrides, grid,
policies, target ε and the search options), so that ``--resume --out DIR`` alone continues it."""


def stored_curve(folder: Path) -> dict[str, Any]:
    """The options of the tuning curve stored in ``folder`` (:data:`CURVE_SPEC_FILE`)."""
    path = Path(folder) / CURVE_SPEC_FILE
    if not path.is_file():
        raise ConfigError(
            f"{folder} holds a tuning curve without {CURVE_SPEC_FILE} (written before it was kept): "
            "resume it with its --policies, --epsilons, --grid and scenario"
        )
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ConfigError(f"{path} is unreadable ({error}); use a new --out folder") from None
    stored = canonical_keys(stored)  # written before issue 66: strategies
    for key in ("grid", "overrides"):  # written before policy.* was named so: strategy.*
        if isinstance(stored.get(key), dict):
            stored[key] = canonical_mapping(stored[key], quiet=True)
    return stored


CURVE_FILE = TUNE_CURVE_FILE


CURVE_PLOT = "tuning_curve.png"


def policy_grid(grid: Mapping[str, Sequence[Any]], policy: str) -> dict[str, list[Any]]:
    """The grid keys that apply to ``policy``: every key but another policy's own table
    (``policy.<other>.<parameter>``)."""
    kept = {}
    for key, values in grid.items():
        parts = key.split(".")
        if len(parts) > 2 and parts[0] == "policy" and parts[1] != policy:
            continue
        kept[key] = list(values)
    return kept


def search_key(policy: str, target: float) -> str:
    return f"{policy}__eps-{target:g}"


def curve_row(policy: str, target: float, tuning: Tuning) -> dict[str, Any]:
    """One search as a row of :data:`INTERNAL`'s ``curve.csv`` (every column; the public curve
    keeps :func:`curve_public_columns`)."""
    metric = tuning.metric
    return {
        "policy": policy,
        "target_epsilon": target,
        "trials": len(tuning.trials),
        "epsilon_search": tuning.epsilon,
        "epsilon_trial_rdp": tuning.epsilon_trial_rdp,
        f"dp_search_{metric}": math.nan if tuning.best is None else float(tuning.best[metric]),
        f"grid_{metric}": math.nan if tuning.grid_best is None else float(tuning.grid_best[metric]),
        "grid_epsilon_run": math.nan if tuning.grid_best is None else float(tuning.grid_best["epsilon_run"]),
    }


def curve_public_columns(metric: str) -> list[str]:
    """The columns of :func:`curve_row` that each search's ε covers (its release; the target ε
    and one trial's ε are public choices): not the number of trials, not the grid selection."""
    return ["policy", "target_epsilon", "epsilon_search", "epsilon_trial_rdp", f"dp_search_{metric}"]


def write_curve_rows(folder: Path, rows: list[dict[str, Any]], metric: str) -> None:
    """``curve.csv`` of the searches finished so far: the public columns at the top of
    ``folder``, every column in :data:`INTERNAL`."""
    write_note(folder / INTERNAL, CURVE_NOTE)
    write_csv(folder / INTERNAL / CURVE_FILE, rows)
    write_csv(folder / CURVE_FILE, pd.DataFrame(rows)[curve_public_columns(metric)].to_dict("records"))


def write_curve_report(folder: Path, table: pd.DataFrame, metric: str, trials: TrialCount) -> None:
    """The curve's plot and report: of the public columns at the top of ``folder``, of every
    column (with the non-private selection) in :data:`INTERNAL`."""
    public = table[curve_public_columns(metric)]
    plot_curve(public, metric, folder / CURVE_PLOT)
    atomic_write_text(folder / "report.md", curve_report(public, metric, trials))
    plot_curve(table, metric, folder / INTERNAL / CURVE_PLOT)
    atomic_write_text(folder / INTERNAL / "report.md", curve_report(table, metric, trials, internal=True))


def move_old_curve(folder: Path, metric: str) -> None:
    """Move what a curve folder of the layout before :data:`INTERNAL` shows beyond each search's
    release (the number of trials, the grid selection) into :data:`INTERNAL`: its report and plot,
    and its ``curve.csv``, of which the public columns stay (a resumed curve writes all again)."""
    curve = folder / CURVE_FILE
    if not curve.is_file():
        return
    table = read_table(curve)
    public = [column for column in table.columns if column in curve_public_columns(metric)]
    if len(public) == len(table.columns):
        return
    write_note(folder / INTERNAL, CURVE_NOTE)
    for name in ("report.md", CURVE_PLOT):
        if (folder / name).exists():
            os.replace(folder / name, folder / INTERNAL / name)
    write_csv(folder / INTERNAL / CURVE_FILE, table.to_dict("records"))
    write_csv(curve, table[public].to_dict("records"))


def plot_curve(table: pd.DataFrame, metric: str, path: Path) -> None:
    """Best ``metric`` against ε: the DP search against the ε of the whole search (solid), the
    non-private selection against its chosen run's ε (dotted, where ``table`` has it), one
    colour per policy."""
    from fairclip.sims.sweeps.plots import plt, policy_styles, save  # matplotlib: only to draw

    figure, axes = plt.subplots(figsize=(6.4, 4.2))
    styles = policy_styles(table["policy"])
    grid = f"grid_{metric}" in table
    for policy, rows in table.groupby("policy", sort=False):
        colour = styles[str(policy)].colour
        rows = rows.sort_values("target_epsilon")
        axes.plot(rows["epsilon_search"], rows[f"dp_search_{metric}"], "o-", color=colour,
                  label=f"{policy}: DP search (ε of the search)")  # fmt: skip
        if grid and rows[f"grid_{metric}"].notna().any():
            axes.plot(rows["grid_epsilon_run"], rows[f"grid_{metric}"], "s:", color=colour, alpha=0.7,
                      label=f"{policy}: non-private selection (ε of one run)")  # fmt: skip
    axes.set_xscale("log")
    from matplotlib.ticker import FixedLocator, NullLocator

    spent = table["epsilon_search"]
    if grid:
        spent = pd.concat([spent, table["grid_epsilon_run"]])
    spent = spent.dropna()
    spent = spent[np.isfinite(spent) & (spent > 0)]
    if not spent.empty:  # 1-2-5 ticks across the ε drawn
        low, high = math.floor(math.log10(spent.min())), math.ceil(math.log10(spent.max()))
        ticks = [m * 10.0**k for k in range(low, high + 1) for m in (1, 2, 5)]
        ticks = [t for t in ticks if spent.min() / 1.5 <= t <= spent.max() * 1.5]
        axes.xaxis.set_major_locator(FixedLocator(ticks))
        axes.xaxis.set_minor_locator(NullLocator())
        axes.set_xticklabels([f"{tick:g}" for tick in ticks])
    axes.set_xlabel("ε (δ as configured)")
    axes.set_ylabel(f"best {metric}")
    axes.legend(fontsize=7)
    axes.grid(alpha=0.3)
    save(figure, path)


def curve_report(table: pd.DataFrame, metric: str, trials: TrialCount, internal: bool = False) -> str:
    """The curve's ``report.md``: public (each search's release only), or ``internal``."""
    if internal:
        title = "# fairclip tune: best result against ε, every selection (NOT DP-PROTECTED, never publish)"
        about = (
            "`trials` is how many each search drew; the non-private selection's `grid_epsilon_run` "
            f"covers its chosen run only. Each search's trials are in its folder's `{INTERNAL}/`."
        )
    else:
        title = "# fairclip tune: best result against ε"
        about = (
            "Each row is its search's release (no value: it released nothing). How many trials each "
            f"search drew, its trials and the non-private selection are in `{INTERNAL}/`: not "
            "DP-protected, never publish them (see its README.txt)."
        )
    return "\n".join([
        title,
        "",
        f"One DP random search per policy and target ε of a run ({trials.describe()}), selected "
        f"by **{metric}**. `epsilon_search` covers the whole search (RDP, Papernot & Steinke 2022). "
        + about,
        "",
        markdown_table(table),
        "",
        f"![{CURVE_PLOT}]({CURVE_PLOT})",
        "",
    ])  # fmt: skip
