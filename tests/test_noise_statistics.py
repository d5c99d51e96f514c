"""Statistics of the server step, with fixed seeds (docs/design.md, section 2, steps 3 and 4).

* The sum is noised with standard deviation σ_Δ · s_t, where s_t is the sensitivity of the round
  that produced the updates -- not the bound after this round's update (Flower 1.41's adaptive
  wrapper gets this wrong). Each case below moves the bound a lot in the measured round, so the
  two are far apart.
* Report noise has standard deviation σ_b, whatever the bound.
* Without noise and with τ = 1, ``adaptive`` drives the fraction of updates above its bound to γ.
* ``none`` is the plain mean; ``normalize`` divides by m̂ · s_t.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from fairclip.strategies import NoiseMultipliers, build_policy
from fairclip.strategies.per_cohort import CohortBoundsState
from fairclip.strategies.reweight import CohortWeightsState

DIM = 5_000
SEEDS = range(8)
SIGMA = 1.7
TOLERANCE = 0.02
"""Relative tolerance on an empirical std from 40 000 Gaussian draws (standard error 0.35 %)."""


def _updates(n: int, norm: float, seed: int = 0, dim: int = DIM) -> np.ndarray:
    rng = np.random.default_rng(1000 + seed)
    rows = rng.normal(size=(n, dim))
    return rows / np.linalg.norm(rows, axis=1, keepdims=True) * norm


def _exact(policy, state, report_sum, expected_clients, dim=DIM):
    """A noise-free server step that only moves the state (to build a state to measure from)."""
    return policy.server_side(
        state,
        np.zeros(dim),
        np.asarray(report_sum, dtype=np.float64),
        expected_clients=expected_clients,
        num_reports=1,
        noise=NoiseMultipliers(0.0, 0.0),
        rng=np.random.default_rng(0),
    ).state


def _case(name: str):
    """(policy, state, updates, cohorts, m̂) where this round's step moves the bound a lot."""
    n, m_hat = 6, 6.0
    zeros = np.zeros(n, dtype=np.int64)
    if name in ("adaptive", "bounded", "soft"):
        params = {"initial_bound": 2.0, "target_quantile": 0.1, "threshold_multiplier": 1.0, "bound_lr": 2.0}
        if name == "bounded":
            params["lower_bound"] = 0.5
        policy = build_policy(name, params)
        # every update is far above τ·C_t: b̃ = 1, so C_{t+1} = C_t · e^{1.8} ≈ 6 C_t
        return policy, policy.initial_state(DIM), _updates(n, 50.0), zeros, m_hat
    if name == "constant":
        policy = build_policy(name, {"initial_bound": 3.0})
        return policy, policy.initial_state(DIM), _updates(n, 50.0), zeros, m_hat
    if name == "global":
        policy = build_policy(name, {"initial_bound": 3.0, "scale_threshold": 10.0})
        return policy, policy.initial_state(DIM), _updates(n, 5.0), zeros, m_hat
    if name == "global-adapt":
        # Z_t = 0.5 shrinks or grows, but the sensitivity is C_0 = 3
        policy = build_policy(name, {"initial_bound": 3.0, "scale_threshold": 0.5, "threshold_lr": 0.1})
        return policy, policy.initial_state(DIM), _updates(n, 2.0), zeros, m_hat
    if name == "online":
        policy = build_policy(name, {"initial_bound": 1.5, "bound_lr": 1.5})
        # last round released q̃_{t-1} along e_0; this round's updates point along e_0 too, so
        # ⟨Δ̂_t, q̃_{t-1}⟩ > 0 and C_{t+1} = e^{1.5} C_t
        first = np.zeros(DIM)
        first[0] = 6.0
        state = policy.server_side(
            policy.initial_state(DIM),
            np.zeros(DIM),
            first,
            expected_clients=m_hat,
            num_reports=n,
            noise=NoiseMultipliers(0.0, 0.0),
            rng=np.random.default_rng(0),
        ).state
        assert state.bound == 1.5
        updates = np.zeros((n, DIM))
        updates[:, 0] = 40.0
        return policy, state, updates, zeros, m_hat
    if name == "per-cohort":
        policy = build_policy(name, {"initial_bound": 1.0}, num_cohorts=2)
        state = CohortBoundsState((1.0, 4.0))  # s_t = max_k C_k = 4, not C_0 = 1
        cohorts = np.array([0, 0, 0, 1, 1, 1])
        # this round nobody is above C_0: every bound falls back to C_0 = 1
        return policy, state, _updates(n, 0.5), cohorts, m_hat
    if name == "reweight":
        policy = build_policy(name, {"initial_bound": 1.0}, num_cohorts=2)
        state = CohortWeightsState((0.6, 3.0))  # s_t = C_0 · max θ = 3
        cohorts = np.array([0, 0, 0, 1, 1, 1])  # balanced this round: θ_{t+1} = (1, 1)
        return policy, state, _updates(n, 5.0), cohorts, m_hat
    raise AssertionError(name)


CASES = [
    "adaptive",
    "bounded",
    "soft",
    "constant",
    "global",
    "global-adapt",
    "online",
    "per-cohort",
    "reweight",
]
MOVING = {"adaptive", "bounded", "soft", "online", "per-cohort", "reweight"}


@pytest.mark.parametrize("name", CASES)
def test_sum_noise_uses_the_sensitivity_of_the_round_that_clipped(name):
    policy, state, updates, cohorts, m_hat = _case(name)
    s_t = policy.sensitivity(state)
    params = policy.broadcast(state)
    out = policy.client_side(updates, cohorts, params)
    true_sum = out.contributions.sum(axis=0)
    report_sum = out.reports.sum(axis=0) if out.reports.shape[1] else None
    noise = NoiseMultipliers(update=SIGMA, report=0.0)

    errors, next_sensitivities = [], set()
    for seed in SEEDS:
        result = policy.server_side(
            state,
            true_sum,
            report_sum,
            expected_clients=m_hat,
            num_reports=len(updates),
            noise=noise,
            rng=np.random.default_rng(seed),
        )
        assert result.sensitivity == s_t
        assert result.noise_std == pytest.approx(SIGMA * s_t, rel=1e-12)
        errors.append(result.estimate * m_hat - true_sum)
        next_sensitivities.add(policy.sensitivity(result.state))
    errors = np.concatenate(errors)

    std = errors.std()
    assert std == pytest.approx(SIGMA * s_t, rel=TOLERANCE)
    assert abs(errors.mean()) < 5 * SIGMA * s_t / math.sqrt(errors.size)

    (s_next,) = next_sensitivities  # no report noise: the next state is the same for every seed
    if name in MOVING:
        # the measured round really moved the bound, far beyond the statistical tolerance
        assert abs(math.log(s_next / s_t)) > 0.4
        assert abs(std / (SIGMA * s_next) - 1) > 10 * TOLERANCE
    else:
        assert s_next == s_t


def test_adaptive_noise_is_not_the_updated_bound():
    """The headline case spelled out: C_t = 2, C_{t+1} = 2 e^{1.8}; the noise is σ_Δ · 2."""
    policy, state, updates, cohorts, m_hat = _case("adaptive")
    out = policy.client_side(updates, cohorts, policy.broadcast(state))
    # the updates of round t were clipped at C_t
    np.testing.assert_allclose(np.linalg.norm(out.contributions, axis=1), 2.0, rtol=1e-8)
    result = policy.server_side(
        state,
        out.contributions.sum(axis=0),
        out.reports.sum(axis=0),
        expected_clients=m_hat,
        num_reports=len(updates),
        noise=NoiseMultipliers(update=SIGMA, report=0.0),
        rng=np.random.default_rng(42),
    )
    assert result.state.bound == pytest.approx(2.0 * math.exp(2.0 * (1.0 - 0.1)), rel=1e-12)
    assert result.clip_bound == 2.0
    assert result.noise_std == pytest.approx(SIGMA * 2.0, rel=1e-12)
    errors = result.estimate * m_hat - out.contributions.sum(axis=0)
    assert errors.std() == pytest.approx(SIGMA * 2.0, rel=0.05)


@pytest.mark.parametrize(
    ("name", "num_cohorts"), [("adaptive", 1), ("global-adapt", 1), ("per-cohort", 3), ("reweight", 4)]
)
def test_count_noise_has_std_sigma_b(name, num_cohorts):
    """B = Σ b_i + N(0, σ_b²) per count, independent of the bound (here C = 7)."""
    sigma_b = 3.0
    params = {"initial_bound": 7.0}
    policy = build_policy(name, params, num_cohorts=num_cohorts)
    state = policy.initial_state(2)
    n = 12
    rng = np.random.default_rng(5)
    updates = rng.normal(size=(n, 2)) * 100
    cohorts = np.arange(n) % num_cohorts
    out = policy.client_side(updates, cohorts, policy.broadcast(state))
    report_sum = out.reports.sum(axis=0)
    assert report_sum.sum() > 0
    draws = []
    for _ in range(1500 if num_cohorts == 1 else 400):
        result = policy.server_side(
            state,
            out.contributions.sum(axis=0),
            report_sum,
            expected_clients=10.0,
            num_reports=n,
            noise=NoiseMultipliers(update=0.5, report=sigma_b),
            rng=rng,
        )
        draws.append(result.noisy_reports - report_sum)
    draws = np.concatenate(draws)
    assert draws.size >= 1500
    assert draws.std() == pytest.approx(sigma_b, rel=0.06)
    assert abs(draws.mean()) < 5 * sigma_b / math.sqrt(draws.size)


def test_online_direction_noise_has_std_sigma_b():
    policy = build_policy("online", {"initial_bound": 1.0})
    state = policy.initial_state(DIM)
    updates = _updates(4, 3.0)
    out = policy.client_side(updates, np.zeros(4, dtype=np.int64), policy.broadcast(state))
    report_sum = out.reports.sum(axis=0)
    result = policy.server_side(
        state,
        out.contributions.sum(axis=0),
        report_sum,
        expected_clients=4.0,
        num_reports=4,
        noise=NoiseMultipliers(update=0.3, report=2.5),
        rng=np.random.default_rng(9),
    )
    assert (result.noisy_reports - report_sum).std() == pytest.approx(2.5, rel=0.05)
    assert (result.estimate * 4.0 - out.contributions.sum(axis=0)).std() == pytest.approx(0.3, rel=0.05)


def test_no_noise_when_multipliers_are_zero():
    policy = build_policy("adaptive")
    state = policy.initial_state(3)
    total = np.array([1.0, -2.0, 0.5])
    result = policy.server_side(
        state,
        total,
        np.array([2.0]),
        expected_clients=4.0,
        num_reports=3,
        noise=NoiseMultipliers(0.0, 0.0),
        rng=np.random.default_rng(0),
    )
    assert np.array_equal(result.estimate, total / 4.0)
    assert result.noisy_reports.tolist() == [2.0]
    assert result.noise_std == 0.0


# ----- convergence of the adaptive bound (noise off, τ = 1) -------------------------------
NORMS = np.random.default_rng(7).lognormal(mean=0.0, sigma=1.0, size=2_000)


@pytest.mark.parametrize("gamma", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("start", [0.01, 100.0])
def test_adaptive_fraction_above_the_bound_converges_to_gamma(gamma, start):
    n, d = NORMS.size, 3
    rng = np.random.default_rng(8)
    directions = rng.normal(size=(n, d))
    updates = directions / np.linalg.norm(directions, axis=1, keepdims=True) * NORMS[:, None]
    cohorts = np.zeros(n, dtype=np.int64)
    policy = build_policy(
        "adaptive",
        {"initial_bound": start, "target_quantile": gamma, "threshold_multiplier": 1.0, "bound_lr": 0.2},
    )
    state = policy.initial_state(d)
    fractions = []
    for _ in range(400):
        out = policy.client_side(updates, cohorts, policy.broadcast(state))
        fraction = out.reports[:, 0].mean()
        assert fraction == np.mean(state.bound < NORMS)
        result = policy.server_side(
            state,
            out.contributions.sum(axis=0),
            out.reports.sum(axis=0),
            expected_clients=float(n),
            num_reports=n,
            noise=NoiseMultipliers(0.0, 0.0),
            rng=rng,
        )
        # too many clipped -> the bound grows; too few -> it shrinks
        if fraction > gamma:
            assert result.state.bound > state.bound
        elif fraction < gamma:
            assert result.state.bound < state.bound
        fractions.append(fraction)
        state = result.state
    # it starts on the wrong side and moves towards γ ...
    assert (fractions[0] - gamma) * (1 if start < 1 else -1) > 0.05
    # ... and ends with γ of the updates above the bound
    assert np.mean(fractions[-100:]) == pytest.approx(gamma, abs=0.02)
    assert max(abs(f - gamma) for f in fractions[-100:]) < 0.05
    quantile = np.quantile(NORMS, 1.0 - gamma)
    assert abs(math.log(state.bound / quantile)) < 0.1


def test_bounded_stays_at_its_floor_when_the_quantile_is_below_it():
    """Seed 000: C_LB keeps the bound up where ``adaptive`` would follow the majority down."""
    n = NORMS.size
    updates = np.zeros((n, 2))
    updates[:, 0] = NORMS
    results = {}
    for name in ("adaptive", "bounded"):
        params = {"initial_bound": 5.0, "target_quantile": 0.5, "threshold_multiplier": 1.0, "bound_lr": 0.2}
        if name == "bounded":
            params["lower_bound"] = 3.0  # above the median norm (1.0)
        policy = build_policy(name, params)
        state = policy.initial_state(2)
        for _ in range(300):
            out = policy.client_side(updates, np.zeros(n, dtype=np.int64), policy.broadcast(state))
            state = policy.server_side(
                state,
                out.contributions.sum(axis=0),
                out.reports.sum(axis=0),
                expected_clients=float(n),
                num_reports=n,
                noise=NoiseMultipliers(0.0, 0.0),
                rng=np.random.default_rng(0),
            ).state
        results[name] = state.bound
    assert results["bounded"] == 3.0
    assert abs(math.log(results["adaptive"] / np.median(NORMS))) < 0.1


# ----- estimates ----------------------------------------------------------------------------
def test_none_estimate_is_the_plain_mean():
    policy = build_policy("none")
    rng = np.random.default_rng(3)
    updates = rng.normal(size=(7, 4)) * np.array([[1e-3], [1], [10], [1e3], [5], [0.1], [100]])
    out = policy.client_side(updates, np.zeros(7, dtype=np.int64), policy.broadcast(policy.initial_state(4)))
    assert np.array_equal(out.contributions, updates)
    result = policy.server_side(
        policy.initial_state(4),
        out.contributions.sum(axis=0),
        None,
        expected_clients=20.0,  # ignored: the reference averages over the clients that reported
        num_reports=7,
        noise=NoiseMultipliers(5.0, 50.0),  # ignored: no noise
        rng=np.random.default_rng(0),
    )
    np.testing.assert_allclose(result.estimate, updates.mean(axis=0), rtol=1e-12)
    assert result.noise_std == 0.0
    assert result.noisy_reports is None
    empty = policy.server_side(
        policy.initial_state(4),
        np.zeros(4),
        None,
        expected_clients=20.0,
        num_reports=0,
        noise=NoiseMultipliers(0.0, 0.0),
        rng=np.random.default_rng(0),
    )
    assert np.array_equal(empty.estimate, np.zeros(4))


def test_private_estimate_divides_by_the_public_expected_size():
    policy = build_policy("constant", {"initial_bound": 2.0})
    total = np.array([3.0, -1.0])
    result = policy.server_side(
        policy.initial_state(2),
        total,
        None,
        expected_clients=10.0,
        num_reports=3,  # private: never the denominator
        noise=NoiseMultipliers(0.0, 0.0),
        rng=np.random.default_rng(0),
    )
    assert np.array_equal(result.estimate, total / 10.0)


@pytest.mark.parametrize("name", ["constant", "adaptive", "per-cohort"])
def test_normalize_divides_by_expected_size_times_the_round_sensitivity(name):
    params = {"initial_bound": 2.5, "normalize": True}
    if name == "adaptive":
        params.update(target_quantile=0.0, bound_lr=1.0)  # the bound moves in this round
    policy = build_policy(name, params, num_cohorts=2 if name == "per-cohort" else 1)
    state = policy.initial_state(3)
    if name == "per-cohort":
        state = CohortBoundsState((2.5, 6.0))
    s_t = policy.sensitivity(state)
    total = np.array([3.0, -1.0, 0.25])
    size = policy.report_size(3)
    report_sum = np.full(size, 8.0) if size else None
    noise_free = policy.server_side(
        state,
        total,
        report_sum,
        expected_clients=8.0,
        num_reports=8,
        noise=NoiseMultipliers(0.0, 0.0),
        rng=np.random.default_rng(0),
    )
    np.testing.assert_allclose(noise_free.estimate, total / (8.0 * s_t), rtol=1e-12)
    if name == "adaptive":
        assert policy.sensitivity(noise_free.state) > 2 * s_t
    # with noise the estimate's noise is σ_Δ s_t / (m̂ s_t) = σ_Δ / m̂ per coordinate
    big = np.zeros(DIM)
    noisy = policy.server_side(
        state,
        big,
        report_sum,
        expected_clients=8.0,
        num_reports=8,
        noise=NoiseMultipliers(SIGMA, 0.0),
        rng=np.random.default_rng(1),
    )
    assert noisy.estimate.std() == pytest.approx(SIGMA / 8.0, rel=0.05)
