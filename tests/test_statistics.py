"""t intervals and paired tests across seeds; group fairness with Fairlearn."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy import stats

from fairclip.scenarios.tasks.fairness import group_fairness, partition
from fairclip.sims.sweeps import statistics


def test_mean_interval_is_students_t_interval():
    values = [0.80, 0.82, 0.79, 0.85, 0.81]
    low, high = statistics.mean_interval(values)
    half = stats.t.ppf(0.975, 4) * np.std(values, ddof=1) / math.sqrt(5)
    assert (low, high) == pytest.approx((np.mean(values) - half, np.mean(values) + half))
    assert statistics.mean_interval([0.5, 0.5, 0.5]) == (0.5, 0.5)
    assert all(math.isnan(v) for v in statistics.mean_interval([0.7]))
    assert statistics.mean_interval([0.7, math.nan, 0.9]) == pytest.approx(
        statistics.mean_interval([0.7, 0.9])
    )


@pytest.mark.parametrize("seeds", [2, 3, 20])
def test_mean_interval_has_its_coverage_with_few_seeds_too(seeds):
    """Over many samples of n seeds from N(0, 1), the 95 % interval holds the true mean about
    95 % of the time, with 2 and 3 seeds as with 20. A percentile bootstrap of 2 or 3 values is
    their range: it held the mean about half the time with 2 seeds and about 3/4 with 3."""
    generator = np.random.default_rng(7)
    trials = 2000
    covered = sum(
        low <= 0.0 <= high
        for low, high in (statistics.mean_interval(generator.normal(size=seeds)) for _ in range(trials))
    )
    assert 0.93 <= covered / trials <= 0.97


def test_two_seeds_that_agree_in_sign_are_not_a_sure_lead():
    """Differences +0.001 and +0.009 (p = 0.23): the interval holds 0, as the p says. The
    bootstrap interval was [+0.001, +0.009]."""
    (test,) = statistics.paired_tests(_runs({"a": [0.801, 0.809], "b": [0.8, 0.8]}), "q")
    assert test.p_value == pytest.approx(stats.ttest_1samp([0.001, 0.009], 0.0).pvalue)
    assert test.p_value > 0.05 and not test.significant
    assert test.interval_low < 0 < test.interval_high


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0, 1, allow_subnormal=False), st.floats(0, 1, allow_subnormal=False)),
        min_size=2,
        max_size=8,
    )
)
def test_a_paired_interval_leaves_out_zero_exactly_where_the_test_is_significant(pairs):
    """The interval and the p come from one t-test: 0 lies outside the interval iff p < 0.05
    (NaN together, where every difference is the same non-zero number)."""
    per_run = _runs({"a": [a for a, _ in pairs], "b": [b for _, b in pairs]})
    (test,) = statistics.paired_tests(per_run, "q")
    if math.isnan(test.p_value):
        assert math.isnan(test.interval_low) and math.isnan(test.interval_high)
        return
    assert test.interval_low <= test.mean_difference * (1 + 1e-12) + 1e-15
    assume(abs(test.p_value - statistics.SIGNIFICANCE) > 1e-9)
    assume(min(abs(test.interval_low), abs(test.interval_high)) > 1e-12)
    outside = test.interval_low > 0 or test.interval_high < 0
    assert outside == test.significant


def _runs(values: dict[str, list[float]]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"policy": policy, "seed": seed, "q": value}
            for policy, series in values.items()
            for seed, value in enumerate(series)
        ]
    )


def test_paired_test_uses_the_pairs_not_the_levels():
    """Seeds that move both policies together: a consistent small lead is significant when
    paired, though the levels' spread dwarfs it."""
    per_run = _runs({"a": [0.70, 0.80, 0.90, 0.75], "b": [0.69, 0.79, 0.89, 0.745]})
    (test,) = statistics.paired_tests(per_run, "q")
    assert (test.first, test.second, test.seeds) == ("a", "b", 4)
    assert test.mean_difference == pytest.approx(0.00875)
    expected = stats.ttest_rel([0.70, 0.80, 0.90, 0.75], [0.69, 0.79, 0.89, 0.745]).pvalue
    assert test.p_value == pytest.approx(expected)
    assert test.significant
    assert stats.ttest_ind([0.70, 0.80, 0.90, 0.75], [0.69, 0.79, 0.89, 0.745]).pvalue > 0.5
    assert test.interval_low > 0


def test_paired_tests_say_when_a_difference_is_not_significant():
    per_run = _runs({"a": [0.80, 0.75, 0.85], "b": [0.78, 0.79, 0.82], "c": [0.80, 0.75, 0.85]})
    tests = {(t.first, t.second): t for t in statistics.paired_tests(per_run, "q")}
    assert len(tests) == 3
    assert not any(t.significant for t in tests.values())
    same = tests.get(("a", "c")) or tests[("c", "a")]
    assert same.mean_difference == 0 and same.p_value == 1.0
    one_seed = statistics.paired_tests(_runs({"a": [0.9], "b": [0.8]}), "q")[0]
    assert math.isnan(one_seed.p_value) and not one_seed.significant


def test_summary_and_test_rows_group_by_target_epsilon():
    per_run = pd.concat(
        [
            _runs({"a": [0.8, 0.82, 0.81], "b": [0.7, 0.71, 0.69]}).assign(target_epsilon=eps)
            for eps in (1.0, 8.0)
        ]
    )
    summary = statistics.summary_rows(per_run, ["q"], ["target_epsilon", "policy"])
    assert len(summary) == 4
    first = summary[0]
    assert first["quantity"] == "q" and first["seeds"] == 3
    assert first["ci_low"] <= first["mean"] <= first["ci_high"]
    tests = statistics.paired_test_rows(per_run, ["q"], ["target_epsilon"])
    assert len(tests) == 2 and all(row["significant"] for row in tests)
    assert {row["target_epsilon"] for row in tests} == {1.0, 8.0}


def test_group_fairness_matches_the_definitions():
    labels = np.array([1, 1, 0, 0, 1, 0, 1, 0])
    predictions = np.array([1, 0, 0, 1, 1, 1, 1, 0])
    cohorts = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    overall, per_cohort = group_fairness(labels, predictions, cohorts, ["a", "b"])
    assert per_cohort["a"] == {"tpr": 0.5, "fpr": 0.5, "selection_rate": 0.5}
    assert per_cohort["b"] == {"tpr": 1.0, "fpr": 0.5, "selection_rate": 0.75}
    assert overall["demographic_parity_difference"] == pytest.approx(0.25)
    assert overall["equalized_odds_difference"] == pytest.approx(0.5)  # max(TPR gap .5, FPR gap 0)


def test_group_differences_are_fairleans_own_on_random_predictions():
    from fairlearn.metrics import demographic_parity_difference, equalized_odds_difference

    generator = np.random.default_rng(3)
    for _ in range(5):
        labels, predictions = generator.integers(0, 2, 300), generator.integers(0, 2, 300)
        cohorts = generator.integers(0, 3, 300)
        groups = np.array(["a", "b", "c"], dtype=object)[cohorts]
        overall, _ = group_fairness(labels, predictions, cohorts, ["a", "b", "c"])
        assert overall["demographic_parity_difference"] == pytest.approx(
            demographic_parity_difference(labels, predictions, sensitive_features=groups)
        )
        assert overall["equalized_odds_difference"] == pytest.approx(
            equalized_odds_difference(labels, predictions, sensitive_features=groups)
        )


def test_only_cohorts_that_partition_the_test_set_get_group_metrics():
    owner = np.array([0, 1, 1, 0])
    assert partition({"a": (owner == 0) * 1.0, "b": (owner == 1) * 1.0}).tolist() == [0, 1, 1, 0]
    assert partition({"a": np.array([0.5, 1, 1, 0]), "b": np.array([0.5, 0, 0, 1])}) is None
    assert partition({"a": np.ones(4), "b": np.ones(4)}) is None  # class-mix cohorts weigh every row


def test_differences_equal_up_to_rounding_are_not_called_significant():
    """Two seeds on which A beats B by the same number of test examples: the differences agree
    to the last bits only, their variance is rounding, and the t-test is undefined -- not p ≈ 0."""
    by_seed = pd.DataFrame(
        {"a": [0.8809034907597536, 0.8788501026694046], "b": [0.8644763860369611, 0.8624229979466119]}
    )
    assert (by_seed["a"] - by_seed["b"]).nunique() == 2  # not bit-equal: rounding tells them apart
    test = statistics.paired_test("a", "b", by_seed)
    assert math.isnan(test.p_value) and not test.significant
    assert test.mean_difference == pytest.approx(16 / 974)
    # a real spread, however small against the levels, is still tested
    spread = pd.DataFrame({"a": [0.8809, 0.8790, 0.8801], "b": [0.8645, 0.8625, 0.8640]})
    assert statistics.paired_test("a", "b", spread).p_value < 0.05
