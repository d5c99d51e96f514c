"""Tables and plots of a comparison: per-cohort accuracy, privacy cost and their gaps.

Across runs (seeds 003/004), for cohort k against the `none` reference of the same seed:

    π_k = acc_k(none) − acc_k(private)          privacy cost
    max_{a,b} |π_a − π_b|                       privacy-cost gap (per run, then over seeds)
    R_k = loss_k(private) − loss_k(none)        excessive risk, and its gap likewise

Every figure is a mean over seeds of numbers measured in the runs, with its 95 % Student t
interval over the seeds (:mod:`fairclip.sims.sweeps.statistics`); ``statistics.csv`` holds
each mean with its standard error and interval, and ``paired_tests.csv`` every pair of policies
compared on the same seeds (paired t-test, significant at 5 % or not), which ``report.md``
summarises. Binary tasks whose cohorts partition the test set add Fairlearn's group metrics of
the final model (TPR and FPR per cohort, demographic-parity and equalized-odds differences).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from scipy import stats

from fairclip.atomic import atomic_write_text, write_csv
from fairclip.sims.sweeps import statistics
from fairclip.sims.sweeps.plots import PLOTS, RunKeys, epsilon_label, policy_styles, write_plots

CONFIDENCE = 0.95
"""A policy is named best for the worst cohort only where its lead over every other is clear:
the lower end of the two-sided 95 % t interval of the paired (same seed) difference is above 0."""


def _interval(values: pd.Series, digits: int = 3) -> str:
    """``mean [low, high]``: the mean over seeds and its 95 % t interval (the mean
    alone for one seed, or where every seed gave the same value)."""
    values = values.dropna()
    if values.empty:
        return "–"
    mean = float(values.mean())
    if math.isinf(mean):
        return "∞"
    low, high = statistics.mean_interval(values.to_numpy())
    if math.isnan(low) or low == high:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def paired_lines(tests: list[dict], target: float, quantities: list[str]) -> list[str]:
    """The paired-test table of one target ε for ``quantities`` (each pair of policies)."""
    shown = [t for t in tests if t["quantity"] in quantities and _same_target(t["target_epsilon"], target)]
    if not shown or all(math.isnan(t["p_value"]) for t in shown):
        return []
    lines = [
        f"Paired tests at ε = {epsilon_label(target)} (same seeds; two-sided paired t-test, "
        "significant where p < 0.05):",
        "",
        "| quantity | A − B | mean difference [95 % interval] | p | significant |",
        "|---|---|---|---|---|",
    ]
    for test in shown:
        interval = (
            f"{test['mean_difference']:.3f}"
            if math.isnan(test["interval_low"])
            else f"{test['mean_difference']:.3f} [{test['interval_low']:.3f}, {test['interval_high']:.3f}]"
        )
        p_value = "–" if math.isnan(test["p_value"]) else f"{test['p_value']:.3f}"
        lines.append(
            f"| {test['quantity']} | `{test['first']}` − `{test['second']}` | {interval} | {p_value} | "
            f"{'**yes**' if test['significant'] else 'no'} |"
        )
    return [*lines, ""]


def _same_target(a: float, b: float) -> bool:
    return (pd.isna(a) and pd.isna(b)) or a == b


RUN_QUANTITIES = (
    "privacy_cost_gap",
    "excessive_risk_gap",
    "worst_cohort_accuracy",
    "worst_class_accuracy",
    "demographic_parity_difference",
    "equalized_odds_difference",
)
"""One value per run (:func:`gaps`)."""
TESTED = ("worst_cohort_accuracy", "privacy_cost_gap", "demographic_parity_difference")
"""The run quantities compared pair by pair in ``report.md`` (with each cohort's accuracy);
``paired_tests.csv`` holds every one."""
STATISTICS_FILES = ("statistics.csv", "paired_tests.csv")


def gaps(table: pd.DataFrame) -> pd.DataFrame:
    """Per run (policy, target ε, seed): privacy-cost gap, excessive-risk gap, worst cohort's
    accuracy, and the final model's whole-run metrics where the table has them."""
    grouped = table.groupby(["policy", "target_epsilon", "seed"], dropna=False)
    extra = {name: (name, "first") for name in RUN_QUANTITIES[3:] if name in table.columns}
    return grouped.agg(
        privacy_cost_gap=("privacy_cost", lambda v: v.max() - v.min()),
        excessive_risk_gap=("excessive_risk", lambda v: v.max() - v.min()),
        worst_cohort_accuracy=("accuracy", "min"),
        epsilon=("epsilon", "first"),
        **extra,
    ).reset_index()


def per_run_quantities(table: pd.DataFrame) -> pd.DataFrame:
    """One row per run: :func:`gaps` plus each cohort's accuracy (``<cohort> accuracy``) and, for
    binary tasks, TPR (``<cohort> tpr``)."""
    per_run = gaps(table)
    keys = ["policy", "target_epsilon", "seed"]
    for metric in ("accuracy", "tpr"):
        if metric not in table.columns or table[metric].isna().all():
            continue
        wide = table.pivot_table(index=keys, columns="cohort", values=metric, dropna=False)
        # named before the keys come back as columns, so that a cohort named like a key ("seed",
        # "policy") cannot take a key's place or collide with it
        wide.columns = [f"{cohort} {metric}" for cohort in wide.columns]
        wide = wide.reset_index()
        per_run = per_run.merge(wide, on=keys, how="left")
    return per_run


def statistics_tables(table: pd.DataFrame) -> tuple[list[dict], list[dict]]:
    """(every mean with its standard error and t interval, every paired test) per
    target ε: the rows of ``statistics.csv`` and ``paired_tests.csv``. The reference ``none``
    is tested against the others at every ε."""
    per_run = per_run_quantities(table)
    quantities = [c for c in per_run.columns if c in RUN_QUANTITIES or c.endswith((" accuracy", " tpr"))]
    quantities = [q for q in quantities if per_run[q].notna().any()]
    summary = statistics.summary_rows(per_run, quantities, ["target_epsilon", "policy"])
    reference = per_run[per_run["policy"] == "none"]
    tests = []
    for target, block in per_run[per_run["policy"] != "none"].groupby("target_epsilon", dropna=False):
        paired = pd.concat([block, reference.assign(target_epsilon=target)])
        tests += statistics.paired_test_rows(paired, quantities, ["target_epsilon"])
    return summary, tests


def best_for_worst_cohort(per_run: pd.DataFrame, seeds: int) -> str:
    """The sentence of ``report.md`` on the best policy for the worst cohort, from one row per
    private run (policy, seed, worst_cohort_accuracy) at one target ε.

    The policy with the highest mean is *best* only where, against every other policy, the
    paired differences over seeds d_s = a_s(best) − a_s(other) have a clear lead:
    mean(d) − t_{0.975, n−1} · se(d) > 0. Otherwise the policies it does not clearly beat are
    named as tied. One seed gives no interval, so no best is named.
    """
    scores = per_run.pivot_table(index="seed", columns="policy", values="worst_cohort_accuracy")
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
            "uncertainty estimate, so no policy is named best (run --seeds 2 or more)."
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
        return f"Best policy for the worst cohort: **`{leader}`** (worst-cohort accuracy {value})."
    names = ", ".join(f"`{name}`" for name in tied)
    return (
        f"No clear best for the worst cohort: `{leader}` has the highest worst-cohort accuracy "
        f"({value}) but is tied with {names} (over {len(scores)} seeds, the {CONFIDENCE:.0%} interval "
        "of its paired lead over each of them includes 0)."
    )


def markdown_report(
    table: pd.DataFrame, title: str, left_out: dict[str, str] | None = None, tests: list[dict] | None = None
) -> str:
    """``report.md``: one section per target ε with each mean's t interval, the paired
    tests of ``tests`` (:func:`statistics_tables`), the best policy for the worst cohort (or
    the tie, :func:`best_for_worst_cohort`) and the plots, with the reason for any left out."""
    cohorts = list(dict.fromkeys(table["cohort"]))
    per_run = gaps(table)
    reference = table[table["policy"] == "none"]
    lines = [f"# {title}", ""]
    seeds = table["seed"].nunique()
    group_metrics = (
        "demographic_parity_difference" in per_run and per_run["demographic_parity_difference"].notna().any()
    )
    lines += [
        f"Mean over {seeds} seed(s) [95 % t interval over the seeds; standard errors are in "
        "`statistics.csv`]. Privacy cost π = accuracy(none) − accuracy; "
        "excessive risk R = loss − loss(none); gaps are max − min over cohorts within a run. "
        "ε is the value spent (δ, accountant and noise multipliers are in `summary.csv`).",
        "",
    ]
    private = table[table["policy"] != "none"]
    order = list(policy_styles(table["policy"]))
    for target, block in private.groupby("target_epsilon", dropna=False, sort=True):
        lines += [f"## target ε = {epsilon_label(target)}", ""]
        header = ["policy", "ε spent"]
        header += [f"{c} accuracy" for c in cohorts] + [f"{c} π" for c in cohorts]
        header += ["π gap", "R gap", "worst-cohort accuracy"]
        if group_metrics:
            header += ["DP difference", "EO difference"]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        rows = pd.concat([reference, block])
        run_gaps = per_run[
            per_run["policy"].isin(rows["policy"].unique())
            & ((per_run["target_epsilon"] == target) | (per_run["policy"] == "none") | pd.isna(target))
        ]
        for policy in [name for name in order if name in set(rows["policy"])]:
            mine = rows[rows["policy"] == policy]
            mine_gaps = run_gaps[run_gaps["policy"] == policy]
            cells = [f"`{policy}`", _interval(mine_gaps["epsilon"], digits=2)]
            cells += [_interval(mine[mine["cohort"] == c]["accuracy"]) for c in cohorts]
            cells += [_interval(mine[mine["cohort"] == c]["privacy_cost"]) for c in cohorts]
            cells += [
                _interval(mine_gaps["privacy_cost_gap"]),
                _interval(mine_gaps["excessive_risk_gap"]),
                _interval(mine_gaps["worst_cohort_accuracy"]),
            ]
            if group_metrics:
                cells += [
                    _interval(mine_gaps["demographic_parity_difference"]),
                    _interval(mine_gaps["equalized_odds_difference"]),
                ]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        lines += paired_lines(tests or [], target, [*TESTED, *(f"{c} accuracy" for c in cohorts)])
        verdict = best_for_worst_cohort(run_gaps[run_gaps["policy"] != "none"], seeds)
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
    """``report.md`` and the PNG plots (:mod:`fairclip.sims.sweeps.plots`) into ``out``; returns the
    plots drawn."""
    left_out = write_plots(out, table, rounds, keys)
    summary, tests = statistics_tables(table)
    write_csv(out / "statistics.csv", summary)
    write_csv(out / "paired_tests.csv", tests)
    atomic_write_text(out / "report.md", markdown_report(table, title, left_out, tests))
    return [name for name in PLOTS if name not in left_out]
