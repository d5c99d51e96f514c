"""A reproduction's tables: fairclip's means against the paper's, paired tests, claims and report.

``reproduction.csv`` (one row per policy, ε and metric: the paper's value, fairclip's mean and
standard error over the seeds, both accountants' ε, and whether the mean lies outside the paper's
error), ``paired_tests.csv``, ``per_seed.csv``, ``claims.csv``, ``fairest.csv`` and
``reproduction.md`` (:func:`write_outputs`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from fairclip.atomic import atomic_write_text, write_csv
from fairclip.scenarios.errors import ConfigError
from fairclip.sims.reproduce.claims import (
    CLAIM_COLUMNS,
    COHORT_ACCURACY,
    FAIREST_COLUMNS,
    cell_number,
    claim_rows,
    claims_markdown,
    epsilon_text,
    fairest_markdown,
    fairest_rows,
)
from fairclip.sims.reproduce.paired_metrics import add_paired_metrics, per_seed_values
from fairclip.sims.reproduce.setups import PolicySetup, Run, Setup
from fairclip.sims.sweeps.statistics import paired_test_rows
from fairclip.strategies import accounting
from fairclip.strategies.errors import PolicyConfigError

if TYPE_CHECKING:
    from fairclip.sims.reproduce.planning import Planner


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
    "policy",
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


POINTS = 0.02
"""Tolerance where the paper gives no standard error: ± 2 accuracy points."""


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


def table_rows(
    setup: Setup,
    runs: list[Run],
    summaries: dict[str, dict[str, Any]],
    per_seed: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """One row per (policy, ε, metric): the columns of ``reproduction.csv`` plus ``outside``. A
    policy that is not private runs at each target ε of the setup (the target sets no noise, so
    its runs are the same at each): its rows appear once, those of its first target ε. The
    setup's paired metrics follow each policy's metrics (:func:`paired_metric_rows`), read from
    ``per_seed`` (:func:`per_seed_rows` of the same runs; formed here when not given)."""
    rows = []
    seeds_table: pd.DataFrame | None = None  # formed once, where the setup has paired metrics
    for policy in setup.policies:
        for epsilon in setup.epsilons:
            mine = [run for run in runs if run.policy == policy.name and run.target_epsilon == epsilon]
            if not mine:
                continue
            found = [summaries[run.key] for run in mine]
            spent = [float(s["epsilon"]) if s["epsilon"] != "inf" else math.inf for s in found]
            if any(math.isinf(value) for value in spent):  # not private, whatever the target
                if any(row["policy"] == policy.name for row in rows):
                    continue
                shown = math.inf
            else:
                shown = epsilon if epsilon is not None else float(np.mean(spent))
            text = epsilon_text(epsilon)
            reference = None
            if setup.relative_to is not None and policy.name != setup.relative_to:
                reference = _paired_reference(setup.relative_to, epsilon, mine, runs, summaries)
            first_row = len(rows)
            for metric, (cohort, name) in setup.metrics.items():
                values = [metric_value(s, cohort, name) for s in found]
                if reference is not None and setup.changes(metric):  # against the same seed's reference
                    values = [
                        v - metric_value(r, cohort, name) for v, r in zip(values, reference, strict=True)
                    ]
                elif setup.changes(metric):  # the reference itself: absolute values
                    metric = f"{cohort}/{name}"
                rows.append(
                    {
                        "setup": setup.name,
                        "policy": policy.name,
                        "epsilon": "inf" if math.isinf(shown) else float(f"{shown:.4g}"),
                        **{
                            f"epsilon_{name}": both_accountants(found, name, mine[0].search_runs)
                            for name in ("rdp", "prv")
                        },
                        **_against_the_paper(policy, text, metric, values),
                        "grid_point": mine[0].grid_point,
                    }
                )
            if setup.paired_metrics:
                if seeds_table is None:
                    found_rows = per_seed if per_seed is not None else per_seed_rows(setup, runs, summaries)
                    seeds_table = pd.DataFrame(found_rows)
                rows += paired_metric_rows(setup, policy, text, seeds_table, rows[first_row])
    return rows


def paired_metric_rows(
    setup: Setup, policy: PolicySetup, epsilon: str, per_seed: pd.DataFrame, template: dict[str, Any]
) -> list[dict[str, Any]]:
    """The table rows of the setup's paired metrics for ``policy`` at target ε ``epsilon``
    (text), from ``per_seed`` (:func:`fairclip.sims.reproduce.paired_metrics.add_paired_metrics`);
    their other columns (ε, grid point) are those of ``template``, a row of the same policy and ε.
    No rows for the reference itself, or where it did not run."""
    values = per_seed_values(per_seed, policy.name, epsilon, setup.paired_metrics)
    return [
        {**template, **_against_the_paper(policy, epsilon, metric, each)} for metric, each in values.items()
    ]


def _against_the_paper(policy: PolicySetup, epsilon: str, metric: str, values: list[float]) -> dict[str, Any]:
    """The columns of a table row that compare ``metric``'s ``values`` over the seeds with the
    paper's number for ``policy`` at target ε ``epsilon`` (text)."""
    mean, stderr = mean_stderr(values)
    return {
        "metric": metric,
        "fairclip_mean": round(mean, 6),
        "fairclip_stderr": "" if math.isnan(stderr) else round(stderr, 6),
        "seeds": len(values),
        **paper_columns(policy, epsilon, metric, mean, stderr),
    }


def paper_columns(
    policy: PolicySetup, epsilon: str, metric: str, mean: float, stderr: float
) -> dict[str, Any]:
    """The paper's number for ``policy``'s ``metric`` at target ε ``epsilon`` (text), its
    standard error, and whether fairclip's ``mean`` ± ``stderr`` lies outside it (:func:`outside`)."""
    paper = policy.paper.get(epsilon, {}).get(metric)
    paper_se = policy.paper_stderr.get(epsilon, {}).get(metric)
    return {
        "paper": "" if paper is None else paper,
        "paper_stderr": "" if paper_se is None else paper_se,
        "outside": outside(paper, paper_se, mean, stderr),
    }


def _paired_reference(
    name: str, epsilon: float | None, mine: list[Run], runs: list[Run], summaries: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """The summaries of reference policy ``name``'s runs with the seeds of ``mine``, in order
    (its runs at the same target ε, or its only runs where it has none)."""
    by_seed: dict[int, dict[str, Any]] = {}
    for run in runs:
        if run.policy == name and (run.target_epsilon == epsilon or run.target_epsilon is None):
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
    ε is taken; so it is where the clients evaluated the model (``evaluation_releases``: a mixed
    history the claim's (σ_eff, q, T) does not describe). "inf" where a run claims no ε
    (``guarantee`` false: FairLens's coupled updates, a seed that gives the noise away), whatever
    its mechanism alone would give (``mechanism_epsilon``)."""
    values = []
    for summary in summaries:
        claim = summary["privacy"]
        if claim.get("guarantee") is False:
            return "inf"
        if claim.get("noise_multiplier_varies") or claim.get("evaluation_releases"):
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
    """Paired tests between the policies run at one target ε, per metric of the setup, over the
    seeds both ran (:func:`fairclip.sims.sweeps.statistics.paired_test_rows`: a seed fixes the data
    and the sampling, so two policies' runs of one seed form a pair). The values compared are
    the metrics themselves, so for a ``relative_to`` setup the difference of two policies'
    changes is the same number."""
    records = []
    for run in runs:
        summary = summaries[run.key]
        record: dict[str, Any] = {
            "policy": run.policy,
            "seed": run.seed,
            "target_epsilon": epsilon_text(run.target_epsilon) or "—",
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
    """One row per final run (``per_seed.csv``): its policy, target ε (as text), seed, each of
    the setup's metrics as the table reads it -- the change against the reference's run of the
    same seed where the setup has ``relative_to`` (0 for the reference itself) -- and each
    cohort's accuracy (absolute, ``COHORT/accuracy``), the quantities the claims and the
    fairest-policy ranking are paired tests of (:mod:`fairclip.sims.reproduce.claims`), and the
    setup's paired metrics (:func:`fairclip.sims.reproduce.paired_metrics.add_paired_metrics`)."""
    rows = []
    for policy in setup.policies:
        for epsilon in setup.epsilons:
            mine = [run for run in runs if run.policy == policy.name and run.target_epsilon == epsilon]
            if not mine:
                continue
            reference = None
            if setup.relative_to is not None:
                reference = _paired_reference(setup.relative_to, epsilon, mine, runs, summaries)
            for index, run in enumerate(mine):
                summary = summaries[run.key]
                row: dict[str, Any] = {
                    "policy": run.policy,
                    "target_epsilon": epsilon_text(epsilon),
                    "seed": run.seed,
                }
                for metric, (cohort, name) in setup.metrics.items():
                    value = metric_value(summary, cohort, name)
                    if reference is not None and setup.changes(metric):
                        value -= metric_value(reference[index], cohort, name)
                    row[metric] = value
                for cohort, values in summary.get("cohorts", {}).items():
                    if values.get("accuracy") is not None:
                        row[COHORT_ACCURACY.format(cohort=cohort)] = float(values["accuracy"])
                rows.append(row)
    return add_paired_metrics(setup.paired_metrics, reference_policy(setup), rows)


def reference_policy(setup: Setup) -> str | None:
    """The setup's non-private reference, against which privacy costs are measured: its
    ``relative_to``, else its policy that runs ``none``, else None."""
    if setup.relative_to is not None:
        return setup.relative_to
    return next((s.name for s in setup.policies if s.policy_name == "none"), None)


def spent_epsilons(setup: Setup, rows: list[dict[str, Any]]) -> dict[tuple[str, str], float]:
    """(policy, target ε as text) → the ε its runs spent, from the table's rows (:func:`table_rows`:
    the target where the setup has one, else the runs' mean; ``inf`` for a policy that claims
    none, at every target)."""
    spent: dict[tuple[str, str], float] = {}
    for row in rows:
        for target in target_texts(setup, row["epsilon"]):
            spent[(row["policy"], target)] = float(row["epsilon"])  # "inf" reads as math.inf
    return spent


def target_texts(setup: Setup, shown: Any) -> list[str]:
    """The target ε (as text) of a table row that shows ε ``shown``: the setup's only one where it
    has none, else ``shown`` itself; every target for a policy that claims none (it shows inf,
    and its runs are the same at each)."""
    if setup.epsilons == [None]:
        return [""]
    if str(shown) == "inf":
        return [epsilon_text(epsilon) for epsilon in setup.epsilons]
    return [epsilon_text(float(shown))]


def claim_and_fairest_rows(
    setup: Setup, per_seed: list[dict[str, Any]], spent: dict[tuple[str, str], float] | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The setup's claims tested on ``per_seed`` (those whose policies and metrics are there), and its
    policies ranked by worst-group privacy cost (:mod:`fairclip.sims.reproduce.claims`; ``spent``,
    from :func:`spent_epsilons`, leaves a policy of incomparable ε unranked)."""
    table = pd.DataFrame(per_seed)
    if table.empty:
        return [], []
    ran = set(table["policy"])
    measured = set(table.columns)  # paired metrics only where the reference ran
    claims = [
        c
        for c in setup.claims
        if {c.first.policy, c.second.policy} <= ran and {c.first.metric, c.second.metric} <= measured
    ]
    suffix = COHORT_ACCURACY.format(cohort="")
    cohorts = [column[: -len(suffix)] for column in table.columns if column.endswith(suffix)]
    reference = reference_policy(setup)
    fairest = fairest_rows(setup.name, table, reference if reference in ran else None, cohorts, spent)
    return claim_rows(setup.name, claims, table), fairest


def paired_lines(tests: list[dict[str, Any]]) -> list[str]:
    """The paired tests as a Markdown section (nothing where fewer than two seeds ran)."""
    shown = [t for t in tests if t["seeds"] >= 2]
    if not shown:
        return []
    lines = [
        "## Paired tests between policies (same seeds)",
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
        low, high, p_value = (cell_number(test[key]) for key in ("interval_low", "interval_high", "p_value"))
        interval = "[—]" if math.isnan(low) else f"[{low:+.4f}, {high:+.4f}]"
        lines.append(
            f"| {test['target_epsilon']} | {test['quantity']} | `{test['first']}` − `{test['second']}` | "
            f"{test['seeds']} | {cell_number(test['mean_difference']):+.4f} {interval} | {p_value:.3g} | "
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
        "| policy | ε | ε RDP / PRV | metric | paper | fairclip (mean ± s.e.) | seeds | chosen | |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        se = "" if row["fairclip_stderr"] == "" else f" ± {row['fairclip_stderr']:.4f}"
        paper = "—" if row["paper"] == "" else f"{row['paper']:.4f}"
        chosen = ", ".join(f"{k.split('.')[-1]}={v:g}" for k, v in row["grid_point"].items())
        flag = "**outside**" if row["outside"] else ""
        lines.append(
            f"| `{row['policy']}` | {row['epsilon']} | {row['epsilon_rdp']} / {row['epsilon_prv']} | "
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
            + ", ".join(f"`{r['policy']}` {r['metric']} (ε {r['epsilon']})" for r in flagged)
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
    """The report's line on a ``per-grid`` budget: each policy's k and what the ε columns are."""
    sizes = ", ".join(f"`{s.name}` {planner.search_runs(s)}" for s in setup.policies)
    return (
        "Privacy budget per grid (`setup.budget = per-grid`): each target ε covers a policy's whole "
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
    claims, fairest = claim_and_fairest_rows(setup, per_seed or [], spent_epsilons(setup, rows))
    write_csv(out / "reproduction.csv", [{column: row[column] for column in COLUMNS} for row in rows])
    write_csv(out / "paired_tests.csv", tests or [], columns=PAIRED_COLUMNS)
    write_csv(out / "per_seed.csv", per_seed or [])
    write_csv(out / "claims.csv", claims, columns=CLAIM_COLUMNS)
    write_csv(out / "fairest.csv", fairest, columns=FAIREST_COLUMNS)
    atomic_write_text(out / "reproduction.md", markdown(setup, rows, wall, extra, tests, claims, fairest))
