"""Properties every clipping policy must keep, for any input and any reachable state.

For every registered policy, arbitrary update matrices (huge, tiny, subnormal, zero and
non-finite entries), arbitrary valid parameters and states reached through ``server_side``
with arbitrary sums and noisy reports (including huge and negative noisy counts):

* every contribution has norm at most ``policy.sensitivity(state)``, the sensitivity the server
  noises with, and is finite; every report vector has norm at most 1;
* bounds stay in their allowed range (C_t >= C_LB, > 0 and finite; per-cohort bounds >= C_0;
  reweighting weights finite and > 0; the global-adapt threshold finite and > 0);
* report bits mean what docs/design.md, section 3 says (for example b_i = 1[||Δ_i|| > τ·C_t]) and the
  bound moves the right way: a noisy fraction above γ makes it grow, below γ makes it shrink.

Parameter validation is checked at the end: every bad value raises one
:class:`PolicyConfigError` line that names the parameter.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from fairclip.strategies import (
    POLICIES,
    NoiseMultipliers,
    PolicyConfigError,
    build_policy,
    policy_parameters,
)
from fairclip.strategies.clipping import (
    SAFETY,
    clip_rows,
    clip_rows_with_norms,
    hard_clip,
    inner,
    row_norms,
    vector_norm,
)
from fairclip.strategies.testing import log_uniform, noisy_counts, round_inputs, update_matrices

NAMES = sorted(POLICIES)
SETTINGS = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TIE = 1e-9
"""Relative distance from a threshold below which a report bit may go either way (rounding)."""


# ----- strategies -------------------------------------------------------------------------
BOUNDS = log_uniform(-30, 30)
RATES = st.just(0.0) | log_uniform(-4, 3)
"""Learning rates from 0 to 10^3: exp(η) overflows float64 for η > 709 if not guarded."""

HANDLED = {
    "initial_bound",
    "lower_bound",
    "target_quantile",
    "threshold_multiplier",
    "bound_lr",
    "adaptive",
    "tanh_epsilon",
    "scale_threshold",
    "threshold_lr",
    "adapt_server_lr",
    "server_lr_rate",
    "normalize",
    "same_round",
    "rule",
    "noise_bound",
}


@st.composite
def configurations(draw, name: str) -> tuple[dict, int]:
    """Arbitrary valid parameters of policy ``name`` and a number of cohorts."""
    known = policy_parameters(name)
    params: dict = {}
    if "initial_bound" in known:
        params["initial_bound"] = draw(BOUNDS)
    if "lower_bound" in known:
        fraction = draw(st.floats(1e-6, 1.0) if name == "bounded" else st.just(0.0) | st.floats(0.0, 1.0))
        params["lower_bound"] = params["initial_bound"] * fraction
    if "target_quantile" in known:
        params["target_quantile"] = draw(st.floats(0.0, 1.0))
    if "threshold_multiplier" in known:
        params["threshold_multiplier"] = draw(log_uniform(-3, 3))
    for key in ("bound_lr", "threshold_lr", "server_lr_rate"):
        if key in known:
            params[key] = draw(RATES)
    for key in ("adaptive", "adapt_server_lr", "normalize", "same_round"):
        if key in known:
            params[key] = draw(st.booleans())
    if "tanh_epsilon" in known:
        params["tanh_epsilon"] = draw(log_uniform(-12, 0))
    if "scale_threshold" in known:
        params["scale_threshold"] = draw(BOUNDS)
    if "rule" in known:
        params["rule"] = draw(st.sampled_from([None, "esipova", "xu"]))
    if "noise_bound" in known:
        params["noise_bound"] = draw(st.sampled_from(["max", "initial"]))
    cohorts = draw(st.integers(1, 4)) if POLICIES[name].needs_cohorts else 1
    return params, cohorts


COUNTS = noisy_counts()


# ----- helpers ----------------------------------------------------------------------------
def reference_norms(rows: np.ndarray) -> np.ndarray:
    """||Δ_i|| computed independently of the package (``math.hypot`` scales; inf on overflow)."""
    return np.array([math.hypot(*row) for row in rows]) if rows.shape[1] else np.zeros(rows.shape[0])


def not_a_tie(norms: np.ndarray, threshold: float) -> np.ndarray:
    return ~(np.abs(norms - threshold) <= TIE * threshold)


def step(policy, state, inputs: dict, d: int):
    """Run ``server_side`` with the round's arbitrary sums; the report sum is resized to fit. A
    counts-first policy releases the reports first (``count_side``), from the same noise stream."""
    size = policy.report_size(d)
    report_sum = np.resize(np.asarray(inputs["reports"], dtype=np.float64), size) if size else None
    noise = np.random.default_rng(inputs["seed"])
    released = None
    if policy.counts_first:
        counts = policy.count_side(
            state, report_sum, expected_clients=inputs["expected_clients"], noise=inputs["noise"], rng=noise
        )
        state, released = counts.state, counts.noisy_reports
    return policy.server_side(
        state,
        inputs["sum"],
        report_sum,
        expected_clients=inputs["expected_clients"],
        num_reports=inputs["num_reports"],
        noise=inputs["noise"],
        rng=noise,
        released_reports=released,
    )


def check_state(name: str, policy, state, expected_clients: float | None) -> None:
    """The policy state is in its allowed range (``expected_clients`` of the last step, if any)."""
    sensitivity = policy.sensitivity(state)
    assert math.isfinite(sensitivity) or name == "none"
    assert sensitivity > 0
    if name in ("constant", "global"):
        assert sensitivity == policy.initial_bound
    if name in ("adaptive", "bounded", "soft", "online"):
        assert 0 < state.bound < math.inf
        if name != "online":
            assert state.bound >= policy.lower_bound
        if name == "bounded":
            assert state.bound >= policy.lower_bound > 0
        if name == "soft" and not policy.adaptive:
            assert state.bound == policy.initial_bound
    if name == "online":
        assert 0 < state.lr_factor < math.inf
        assert policy.adapt_server_lr or state.lr_factor == 1.0
    if name == "global-adapt":
        assert 0 < state.scale_threshold < math.inf
        assert sensitivity == policy.initial_bound
    if name == "per-cohort":
        bounds = np.asarray(state.bounds)
        assert bounds.shape == (policy.num_cohorts,)
        assert np.all(bounds >= policy.initial_bound)
        assert np.all(np.isfinite(bounds))
        if policy.bound_rule == "esipova":  # C_k <= C_0 (1 + K): f_k / mean f <= K
            assert np.all(bounds <= policy.initial_bound * (1 + policy.num_cohorts) * (1 + 1e-12))
        elif expected_clients is not None:  # C_k <= C_0 (1 + m̂), a decision in per_cohort.py
            assert np.all(bounds <= policy.initial_bound * (1 + max(expected_clients, 1.0)) * (1 + 1e-12))
        assert sensitivity == bounds.max()
    if name == "reweight":
        weights = np.asarray(state.weights)
        assert weights.shape == (policy.num_cohorts,)
        assert np.all(np.isfinite(weights))
        assert np.all(weights > 0)
        if expected_clients is not None:
            assert np.all(weights <= expected_clients / policy.num_cohorts * (1 + 1e-12))
        assert sensitivity == pytest.approx(policy.initial_bound * weights.max(), rel=1e-12)


def check_semantics(name: str, policy, params: dict, updates: np.ndarray, cohorts: np.ndarray, out) -> None:
    """Contributions and reports of the finite rows are the transform docs/design.md, section 3 names."""
    finite = np.isfinite(updates).all(axis=1)
    rows, contributions, reports = updates[finite], out.contributions[finite], out.reports[finite]
    norms = reference_norms(rows)
    measurable = np.isfinite(norms)  # rows whose norm overflows float64 are only checked for the bound
    rows, contributions, reports, norms = (
        rows[measurable],
        contributions[measurable],
        reports[measurable],
        norms[measurable],
    )
    labels = cohorts[finite][measurable]
    n = rows.shape[0]

    # a factor C / ||Δ|| below the normal range (||Δ|| > 1e280 C) has few significant digits;
    # such rows are checked against the bound above, not for their exact values
    precise = norms <= 1e280 * float(params.get("bound", math.inf))

    def close(actual: np.ndarray, expected: np.ndarray, scale: float) -> None:
        keep = precise if len(actual) == n else np.ones(len(actual), dtype=bool)
        np.testing.assert_allclose(actual[keep], expected[keep], rtol=1e-6, atol=1e-12 * scale)

    def hard(bounds) -> np.ndarray:
        bounds = np.broadcast_to(np.asarray(bounds, dtype=np.float64), norms.shape)
        factor = np.ones(n)
        over = norms > bounds
        factor[over] = bounds[over] / norms[over]
        return rows * factor[:, None]

    def bit(threshold: float) -> None:
        keep = not_a_tie(norms, threshold)
        assert np.array_equal(reports[keep, 0], (norms[keep] > threshold).astype(np.float64))
        assert set(np.unique(reports)) <= {0.0, 1.0}

    if name == "none":
        assert out.reports.shape[1] == 0
        assert np.array_equal(contributions, rows)
    elif name == "constant":
        assert out.reports.shape[1] == 0
        close(contributions, hard(params["bound"]), params["bound"])
    elif name in ("adaptive", "bounded"):
        bound, tau = params["bound"], params["threshold_multiplier"]
        close(contributions, hard(bound), bound)
        bit(tau * bound)
    elif name == "soft":
        bound = params["bound"]
        expected = rows * np.tanh(bound / (norms + params["tanh_epsilon"]))[:, None]
        close(contributions, expected, bound)
        if policy.adaptive:
            bit(params["threshold_multiplier"] * bound)
        else:
            assert out.reports.shape[1] == 0
    elif name == "global":
        bound, threshold = params["bound"], params["scale_threshold"]
        expected = np.zeros_like(rows)
        kept = norms <= threshold
        expected[kept] = rows[kept] / threshold * bound
        keep = not_a_tie(norms, threshold) & precise
        np.testing.assert_allclose(contributions[keep], expected[keep], rtol=1e-6, atol=1e-12 * bound)
    elif name == "global-adapt":
        bound, threshold = params["bound"], params["scale_threshold"]
        close(contributions, rows / np.maximum(norms, max(threshold, bound))[:, None] * bound, bound)
        bit(params["threshold_multiplier"] * threshold)
    elif name == "per-cohort":
        own = np.asarray(params["cohort_bounds"])[labels]
        close(contributions, hard(own), max(params["cohort_bounds"]))
        keep = not_a_tie(norms, params["bound"])
        expected = np.zeros_like(reports)
        expected[np.arange(n), 2 * labels + (norms <= params["bound"])] = 1.0
        assert np.array_equal(reports[keep], expected[keep])
    elif name == "reweight":
        weights = np.asarray(params["cohort_weights"])[labels]
        close(
            contributions, hard(params["bound"]) * weights[:, None], params["bound"] * max(weights, default=1)
        )
        assert np.array_equal(reports, np.eye(policy.num_cohorts)[labels])
    elif name == "online":
        bound = params["bound"]
        close(contributions, hard(bound), bound)
        keep = not_a_tie(norms, bound)
        above = (norms > bound) & keep
        np.testing.assert_allclose(reports[above], rows[above] / norms[above][:, None], rtol=1e-8, atol=1e-15)
        assert np.all(reports[~(norms > bound) & keep] == 0)
    else:  # pragma: no cover - a new policy must get its semantics written here
        pytest.fail(f"no semantics check for policy {name!r}")


# ----- the properties ---------------------------------------------------------------------
def test_every_parameter_is_exercised():
    """A new policy parameter must be added to ``configurations`` (or the property is blind to it)."""
    for name in NAMES:
        assert set(policy_parameters(name)) <= HANDLED, name


@pytest.mark.parametrize("name", NAMES)
@SETTINGS
@given(data=st.data())
def test_contributions_stay_within_the_noised_sensitivity(name, data):
    params, num_cohorts = data.draw(configurations(name), label="params")
    policy = build_policy(name, params, num_cohorts=num_cohorts)
    n = data.draw(st.integers(0, 6), label="n")
    d = data.draw(st.integers(1, 5), label="d")
    state = policy.initial_state(d)
    check_state(name, policy, state, None)

    for inputs in data.draw(st.lists(round_inputs(d), max_size=4), label="rounds"):
        before = policy.sensitivity(state)
        result = step(policy, state, inputs, d)
        if policy.counts_first:  # round t is clipped at the state its own counts set, which it keeps
            before = policy.sensitivity(result.state)
        # noise of round t uses the sensitivity of round t, whatever the state becomes
        assert result.sensitivity == before
        expected_std = 0.0 if name == "none" else inputs["noise"].update * before
        if name == "per-cohort" and policy.noise_bound == "initial":  # seed 003's Algorithm 3: C_0
            scale = policy.initial_bound
            assert result.noise_std == pytest.approx(inputs["noise"].update * scale, rel=1e-12)
            assert result.event.noise_multiplier == pytest.approx(
                inputs["noise"].update * scale / before, rel=1e-12
            )
        else:
            assert result.noise_std == expected_std
            assert result.event.noise_multiplier == (0.0 if name == "none" else inputs["noise"].update)
        assert np.all(np.isfinite(result.estimate))
        assert (result.noisy_reports is None) == (policy.report_size(d) == 0 or name == "none")
        check_state(name, policy, result.state, inputs["expected_clients"])
        state = result.state

    updates = data.draw(update_matrices(n, d), label="updates")
    labels = data.draw(st.lists(st.integers(0, num_cohorts - 1), min_size=n, max_size=n), label="cohorts")
    cohorts = np.asarray(labels, dtype=np.int64)
    params_t = policy.broadcast(state)
    json.dumps(params_t)  # a broadcast is public and JSON-serialisable
    out = policy.client_side(updates, cohorts, params_t)
    sensitivity = policy.sensitivity(state)

    assert out.contributions.shape == (n, d)
    assert np.all(np.isfinite(out.contributions))
    with np.errstate(over="ignore"):  # ``none`` passes huge rows through: their norm may be inf
        norms = np.linalg.norm(out.contributions, axis=1)
    assert np.all(norms <= sensitivity), (norms, sensitivity)
    per_client = policy.contribution_bounds(params_t, cohorts)
    assert np.all(per_client <= sensitivity)
    assert np.all(norms <= per_client)

    assert out.reports.shape == (n, policy.report_size(d))
    assert np.all(np.isfinite(out.reports))
    assert np.all(np.linalg.norm(out.reports, axis=1) <= 1.0)
    # what the Flower server checks, one reply at a time and with no slack: the norm as the server
    # computes it, and a report of the policy's exact shape in the client's own cohort
    assert np.all(row_norms(out.contributions) <= per_client)
    for report, cohort in zip(out.reports, cohorts, strict=True):
        assert policy.report_is_valid(report, int(cohort) if policy.needs_cohorts else None), report

    # non-finite: an entry, or the norm of finite entries (it overflows), is not finite
    nonfinite = ~np.isfinite(updates).all(axis=1)
    nonfinite |= ~np.isfinite(row_norms(np.where(nonfinite[:, None], 0.0, updates)))
    assert np.array_equal(out.nonfinite, nonfinite)
    assert np.all(out.contributions[nonfinite] == 0)
    assert np.all(out.reports[nonfinite] == 0)
    assert not np.any(out.exceeded[nonfinite])
    # the diagnostic norms are those of the finite updates and of what is sent, exactly
    finite = np.where(nonfinite[:, None], 0.0, updates)
    assert np.array_equal(out.norms, row_norms(finite))
    assert np.array_equal(out.contribution_norms, row_norms(out.contributions))

    check_semantics(name, policy, params_t, updates, cohorts, out)


@SETTINGS
@given(
    vectors=st.integers(1, 40).flatmap(
        lambda d: st.tuples(
            st.lists(st.floats(-1e3, 1e3), min_size=d, max_size=d),
            st.lists(st.floats(-1e3, 1e3), min_size=d, max_size=d),
        )
    ),
    scale=log_uniform(-300, 300),
)
def test_a_vectors_norm_and_inner_product_without_blas(vectors, scale):
    """vector_norm and inner (the server's per-round norms and products, numpy's own loops
    instead of BLAS) are the norm and np.dot to float64 rounding, and a vector of huge or tiny
    entries keeps its norm (no overflow to inf, no underflow to 0, where np.linalg.norm of a
    single 1.9e-261 gives 0)."""
    a, b = (np.asarray(v) for v in vectors)
    assert inner(a, b) == pytest.approx(float(np.dot(a, b)), rel=1e-9, abs=1e-9 * (1 + np.abs(a) @ np.abs(b)))
    peak = float(np.abs(a).max())
    if peak == 0:
        assert vector_norm(a) == 0.0
        return
    unit_norm = float(np.linalg.norm(a / peak))  # its largest entry 1: no underflow, no overflow
    assert vector_norm(a) == pytest.approx(peak * unit_norm, rel=1e-12)
    scaled = a / peak * scale  # its largest entry: scale, from 1e-300 to 1e300
    assert vector_norm(scaled) == pytest.approx(scale * unit_norm, rel=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_many_random_rows_respect_the_bounds(name):
    """Rounding: hypothesis draws few rows; this draws 20 000 of every scale, over a few rounds."""
    rng = np.random.default_rng(11)
    n, d = 20_000, 7
    updates = rng.normal(size=(n, d)) * rng.lognormal(0.0, 4.0, size=(n, 1))
    policy = build_policy(name, {"lower_bound": 0.5} if name == "bounded" else {}, num_cohorts=3)
    cohorts = rng.integers(0, 3, n)
    state = policy.initial_state(d)
    for _ in range(3):
        out = policy.client_side(updates, cohorts, policy.broadcast(state))
        assert np.all(np.linalg.norm(out.contributions, axis=1) <= policy.sensitivity(state))
        assert np.all(np.linalg.norm(out.reports, axis=1) <= 1.0)
        state = policy.server_side(
            state,
            out.contributions.sum(axis=0),
            out.reports.sum(axis=0),
            expected_clients=n / 2,
            num_reports=n,
            noise=NoiseMultipliers(1.0, 10.0),
            rng=rng,
        ).state
        check_state(name, policy, state, n / 2)


GEOMETRIC = ["adaptive", "bounded", "soft"]


@pytest.mark.parametrize("name", GEOMETRIC)
@SETTINGS
@given(
    bound=log_uniform(-6, 6),
    floor_fraction=st.floats(1e-3, 1.0),
    gamma=st.floats(0.0, 1.0),
    bound_lr=st.floats(1e-3, 5.0),
    clients=st.integers(1, 40),
    expected_clients=st.floats(0.5, 60.0),
    above=st.floats(0.0, 1.0),
    report_noise=st.just(0.0) | st.floats(0.1, 30.0),
    seed=st.integers(0, 2**32 - 1),
)
def test_geometric_bound_grows_above_and_shrinks_below_the_target(
    name, bound, floor_fraction, gamma, bound_lr, clients, expected_clients, above, report_noise, seed
):
    """C_{t+1} = max(C_LB, C_t · exp(η_C (b̃ − γ))) with b̃ the clamped noisy fraction above τ·C_t."""
    params = {
        "initial_bound": bound,
        "target_quantile": gamma,
        "bound_lr": bound_lr,
        "threshold_multiplier": 1.0,
    }
    if name == "bounded":
        params["lower_bound"] = bound * floor_fraction
    policy = build_policy(name, params)
    state = policy.initial_state(3)
    # clients whose update is above τ·C_t (norm 2·C_t) or below it (norm C_t / 2)
    n_above = round(above * clients)
    norms = np.where(np.arange(clients) < n_above, 2.0 * bound, 0.5 * bound)
    updates = np.zeros((clients, 3))
    updates[:, 1] = norms
    out = policy.client_side(updates, np.zeros(clients, dtype=int), policy.broadcast(state))
    assert out.reports[:, 0].sum() == n_above
    result = policy.server_side(
        state,
        out.contributions.sum(axis=0),
        out.reports.sum(axis=0),
        expected_clients=expected_clients,
        num_reports=clients,
        noise=NoiseMultipliers(update=1.0, report=report_noise),
        rng=np.random.default_rng(seed),
    )
    if report_noise == 0:
        assert result.noisy_reports[0] == n_above
    fraction = result.noisy_reports[0] / expected_clients
    clamped = min(max(fraction, 0.0), 1.0)
    floor = params.get("lower_bound", 0.0)
    expected = max(floor, bound * math.exp(bound_lr * (clamped - gamma)))
    new = result.state.bound
    assert new == pytest.approx(expected, rel=1e-9)
    assume(abs(clamped - gamma) * bound_lr > 1e-9)
    if clamped > gamma:
        assert new > bound
    else:
        assert new < bound or new == floor > 0
        assert new >= floor


@SETTINGS
@given(
    threshold=log_uniform(-6, 6),
    threshold_lr=st.floats(0.0, 2.0),
    expected_clients=st.floats(0.5, 60.0),
    count=COUNTS,
)
def test_global_adapt_threshold_follows_its_rule(threshold, threshold_lr, expected_clients, count):
    """Z_{t+1} = Z_t · exp(−η_Z + b̃): it grows when more than η_Z of the updates exceed τ·Z_t."""
    policy = build_policy("global-adapt", {"scale_threshold": threshold, "threshold_lr": threshold_lr})
    state = policy.initial_state(2)
    result = policy.server_side(
        state,
        np.zeros(2),
        np.array([count]),
        expected_clients=expected_clients,
        num_reports=1,
        noise=NoiseMultipliers(0.0, 0.0),
        rng=np.random.default_rng(0),
    )
    clamped = min(max(count / expected_clients, 0.0), 1.0)
    new = result.state.scale_threshold
    assert new == pytest.approx(threshold * math.exp(-threshold_lr + clamped), rel=1e-9)
    assume(abs(clamped - threshold_lr) > 1e-9)
    assert (new > threshold) == (clamped > threshold_lr)
    assert result.sensitivity == policy.initial_bound


def test_global_adapt_below_its_bound_clips_and_never_scales_up():
    """Z_t < C_0 (the adaptive rule can take it there; Algorithm 2 requires Z >= C_0): plain
    clipping at C_0, as the authors' code computes it, not C_0 / Z_t > 1 on the small updates;
    the count still uses Z_t."""
    policy = build_policy("global-adapt", {"initial_bound": 1.0, "scale_threshold": 0.25})
    params = policy.broadcast(policy.initial_state(2))
    updates = np.array([[0.1, 0.0], [0.0, 0.5], [3.0, 4.0]])  # norms 0.1, 0.5, 5
    out = policy.client_side(updates, np.zeros(3, dtype=int), params)
    np.testing.assert_allclose(out.contributions, [[0.1, 0.0], [0.0, 0.5], [0.6, 0.8]], rtol=1e-6)
    assert out.reports[:, 0].tolist() == [0.0, 1.0, 1.0]  # above τ Z_t = 0.25


def _exact_step(policy, state, report_sum, expected_clients, d=2):
    return policy.server_side(
        state,
        np.zeros(d),
        np.asarray(report_sum, dtype=np.float64),
        expected_clients=expected_clients,
        num_reports=1,
        noise=NoiseMultipliers(0.0, 0.0),
        rng=np.random.default_rng(0),
    )


def test_per_cohort_bounds_follow_the_clipped_fractions():
    """C_k = C_0 (1 + (m̃_k / b̃_k) / (m̃ / m̂)); counts are [above_k, below_k] per cohort; an
    empty cohort counts as clipped (m̃_k / b̃_k = 1)."""
    policy = build_policy("per-cohort", {"initial_bound": 2.0}, num_cohorts=3)
    state = policy.initial_state(2)
    result = _exact_step(policy, state, [1, 5, 3, 1, 0, 0], expected_clients=10.0)
    overall = 4 / 10
    assert result.state.bounds == pytest.approx(
        (2.0 * (1 + (1 / 6) / overall), 2.0 * (1 + (3 / 4) / overall), 2.0 * (1 + 1 / overall)), rel=1e-12
    )
    # the cohorts clipped most (here the empty one) get the largest bound; the noise follows it
    assert policy.sensitivity(result.state) == max(result.state.bounds)
    # negative noisy counts are clamped to 0 (post-processing) and never lower a bound below C_0
    clamped = _exact_step(policy, state, [-4, 2, 5, -3, -1, -1], expected_clients=10.0)
    assert clamped.state.bounds == pytest.approx((2.0, 2.0 * (1 + 1 / 0.5), 2.0 * (1 + 1 / 0.5)), rel=1e-12)


def test_per_cohort_reports_count_above_and_below_the_base_bound():
    policy = build_policy("per-cohort", {"initial_bound": 1.0}, num_cohorts=2)
    state = policy.initial_state(2)
    updates = np.array([[3.0, 0.0], [0.1, 0.0], [0.0, 2.0], [0.5, 0.5]])
    out = policy.client_side(updates, np.array([0, 0, 1, 1]), policy.broadcast(state))
    assert out.reports.sum(axis=0).tolist() == [1.0, 1.0, 1.0, 1.0]
    assert out.reports[0].tolist() == [1.0, 0.0, 0.0, 0.0]  # cohort 0, above C_0
    assert out.reports[3].tolist() == [0.0, 0.0, 0.0, 1.0]  # cohort 1, below C_0


def test_reweight_weights_equalise_the_cohorts():
    """θ_k = (m̂ / K) / max(b̃_k, 1): a cohort rare in the sample gets a large weight."""
    policy = build_policy("reweight", {"initial_bound": 0.5}, num_cohorts=2)
    state = policy.initial_state(2)
    result = _exact_step(policy, state, [18.0, 2.0], expected_clients=20.0)
    assert result.state.weights == pytest.approx((10 / 18, 10 / 2), rel=1e-12)
    assert policy.sensitivity(result.state) == pytest.approx(0.5 * 5.0, rel=1e-12)
    assert policy.clip_bound(result.state) == 0.5
    floored = _exact_step(policy, state, [-7.0, 0.25], expected_clients=20.0)
    assert floored.state.weights == pytest.approx((10.0, 10.0), rel=1e-12)


def test_online_bound_follows_the_sign_of_the_inner_product():
    """C_{t+1} = C_t · exp(ρ_c · sign(⟨Δ̂_t, q̃_{t−1}⟩)); no previous direction: unchanged."""
    rho = 0.5
    policy = build_policy("online", {"initial_bound": 1.0, "bound_lr": rho})
    state = policy.initial_state(2)
    first = policy.server_side(
        state,
        np.array([1.0, 0.0]),
        np.array([3.0, 0.0]),
        expected_clients=4.0,
        num_reports=4,
        noise=NoiseMultipliers(0.0, 0.0),
        rng=np.random.default_rng(0),
    )
    assert first.state.bound == 1.0
    aligned = _exact_step(policy, first.state, [0.0, 0.0], expected_clients=4.0)
    assert aligned.state.bound == 1.0  # Δ̂_t = 0: sign 0
    along = policy.server_side(
        first.state,
        np.array([2.0, 1.0]),
        np.zeros(2),
        expected_clients=4.0,
        num_reports=4,
        noise=NoiseMultipliers(0.0, 0.0),
        rng=np.random.default_rng(0),
    )
    assert along.state.bound == pytest.approx(math.exp(rho))
    against = policy.server_side(
        first.state,
        np.array([-2.0, 1.0]),
        np.zeros(2),
        expected_clients=4.0,
        num_reports=4,
        noise=NoiseMultipliers(0.0, 0.0),
        rng=np.random.default_rng(0),
    )
    assert against.state.bound == pytest.approx(math.exp(-rho))


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("adaptive", {"target_quantile": 0.0, "bound_lr": 1000.0}),
        ("bounded", {"target_quantile": 0.0, "bound_lr": 1000.0, "lower_bound": 0.5}),
        ("soft", {"target_quantile": 0.0, "bound_lr": 1000.0}),
        ("global-adapt", {"threshold_lr": 0.0}),
        ("online", {"bound_lr": 800.0, "adapt_server_lr": True, "server_lr_rate": 800.0}),
    ],
)
def test_bounds_that_keep_growing_stay_finite(name, params):
    """A bound that grows every round (γ = 0 with every update above, or a huge learning rate)
    must stay finite: it is the sensitivity, and σ_Δ · s_t must stay a number."""
    policy = build_policy(name, params)
    state = policy.initial_state(2)
    size = policy.report_size(2)
    for _ in range(1000 if name == "global-adapt" else 5):
        previous = policy.sensitivity(state) if name != "global-adapt" else state.scale_threshold
        result = policy.server_side(
            state,
            np.ones(2),
            np.full(size, 1.0),  # every client above: b̃ = 1; online: q̃ along Δ̂
            expected_clients=1.0,
            num_reports=1,
            # online: no update noise, or its sign (not the bound's growth) would be under test
            noise=NoiseMultipliers(0.0 if name == "online" else 1.0, 0.0),
            rng=np.random.default_rng(0),
        )
        assert np.all(np.isfinite(result.estimate))
        state = result.state
        current = policy.sensitivity(state) if name != "global-adapt" else state.scale_threshold
        assert math.isfinite(current)
        assert current >= previous  # it never moves the wrong way, it only stops growing
        if name == "online":
            assert 0 < state.lr_factor < math.inf
    assert current > 1e20


@settings(max_examples=300, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    shape=st.tuples(st.integers(1, 12), st.integers(1, 300)),
    scale=log_uniform(-30, 30),
    bound=BOUNDS,
)
def test_projection_is_idempotent_and_keeps_what_hard_clip_clipped(seed, shape, scale, bound):
    """The final projection leaves rows it (or ``hard_clip``) scaled down where they are, and
    returns its input itself, uncopied, when no row lies beyond C·(1 − SAFETY)."""
    rows = np.random.default_rng(seed).normal(size=shape) * scale
    once, once_norms = clip_rows_with_norms(rows, bound)
    assert np.all(once_norms <= bound * (1 - SAFETY))
    assert clip_rows(once, bound) is once
    norms = row_norms(rows)
    clipped = hard_clip(rows, norms, bound)
    assert np.array_equal(clipped[norms <= bound], rows[norms <= bound])
    band = (norms > bound * (1 - SAFETY)) & (norms <= bound)  # within C but not within the margin
    guarded = clip_rows(clipped, bound)
    assert np.array_equal(guarded[~band], clipped[~band])
    if not band.any():
        assert guarded is clipped
    within = norms <= bound * (1 - SAFETY)
    assert (clip_rows(rows, bound) is rows) == bool(within.all())


@pytest.mark.parametrize("name", ["constant", "adaptive", "online", "per-cohort", "reweight"])
def test_clipping_a_huge_update_to_a_small_bound_keeps_its_direction_exactly(name):
    """C / ||Δ|| = 1e-11 / 1.7e308 is subnormal (few digits); Δ / ||Δ|| · C is not."""
    policy = build_policy(name, {"initial_bound": 1e-11})
    update = np.array([[1.5e308, -8e307, 3.0]])
    out = policy.client_side(update, np.zeros(1, dtype=np.int64), policy.broadcast(policy.initial_state(3)))
    direction = update / reference_norms(update)[:, None]
    np.testing.assert_allclose(out.contributions, 1e-11 * direction, rtol=1e-8, atol=1e-30)


def test_online_bound_survives_inner_products_beyond_the_float_range():
    """⟨Δ̂_t, q̃_{t−1}⟩ of huge vectors must keep its sign, not become inf − inf = nan."""
    policy = build_policy("online", {"initial_bound": 1.0, "bound_lr": 0.5, "adapt_server_lr": True})
    state = policy.initial_state(2)
    for total, reports in (([1e200, 1e200], [1e200, -2e200]), ([1e200, 1e200], [0.0, 0.0])):
        previous = state
        state = policy.server_side(
            state,
            np.array(total),
            np.array(reports),
            expected_clients=1.0,
            num_reports=1,
            noise=NoiseMultipliers(0.0, 0.0),
            rng=np.random.default_rng(0),
        ).state
    assert previous.bound == 1.0
    assert state.bound == pytest.approx(math.exp(-0.5))  # against last round's direction
    assert state.lr_factor == pytest.approx(math.exp(2.5e-3))  # along last round's estimate


@pytest.mark.parametrize("name", [n for n in NAMES if not POLICIES[n].needs_cohorts])
def test_policies_without_cohorts_ignore_the_labels(name):
    params = {"lower_bound": 0.5} if name == "bounded" else {}
    policy = build_policy(name, params, num_cohorts=3)
    state = policy.initial_state(4)
    updates = np.random.default_rng(3).normal(size=(6, 4)) * np.array([[0.1], [1], [10], [100], [0.5], [3]])
    plain = policy.client_side(updates, np.zeros(6, dtype=int), policy.broadcast(state))
    labelled = policy.client_side(updates, np.array([0, 1, 2, 2, 1, 0]), policy.broadcast(state))
    assert np.array_equal(plain.contributions, labelled.contributions)
    assert np.array_equal(plain.reports, labelled.reports)


@pytest.mark.parametrize("name", ["per-cohort", "reweight"])
def test_cohort_labels_out_of_range_are_rejected(name):
    policy = build_policy(name, {}, num_cohorts=2)
    state = policy.initial_state(2)
    with pytest.raises(ValueError, match="cohort"):
        policy.client_side(np.ones((2, 2)), np.array([0, 2]), policy.broadcast(state))


def test_documented_defaults():
    """docs/design.md, section 3: adaptive and bounded share their defaults so they differ only in C_LB."""
    for name in ("adaptive", "bounded"):
        defaults = policy_parameters(name)
        assert defaults["initial_bound"] == 1.0
        assert defaults["target_quantile"] == 0.5
        assert defaults["threshold_multiplier"] == 2.5
        assert defaults["bound_lr"] == 0.2
    assert policy_parameters("bounded")["lower_bound"] is None  # required
    assert policy_parameters("soft")["threshold_multiplier"] == 1.0
    assert policy_parameters("soft")["tanh_epsilon"] == 1e-6
    global_adapt = policy_parameters("global-adapt")
    assert (
        global_adapt["scale_threshold"],
        global_adapt["threshold_lr"],
        global_adapt["threshold_multiplier"],
    ) == (
        50.0,
        0.1,
        1.0,
    )
    online = policy_parameters("online")
    assert (online["initial_bound"], online["bound_lr"], online["server_lr_rate"]) == (0.1, 2.5e-3, 2.5e-3)
    assert policy_parameters("constant")["initial_bound"] == 1.0


def test_report_releases_match_the_design_table():
    """Which policies release a report vector (and so are accounted with σ_eff < σ_Δ)."""
    d = 7
    sizes = {
        name: build_policy(
            name, {"lower_bound": 0.1} if name == "bounded" else {}, num_cohorts=3
        ).report_size(d)
        for name in NAMES
    }
    assert sizes == {
        "none": 0,
        "constant": 0,
        "adaptive": 1,
        "bounded": 1,
        "soft": 1,
        "global": 0,
        "global-adapt": 1,
        "per-cohort": 6,
        "reweight": 3,
        "online": d,
    }
    assert build_policy("soft", {"adaptive": False}).report_size(d) == 0


# ----- parameter validation ---------------------------------------------------------------
def _config_error(name: str, params: dict, mentions: str, num_cohorts: int = 1) -> None:
    with pytest.raises(PolicyConfigError) as caught:
        build_policy(name, params, num_cohorts=num_cohorts)
    message = str(caught.value)
    assert isinstance(caught.value, ValueError)
    assert "\n" not in message
    assert mentions in message, message


QUANTILE_POLICIES = [n for n in NAMES if "target_quantile" in policy_parameters(n)]
BOUND_POLICIES = [n for n in NAMES if "initial_bound" in policy_parameters(n)]


@pytest.mark.parametrize("name", QUANTILE_POLICIES)
@pytest.mark.parametrize("gamma", [-0.01, 1.01, 5.0, math.nan, math.inf, "0.5", True])
def test_target_quantile_outside_unit_interval_is_rejected(name, gamma):
    extra = {"lower_bound": 0.1} if name == "bounded" else {}
    _config_error(name, {"target_quantile": gamma, **extra}, "target_quantile")


@pytest.mark.parametrize("name", BOUND_POLICIES)
@pytest.mark.parametrize("bound", [0.0, -1.0, math.nan, math.inf, -math.inf, None, "1"])
def test_non_positive_or_non_finite_bound_is_rejected(name, bound):
    extra = {"lower_bound": 1e-9} if name == "bounded" else {}
    _config_error(name, {"initial_bound": bound, **extra}, "initial_bound")


@pytest.mark.parametrize("lower", [0.0, -0.5, math.nan, math.inf])
def test_bounded_lower_bound_must_be_positive(lower):
    _config_error("bounded", {"lower_bound": lower}, "lower_bound")


def test_bounded_needs_a_lower_bound():
    _config_error("bounded", {}, "lower_bound")
    _config_error("bounded", {"initial_bound": 2.0, "target_quantile": 0.3}, "lower_bound")


@pytest.mark.parametrize("name", ["bounded", "soft"])
def test_lower_bound_above_initial_bound_is_rejected(name):
    _config_error(name, {"initial_bound": 1.0, "lower_bound": 1.5}, "lower_bound")
    build_policy(name, {"initial_bound": 1.0, "lower_bound": 1.0})  # equal is allowed


@pytest.mark.parametrize(
    ("name", "key", "value"),
    [
        ("adaptive", "bound_lr", -0.1),
        ("adaptive", "threshold_multiplier", 0.0),
        ("soft", "tanh_epsilon", 0.0),
        ("soft", "adaptive", "yes"),
        ("soft", "lower_bound", -1.0),
        ("global", "scale_threshold", -2.0),
        ("global-adapt", "threshold_lr", math.nan),
        ("global-adapt", "scale_threshold", 0.0),
        ("online", "bound_lr", -1.0),
        ("online", "server_lr_rate", math.inf),
        ("online", "adapt_server_lr", 1),
    ],
)
def test_other_out_of_range_parameters_are_rejected(name, key, value):
    _config_error(name, {key: value}, key)


@pytest.mark.parametrize("name", NAMES)
def test_unknown_parameter_is_rejected(name):
    _config_error(name, {"clip_norm": 1.0}, "clip_norm")


def test_a_parameter_of_another_policy_is_rejected():
    _config_error("adaptive", {"lower_bound": 0.5}, "lower_bound")
    _config_error("constant", {"target_quantile": 0.5}, "target_quantile")


def test_unknown_policy_is_rejected():
    _config_error("dp-ftrl", {}, "dp-ftrl")
    with pytest.raises(PolicyConfigError, match="dp-ftrl"):
        policy_parameters("dp-ftrl")


def test_number_of_cohorts_must_be_positive():
    _config_error("per-cohort", {}, "num_cohorts", num_cohorts=0)


@pytest.mark.parametrize("value", [-1.0, math.nan, math.inf])
def test_noise_multipliers_are_validated(value):
    with pytest.raises(PolicyConfigError, match="noise multiplier"):
        NoiseMultipliers(update=value, report=1.0)
    with pytest.raises(PolicyConfigError, match="count noise multiplier"):
        NoiseMultipliers(update=1.0, report=value)


@pytest.mark.parametrize("name", NAMES)
def test_an_update_whose_norm_overflows_is_dropped_on_both_paths(name):
    """Finite entries, infinite norm (the fresh-clone CI's hypothesis example): both the
    materialised and the scaled client side drop it as non-finite, and the plugin helper's
    client checks accept every built-in policy on it."""
    from fairclip.strategies.testing import _check_clients

    policy = build_policy(name, {"lower_bound": 0.1} if name == "bounded" else {}, num_cohorts=1)
    state = policy.initial_state(2)
    updates = np.array([[1.27116101e308, 1.27116101e308], [0.3, 0.4]])
    cohorts = np.zeros(2, dtype=np.int64)
    out = policy.client_side(updates, cohorts, policy.broadcast(state))
    assert list(out.nonfinite) == [True, False]
    assert np.all(out.contributions[0] == 0) and np.all(out.reports[0] == 0) and not out.exceeded[0]
    _check_clients(policy, state, updates, cohorts)
