"""Privacy accounting: fairclip's ε is Opacus' ε, calibration round-trips, budgets stop in time.

DESIGN section 2, step 5: each round is a sampled Gaussian mechanism with
σ_eff = (σ_Δ^−2 + σ_b^−2)^−1/2 when the policy also releases reports; ε comes from Opacus' RDP
or PRV accountant with history [(σ_eff, q, T)], never from a hand-written formula.
"""

from __future__ import annotations

import math
import warnings

import pytest
from opacus.accountants import PRVAccountant, RDPAccountant

from fairclip.strategies import NoiseMultipliers, PolicyConfigError
from fairclip.strategies.accounting import (
    DEFAULT_COUNT_RATIO,
    PrivacyClaim,
    calibrate,
    effective_noise_multiplier,
    epsilon,
    rounds_within_budget,
)

ACCOUNTANTS = {"prv": PRVAccountant, "rdp": RDPAccountant}


def opacus_epsilon(accountant: str, sigma: float, q: float, rounds: int, delta: float) -> float:
    """Opacus called directly, the way its documentation does it."""
    opacus_accountant = ACCOUNTANTS[accountant]()
    opacus_accountant.history = [(sigma, q, rounds)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return opacus_accountant.get_epsilon(delta=delta)


@pytest.mark.parametrize("accountant", ["prv", "rdp"])
@pytest.mark.parametrize(
    ("sigma", "q", "rounds", "delta"),
    [(1.1, 0.02, 300, 1e-5), (0.8, 0.1, 40, 1e-6), (3.0, 0.005, 1000, 1e-5)],
)
def test_epsilon_is_opacus(accountant, sigma, q, rounds, delta):
    expected = opacus_epsilon(accountant, sigma, q, rounds, delta)
    assert epsilon(sigma, q, rounds, delta, accountant) == pytest.approx(expected, rel=1e-12)


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
    # the claim names everything it came from (DESIGN section 7)
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
