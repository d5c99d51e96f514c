"""Uncertainty across seeds: intervals of means, and paired tests between policies.

A comparison runs every policy on the same seeds, and a seed fixes the data, the partition and
the client sampling, so two policies' results on one seed form a pair. For a quantity q (a
cohort's accuracy, a privacy-cost gap, the worst cohort's accuracy ...) measured on seeds
s = 1..n:

* **interval of a mean**: Student's t interval mean ± t_{0.975, n−1} · s/√n, with s the
  standard deviation over the seeds (``scipy.stats.t``);
* **paired test** of policies A and B: d_s = q_s(A) − q_s(B), the paired t-test of mean d = 0
  (``scipy.stats.ttest_rel``, two-sided) and the t interval of mean d that comes with it, so the
  interval leaves out 0 exactly where p < 0.05. A difference is *significant at 5 %* where
  p < 0.05. With n = 2 or 3 seeds both are weak (t_{0.975, 1} = 12.7: two seeds give a wide
  interval), and the report says how many seeds they rest on.

These intervals used to be percentile bootstraps. With 2 or 3 seeds, the reproductions' usual
count, a percentile bootstrap of the mean is the range [min, max] of the seeds' values: the
extreme resamples (all copies of one seed) have probability 1/4 and 1/27, above 2.5 %. So it left
out 0 whenever every seed's difference had the same sign, about half the time with two seeds
where the true difference is 0, and a reader took "[+0.032, +0.054]" beside p = 0.16 for a sure
lead.

Seed 000 says of its Table 6 that its differences are not significant; these are the numbers that
let a fairclip report say such a thing itself.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
from scipy import stats

CONFIDENCE = 0.95
SIGNIFICANCE = 0.05
EQUAL_DIFFERENCES = 1e-9
"""Differences d_s that agree to this fraction of the largest are equal: their spread is
floating-point rounding, and the t-test of such differences is undefined (zero variance), so its p
and interval are NaN, never significant. Unchecked, two seeds on which A beat B by the same 16
test examples of 974 (0.8809 − 0.8645 and 0.8789 − 0.8625: equal to 1e-16) gave p = 2e-15,
"significant"."""


def mean_interval(values, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Student's t interval of the mean of ``values`` (NaN ignored):
    mean ± t_{(1+confidence)/2, n−1} · s/√n; (NaN, NaN) for fewer than two values, (v, v) where
    every value is v."""
    array = np.asarray(values, dtype=np.float64)
    array = array[np.isfinite(array)]
    if array.size < 2:
        return math.nan, math.nan
    if np.all(array == array[0]):
        return float(array[0]), float(array[0])
    low, high = stats.t.interval(confidence, array.size - 1, loc=array.mean(), scale=stats.sem(array))
    return float(low), float(high)


@dataclass(frozen=True)
class PairedTest:
    """A's quantity against B's over the seeds both ran."""

    first: str
    second: str
    seeds: int
    mean_difference: float
    """mean over seeds of q(first) − q(second)."""
    interval_low: float
    interval_high: float
    """The t interval of the mean difference that goes with :attr:`p_value` (it leaves out 0
    exactly where p < 0.05; NaN where p is)."""
    p_value: float
    """Two-sided paired t-test of a zero mean difference (NaN with fewer than two seeds, or where
    every difference is the same non-zero number)."""

    @property
    def significant(self) -> bool:
        return bool(self.p_value < SIGNIFICANCE)


def paired_test(first: str, second: str, by_seed: pd.DataFrame) -> PairedTest:
    """The paired test of columns ``first`` and ``second`` of ``by_seed`` (one row per seed)."""
    pairs = by_seed[[first, second]].dropna()
    differences = (pairs[first] - pairs[second]).to_numpy(dtype=np.float64)
    # NaN is also what ttest_rel gives where every difference is equal and non-zero
    p_value, low, high = math.nan, math.nan, math.nan
    if len(differences) >= 2:
        largest = float(np.abs(differences).max())
        if largest == 0:
            p_value, low, high = 1.0, 0.0, 0.0
        elif np.ptp(differences) > EQUAL_DIFFERENCES * largest:
            test = stats.ttest_rel(pairs[first], pairs[second])
            interval = test.confidence_interval(CONFIDENCE)
            p_value, low, high = float(test.pvalue), float(interval.low), float(interval.high)
    mean = float(differences.mean()) if len(differences) else math.nan
    return PairedTest(first, second, len(differences), mean, low, high, p_value)


def paired_tests(per_run: pd.DataFrame, quantity: str) -> list[PairedTest]:
    """Every pair of policies in ``per_run`` (columns ``policy``, ``seed`` and ``quantity``),
    the better mean first."""
    by_seed = per_run.pivot_table(index="seed", columns="policy", values=quantity)
    order = by_seed.mean().sort_values(ascending=False).index
    return [paired_test(str(a), str(b), by_seed) for a, b in itertools.combinations(order, 2)]


def summary_rows(per_run: pd.DataFrame, quantities: list[str], keys: list[str]) -> list[dict]:
    """Mean, standard error and t interval (:func:`mean_interval`) of each quantity, per group of
    ``keys``."""
    rows = []
    for group, block in per_run.groupby(keys, dropna=False, sort=True):
        group = group if isinstance(group, tuple) else (group,)
        for quantity in quantities:
            values = block[quantity].dropna().to_numpy(dtype=np.float64)
            finite = values[np.isfinite(values)]
            mean = float(finite.mean()) if finite.size else math.nan
            se = float(finite.std(ddof=1) / math.sqrt(finite.size)) if finite.size > 1 else math.nan
            low, high = mean_interval(finite)
            rows.append(
                {
                    **dict(zip(keys, group, strict=True)),
                    "quantity": quantity,
                    "mean": mean,
                    "stderr": se,
                    "ci_low": low,
                    "ci_high": high,
                    "seeds": int(finite.size),
                }
            )
    return rows


def paired_test_rows(per_run: pd.DataFrame, quantities: list[str], keys: list[str]) -> list[dict]:
    """Every paired test of each quantity, per group of ``keys`` (the target ε)."""
    rows = []
    for group, block in per_run.groupby(keys, dropna=False, sort=True):
        group = group if isinstance(group, tuple) else (group,)
        for quantity in quantities:
            for test in paired_tests(block, quantity):
                rows.append(
                    {
                        **dict(zip(keys, group, strict=True)),
                        "quantity": quantity,
                        **asdict(test),
                        "significant": test.significant,
                    }
                )
    return rows
