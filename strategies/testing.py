"""Property checks every policy must pass, for plug-in authors' own tests (needs ``hypothesis``).

:func:`check_policy` runs a policy through arbitrary rounds with hypothesis and fails (an
``AssertionError`` naming the broken property, with hypothesis's smallest example) unless:

* every contribution leaving :meth:`Policy.client_side` is finite, has norm at most its client's
  bound, and every client's bound is at most ``sensitivity(state)``, the sensitivity the server
  noises with -- for any update matrix, huge, tiny, subnormal or not finite;
* every report vector is finite, of norm at most 1 and of length ``report_size``, and the policy
  accepts the honest reports it produced (``report_is_valid``); a non-finite update sends zeros;
* ``server_side`` noises round t with the sensitivity of round t (noise standard deviation at
  least σ_Δ · s_t; for a policy that ``noises_below_sensitivity``, at least the accounted
  multiplier times s_t, and the round's event never claims more than σ_Δ), returns a finite
  estimate, and reaches only states whose sensitivity and clip bound are finite and > 0,
  whatever sums and noisy reports it was given (noisy counts can be negative or huge);
* the broadcast is JSON-serialisable (it is sent to clients in public).

The built-in policies pass it in fairclip's own tests. A plug-in's test is one line::

    from fairclip.policies import check_policy
    def test_my_policy_keeps_dp():
        check_policy(HardSchedule, {"initial_bound": 2.0})
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from fairclip.strategies.base import NoiseMultipliers, Policy
from fairclip.strategies.clipping import PRECISE_FACTOR_BELOW, row_norms
from fairclip.strategies.registry import check_policy_class, policy_class


def check_policy(
    policy: type[Policy] | str,
    params: Mapping[str, Any] | Any = None,
    *,
    num_cohorts: int | None = None,
    max_examples: int = 100,
    max_rounds: int = 4,
) -> None:
    """Check the properties of the module docstring for the policy class (or policy name)
    ``policy`` with ``params`` (a mapping, or a hypothesis strategy that draws mappings).

    ``num_cohorts`` fixes the number of cohorts; by default 1 to 4 are drawn for a policy that
    ``needs_cohorts`` and 1 otherwise. Deterministic: the same call checks the same examples.
    """
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    cls = policy_class(policy) if isinstance(policy, str) else check_policy_class(policy, repr(policy))
    params_strategy = params if isinstance(params, st.SearchStrategy) else st.just(dict(params or {}))
    if num_cohorts is not None:
        cohort_counts = st.just(num_cohorts)
    else:
        cohort_counts = st.integers(1, 4) if cls.needs_cohorts else st.just(1)

    @settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(data=st.data())
    def properties(data: Any) -> None:
        cohorts_k = data.draw(cohort_counts, label="num_cohorts")
        instance = cls(num_cohorts=cohorts_k, **data.draw(params_strategy, label="params"))
        n = data.draw(st.integers(0, 6), label="clients")
        d = data.draw(st.integers(1, 5), label="dimension")
        state = instance.initial_state(d)
        _check_state(instance, state)
        for _ in range(data.draw(st.integers(0, max_rounds), label="rounds")):
            state = _check_round(instance, state, d, data.draw(round_inputs(d), label="round"))
        updates = data.draw(update_matrices(n, d), label="updates")
        cohorts = np.asarray(
            data.draw(st.lists(st.integers(0, cohorts_k - 1), min_size=n, max_size=n), label="cohorts"),
            dtype=np.int64,
        )
        _check_clients(instance, state, updates, cohorts)

    properties()


def _check_state(policy: Policy, state: Any) -> None:
    sensitivity = policy.sensitivity(state)
    assert sensitivity > 0, f"sensitivity {sensitivity} is not > 0"
    assert math.isfinite(sensitivity) or not policy.private, f"sensitivity {sensitivity} is not finite"
    bound = policy.clip_bound(state)
    assert bound > 0 and (math.isfinite(bound) or not policy.private), f"clip bound {bound}"


def _check_round(policy: Policy, state: Any, d: int, inputs: dict[str, Any]) -> Any:
    size = policy.report_size(d)
    report_sum = np.resize(np.asarray(inputs["reports"], dtype=np.float64), size) if size else None
    noise = np.random.default_rng(inputs["seed"])
    released = None
    if policy.counts_first:  # the round's first exchange sets the state that clips it
        counts = policy.count_side(
            state, report_sum, expected_clients=inputs["expected_clients"], noise=inputs["noise"], rng=noise
        )
        _check_state(policy, counts.state)
        state, released = counts.state, counts.noisy_reports
    before = policy.sensitivity(state)
    result = policy.server_side(
        state,
        inputs["sum"],
        report_sum,
        expected_clients=inputs["expected_clients"],
        num_reports=inputs["num_reports"],
        noise=inputs["noise"],
        rng=noise,
        released_reports=released,
    )
    assert result.sensitivity == before, (
        f"round noised with sensitivity {result.sensitivity}, but its contributions were bounded by {before}"
    )
    if policy.private:
        event = result.event
        # the accountant is told a multiplier the noise really has: std >= multiplier · s_t
        assert result.noise_std >= event.noise_multiplier * before * (1 - 1e-12), (
            f"noise std {result.noise_std} < the accounted multiplier {event.noise_multiplier} · s_t = "
            f"{event.noise_multiplier * before}"
        )
        assert event.noise_multiplier <= inputs["noise"].update, (
            f"the round claims multiplier {event.noise_multiplier} > σ_Δ = {inputs['noise'].update}"
        )
        if not policy.noises_below_sensitivity:
            assert event.noise_multiplier == inputs["noise"].update, (
                f"the round is accounted with {event.noise_multiplier}, not σ_Δ = {inputs['noise'].update}"
            )
            assert result.noise_std >= inputs["noise"].update * before, (
                f"noise std {result.noise_std} < σ_Δ · s_t = {inputs['noise'].update * before}"
            )
        # ξ_t, which a server optimizer may scale by (adam-wosm), is the noise std of Δ̂ itself
        denominator = inputs["expected_clients"] * (before if policy.normalize else 1.0)
        assert math.isclose(result.estimate_noise_std * denominator, result.noise_std, rel_tol=1e-9), (
            f"estimate_noise_std {result.estimate_noise_std} is not the noise std {result.noise_std} "
            f"over Δ̂'s denominator {denominator}"
        )
        expected_report = inputs["noise"].report if result.noisy_reports is not None else None
        assert event.report_noise_multiplier == expected_report, (
            f"the round's report multiplier {event.report_noise_multiplier} is not {expected_report}"
        )
    assert np.all(np.isfinite(result.estimate)), "the update estimate is not finite"
    _check_state(policy, result.state)
    return result.state


def _check_clients(policy: Policy, state: Any, updates: np.ndarray, cohorts: np.ndarray) -> None:
    params = policy.broadcast(state)
    json.dumps(params)  # public, sent to every client
    out = policy.client_side(updates, cohorts, params)
    n, d = updates.shape
    sensitivity = policy.sensitivity(state)
    bounds = policy.contribution_bounds(params, cohorts)
    assert np.all(bounds <= sensitivity), (
        f"a client's bound {bounds.max()} exceeds the sensitivity {sensitivity}"
    )
    assert out.contributions.shape == (n, d)
    assert np.all(np.isfinite(out.contributions)), "a contribution is not finite"
    norms = row_norms(out.contributions)
    assert np.all(norms <= bounds), f"a contribution of norm {norms.max()} exceeds its bound"
    assert out.reports.shape == (n, policy.report_size(d)), f"reports of shape {out.reports.shape}"
    assert np.all(np.isfinite(out.reports)), "a report is not finite"
    if out.reports.size:
        assert np.all(row_norms(out.reports) <= 1.0), "a report vector has norm > 1"
    for report, cohort in zip(out.reports, cohorts, strict=True):
        assert policy.report_is_valid(report, int(cohort) if policy.needs_cohorts else None), (
            f"the policy rejects its own honest report {report}"
        )
    nonfinite = ~np.isfinite(updates).all(axis=1)
    assert np.all(out.nonfinite[nonfinite]), "a non-finite update is not marked so"
    assert np.all(out.contributions[nonfinite] == 0), "a non-finite update contributed"
    assert np.all(out.reports[nonfinite] == 0), "a non-finite update reported"
    if policy.row_scaling:
        _check_scaled_clients(policy, params, updates, cohorts, out, bounds)


def _check_scaled_clients(
    policy: Policy, params: dict, updates: np.ndarray, cohorts: np.ndarray, out: Any, bounds: np.ndarray
) -> None:
    """A row-scaling policy decides from the norms alone what :meth:`Policy.client_side` sends:
    the factors keep every contribution inside its bound and rebuild the same rows (to
    rounding; where a factor is subnormal only the bound is checked)."""
    nonfinite = ~np.isfinite(updates).all(axis=1)
    safe = np.where(nonfinite[:, None], 0.0, updates)
    norms = row_norms(safe)
    nonfinite |= ~np.isfinite(norms)  # finite entries whose norm overflows count as non-finite
    safe = np.where(nonfinite[:, None], 0.0, updates)
    scaled = policy.scaled_client_side(np.where(nonfinite, np.inf, norms), cohorts, params)
    assert np.array_equal(scaled.nonfinite, nonfinite) and np.array_equal(scaled.exceeded, out.exceeded)
    assert np.all(scaled.contribution_norms <= bounds), "a scaled contribution exceeds its bound"
    assert np.all(scaled.contribution_scales[nonfinite] == 0), "a non-finite update has a factor"
    precise = np.abs(scaled.contribution_scales) >= PRECISE_FACTOR_BELOW
    rebuilt = safe[precise] * scaled.contribution_scales[precise, None]
    difference = row_norms(rebuilt - out.contributions[precise])
    assert np.all(difference <= 1e-8 * row_norms(out.contributions[precise]) + 1e-300), (
        "the factors do not rebuild the contributions"
    )
    if scaled.report_scales is None:
        assert np.array_equal(scaled.reports, out.reports), "the scaled reports differ"
    else:
        finite_norms = np.where(nonfinite, 0.0, norms)  # a dropped row's factor is 0, its norm maybe ∞
        assert np.all(np.abs(scaled.report_scales) * finite_norms <= 1.0), "a scaled report has norm > 1"
        directions = safe * scaled.report_scales[:, None]
        difference = row_norms(directions - out.reports)
        assert np.all(difference <= 1e-8), "the report factors do not rebuild the reports"


# ----- hypothesis strategies (also the built-in policies' own property tests use these) -------


def noisy_counts() -> Any:
    """Noisy counts: anything a count plus Gaussian noise can be, far beyond any real federation."""
    from hypothesis import strategies as st

    return st.floats(-1e15, 1e15) | st.sampled_from([0.0, 1.0, -1.0, 1e15, -1e15, 0.5])


def round_inputs(d: int) -> Any:
    """One server step's inputs: an arbitrary sum of ``d`` coordinates, report sums, noise
    multipliers (0 included), m̂, the number of reports and a noise seed."""
    from hypothesis import strategies as st

    return st.fixed_dictionaries(
        {
            "expected_clients": log_uniform(-1, 4),
            "noise": st.builds(
                NoiseMultipliers, st.just(0.0) | log_uniform(-3, 3), st.just(0.0) | log_uniform(-3, 3)
            ),
            "sum": st.lists(st.floats(-1e30, 1e30), min_size=d, max_size=d).map(np.asarray),
            "reports": st.lists(noisy_counts(), min_size=1, max_size=8),
            "num_reports": st.integers(0, 50),
            "seed": st.integers(0, 2**32 - 1),
        }
    )


def update_matrices(n: int, d: int) -> Any:
    """``n`` client updates of ``d`` coordinates: arbitrary floats (NaN, ±inf, subnormals and
    extremes included) or Gaussian rows at a scale from 10^−35 to 10^35."""
    from hypothesis import strategies as st
    from hypothesis.extra import numpy as hnp

    entries = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(
        [0.0, -0.0, 5e-324, -5e-324, 1e-300, 1e300, -1e300, 1.7e308, -1.7e308, math.inf, -math.inf, math.nan]
    )
    gaussian = st.builds(
        lambda seed, scale: np.random.default_rng(seed).normal(size=(n, d)) * scale,
        st.integers(0, 2**32 - 1),
        log_uniform(-35, 35),
    )
    return hnp.arrays(np.float64, (n, d), elements=entries) | gaussian


def log_uniform(low_exponent: int, high_exponent: int) -> Any:
    """Positive floats spread over the decades 10^low .. 10^high."""
    from hypothesis import strategies as st

    return st.builds(
        lambda mantissa, exponent: mantissa * 10.0**exponent,
        st.floats(1.0, 9.99),
        st.integers(low_exponent, high_exponent),
    )


__all__ = ["check_policy", "log_uniform", "noisy_counts", "round_inputs", "update_matrices"]
