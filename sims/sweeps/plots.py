"""The figures of a comparison (``fairclip compare``), drawn from its summary table and rounds.

Every figure gives a policy the same colour and the same place in the legend
(:func:`policy_styles`: the order of :data:`fairclip.strategies.POLICIES`, `none` black and
dashed), every curve over rounds is the mean over seeds with a band of ± 1 standard error, and
the ε axis is labelled with the ε values that were run.

- ``accuracy_vs_epsilon.png``: each cohort's final accuracy against target ε (or, for a sweep
  run at the scenario's own noise, against the ε each run spent).
- ``clip_bound_rounds.png``: the clipping bound C_t over rounds.
- ``cohort_accuracy_rounds.png``: each cohort's accuracy over rounds.
- ``cohort_norms_rounds.png``: the mechanism -- each cohort's median update norm (before
  clipping; a simulation diagnostic) against the clipping bound, over rounds, one panel per
  policy: a cohort whose median lies above the bound has most of its updates clipped.
- ``cohort_directions_rounds.png`` (runs with ``training.cohort_directions``): why clipping hurts
  a cohort (seed 003, section 4) -- per cohort, the direction error cos(Σ c_i, Σ Δ_i) and the
  magnitude error ||Σ c_i|| / ||Σ Δ_i|| of its clipped aggregate against its unclipped one, over
  rounds (simulation-only diagnostics).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import FixedLocator, NullLocator

from fairclip.strategies import POLICIES

ACCURACY_VS_EPSILON = "accuracy_vs_epsilon.png"
CLIP_BOUND_ROUNDS = "clip_bound_rounds.png"
COHORT_ACCURACY_ROUNDS = "cohort_accuracy_rounds.png"
COHORT_NORMS_ROUNDS = "cohort_norms_rounds.png"
COHORT_DIRECTIONS_ROUNDS = "cohort_directions_rounds.png"
PLOTS = (
    ACCURACY_VS_EPSILON,
    CLIP_BOUND_ROUNDS,
    COHORT_ACCURACY_ROUNDS,
    COHORT_NORMS_ROUNDS,
    COHORT_DIRECTIONS_ROUNDS,
)

REFERENCE = "none"
_FIXED_COLOURS = plt.get_cmap("tab10").colors
_EXTRA_COLOURS = plt.get_cmap("Dark2").colors
_COHORT_COLOURS = plt.get_cmap("Set1").colors


@dataclass(frozen=True)
class Style:
    """How one policy is drawn in every figure."""

    colour: tuple[float, ...] | str
    linestyle: str
    rank: int


def policy_styles(names: Iterable[str]) -> dict[str, Style]:
    """A fixed style per policy: `none` black dashed; a built-in policy the tab10 colour of
    its place in :data:`POLICIES` (the same in every figure and every sweep); any other
    (a user's policy) a Dark2 colour in order of appearance, after the built-ins."""
    builtin = [name for name in POLICIES if name != REFERENCE]
    styles: dict[str, Style] = {}
    extra = 0
    for name in dict.fromkeys(names):
        if name == REFERENCE:
            styles[name] = Style("black", "--", -1)
        elif name in builtin:
            index = builtin.index(name)
            styles[name] = Style(_FIXED_COLOURS[index % len(_FIXED_COLOURS)], "-", index)
        else:
            styles[name] = Style(_EXTRA_COLOURS[extra % len(_EXTRA_COLOURS)], "-", len(builtin) + extra)
            extra += 1
    return dict(sorted(styles.items(), key=lambda item: item[1].rank))


def epsilon_label(value: float) -> str:
    """A target ε in titles and headings: ∞ for the reference, "as configured" where the sweep
    ran the scenario's own privacy settings (no target)."""
    if math.isinf(value):
        return "∞ (non-private)"
    if math.isnan(value):
        return "as configured"
    return f"{value:g}"


def _band_note(seeds: int) -> str:
    if seeds > 1:
        return f"line: mean over {seeds} seeds; band: ± 1 standard error over seeds"
    return "one seed: no band (run --seeds 2 or more for one)"


SHARED_Y = "all panels share one y axis"


def _epsilon_ticks(axis: plt.Axes, values: Iterable[float]) -> None:
    """Label the x axis with exactly the ε values run (log scale where they span more than 2×)."""
    ticks = sorted({float(v) for v in values if math.isfinite(v)})
    if not ticks:
        return
    if ticks[-1] > 2 * ticks[0]:
        axis.set_xscale("log")
    axis.xaxis.set_major_locator(FixedLocator(ticks))
    axis.xaxis.set_minor_locator(NullLocator())
    axis.set_xticklabels([f"{tick:.3g}" for tick in ticks])


def epsilon_axis(table: pd.DataFrame) -> tuple[str, str] | None:
    """(column, axis label) of the x axis of ``accuracy_vs_epsilon.png``: the target ε where the
    sweep set one, else the ε each run spent; None where neither is finite (a run without
    noise spends ε = ∞), so the plot is left out."""
    private = table[table["policy"] != REFERENCE]
    if private.empty:
        return None
    if np.isfinite(private["target_epsilon"]).all():
        return "target_epsilon", "target ε"
    if np.isfinite(private["epsilon"]).all():
        return "epsilon", "ε spent (the scenario's own noise; no target ε was given)"
    return None


def plot_accuracy_vs_epsilon(table: pd.DataFrame, path: Path) -> bool:
    """Per-cohort accuracy against ε (:func:`epsilon_axis`), one line per policy with error
    bars of ± 1 standard error over seeds, `none` as a dashed level. False (nothing drawn)
    where no finite ε was run."""
    axis_choice = epsilon_axis(table)
    if axis_choice is None:
        return False
    column, xlabel = axis_choice
    styles = policy_styles(table["policy"])
    cohorts = list(dict.fromkeys(table["cohort"]))
    private = table[table["policy"] != REFERENCE]
    figure, axes = plt.subplots(1, len(cohorts), figsize=(5 * len(cohorts), 4), squeeze=False, sharey=True)
    for axis, cohort in zip(axes[0], cohorts, strict=True):
        mine = table[table["cohort"] == cohort]
        lines: dict[str, pd.DataFrame] = {}
        for policy, style in styles.items():
            block = mine[mine["policy"] == policy]
            if block.empty:
                continue
            if policy == REFERENCE:
                axis.axhline(block["accuracy"].mean(), color=style.colour, linestyle="--", label=policy)
                continue
            grouped = block.groupby("target_epsilon", dropna=False)
            accuracy = grouped["accuracy"]
            stats = pd.DataFrame({"x": grouped[column].mean(), "mean": accuracy.mean(), "se": accuracy.sem()})
            lines[policy] = stats.fillna({"se": 0.0}).set_index("x")
        hidden = coinciding({name: stats["mean"] for name, stats in lines.items()})
        for policy, stats in lines.items():
            axis.errorbar(
                stats.index, stats["mean"], yerr=stats["se"], marker="o", capsize=3,
                color=styles[policy].colour, label=_label(policy, hidden),
            )  # fmt: skip
        _epsilon_ticks(axis, private[column])
        axis.set(title=f"cohort {cohort}", xlabel=xlabel, ylabel="final accuracy")
        axis.grid(alpha=0.3)
    axes[0][0].legend()
    seeds = table["seed"].nunique()
    note = f"points: mean over {seeds} seeds; bars: ± 1 standard error" if seeds > 1 else "one seed"
    figure.suptitle(f"{note}; {SHARED_Y}", fontsize="small")
    save(figure, path)
    return True


def _curves(frames: list[pd.DataFrame], column: str) -> pd.DataFrame | None:
    """Mean and standard error over seeds of ``column`` per round (rounds not evaluated,
    NaN in every seed, are left out); None where no run has the column."""
    series = [frame.set_index("round")[column] for frame in frames if column in frame]
    if not series:
        return None
    values = pd.concat(series, axis=1).replace([np.inf, -np.inf], np.nan)  # `none`: C = ∞
    stats = pd.DataFrame({"mean": values.mean(axis=1), "se": values.sem(axis=1)}).dropna(subset=["mean"])
    return None if stats.empty else stats


def _draw_band(axis: plt.Axes, stats: pd.DataFrame, colour, linestyle: str, label: str) -> None:
    axis.plot(stats.index, stats["mean"], color=colour, linestyle=linestyle, label=label)
    se = stats["se"].fillna(0.0)
    if (se > 0).any():
        axis.fill_between(stats.index, stats["mean"] - se, stats["mean"] + se, color=colour, alpha=0.2, lw=0)


RunKeys = dict[str, tuple[str, float]]
"""Each run's (policy, target ε) by its key."""


def _epsilons(keys: RunKeys) -> list[float]:
    return sorted({eps for _, eps in keys.values() if not math.isinf(eps)}, key=lambda e: (math.isnan(e), e))


def _runs_of(
    rounds: dict[str, pd.DataFrame], keys: RunKeys, policy: str, epsilon: float
) -> list[pd.DataFrame]:
    """The rounds of ``policy``'s runs at ``epsilon`` (`none`: at any)."""
    return [
        frame
        for key, frame in rounds.items()
        if keys[key][0] == policy and (policy == REFERENCE or _same(keys[key][1], epsilon))
    ]


def plot_over_rounds(
    table: pd.DataFrame,
    rounds: dict[str, pd.DataFrame],
    keys: RunKeys,
    path: Path,
    column_of: Callable[[str | None], str],
    ylabel: str,
    per_cohort: bool,
) -> None:
    """One panel per (ε[, cohort]); one line per policy, the mean over seeds with its band."""
    epsilons = _epsilons(keys)
    styles = policy_styles(policy for policy, _ in keys.values())
    cohorts = list(dict.fromkeys(table["cohort"])) if per_cohort else [None]
    figure, axes = plt.subplots(
        max(len(epsilons), 1),
        len(cohorts),
        figsize=(5 * len(cohorts), 3.5 * max(len(epsilons), 1)),
        squeeze=False,
        sharey=True,
    )
    for row, epsilon in enumerate(epsilons):
        for col, cohort in enumerate(cohorts):
            axis = axes[row][col]
            _draw_policies(axis, styles, rounds, keys, epsilon, column_of(cohort))
            title = f"ε = {epsilon_label(epsilon)}" + (f", cohort {cohort}" if cohort else "")
            axis.set(title=title, xlabel="round", ylabel=ylabel)
            axis.grid(alpha=0.3)
            axis.legend(fontsize="small")
    figure.suptitle(f"{_band_note(table['seed'].nunique())}; {SHARED_Y}", fontsize="small")
    save(figure, path)


def coinciding(lines: dict[str, pd.Series]) -> dict[str, str]:
    """The lines drawn exactly on an earlier one (same points, to 1e-9 relative): {name: the
    earlier line's name}. A plot labels them, since the later line hides the earlier."""
    hidden: dict[str, str] = {}
    names = list(lines)
    for position, name in enumerate(names):
        for earlier in names[:position]:
            a, b = lines[earlier].dropna(), lines[name].dropna()
            same_points = earlier not in hidden and a.index.equals(b.index) and len(a) > 0
            if same_points and np.allclose(a.to_numpy(float), b.to_numpy(float), rtol=1e-9, atol=1e-12):
                hidden[name] = earlier
                break
    return hidden


def _label(name: str, hidden: dict[str, str]) -> str:
    return f"{name} (same as {hidden[name]}: lines coincide)" if name in hidden else name


def _draw_policies(
    axis: plt.Axes, styles: dict[str, Style], rounds: dict[str, pd.DataFrame], keys: RunKeys,
    epsilon: float, column: str,
) -> None:  # fmt: skip
    """One band per policy of ``styles`` over rounds; a line that hides another says so."""
    curves = {}
    for policy in styles:
        stats = _curves(_runs_of(rounds, keys, policy, epsilon), column)
        if stats is not None:
            curves[policy] = stats
    hidden = coinciding({name: stats["mean"] for name, stats in curves.items()})
    for policy, stats in curves.items():
        style = styles[policy]
        _draw_band(axis, stats, style.colour, style.linestyle, _label(policy, hidden))


def plot_cohort_norms(
    table: pd.DataFrame, rounds: dict[str, pd.DataFrame], keys: RunKeys, path: Path
) -> None:
    """One panel per (ε, private policy): the clipping bound C_t (black) and each cohort's
    median update norm before clipping (one colour per cohort), over rounds."""
    epsilons = _epsilons(keys)
    policies = [name for name in policy_styles(s for s, _ in keys.values()) if name != REFERENCE]
    cohorts = list(dict.fromkeys(table["cohort"]))
    rows, cols = max(len(epsilons), 1), max(len(policies), 1)
    figure, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.5 * rows), squeeze=False, sharey=True)
    for row, epsilon in enumerate(epsilons):
        for col, policy in enumerate(policies):
            axis = axes[row][col]
            frames = _runs_of(rounds, keys, policy, epsilon)
            bound = _curves(frames, "clip_bound")
            if bound is not None:
                _draw_band(axis, bound, "black", "-", "clipping bound")
            for index, cohort in enumerate(cohorts):
                stats = _curves(frames, f"{cohort}/median_norm")
                if stats is not None:
                    colour = _COHORT_COLOURS[index % len(_COHORT_COLOURS)]
                    _draw_band(axis, stats, colour, ":", f"{cohort} median norm")
            axis.set(title=f"{policy}, ε = {epsilon_label(epsilon)}", xlabel="round", ylabel="update norm")
            axis.grid(alpha=0.3)
            axis.legend(fontsize="small")
    note = (
        "each cohort's median update norm before clipping against the bound; "
        + _band_note(table["seed"].nunique())
        + f"; {SHARED_Y}"
    )
    figure.suptitle(note, fontsize="small")
    save(figure, path)


DIRECTION_ERRORS = (
    ("direction_cosine", "direction: cos(clipped, unclipped)"),
    ("magnitude_ratio", "magnitude: |clipped| / |unclipped|"),
)


def tracks_directions(rounds: dict[str, pd.DataFrame]) -> bool:
    """Whether any run recorded its cohorts' direction and magnitude errors."""
    return any(column.endswith("/direction_cosine") for frame in rounds.values() for column in frame.columns)


def plot_cohort_directions(
    table: pd.DataFrame, rounds: dict[str, pd.DataFrame], keys: RunKeys, path: Path
) -> bool:
    """Rows: (error, ε); columns: cohorts; one line per private policy over rounds. False
    (nothing drawn) without a private run at a finite ε."""
    epsilons = _epsilons(keys)
    if not epsilons:
        return False
    styles = {
        name: style for name, style in policy_styles(s for s, _ in keys.values()).items() if name != REFERENCE
    }
    cohorts = list(dict.fromkeys(table["cohort"]))
    panels = [(column, label, epsilon) for column, label in DIRECTION_ERRORS for epsilon in epsilons]
    figure, axes = plt.subplots(
        len(panels), len(cohorts), figsize=(5 * len(cohorts), 3.2 * len(panels)), squeeze=False, sharey="row"
    )
    for row, (column, label, epsilon) in enumerate(panels):
        for col, cohort in enumerate(cohorts):
            axis = axes[row][col]
            _draw_policies(axis, styles, rounds, keys, epsilon, f"{cohort}/{column}")
            axis.set(title=f"{cohort}, ε = {epsilon_label(epsilon)}", xlabel="round", ylabel=label)
            axis.grid(alpha=0.3)
            axis.legend(fontsize="small")
    note = (
        "each cohort's clipped aggregate against its unclipped one (simulation only); "
        + _band_note(table["seed"].nunique())
        + "; the panels of a row share their y axis"
    )
    figure.suptitle(note, fontsize="small")
    save(figure, path)
    return True


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def save(figure: plt.Figure, path: Path) -> None:
    """Write ``figure`` to ``path`` atomically (a temporary file, then a rename)."""
    figure.tight_layout()
    temporary = path.with_name(f".{path.name}.tmp.png")
    figure.savefig(temporary, dpi=110)
    plt.close(figure)
    temporary.replace(path)


def write_plots(
    out: Path, table: pd.DataFrame, rounds: dict[str, pd.DataFrame], keys: RunKeys
) -> dict[str, str]:
    """Draw every plot into ``out``; returns the plots left out, each with the reason (a stale
    copy from an earlier sweep in ``out`` is deleted)."""
    left_out = {}
    if not plot_accuracy_vs_epsilon(table, out / ACCURACY_VS_EPSILON):
        (out / ACCURACY_VS_EPSILON).unlink(missing_ok=True)
        left_out[ACCURACY_VS_EPSILON] = (
            "no finite ε was run (no target ε was given and the scenario's own noise spends ε = ∞)"
        )
    plot_over_rounds(
        table, rounds, keys, out / CLIP_BOUND_ROUNDS, lambda _c: "clip_bound", "clipping bound", False
    )
    plot_over_rounds(
        table, rounds, keys, out / COHORT_ACCURACY_ROUNDS, lambda c: f"{c}/accuracy", "accuracy", True
    )
    plot_cohort_norms(table, rounds, keys, out / COHORT_NORMS_ROUNDS)
    if not tracks_directions(rounds):
        (out / COHORT_DIRECTIONS_ROUNDS).unlink(missing_ok=True)
        left_out[COHORT_DIRECTIONS_ROUNDS] = (
            "the runs did not record their cohorts' direction and magnitude errors "
            "(set training.cohort_directions = true)"
        )
    elif not plot_cohort_directions(table, rounds, keys, out / COHORT_DIRECTIONS_ROUNDS):
        (out / COHORT_DIRECTIONS_ROUNDS).unlink(missing_ok=True)
        left_out[COHORT_DIRECTIONS_ROUNDS] = "no private run at a finite ε"
    return left_out
