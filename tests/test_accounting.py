"""Privacy accounting: fairclip's ε is Opacus' ε, calibration round-trips, budgets stop in time.

docs/design.md, section 2, step 5: each round is a sampled Gaussian mechanism with
σ_eff = (σ_Δ^−2 + σ_b^−2)^−1/2 when the policy also releases reports; ε comes from Opacus' RDP
or PRV accountant with history [(σ_eff, q, T)], never from a hand-written formula.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opacus.accountants import PRVAccountant, RDPAccountant

from fairclip.strategies import NoiseMultipliers, PolicyConfigError
from fairclip.strategies.accountants import (
    PRVAccountantSharedRDP,
    RdpCurve,
    one_blas_thread,
    rdp_curve,
    rdp_epsilon,
)
from fairclip.strategies.accounting import (
    CALIBRATION_TOLERANCE,
    DEFAULT_COUNT_RATIO,
    PrivacyClaim,
    calibrate,
    calibrate_effective,
    clear_caches,
    effective_noise_multiplier,
    epsilon,
    rounds_within_budget,
)

ACCOUNTANTS = {"prv": PRVAccountant, "rdp": RDPAccountant}


def opacus_epsilon(accountant: str, sigma: float, q: float, rounds: int, delta: float) -> float:
    """Opacus called directly, the way its documentation does it, with one BLAS thread as fairclip
    runs it: PRV's mean is a BLAS dot product, whose last bits depend on the number of threads."""
    opacus_accountant = ACCOUNTANTS[accountant]()
    opacus_accountant.history = [(sigma, q, rounds)]
    with warnings.catch_warnings(), one_blas_thread():
        warnings.simplefilter("ignore")
        return opacus_accountant.get_epsilon(delta=delta)


@pytest.mark.parametrize("accountant", ["prv", "rdp"])
@pytest.mark.parametrize(
    ("sigma", "q", "rounds", "delta"),
    [(1.1, 0.02, 300, 1e-5), (0.8, 0.1, 40, 1e-6), (3.0, 0.005, 1000, 1e-5)],
)
def test_epsilon_is_opacus(accountant, sigma, q, rounds, delta):
    expected = opacus_epsilon(accountant, sigma, q, rounds, delta)
    assert epsilon(sigma, q, rounds, delta, accountant) == expected


@settings(max_examples=25, deadline=None)
@given(
    sigma=st.floats(0.7, 8.0),
    q=st.floats(1e-3, 0.2),
    rounds=st.integers(1, 1000),
    delta=st.sampled_from([1e-4, 1e-5, 1e-6, 1e-8]),
    accountant=st.sampled_from(["prv", "rdp"]),
)
def test_epsilon_is_opacus_bit_for_bit(sigma, q, rounds, delta, accountant):
    """The shared per-step RDP curve (computed once for the PRV domain's two RDP bounds and for
    RDP's ε at every T, and only at the orders that can decide it) changes no bit of Opacus' ε,
    also once the curve is cached."""
    expected = opacus_epsilon(accountant, sigma, q, rounds, delta)
    clear_caches()
    assert epsilon(sigma, q, rounds, delta, accountant) == expected
    epsilon.cache_clear()
    assert epsilon(sigma, q, rounds, delta, accountant) == expected  # from the cached curve


@settings(max_examples=10, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.floats(0.7, 4.0), st.floats(0.005, 0.2), st.integers(1, 200)), min_size=1, max_size=3
    ),
    delta=st.sampled_from([1e-5, 1e-7]),
)
def test_shared_rdp_prv_accountant_is_opacus_on_any_history(steps, delta):
    """Heterogeneous histories too: the domain composes the per-step curves as Opacus does."""
    ours, theirs = PRVAccountantSharedRDP(), PRVAccountant()
    ours.history = list(steps)
    theirs.history = list(steps)
    with warnings.catch_warnings(), one_blas_thread():
        warnings.simplefilter("ignore")
        assert ours.get_epsilon(delta=delta) == theirs.get_epsilon(delta=delta)


@settings(max_examples=30, deadline=None)
@given(
    sigma=st.floats(0.3, 20.0),
    q=st.floats(1e-4, 1.0),
    conversions=st.lists(st.tuples(st.integers(1, 100_000), st.floats(1e-14, 1e-2)), min_size=1, max_size=4),
)
def test_rdp_curve_computes_only_orders_that_cannot_change_epsilon(sigma, q, conversions):
    """The curve skips fractional orders whose lower bound (RDP at the integer order below) rules
    them out; whatever it skipped, in whatever order it was asked, ε equals Opacus' conversion of
    the complete curve, and every order it did compute is Opacus' value."""
    from opacus.accountants.analysis.rdp import compute_rdp

    complete = compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=RDPAccountant.DEFAULT_ALPHAS)
    curve = RdpCurve(sigma, q)
    for steps, delta in conversions:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = rdp_epsilon(complete * steps, delta)
            actual = curve.epsilon(steps, delta)
        assert actual == expected or (math.isnan(actual) and math.isnan(expected))
        partial = curve.for_conversion(steps, delta)
        computed = np.isfinite(partial)
        assert np.array_equal(partial[computed], complete[computed])
    assert np.array_equal(curve.complete(), complete)


def test_rdp_curve_skips_most_fractional_orders_of_a_w1_claim():
    """W1's final claim (σ = 1, q = 0.1, T = 5, PRV): the domain's two RDP bounds need fewer than
    half of the 90 fractional orders, and ε is still Opacus'."""
    clear_caches()
    sigma, q, rounds, delta = 1.0, 0.1, 5, 1e-5
    assert epsilon(sigma, q, rounds, delta, "prv") == opacus_epsilon("prv", sigma, q, rounds, delta)
    integer_orders = sum(float(order).is_integer() for order in RDPAccountant.DEFAULT_ALPHAS)
    assert integer_orders == 61
    assert rdp_curve(sigma, q).computed_orders < integer_orders + 45


def test_accountants_run_one_at_a_time_with_one_blas_thread_and_restore_it():
    import threading

    from threadpoolctl import threadpool_info

    def blas_threads() -> list[int]:
        return [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]

    original = blas_threads()
    assert original, "numpy's BLAS is loaded"
    seen: list[list[int]] = []
    events: list[str] = []

    def other_caller() -> None:
        with one_blas_thread():
            events.append("other")
            seen.append(blas_threads())

    worker = threading.Thread(target=other_caller)
    with one_blas_thread():
        worker.start()
        worker.join(0.2)  # it waits for this caller to leave
        events.append("first")
        seen.append(blas_threads())
    worker.join(10)
    assert events == ["first", "other"]
    assert all(threads == 1 for pools in seen for threads in pools) and len(seen) == 2
    assert blas_threads() == original


@pytest.mark.parametrize("accountant", ["prv", "rdp"])
def test_a_round_with_reports_is_accounted_with_the_effective_multiplier(accountant):
    noise = NoiseMultipliers(update=1.1, report=11.0)
    sigma_eff = (1.1**-2 + 11.0**-2) ** -0.5
    assert effective_noise_multiplier(noise, releases_reports=True) == pytest.approx(sigma_eff, rel=1e-14)
    assert effective_noise_multiplier(noise, releases_reports=False) == 1.1

    q, rounds, delta = 0.02, 300, 1e-5
    claim = PrivacyClaim.of(
        noise, releases_reports=True, sample_rate=q, rounds=rounds, delta=delta, accountant=accountant
    )
    assert claim.effective_noise_multiplier == pytest.approx(sigma_eff, rel=1e-14)
    assert claim.epsilon == pytest.approx(opacus_epsilon(accountant, sigma_eff, q, rounds, delta), rel=1e-9)
    alone = PrivacyClaim.of(
        noise, releases_reports=False, sample_rate=q, rounds=rounds, delta=delta, accountant=accountant
    )
    assert alone.epsilon == pytest.approx(opacus_epsilon(accountant, 1.1, q, rounds, delta), rel=1e-9)
    # the count release costs privacy: the same σ_Δ with a count gives a strictly larger ε
    assert claim.epsilon > alone.epsilon * 1.001
    # the claim names everything it came from (docs/design.md, section 7)
    record = claim.as_dict()
    assert record["delta"] == delta
    assert record["accountant"] == accountant
    assert record["sample_rate"] == q
    assert record["rounds"] == rounds
    assert (record["noise_multiplier"], record["count_noise_multiplier"]) == (1.1, 11.0)
    assert alone.as_dict()["count_noise_multiplier"] is None


@pytest.mark.parametrize(
    ("accountant", "target"), [("prv", 0.5), ("prv", 2.0), ("rdp", 0.5), ("rdp", 2.0), ("rdp", 8.0)]
)
def test_calibration_round_trips(accountant, target):
    """Target ε -> σ -> ε: within 1 % below the target (PRV calibration takes 1-4 s each)."""
    q, rounds, delta = 0.01, 200, 1e-5
    noise = calibrate(target, q, rounds, delta, accountant, releases_reports=True)
    # σ_b = 10 σ_Δ, and σ_Δ = σ_eff sqrt(1 + 1/k²) so the composition is exactly σ_eff
    assert noise.report == pytest.approx(DEFAULT_COUNT_RATIO * noise.update, rel=1e-12)
    assert DEFAULT_COUNT_RATIO == 10.0
    sigma_eff = effective_noise_multiplier(noise, releases_reports=True)
    assert noise.update == pytest.approx(sigma_eff * math.sqrt(1.0 + 1.0 / 100.0), rel=1e-12)
    achieved = opacus_epsilon(accountant, sigma_eff, q, rounds, delta)
    assert achieved <= target
    assert achieved >= 0.99 * target
    assert epsilon(sigma_eff, q, rounds, delta, accountant) == pytest.approx(achieved, rel=1e-12)


@pytest.mark.parametrize(
    ("accountant", "target", "q", "rounds"),
    [("prv", 1.0, 0.5, 50), ("prv", 8.0, 0.5, 50), ("rdp", 0.5, 0.01, 200), ("rdp", 3.0, 0.2, 30)],
)
def test_calibration_is_opacus_search_bit_for_bit(accountant, target, q, rounds):
    """The σ_eff search is Opacus' get_noise_multiplier over fairclip's ε: the same σ exactly."""
    from opacus.accountants.utils import get_noise_multiplier

    delta = 1e-5
    ours = calibrate_effective(target, q, rounds, delta, accountant)
    with one_blas_thread():
        theirs = get_noise_multiplier(
            target_epsilon=target,
            target_delta=delta,
            sample_rate=q,
            steps=rounds,
            accountant=accountant,
            epsilon_tolerance=CALIBRATION_TOLERANCE * target,
        )
    assert ours == theirs


def test_calibration_without_reports_and_with_another_split():
    accountant, q, rounds, delta, target = "rdp", 0.05, 60, 1e-5, 1.5
    alone = calibrate(target, q, rounds, delta, accountant, releases_reports=False)
    assert alone.report == 0.0
    achieved = opacus_epsilon(accountant, alone.update, q, rounds, delta)
    assert 0.99 * target <= achieved <= target

    split = calibrate(target, q, rounds, delta, accountant, releases_reports=True, count_ratio=4.0)
    assert split.report == pytest.approx(4.0 * split.update, rel=1e-12)
    sigma_eff = effective_noise_multiplier(split, releases_reports=True)
    assert sigma_eff == pytest.approx(alone.update, rel=1e-12)  # the same Opacus search
    assert split.update > alone.update  # the count's share is paid with more update noise


def test_zero_noise_is_infinitely_expensive():
    assert epsilon(0.0, 0.01, 100, 1e-5, "rdp") == math.inf
    assert epsilon(0.0, 0.01, 100, 1e-5, "prv") == math.inf
    assert epsilon(1.0, 0.01, 0, 1e-5, "prv") == 0.0  # nothing released yet
    kwargs = {"sample_rate": 0.01, "rounds": 100, "delta": 1e-5, "accountant": "rdp"}
    no_update_noise = PrivacyClaim.of(NoiseMultipliers(0.0, 10.0), releases_reports=True, **kwargs)
    no_count_noise = PrivacyClaim.of(NoiseMultipliers(1.0, 0.0), releases_reports=True, **kwargs)
    assert no_update_noise.epsilon == math.inf
    assert no_count_noise.epsilon == math.inf  # an un-noised count is not private either
    assert no_update_noise.as_dict()["epsilon"] == "inf"
    assert math.isfinite(
        PrivacyClaim.of(NoiseMultipliers(1.0, 0.0), releases_reports=False, **kwargs).epsilon
    )


@pytest.mark.parametrize(("accountant", "budget"), [("rdp", 1.0), ("rdp", 3.0), ("prv", 1.0)])
def test_rounds_within_budget_is_the_last_round_within_it(accountant, budget):
    sigma, q, delta = 1.0, 0.01, 1e-5
    rounds = rounds_within_budget(budget, sigma, q, delta, accountant, limit=5_000)
    assert 1 <= rounds < 5_000
    assert epsilon(sigma, q, rounds, delta, accountant) <= budget
    assert epsilon(sigma, q, rounds + 1, delta, accountant) > budget
    assert opacus_epsilon(accountant, sigma, q, rounds + 1, delta) > budget


def test_rounds_within_budget_edges():
    sigma, q, delta = 1.0, 0.01, 1e-5
    assert rounds_within_budget(50.0, sigma, q, delta, "rdp", limit=200) == 200  # never exceeded
    assert rounds_within_budget(1e-4, sigma, q, delta, "rdp", limit=200) == 0  # not even one round
    assert rounds_within_budget(10.0, 0.0, q, delta, "rdp", limit=200) == 0  # no noise: no round


@pytest.mark.parametrize(
    ("call", "mentions"),
    [
        (lambda: epsilon(1.0, 0.01, 10, 1e-5, "gdp"), "accountant"),
        (lambda: epsilon(1.0, 0.0, 10, 1e-5, "rdp"), "sample rate"),
        (lambda: epsilon(1.0, 1.5, 10, 1e-5, "rdp"), "sample rate"),
        (lambda: epsilon(1.0, 0.01, -1, 1e-5, "rdp"), "rounds"),
        (lambda: epsilon(1.0, 0.01, 10, 0.0, "rdp"), "delta"),
        (lambda: epsilon(1.0, 0.01, 10, 1.0, "rdp"), "delta"),
        (lambda: calibrate(0.0, 0.01, 10, 1e-5, "rdp", releases_reports=True), "target epsilon"),
        (lambda: calibrate(math.nan, 0.01, 10, 1e-5, "rdp", releases_reports=True), "target epsilon"),
        (lambda: calibrate(math.inf, 0.01, 10, 1e-5, "rdp", releases_reports=True), "target epsilon"),
        (lambda: calibrate(1.0, 0.01, 0, 1e-5, "rdp", releases_reports=True), "0 rounds"),
        (
            lambda: calibrate(1.0, 0.01, 10, 1e-5, "rdp", releases_reports=True, count_ratio=0.0),
            "count noise",
        ),
        (lambda: calibrate(1e-6, 1.0, 1000, 1e-5, "rdp", releases_reports=False), "cannot be reached"),
    ],
)
def test_bad_privacy_parameters_raise_one_clear_line(call, mentions):
    with pytest.raises(PolicyConfigError) as caught:
        call()
    assert mentions in str(caught.value)
    assert "\n" not in str(caught.value)
