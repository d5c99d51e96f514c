"""Metrics of a run paired with the non-private reference run of the same seed: seed 003's
privacy cost π_k (its Eq. 1), excessive risk R_k (Eq. 2) and their gaps between two groups.

A setup declares them over its own metrics (``[setup.metrics]``)::

    [setup.paired_metrics]
    privacy_cost_male = { of = "accuracy_male", difference = "reference - policy" }
    excessive_risk_male = { of = "loss_male", difference = "policy - reference" }
    privacy_cost_gap = { gap = ["privacy_cost_male", "privacy_cost_female"] }

For a policy P and seed s, with the reference run of the same seed (the setup's policy that runs
``none``: the seed fixes the data, the partition and the sampling), Esipova et al. (2023,
section 2) define

    π_k(P, s) = acc_k(none, s) − acc_k(P, s)
    R_k(P, s) = L_k(P, s) − L_k(none, s)
    π_{a,b}(P, s) = |π_a(P, s) − π_b(P, s)|,   R_{a,b}(P, s) = |R_a(P, s) − R_b(P, s)|.

Each is formed per seed and then averaged over the seeds (mean ± s.e.), as the paper's tables
report them: their s.e. of π_k is far below that of acc_k, which only pairing by seed gives.
The reference's own rows have none of them. A setup whose metrics are already changes against
a reference (``setup.relative_to``) has no paired metrics: its metrics are paired already.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from fairclip.scenarios.errors import ConfigError

DIFFERENCES = {"policy - reference": 1.0, "reference - policy": -1.0}
"""``difference`` of a paired metric, and the sign it gives metric(P, s) − metric(reference, s)."""


@dataclass(frozen=True)
class PairedMetric:
    """One paired metric: a signed difference ``of`` a setup metric against the reference, or the
    ``gap`` |a − b| of two other paired metrics."""

    name: str
    of: str | None = None
    sign: float = 1.0
    gap: tuple[str, str] | None = None


def parse_paired_metrics(table: Any, metrics: Sequence[str], where: str) -> tuple[PairedMetric, ...]:
    """``[setup.paired_metrics]``, checked against the setup's metric names; one
    :class:`ConfigError` line naming the first problem."""
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where}: setup.paired_metrics must be a table of tables")
    parsed: list[PairedMetric] = []
    for name, entry in table.items():
        place = f"{where}: setup.paired_metrics.{name}"
        if name in metrics:
            raise ConfigError(f"{place}: the name is already a metric of the setup")
        if not isinstance(entry, Mapping) or set(entry) not in ({"of", "difference"}, {"gap"}):
            raise ConfigError(f'{place} must be {{ of = METRIC, difference = "..." }} or {{ gap = [A, B] }}')
        if "gap" in entry:
            pair = entry["gap"]
            if not (isinstance(pair, list) and len(pair) == 2 and pair[0] != pair[1]):
                raise ConfigError(f"{place}: gap must name two different paired metrics")
            parsed.append(PairedMetric(name, gap=(str(pair[0]), str(pair[1]))))
            continue
        if entry["of"] not in metrics:
            known = ", ".join(metrics)
            raise ConfigError(f"{place}: the setup has no metric {entry['of']!r} (it has: {known})")
        if entry["difference"] not in DIFFERENCES:
            raise ConfigError(f"{place}: difference must be one of {', '.join(map(repr, DIFFERENCES))}")
        parsed.append(PairedMetric(name, of=entry["of"], sign=DIFFERENCES[entry["difference"]]))
    differences = {metric.name for metric in parsed if metric.gap is None}
    for metric in parsed:
        unknown = [part for part in metric.gap or () if part not in differences]
        if unknown:
            raise ConfigError(
                f"{where}: setup.paired_metrics.{metric.name}: gap names {unknown[0]!r}, "
                "which is no difference declared in setup.paired_metrics"
            )
    return tuple(parsed)


def add_paired_metrics(
    paired: Sequence[PairedMetric], reference: str | None, per_seed: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """``per_seed`` (the rows of ``per_seed.csv``: policy, target ε text, seed, the setup's
    metrics) with each paired metric added to every row of a policy other than ``reference``
    whose seed the reference ran (its run at the same target ε, else its only runs). Nothing is
    added where the reference did not run at all (``--policies`` without it)."""
    if not paired or reference is None:
        return per_seed
    runs = [row for row in per_seed if row["policy"] == reference]
    if not runs:
        return per_seed
    out = []
    for row in per_seed:
        row = dict(row)
        if row["policy"] != reference:
            same_seed = [r for r in runs if r["seed"] == row["seed"]]
            matched = [r for r in same_seed if r["target_epsilon"] == row["target_epsilon"]] or same_seed
            values: dict[str, float] = {}
            for metric in sorted(paired, key=lambda m: m.gap is not None):  # a gap reads two differences
                values[metric.name] = _value(metric, row, matched[0], values) if matched else math.nan
            row.update({metric.name: values[metric.name] for metric in paired})  # in declared order
        out.append(row)
    return out


def _value(
    metric: PairedMetric, row: dict[str, Any], reference: dict[str, Any], differences: dict[str, float]
) -> float:
    """``metric`` of ``row`` against ``reference`` (a gap from the row's ``differences``)."""
    if metric.gap is not None:
        first, second = (differences[name] for name in metric.gap)
        return abs(first - second)
    return metric.sign * (float(row[metric.of]) - float(reference[metric.of]))


def per_seed_values(
    per_seed: pd.DataFrame, policy: str, epsilon: str, paired: Sequence[PairedMetric]
) -> dict[str, list[float]]:
    """Each paired metric's values over the seeds of ``policy`` at target ε ``epsilon`` (text),
    where the reference ran that seed; empty where no row of the policy holds them."""
    if per_seed.empty:
        return {}
    rows = per_seed[(per_seed["policy"] == policy) & (per_seed["target_epsilon"].astype(str) == epsilon)]
    values = {}
    for metric in paired:
        if metric.name in rows.columns:
            column = pd.to_numeric(rows[metric.name], errors="coerce").dropna()
            if len(column):
                values[metric.name] = [float(v) for v in column]
    return values
