"""Tables and plots of a comparison: per-cohort accuracy, privacy cost and their gaps.

Across runs (seeds 003/004), for cohort k against the `none` reference of the same seed:

    π_k = acc_k(none) − acc_k(private)          privacy cost
    max_{a,b} |π_a − π_b|                       privacy-cost gap (per run, then over seeds)
    R_k = loss_k(private) − loss_k(none)        excessive risk, and its gap likewise

Every figure is a mean ± standard error over seeds of numbers measured in the runs.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from fairclip.sims.outputs import atomic_write_text

PLOTS = ("accuracy_vs_epsilon.png", "clip_bound_rounds.png", "cohort_accuracy_rounds.png")


def mean_se(values: pd.Series) -> tuple[float, float]:
    """Mean and standard error (0 for a single value)."""
    values = values.dropna()
    if values.empty:
        return math.nan, math.nan
    if values.nunique() == 1:
        return float(values.iloc[0]), 0.0
    se = float(values.std(ddof=1) / math.sqrt(len(values))) if len(values) > 1 else 0.0
    return float(values.mean()), se


def _fmt(mean: float, se: float, digits: int = 3) -> str:
    if math.isnan(mean):
        return "–"
    if math.isinf(mean):
        return "∞"
    return f"{mean:.{digits}f} ± {se:.{digits}f}"


def gaps(table: pd.DataFrame) -> pd.DataFrame:
    """Per run (strategy, target ε, seed): privacy-cost gap, excessive-risk gap, worst accuracy."""
    grouped = table.groupby(["strategy", "target_epsilon", "seed"], dropna=False)
    return grouped.agg(
        privacy_cost_gap=("privacy_cost", lambda v: v.max() - v.min()),
        excessive_risk_gap=("excessive_risk", lambda v: v.max() - v.min()),
        worst_cohort_accuracy=("accuracy", "min"),
        epsilon=("epsilon", "first"),
    ).reset_index()


def _epsilon_label(value: float) -> str:
    if math.isinf(value):
        return "∞ (non-private)"
    if math.isnan(value):
        return "as configured"
    return f"{value:g}"


def markdown_report(table: pd.DataFrame, title: str) -> str:
    """``report.md``: one section per target ε, best strategy for the worst cohort."""
    cohorts = list(dict.fromkeys(table["cohort"]))
    per_run = gaps(table)
    reference = table[table["strategy"] == "none"]
    lines = [f"# {title}", ""]
    seeds = table["seed"].nunique()
    lines += [
        f"Mean ± standard error over {seeds} seed(s). Privacy cost π = accuracy(none) − accuracy; "
        "excessive risk R = loss − loss(none); gaps are max − min over cohorts within a run. "
        "ε is the value spent (δ, accountant and noise multipliers are in `summary.csv`).",
        "",
    ]
    private = table[table["strategy"] != "none"]
    for target, block in private.groupby("target_epsilon", dropna=False, sort=True):
        lines += [f"## target ε = {_epsilon_label(target)}", ""]
        header = ["strategy", "ε spent"]
        header += [f"{c} accuracy" for c in cohorts] + [f"{c} π" for c in cohorts]
        header += ["π gap", "R gap", "worst-cohort accuracy"]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        rows = pd.concat([reference, block])
        run_gaps = per_run[
            per_run["strategy"].isin(rows["strategy"].unique())
            & ((per_run["target_epsilon"] == target) | (per_run["strategy"] == "none") | pd.isna(target))
        ]
        best, best_value = None, -math.inf
        for strategy in dict.fromkeys(rows["strategy"]):
            mine = rows[rows["strategy"] == strategy]
            mine_gaps = run_gaps[run_gaps["strategy"] == strategy]
            cells = [f"`{strategy}`", _fmt(*mean_se(mine_gaps["epsilon"]), digits=2)]
            cells += [_fmt(*mean_se(mine[mine["cohort"] == c]["accuracy"])) for c in cohorts]
            cells += [_fmt(*mean_se(mine[mine["cohort"] == c]["privacy_cost"])) for c in cohorts]
            cells += [
                _fmt(*mean_se(mine_gaps["privacy_cost_gap"])),
                _fmt(*mean_se(mine_gaps["excessive_risk_gap"])),
                _fmt(*mean_se(mine_gaps["worst_cohort_accuracy"])),
            ]
            lines.append("| " + " | ".join(cells) + " |")
            worst = mean_se(mine_gaps["worst_cohort_accuracy"])[0]
            if strategy != "none" and not math.isnan(worst) and worst > best_value:
                best, best_value = strategy, worst
        lines.append("")
        if best is not None:
            lines += [
                f"Best strategy for the worst cohort at ε = {_epsilon_label(target)}: "
                f"**`{best}`** (worst-cohort accuracy {best_value:.3f}).",
                "",
            ]
    lines += ["## Plots", ""] + [f"![{name}]({name})" for name in PLOTS] + [""]
    return "\n".join(lines)


def plot_accuracy_vs_epsilon(table: pd.DataFrame, path: Path) -> None:
    """Per-cohort accuracy against target ε, one line per strategy; `none` dashed."""
    cohorts = list(dict.fromkeys(table["cohort"]))
    figure, axes = plt.subplots(1, len(cohorts), figsize=(5 * len(cohorts), 4), squeeze=False)
    for axis, cohort in zip(axes[0], cohorts, strict=True):
        mine = table[table["cohort"] == cohort]
        for strategy, block in mine.groupby("strategy", sort=False):
            if strategy == "none":
                axis.axhline(block["accuracy"].mean(), color="black", linestyle="--", label="none")
                continue
            stats = block.groupby("target_epsilon")["accuracy"].agg(["mean", "sem"]).fillna(0.0)
            axis.errorbar(
                stats.index, stats["mean"], yerr=stats["sem"], marker="o", capsize=3, label=strategy
            )
        if mine[mine["strategy"] != "none"]["target_epsilon"].nunique() > 1:
            axis.set_xscale("log")
        axis.set(title=f"cohort {cohort}", xlabel="target ε", ylabel="accuracy")
        axis.grid(alpha=0.3)
    axes[0][0].legend()
    _save(figure, path)


def plot_over_rounds(
    table: pd.DataFrame,
    rounds: dict[str, pd.DataFrame],
    keys: dict[str, tuple[str, float]],
    path: Path,
    column_of: callable,
    ylabel: str,
    per_cohort: bool,
) -> None:
    """One subplot per (target ε[, cohort]); one line per strategy, mean over seeds."""
    epsilons = sorted(
        {eps for _, eps in keys.values() if not math.isinf(eps)}, key=lambda e: (math.isnan(e), e)
    )
    cohorts = list(dict.fromkeys(table["cohort"])) if per_cohort else [None]
    figure, axes = plt.subplots(
        max(len(epsilons), 1),
        len(cohorts),
        figsize=(5 * len(cohorts), 3.5 * max(len(epsilons), 1)),
        squeeze=False,
    )
    for row, epsilon in enumerate(epsilons):
        for col, cohort in enumerate(cohorts):
            axis = axes[row][col]
            for strategy in dict.fromkeys(s for s, _ in keys.values()):
                selected = [
                    frame
                    for key, frame in rounds.items()
                    if keys[key][0] == strategy and (strategy == "none" or _same(keys[key][1], epsilon))
                ]
                column = column_of(cohort)
                series = [frame.set_index("round")[column] for frame in selected if column in frame]
                if not series:
                    continue
                # Rounds that were not evaluated (training.eval_every) hold NaN.
                mean = pd.concat(series, axis=1).mean(axis=1).dropna()
                if np.isfinite(mean).any():
                    axis.plot(
                        mean.index, mean.values, label=strategy, linestyle="--" if strategy == "none" else "-"
                    )
            title = f"ε = {_epsilon_label(epsilon)}" + (f", cohort {cohort}" if cohort else "")
            axis.set(title=title, xlabel="round", ylabel=ylabel)
            axis.grid(alpha=0.3)
            axis.legend(fontsize="small")
    _save(figure, path)


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def _save(figure, path: Path) -> None:
    figure.tight_layout()
    temporary = path.with_name(f".{path.name}.tmp.png")
    figure.savefig(temporary, dpi=110)
    plt.close(figure)
    temporary.replace(path)


def write_report(
    out: Path,
    table: pd.DataFrame,
    rounds: dict[str, pd.DataFrame],
    keys: dict[str, tuple[str, float]],
    title: str,
) -> None:
    """``report.md`` and the PNG plots into ``out``."""
    plot_accuracy_vs_epsilon(table, out / PLOTS[0])
    plot_over_rounds(table, rounds, keys, out / PLOTS[1], lambda _c: "clip_bound", "clipping bound", False)
    plot_over_rounds(table, rounds, keys, out / PLOTS[2], lambda c: f"{c}/accuracy", "accuracy", True)
    atomic_write_text(out / "report.md", markdown_report(table, title))
