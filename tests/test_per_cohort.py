"""``per-cohort`` (DPSGD-F): its two bound rules and its two noise bounds.

* ``rule = "xu"``: seed 004's Algorithm 2, C_k = C_0 (1 + (m̃_k/b̃_k) / (m̃/m̂));
  ``rule = "esipova"``: seed 003's code, C_k = C_0 (1 + f_k / (mean f + 1e-8)); unset, each
  mode keeps its old rule;
* ``noise_bound = "initial"`` (seed 003's Algorithm 3) noises with C_0 while clients clip at
  C_k >= C_0: the base class accounts such a round with σ_Δ · C_0 / max_k C_k, so ε grows, and a
  plan that could not follow that (a budget, a target ε, the PRV accountant) is refused.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import strategies as st

from fairclip.policies import check_policy
from fairclip.scenarios.config import load_config
from fairclip.scenarios.errors import ConfigError
from fairclip.scenarios.tasks import build_task
from fairclip.server.privacy_plan import plan_privacy
from fairclip.server.run import Run
from fairclip.sims.executors.loop import simulate
from fairclip.strategies import NoiseMultipliers, PolicyConfigError, build_policy
from fairclip.strategies.accounting import Accountant
from fairclip.strategies.aggregation import CohortDiagnostics, RoundSums
from fairclip.strategies.base import DPEvent, PolicyError
from fairclip.strategies.constant import ConstantClipping
from fairclip.strategies.registry import check_policy_class

COUNTS = np.array([1.0, 5.0, 3.0, 1.0, 0.0, 0.0])
"""[m_0, o_0, m_1, o_1, m_2, o_2]: cohort 0 clipped 1 of 6, cohort 1 3 of 4, cohort 2 empty."""


def _policy(**params) -> object:
    return build_policy("per-cohort", {"initial_bound": 2.0, **params}, num_cohorts=3)


# ----- the rules ----------------------------------------------------------------------------------


@pytest.mark.parametrize("same_round", [False, True])
def test_xu_rule_is_algorithm_2_in_both_modes(same_round):
    """C_k = C_0 (1 + f_k / (m̃/m̂)): the overall fraction over the public m̂, not a mean of
    fractions; an empty cohort counts as clipped (f_k = 1, "0/0 = 1", as the authors' code
    lineage does), so its bound is C_0 (1 + m̂/m̃), not C_0."""
    policy = _policy(rule="xu", same_round=same_round)
    state = policy.initial_state(2)
    bounds = (policy.with_counts if same_round else lambda s, c, m: policy.next_state(s, None, c, m))(
        state, COUNTS, 10.0
    ).bounds
    overall = 4 / 10
    expected = (2.0 * (1 + (1 / 6) / overall), 2.0 * (1 + (3 / 4) / overall), 2.0 * (1 + 1 / overall))
    assert bounds == pytest.approx(expected, rel=1e-12)


def test_xu_rule_post_processing_keeps_bounds_between_c0_and_c0_times_one_plus_m():
    policy = _policy(rule="xu", same_round=True)
    state = policy.initial_state(2)
    # negative noisy counts are clamped to 0 (both of cohort 2's: empty, so counted as clipped); a
    # fraction m̃/m̂ above 1 is clamped to 1
    assert policy.with_counts(state, np.array([-4, 2, 5, -3, -1, -1.0]), 10.0).bounds == pytest.approx(
        (2.0, 2.0 * (1 + 1 / 0.5), 2.0 * (1 + 1 / 0.5)), rel=1e-12
    )
    assert policy.with_counts(state, np.array([30.0, 0, 0, 5, 0, 0]), 10.0).bounds == pytest.approx(
        (4.0, 2.0, 4.0), rel=1e-12
    )
    # fewer than one clipped update in all: m̃/m̂ floored at 1/m̂, so C_k <= C_0 (1 + m̂)
    tiny = policy.with_counts(state, np.array([0.01, 0, 0, 3, 0, 0]), 10.0)
    assert tiny.bounds == pytest.approx((2.0 * 11, 2.0, 2.0 * 11), rel=1e-12)
    # nothing released: every cohort counts as clipped, at the largest bound the rule allows
    assert policy.with_counts(state, np.zeros(6), 10.0).bounds == pytest.approx((22.0,) * 3, rel=1e-12)


@pytest.mark.parametrize("same_round", [False, True])
def test_esipova_rule_is_the_authors_code_in_both_modes(same_round):
    """int-truncated counts, f_k = 1 for an empty cohort, C_k = C_0 (1 + f_k / (mean f + 1e-8))."""
    policy = _policy(rule="esipova", same_round=same_round)
    state = policy.initial_state(2)
    counts = np.array([1.7, 5.2, -3.0, -0.4, 3.9, 1.0])
    fractions = np.array([1 / 6, 1.0, 3 / 4])
    expected = tuple(2.0 * (1 + fractions / (fractions.mean() + 1e-8)))
    if same_round:
        assert policy.with_counts(state, counts, 10.0).bounds == pytest.approx(expected, rel=1e-12)
    else:
        assert policy.next_state(state, None, counts, 10.0).bounds == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("same_round", [False, True])
def test_an_unset_rule_keeps_each_modes_old_rule(same_round):
    default = _policy(same_round=same_round)
    explicit = _policy(same_round=same_round, rule="esipova" if same_round else "xu")
    assert default.bound_rule == explicit.bound_rule
    counts = np.array([1.7, 5.2, 2.0, 2.4, 3.9, 1.0])
    state = default.initial_state(2)
    if same_round:
        assert default.with_counts(state, counts, 10.0) == explicit.with_counts(state, counts, 10.0)
    else:
        assert default.next_state(state, None, counts, 10.0) == explicit.next_state(state, None, counts, 10.0)


@pytest.mark.parametrize(("key", "value"), [("rule", "paper"), ("rule", 1), ("noise_bound", "C0")])
def test_unknown_rule_or_noise_bound_is_one_clear_line(key, value):
    with pytest.raises(PolicyConfigError) as caught:
        _policy(**{key: value})
    assert key in str(caught.value) and "\n" not in str(caught.value)


def test_every_rule_mode_and_noise_bound_keeps_the_policy_invariants():
    """fairclip's own plug-in helper over every combination (counts of any sign and size)."""
    check_policy(
        "per-cohort",
        st.fixed_dictionaries(
            {
                "initial_bound": st.floats(1e-3, 1e3),
                "same_round": st.booleans(),
                "rule": st.sampled_from([None, "esipova", "xu"]),
                "noise_bound": st.sampled_from(["max", "initial"]),
            }
        ),
        max_examples=80,
    )


# ----- the noise bound -----------------------------------------------------------------------------


def _round(policy, noise: NoiseMultipliers, counts: np.ndarray = COUNTS, seed: int = 0):
    """One same-round round of ``policy`` with released ``counts`` and a zero contribution sum."""
    state = policy.with_counts(policy.initial_state(2), counts, 10.0)
    result = policy.server_side(
        state,
        np.zeros(2000),
        None,
        expected_clients=10.0,
        num_reports=4,
        noise=noise,
        rng=np.random.default_rng(seed),
        released_reports=counts,
    )
    return state, result


@pytest.mark.parametrize("rule", ["xu", "esipova"])
def test_initial_noise_bound_is_accounted_with_the_multiplier_it_amounts_to(rule):
    """Seed 003's Algorithm 3 noises with C_0 while cohort 1 clips at C_1 > C_0: the round is a
    Gaussian mechanism of sensitivity max_k C_k and std σ C_0, multiplier σ C_0 / max_k C_k."""
    noise = NoiseMultipliers(0.8, 8.0)
    initial = _policy(rule=rule, same_round=True, noise_bound="initial")
    state, result = _round(initial, noise)
    largest = max(state.bounds)
    assert largest > 2.0  # the round's bounds exceed C_0
    assert result.sensitivity == largest
    assert result.noise_std == pytest.approx(0.8 * 2.0, rel=1e-12)
    assert result.event.noise_multiplier == pytest.approx(0.8 * 2.0 / largest, rel=1e-12)
    assert result.event.report_noise_multiplier == 8.0
    # the noise drawn has that standard deviation (2000 coordinates: within 10 %)
    assert np.std(result.estimate * 10.0) == pytest.approx(0.8 * 2.0, rel=0.1)
    # "max" (the default): noise σ max_k C_k, multiplier σ exactly
    _, plain = _round(_policy(rule=rule, same_round=True), noise)
    assert plain.noise_std == 0.8 * largest and plain.event == DPEvent(0.8, 8.0)
    # a round whose bounds all stay at C_0 costs what "max" costs, exactly
    _, still = _round(initial, noise, counts=np.array([0.0, 5, 0, 4, 0, 3]))
    assert still.event == DPEvent(0.8, 8.0)


def test_initial_noise_bound_costs_more_epsilon_over_a_run():
    """ε of the accountant fed each round's event: larger with C_0 noise than with max_k C_k."""
    noise = NoiseMultipliers(1.0, 10.0)
    epsilons = {}
    for bound in ("max", "initial"):
        policy = _policy(rule="xu", same_round=True, noise_bound=bound)
        accountant = Accountant("rdp")
        generator = np.random.default_rng(1)
        for _ in range(12):
            counts = np.array([3.0, 2, 1, 4, 0, 5]) + generator.normal(size=6)
            _, result = _round(policy, noise, counts)
            accountant.step(result.event, 0.05)
        epsilons[bound] = accountant.get_epsilon(1e-6)
        assert (len(accountant.history) > 1) == (bound == "initial")
    assert epsilons["initial"] > 1.5 * epsilons["max"]


def _sums(dim: int, report) -> RoundSums:
    return RoundSums(np.zeros(dim), np.asarray(report, float), 3, CohortDiagnostics.zeros(2))


def _demo(*settings: str):
    return load_config(
        "demo",
        None,
        [
            "policy.name=per-cohort",
            "policy.same_round=true",
            "policy.initial_bound=0.3",
            "policy.noise_bound=initial",
            "privacy.accountant=rdp",
            "training.rounds=3",
            "seed=4",
            *settings,
        ],
    )


def test_a_counts_first_round_is_accounted_at_its_counts_with_the_smaller_multiplier():
    config = _demo()
    server = Run(config, build_task(config))
    dim = server.model.shape[0]
    noise = server.plan.noise
    counts = server.release_counts(1, _sums(dim, [2.0, 1.0, 0.0, 0.0]))
    state = server.policy.with_counts(None, counts, 1.0)
    expected = noise.update * 0.3 / max(state.bounds)
    entry = server.rounds.accountant.history[-1]
    assert entry[0] == pytest.approx(DPEvent(expected, noise.report).effective_noise_multiplier, rel=1e-12)
    released = server.rounds.release(1, _sums(dim, np.zeros(4)))
    assert released.event.noise_multiplier == pytest.approx(expected, rel=1e-12)
    assert server.rounds.accountant.rounds == 1


def test_a_run_with_the_initial_noise_bound_reports_the_accountants_epsilon():
    config = _demo("training.rounds=4")
    result = simulate(config, build_task(config))
    privacy = result.summary["privacy"]
    assert privacy["noise_multiplier_varies"] is True
    assert privacy["smallest_effective_noise_multiplier"] < 1.0
    plain = _demo("training.rounds=4", "policy.noise_bound=max")
    assert result.summary["epsilon"] > simulate(plain, build_task(plain)).summary["epsilon"]
    for row in result.rows:
        assert row["noise_std"] == pytest.approx(config.privacy.noise_multiplier * 0.3, rel=1e-12)


@pytest.mark.parametrize(
    ("setting", "mentions"),
    [
        ("privacy.target_epsilon=5.0", "privacy.target_epsilon"),
        ("privacy.epsilon_budget=5.0", "privacy.epsilon_budget"),
        ("privacy.accountant=prv", "privacy.accountant"),
    ],
)
def test_a_plan_that_cannot_follow_the_multipliers_is_refused(setting, mentions):
    config = _demo(setting)
    task = build_task(config)
    policy = build_policy("per-cohort", config.policy.params, num_cohorts=len(task.cohort_names))
    with pytest.raises(ConfigError) as caught:
        plan_privacy(config, policy, task.initial_model().shape[0])
    message = str(caught.value)
    assert message.startswith(mentions) and "\n" not in message
    # the same plan for the default noise bound is accepted
    plain = build_policy(
        "per-cohort", {**config.policy.params, "noise_bound": "max"}, num_cohorts=len(task.cohort_names)
    )
    plan_privacy(config, plain, task.initial_model().shape[0])


def test_a_resume_that_would_charge_lost_rounds_at_a_guessed_multiplier_is_refused():
    config = _demo()
    server = Run(config, build_task(config))
    server.charge_released_again(0)  # nothing lost: nothing to refuse
    with pytest.raises(ConfigError, match="cannot resume"):
        server.charge_released_again(2)


# ----- the base class: a plug-in cannot under-noise silently ---------------------------------------


class _Quiet(ConstantClipping):
    """Noises with half its sensitivity."""

    name = "quiet"

    def noise_scale(self, state):
        return 0.5 * self.sensitivity(state)


class _DeclaredQuiet(_Quiet):
    name = "declared-quiet"

    @property
    def noises_below_sensitivity(self) -> bool:
        return True


class _Loud(ConstantClipping):
    name = "loud"

    def noise_scale(self, state):
        return 2.0 * self.sensitivity(state)


def _server_round(policy):
    return policy.server_side(
        policy.initial_state(3),
        np.zeros(3),
        None,
        expected_clients=4.0,
        num_reports=4,
        noise=NoiseMultipliers(1.0, 10.0),
        rng=np.random.default_rng(0),
    )


def test_a_noise_scale_below_the_sensitivity_must_be_declared_and_is_charged():
    with pytest.raises(PolicyError, match="does not declare noises_below_sensitivity"):
        _server_round(_Quiet(initial_bound=2.0))
    result = _server_round(_DeclaredQuiet(initial_bound=2.0))
    assert result.noise_std == pytest.approx(1.0, rel=1e-12)  # σ · C/2
    assert result.event == DPEvent(0.5)  # charged as what it is: multiplier σ/2
    with pytest.raises(PolicyError, match=r"noise_scale\(\) must be a finite number in \(0"):
        _server_round(_Loud(initial_bound=2.0))


def test_a_plugin_may_not_derive_its_own_event():
    class OwnEvent(ConstantClipping):
        name = "own-event"

        def round_event(self, state, noise, releases_reports):
            return DPEvent(noise.update)

    with pytest.raises(PolicyConfigError, match="round_event"):
        check_policy_class(OwnEvent, "own-event")


def test_mixed_rdp_histories_are_opacus_bit_for_bit():
    from opacus.accountants import RDPAccountant

    ours, theirs = Accountant("rdp"), RDPAccountant()
    for index in range(12):
        ours.step(DPEvent(0.6 + 0.01 * (index % 3), 6.0 if index % 2 else None), 0.02)
    theirs.history = list(ours.history)
    assert len(ours.history) == 12
    epsilon = ours.get_epsilon(1e-6)
    assert epsilon == theirs.get_epsilon(1e-6)
    assert math.isfinite(epsilon) and ours.get_epsilon(1e-6) == epsilon


def test_a_report_takes_a_varying_runs_epsilon_from_its_own_accountant():
    """A run whose multiplier changed every round holds only the last one in its claim: the
    report's RDP column is the run's own ε, and PRV (which it could not recompute) is blank."""
    from fairclip.sims.reproduce.tables import both_accountants

    claim = {
        "accountant": "rdp",
        "noise_multiplier_varies": True,
        "effective_noise_multiplier": 5.0,  # the last round's: recomputing from it would mislead
        "sample_rate": 0.01,
        "rounds": 100,
        "delta": 1e-6,
    }
    summaries = [{"epsilon": 3.25, "privacy": claim}, {"epsilon": 3.75, "privacy": claim}]
    assert both_accountants(summaries, "rdp") == 3.5
    assert both_accountants(summaries, "prv") == ""


def test_a_report_shows_no_epsilon_where_a_run_claims_none_or_held_other_releases():
    """FairLens's coupled updates (``guarantee`` false) claim no ε: the report's accountant columns
    say inf, not what the mechanism alone would give. A run whose clients evaluated the model
    composed those releases too: only its own accountant's ε holds, as for a varying multiplier."""
    from fairclip.sims.reproduce.tables import both_accountants

    claim = {"accountant": "rdp", "effective_noise_multiplier": 1.0, "sample_rate": 0.01, "rounds": 100}
    claim["delta"] = 1e-5
    coupled = [{"epsilon": "inf", "privacy": {**claim, "guarantee": False, "mechanism_epsilon": 1.2}}]
    assert both_accountants(coupled, "rdp") == "inf" and both_accountants(coupled, "prv", runs=5) == "inf"
    evaluated = [{"epsilon": 2.5, "privacy": {**claim, "evaluation_releases": 100}}]
    assert both_accountants(evaluated, "rdp") == 2.5
    assert both_accountants(evaluated, "prv") == ""


def test_naive_reweighting_can_weight_a_round_by_its_own_counts():
    """Seed 004's Algorithm 3 weights the batch by its own noisy counts: θ_k = (m̂/K)/max(b̃_k, 1)
    for this round, in two exchanges; the state between rounds does not move."""
    policy = build_policy("reweight", {"initial_bound": 0.5, "same_round": True}, num_cohorts=2)
    state = policy.initial_state(2)
    assert policy.counts_first and not build_policy("reweight", num_cohorts=2).counts_first
    weighted = policy.with_counts(state, np.array([18.0, 0.4]), 20.0)
    assert weighted.weights == pytest.approx((10 / 18, 10.0), rel=1e-12)
    assert policy.next_state(weighted, np.zeros(2), np.array([5.0, 5.0]), 20.0) is weighted
    check_policy("reweight", {"initial_bound": 0.5, "same_round": True}, max_examples=30)


def test_the_flower_wrapper_accounts_a_quiet_plugin_with_rdp_only():
    from flwr.serverapp.strategy import FedAvg

    from fairclip.server.dp_strategy import DifferentialPrivacy

    common = {"num_clients": 10, "sample_rate": 0.5, "noise_multiplier": 1.0}
    with pytest.raises(PolicyConfigError, match="accountant='rdp'"):
        DifferentialPrivacy(FedAvg(), _DeclaredQuiet(initial_bound=1.0), **common)
    DifferentialPrivacy(FedAvg(), _DeclaredQuiet(initial_bound=1.0), accountant="rdp", **common)
