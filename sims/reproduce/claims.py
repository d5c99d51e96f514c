"""The papers' qualitative claims, tested on a reproduction's runs, and which policy is fairest.

A setup file lists the claims of its paper that its runs can test (``[[claims]]``)::

    [[claims]]
    id = "dpsgdf-equalises-class-8"
    claim = "DPSGD-F loses about as much on class 8 as on the other classes"
    source = "Table 3"
    paper = "-0.015 against -0.716"
    expect = "greater"
    first = { policy = "per-cohort", metric = "accuracy_change_class_8", epsilon = 2.0 }
    second = { policy = "constant", metric = "accuracy_change_class_8", epsilon = 2.0 }

A claim is a signed difference of two of the setup's quantities measured on the same seeds (a
seed fixes the data, the partition and the sampling, so the two runs of one seed form a pair):
d_s = first_s − second_s. Its verdict comes from the paired two-sided t-test of mean d = 0
(:func:`fairclip.sims.sweeps.statistics.paired_test`): **holds** where p < 0.05 and the mean difference
has the sign ``expect`` says (``greater``: > 0, ``less``: < 0), **reverses** where p < 0.05 with
the other sign, **inconclusive** otherwise (including fewer than two seeds).

The question fairclip exists to answer, per setup and target ε, is which policy makes its worst
group pay least for privacy: the worst-group privacy cost of policy P on seed s is
max_k (acc_k(reference, s) − acc_k(P, s)) over the setup's cohorts k, with the non-private
reference (``none``) of the same seed (seeds 003/004's privacy cost π_k, docs/design.md section
4). :func:`fairest_rows` gives each policy's mean over seeds with its t interval, ranks them, and
tests the lowest against the runner-up (paired, same seeds). Only policies that spend about the
same ε are ranked: a policy whose ε exceeds the least spent at that target by more than
``COMPARABLE_EPSILON`` (or that claims none) could owe its lower cost to its larger budget, so it
is listed, with its ε, but not ranked (Algorithm 3 of seed 003 as written, FairLens).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from fairclip.scenarios.errors import ConfigError
from fairclip.sims.sweeps.statistics import SIGNIFICANCE, mean_interval, paired_test

EXPECTATIONS = {"greater": 1.0, "less": -1.0}
"""``expect`` of a claim, and the sign of first − second it asserts."""
HOLDS, REVERSES, INCONCLUSIVE = "holds", "reverses", "inconclusive"
CLAIM_COLUMNS = [
    "setup",
    "id",
    "claim",
    "source",
    "paper",
    "expect",
    "first",
    "second",
    "first_mean",
    "second_mean",
    "seeds",
    "mean_difference",
    "interval_low",
    "interval_high",
    "p_value",
    "verdict",
]
"""The columns of ``claims.csv``."""
FAIREST_COLUMNS = [
    "setup",
    "target_epsilon",
    "rank",
    "policy",
    "epsilon",
    "worst_group_cost",
    "ci_low",
    "ci_high",
    "seeds",
    "worst_group",
    "p_vs_next",
]
"""The columns of ``fairest.csv``: one row per private policy and target ε, rank 1 the lowest
mean worst-group privacy cost; ``epsilon`` the ε its runs spent (their mean; the target where
the setup has one); ``rank`` empty for a policy not ranked (its ε not comparable, module
docstring); ``p_vs_next`` (rank 1 only) the paired test against rank 2."""
COMPARABLE_EPSILON = 1.1
"""A policy is ranked where its ε is at most this factor times the least ε spent by a policy at
the same target. The policies each paper compares at one ε lie within 2 % of each other (the
count releases of per-cohort and global-adapt on top of the sum's); Algorithm 3 as written spends
15-140 times more (esipova-adult, -dutch, -skewed-mnist), FairLens claims none."""
COHORT_ACCURACY = "{cohort}/accuracy"
"""The column of a per-seed row that holds a cohort's accuracy (absolute)."""


@dataclass(frozen=True)
class Side:
    """One side of a claim: a policy's metric at a target ε (``""``: the setup has none)."""

    policy: str
    metric: str
    epsilon: str = ""

    def label(self) -> str:
        at = f" at ε {self.epsilon}" if self.epsilon else ""
        return f"{self.policy} {self.metric}{at}"


@dataclass(frozen=True)
class Claim:
    """A paper's qualitative claim as a paired difference (module docstring)."""

    id: str
    claim: str
    source: str
    paper: str
    expect: str
    first: Side
    second: Side


def parse_claims(
    entries: Any,
    *,
    policies: Sequence[str],
    metrics: Sequence[str],
    epsilons: Sequence[str],
    where: str,
) -> list[Claim]:
    """The ``[[claims]]`` of a setup file, checked against the setup's policy labels, metric
    names and target ε (as text, ``""`` where it has none); one :class:`ConfigError` line naming
    the first problem."""
    if not isinstance(entries, list):
        raise ConfigError(f"{where}: claims must be an array of tables ([[claims]])")
    claims: list[Claim] = []
    for number, entry in enumerate(entries, start=1):
        place = f"{where}: claim {number}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{place} is not a table")
        required = ("id", "claim", "source", "paper", "expect", "first", "second")
        missing = [key for key in required if key not in entry]
        if missing:
            raise ConfigError(f"{place} lacks {missing[0]!r}")
        unknown = sorted(set(entry) - set(required))
        if unknown:
            raise ConfigError(f"{place}: unknown key {unknown[0]!r}")
        if entry["expect"] not in EXPECTATIONS:
            raise ConfigError(f"{place}: expect must be one of {', '.join(EXPECTATIONS)}")
        if any(claim.id == entry["id"] for claim in claims):
            raise ConfigError(f"{place}: id {entry['id']!r} is used twice")
        sides = [
            _side(entry[name], policies, metrics, epsilons, f"{place} ({entry['id']}), {name}")
            for name in ("first", "second")
        ]
        if sides[0] == sides[1]:
            raise ConfigError(f"{place} ({entry['id']}): first and second are the same quantity")
        texts = [str(entry[key]) for key in ("id", "claim", "source", "paper")]
        claims.append(Claim(*texts, entry["expect"], *sides))
    return claims


def _side(
    table: Any, policies: Sequence[str], metrics: Sequence[str], epsilons: Sequence[str], place: str
) -> Side:
    if not isinstance(table, dict) or set(table) - {"policy", "strategy", "metric", "epsilon"}:
        raise ConfigError(f"{place} must be a table of policy, metric and (optionally) epsilon")
    if "policy" in table and "strategy" in table:
        raise ConfigError(f"{place}: give policy or strategy (its old name), not both")
    policy, metric = table.get("policy", table.get("strategy")), table.get("metric")
    if policy not in policies:
        raise ConfigError(f"{place}: the setup has no policy {policy!r}")
    if metric not in metrics:
        raise ConfigError(f"{place}: the setup has no metric {metric!r} (it has: {', '.join(metrics)})")
    epsilon = "" if table.get("epsilon") is None else epsilon_text(float(table["epsilon"]))
    if epsilon not in epsilons:
        shown = ", ".join(e or "none" for e in epsilons)
        raise ConfigError(f"{place}: epsilon {epsilon or 'none'} is not a target of the setup ({shown})")
    return Side(policy, metric, epsilon)


def epsilon_text(epsilon: float | None) -> str:
    """A target ε as the setup files and tables write it (``""`` for none)."""
    return "" if epsilon is None else f"{epsilon:g}"


def _by_seed(per_seed: pd.DataFrame, side: Side) -> pd.Series:
    rows = per_seed[(per_seed["policy"] == side.policy) & (per_seed["target_epsilon"] == side.epsilon)]
    return rows.set_index("seed")[side.metric].astype(float)


def verdict(mean_difference: float, p_value: float, expect: str) -> str:
    """``holds``, ``reverses`` or ``inconclusive`` (module docstring)."""
    if not (math.isfinite(p_value) and p_value < SIGNIFICANCE and math.isfinite(mean_difference)):
        return INCONCLUSIVE
    return HOLDS if np.sign(mean_difference) == EXPECTATIONS[expect] else REVERSES


def claim_rows(setup: str, claims: Iterable[Claim], per_seed: pd.DataFrame) -> list[dict[str, Any]]:
    """One row of ``claims.csv`` per claim, tested on the seeds both of its sides ran."""
    rows = []
    for claim in claims:
        pairs = pd.DataFrame(
            {"first": _by_seed(per_seed, claim.first), "second": _by_seed(per_seed, claim.second)}
        ).dropna()
        test = paired_test("first", "second", pairs)
        rows.append(
            {
                "setup": setup,
                "id": claim.id,
                "claim": claim.claim,
                "source": claim.source,
                "paper": claim.paper,
                "expect": claim.expect,
                "first": claim.first.label(),
                "second": claim.second.label(),
                "first_mean": float(pairs["first"].mean()) if len(pairs) else math.nan,
                "second_mean": float(pairs["second"].mean()) if len(pairs) else math.nan,
                "seeds": test.seeds,
                "mean_difference": test.mean_difference,
                "interval_low": test.interval_low,
                "interval_high": test.interval_high,
                "p_value": test.p_value,
                "verdict": verdict(test.mean_difference, test.p_value, claim.expect),
            }
        )
    return rows


def fairest_rows(
    setup: str,
    per_seed: pd.DataFrame,
    reference: str | None,
    cohorts: Sequence[str],
    spent: Mapping[tuple[str, str], float] | None = None,
) -> list[dict[str, Any]]:
    """The private policies of ``per_seed`` ranked at each target ε by their mean worst-group
    privacy cost against ``reference`` (module docstring); none without a reference or cohorts.
    ``spent`` maps (policy, target ε as text) to the ε its runs spent (``inf``: none claimed);
    a policy it leaves out counts as comparable. Those whose ε is not comparable follow the
    ranked ones, with an empty rank."""
    spent = spent or {}
    if reference is None or not cohorts or per_seed.empty:
        return []
    columns = [COHORT_ACCURACY.format(cohort=cohort) for cohort in cohorts]
    base = per_seed[per_seed["policy"] == reference]
    rows: list[dict[str, Any]] = []
    for epsilon in sorted(set(per_seed["target_epsilon"]), key=_epsilon_order):
        own = base[base["target_epsilon"] == epsilon]
        reference_runs = (own if not own.empty else base[base["target_epsilon"] == ""]).set_index("seed")
        costs: dict[str, pd.Series] = {}
        worst: dict[str, str] = {}
        private = per_seed[(per_seed["target_epsilon"] == epsilon) & (per_seed["policy"] != reference)]
        for policy, runs in private.groupby("policy", sort=False):
            runs = runs.set_index("seed")
            seeds = runs.index.intersection(reference_runs.index)
            if seeds.empty:
                continue
            cost = reference_runs.loc[seeds, columns].astype(float) - runs.loc[seeds, columns].astype(float)
            costs[str(policy)] = cost.max(axis=1)
            worst[str(policy)] = cohorts[int(np.argmax(cost.mean(axis=0).to_numpy()))]
        epsilons = {name: spent.get((name, epsilon), math.nan) for name in costs}
        known = [value for value in epsilons.values() if math.isfinite(value)]
        limit = COMPARABLE_EPSILON * min(known) if known else math.inf
        comparable = [name for name in costs if not epsilons[name] > limit]  # nan (unknown) counts
        by_cost = sorted(costs, key=lambda name: costs[name].mean())
        ranked = [name for name in by_cost if name in comparable]
        for place, policy in enumerate([*ranked, *(n for n in by_cost if n not in comparable)], start=1):
            values = costs[policy]
            low, high = mean_interval(values)
            p_next = math.nan
            if place == 1 and len(ranked) > 1:
                pairs = pd.DataFrame({"best": values, "next": costs[ranked[1]]}).dropna()
                p_next = paired_test("best", "next", pairs).p_value
            rows.append(
                {
                    "setup": setup,
                    "target_epsilon": epsilon,
                    "rank": place if policy in comparable else "",
                    "policy": policy,
                    "epsilon": _epsilon_cell(epsilons[policy]),
                    "worst_group_cost": float(values.mean()),
                    "ci_low": low,
                    "ci_high": high,
                    "seeds": int(values.size),
                    "worst_group": worst[policy],
                    "p_vs_next": p_next,
                }
            )
    return rows


def cell_number(value: Any) -> float:
    """A number of a table row, NaN where it is undefined: a row read back from its CSV holds ""
    there (a test without a t interval or p, where every seed's difference is the same)."""
    return math.nan if value in ("", None) else float(value)


def _epsilon_cell(value: float) -> float | str:
    """A policy's spent ε as ``fairest.csv`` holds it: 4 significant digits, "inf", or "" unknown."""
    if math.isnan(value):
        return ""
    return "inf" if math.isinf(value) else float(f"{value:.4g}")


def _epsilon_order(text: str) -> float:
    return math.inf if text == "" else float(text)


def _number(value: Any, digits: int = 4) -> str:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return "—"
    return "—" if math.isnan(number) else f"{number:+.{digits}f}"


def _interval(low: Any, high: Any) -> str:
    low_text, high_text = _number(low), _number(high)
    return "" if "—" in (low_text, high_text) else f" [{low_text}, {high_text}]"


def claims_markdown(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The claims of one setup (or of several, with their setup first) as a Markdown table."""
    if not rows:
        return []
    several = len({row["setup"] for row in rows}) > 1
    lines = [
        "| " + ("setup | " if several else "") + "claim | paper | fairclip: first − second [95 %] | "
        "seeds | p | verdict |",
        "|" + ("---|" if several else "") + "---|---|---|---|---|---|",
    ]
    for row in rows:
        p_value = cell_number(row["p_value"])
        lines.append(
            "| "
            + (f"{row['setup']} | " if several else "")
            + f"{row['claim']} ({row['source']}; `{row['first']}` − `{row['second']}`, expected "
            f"{'> 0' if row['expect'] == 'greater' else '< 0'}) | {row['paper']} | "
            f"{_number(row['mean_difference'])}{_interval(row['interval_low'], row['interval_high'])} | "
            f"{row['seeds']} | {'—' if math.isnan(p_value) else f'{p_value:.3g}'} | **{row['verdict']}** |"
        )
    return lines


def fairest_markdown(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Which policy's worst group pays least for privacy, at each target ε, as Markdown."""
    if not rows:
        return []
    lines = [
        "| ε | rank | policy | ε spent | worst-group privacy cost [95 %] | seeds | worst group | "
        "p (rank 1 vs 2) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        p_value = cell_number(row["p_vs_next"])
        p_text = "" if math.isnan(p_value) else f"{p_value:.3g}"
        rank = row["rank"] if row["rank"] not in ("", None) else "not ranked"
        # a record from before 2026-12-05 holds no spent ε: at a target, its runs spent the target
        spent = row.get("epsilon") or row["target_epsilon"]
        lines.append(
            f"| {row['target_epsilon'] or '—'} | {rank} | `{row['policy']}` | "
            f"{spent or '—'} | "
            f"{_number(row['worst_group_cost'])}{_interval(row['ci_low'], row['ci_high'])} | "
            f"{row['seeds']} | {row['worst_group']} | {p_text} |"
        )
    if any(row["rank"] in ("", None) for row in rows):
        lines += [
            "",
            f"Not ranked: a policy that spends more than {COMPARABLE_EPSILON:g} times the least ε "
            "spent at its target, or claims none, could owe a lower cost to its larger budget.",
        ]
    return lines
