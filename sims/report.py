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

import pandas as pd
from scipy import stats

from fairclip.sims.outputs import atomic_write_text
from fairclip.sims.plots import PLOTS, RunKeys, epsilon_label, strategy_styles, write_plots

CONFIDENCE = 0.95
"""A strategy is named best for the worst cohort only where its lead over every other is clear:
the lower end of the two-sided 95 % t interval of the paired (same seed) difference is above 0."""


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


def best_for_worst_cohort(per_run: pd.DataFrame, seeds: int) -> str:
    """The sentence of ``report.md`` on the best strategy for the worst cohort, from one row per
    private run (strategy, seed, worst_cohort_accuracy) at one target ε.

    The strategy with the highest mean is *best* only where, against every other strategy, the
    paired differences over seeds d_s = a_s(best) − a_s(other) have a clear lead:
    mean(d) − t_{0.975, n−1} · se(d) > 0. Otherwise the strategies it does not clearly beat are
    named as tied. One seed gives no interval, so no best is named.
    """
    scores = per_run.pivot_table(index="seed", columns="strategy", values="worst_cohort_accuracy")
    scores = scores.dropna(axis=1, how="all")
    if scores.empty:
        return ""
    order = scores.mean().sort_values(ascending=False)
    leader = str(order.index[0])
    value = f"{order.iloc[0]:.3f}"
    if len(order) == 1:
        return f"Only `{leader}` ran here (worst-cohort accuracy {value}): nothing to compare."
    if seeds < 2 or len(scores) < 2:
        return (
            f"Highest worst-cohort accuracy: `{leader}` ({value}); with one seed there is no "
            "uncertainty estimate, so no strategy is named best (run --seeds 2 or more)."
        )
    tied = []
    for other in order.index[1:]:
        difference = (scores[leader] - scores[other]).dropna()
        mean = difference.mean()
        se = difference.sem() if len(difference) > 1 else math.inf
        lower = mean - stats.t.ppf(0.5 + CONFIDENCE / 2, len(difference) - 1) * se if se > 0 else mean
        if not lower > 0:
            tied.append(str(other))
    if not tied:
        return f"Best strategy for the worst cohort: **`{leader}`** (worst-cohort accuracy {value})."
    names = ", ".join(f"`{name}`" for name in tied)
    return (
        f"No clear best for the worst cohort: `{leader}` has the highest worst-cohort accuracy "
        f"({value}) but is tied with {names} (over {len(scores)} seeds, the {CONFIDENCE:.0%} interval "
        "of its paired lead over each of them includes 0)."
    )


def markdown_report(table: pd.DataFrame, title: str, left_out: dict[str, str] | None = None) -> str:
    """``report.md``: one section per target ε, the best strategy for the worst cohort (or the
    tie, :func:`best_for_worst_cohort`) and the plots, with the reason for any left out."""
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
    order = list(strategy_styles(table["strategy"]))
    for target, block in private.groupby("target_epsilon", dropna=False, sort=True):
        lines += [f"## target ε = {epsilon_label(target)}", ""]
        header = ["strategy", "ε spent"]
        header += [f"{c} accuracy" for c in cohorts] + [f"{c} π" for c in cohorts]
        header += ["π gap", "R gap", "worst-cohort accuracy"]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        rows = pd.concat([reference, block])
        run_gaps = per_run[
            per_run["strategy"].isin(rows["strategy"].unique())
            & ((per_run["target_epsilon"] == target) | (per_run["strategy"] == "none") | pd.isna(target))
        ]
        for strategy in [name for name in order if name in set(rows["strategy"])]:
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
        lines.append("")
        verdict = best_for_worst_cohort(run_gaps[run_gaps["strategy"] != "none"], seeds)
        if verdict:
            lines += [f"At ε = {epsilon_label(target)}: {verdict}", ""]
    left_out = left_out or {}
    lines += ["## Plots", ""]
    lines += [f"![{name}]({name})" for name in PLOTS if name not in left_out]
    lines += [f"`{name}` is not drawn: {reason}." for name, reason in left_out.items()]
    return "\n".join([*lines, ""])


def write_report(
    out: Path, table: pd.DataFrame, rounds: dict[str, pd.DataFrame], keys: RunKeys, title: str
) -> list[str]:
    """``report.md`` and the PNG plots (:mod:`fairclip.sims.plots`) into ``out``; returns the
    plots drawn."""
    left_out = write_plots(out, table, rounds, keys)
    atomic_write_text(out / "report.md", markdown_report(table, title, left_out))
    return [name for name in PLOTS if name not in left_out]
