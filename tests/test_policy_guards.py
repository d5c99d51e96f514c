"""Issue 64, point 3: a plug-in policy can never release more than its noise covers.

The base class enforces the sensitivity at run time, on every path, without the plug-in author
having called ``check_policy``: a round whose client bounds exceed the sensitivity it is noised
with is refused (``PolicyError`` naming both numbers); every contribution is projected to its
client's bound and every report to norm <= 1 on the client side, the one-step path and the Flower
mod; the server's reply check drops a report of norm above 1; a private policy may not override
the guarded steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.serverapp.strategy import FedAvg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import fairclip
from fairclip.client.protocol import CONTRIBUTION, REPORTS, UPDATE, write_policy_config
from fairclip.flower import DifferentialPrivacy, fairclip_mod
from fairclip.policies import Policy, PolicyConfigError, RowScales, build_policy, hard_clip, register
from fairclip.server.replies import ReplyError, check_reply
from fairclip.strategies.clipping import row_norms
from fairclip.strategies.errors import PolicyError


@dataclass(frozen=True)
class Bound:
    bound: float


class _Hard(Policy):
    """Hard clipping at a fixed bound; the sloppy variants below change one thing each."""

    name = "guard-hard"

    def initial_state(self, dim):
        return Bound(0.1)

    def broadcast(self, state):
        return {"bound": state.bound}

    def sensitivity(self, state):
        return state.bound

    def contribution_bounds(self, params, cohorts):
        return np.full(cohorts.shape[0], params["bound"])

    def transform(self, updates, norms, cohorts, params):
        bound = params["bound"]
        return hard_clip(updates, norms, bound), np.zeros((updates.shape[0], 0)), norms > bound


class ClipsAtTwiceWhatItNoises(_Hard):
    """Clips (and declares its client bounds) at 2C, but noises with sensitivity C."""

    name = "guard-twice"

    def contribution_bounds(self, params, cohorts):
        return np.full(cohorts.shape[0], 2 * params["bound"])

    def transform(self, updates, norms, cohorts, params):
        bound = 2 * params["bound"]
        return hard_clip(updates, norms, bound), np.zeros((updates.shape[0], 0)), norms > bound


class ClipsBeyondItsOwnBound(_Hard):
    """Says C everywhere, but its transform clips at 2C."""

    name = "guard-beyond"

    def transform(self, updates, norms, cohorts, params):
        bound = 2 * params["bound"]
        return hard_clip(updates, norms, bound), np.zeros((updates.shape[0], 0)), norms > bound


class LoudReports(_Hard):
    """Sends a report of norm 5 (and accepts any report it is sent)."""

    name = "guard-loud"

    def report_size(self, dim):
        return 1

    def report_is_valid(self, report, cohort):
        return True

    def transform(self, updates, norms, cohorts, params):
        contributions, _, exceeded = super().transform(updates, norms, cohorts, params)
        return contributions, np.full((updates.shape[0], 1), 5.0), exceeded


class LoudScaledReports(LoudReports):
    """:class:`LoudReports` as a row-scaling policy (the one-step path)."""

    name = "guard-loud-scaled"
    transform = Policy.transform

    def scales(self, norms, cohorts, params):
        n = norms.shape[0]
        return RowScales(np.full(n, 3.0), np.full((n, 1), 5.0), norms > params["bound"], clip=None)


class NotANumber(_Hard):
    """Its transform turns every update into NaN."""

    name = "guard-nan"

    def transform(self, updates, norms, cohorts, params):
        contributions, reports, exceeded = super().transform(updates, norms, cohorts, params)
        return np.full_like(contributions, np.nan), reports, exceeded


class OwnClientSide(_Hard):
    """Replaces the client side the base class guards."""

    name = "guard-own-client-side"

    def client_side(self, updates, cohorts, params):
        return super().client_side(updates * 10, cohorts, params)


def _bimodal(policy: type[Policy], **overrides) -> fairclip.Simulation:
    """One round of ``bimodal-mean`` (1,000 clients, no noise) under ``policy``."""
    register(policy, replace=True)
    settings = {
        "policy.name": policy.name,
        "training.rounds": 1,
        "federation.num_clients": 1000,
        "privacy.noise_multiplier": 0.0,
        "privacy.count_noise_multiplier": 0.0,
        **overrides,
    }
    return fairclip.simulate("bimodal-mean", overrides=settings)


def test_a_round_whose_bounds_exceed_its_sensitivity_is_refused_naming_both():
    with pytest.raises(PolicyError, match=r"contribute up to 0\.2 .* sensitivity 0\.1"):
        _bimodal(ClipsAtTwiceWhatItNoises)
    policy = ClipsAtTwiceWhatItNoises()
    with pytest.raises(PolicyError, match=r"0\.2 .* 0\.1"):
        policy.checked_broadcast(policy.initial_state(1))
    assert _Hard().checked_broadcast(Bound(0.1)) == {"bound": 0.1}


@pytest.mark.parametrize("sensitivity", [0.0, -1.0, np.nan, np.inf])
def test_a_sensitivity_that_is_not_a_positive_number_is_refused(sensitivity):
    policy = _Hard()
    with pytest.raises(PolicyError, match="not a finite number > 0"):
        policy.checked_broadcast(Bound(sensitivity))


def test_a_transform_beyond_its_bound_is_projected_in_a_run():
    """The sum a round releases is what the honest policy at the same bound releases."""
    sloppy = _bimodal(ClipsBeyondItsOwnBound)
    honest = _bimodal(_Hard)
    assert sloppy.summary["estimate"] == pytest.approx(honest.summary["estimate"], rel=1e-12)
    # the near-one cohort's updates (about 1 each) would contribute 0.2 each unprojected, not 0.1
    clipped = sloppy.rounds["near_one/sampled"].iloc[0]
    assert clipped > 20 and sloppy.summary["estimate"] < 0.15 * clipped / 100


def test_reports_above_norm_one_are_projected_in_a_run():
    """The released count sum (no count noise) is at most one per sampled client."""
    run = _bimodal(LoudReports)
    row = run.rounds.iloc[0]
    assert row["noisy_report_0"] <= row["sampled_clients"] * (1 + 1e-12)
    assert row["noisy_report_0"] == pytest.approx(row["sampled_clients"], rel=1e-8)


def test_the_one_step_path_projects_factors_and_reports():
    policy = LoudScaledReports()
    norms = np.array([0.05, 1.0, 30.0])
    scaled = policy.scaled_client_side(norms, np.zeros(3, dtype=np.int64), {"bound": 0.1})
    assert np.all(scaled.contribution_norms <= 0.1)
    assert np.all(row_norms(scaled.reports) <= 1.0)


def test_a_non_finite_transform_sends_zeros():
    out = NotANumber().client_side(np.ones((3, 4)), np.zeros(3, dtype=np.int64), {"bound": 0.1})
    assert np.all(out.contributions == 0) and np.all(out.nonfinite)
    assert np.all(np.isfinite(out.contribution_norms))


@pytest.mark.parametrize("bound", [math.inf, -1.0, math.nan])
@pytest.mark.parametrize("policy", ["constant", "per-cohort"])
def test_a_broadcast_bound_a_private_client_cannot_use_lets_nothing_through(policy, bound):
    """A server that broadcasts an infinite, negative or NaN bound gets zeros, never the update
    unclipped (or, for a negative bound, flipped and rescaled)."""
    made = build_policy(policy, {"initial_bound": 1.0}, num_cohorts=2)
    params = {"bound": bound, "cohort_bounds": [bound, bound]}
    out = made.client_side(np.array([[30.0, 40.0]]), np.zeros(1, dtype=np.int64), params)
    assert np.all(out.contributions == 0)


def _mod_round(policy: Policy, train) -> Message:
    """The reply of ``fairclip_mod`` around the app ``train`` to a train message of ``policy``'s
    first round on a two-weight model."""
    config = ConfigRecord({})
    write_policy_config(config, policy, policy.checked_broadcast(policy.initial_state(2)))
    arrays = ArrayRecord({"w": Array(np.zeros(2, dtype=np.float32))})
    message = Message(
        RecordDict({"arrays": arrays, "config": config}), dst_node_id=3, message_type=MessageType.TRAIN
    )
    context = Context(run_id=1, node_id=3, node_config={}, state=RecordDict(), run_config={})
    return fairclip_mod(message, context, train)


def test_the_flower_mod_refuses_a_policy_that_does_not_clip(server_task_identity):
    def train(message: Message, context: Context) -> Message:
        raise AssertionError("the app must not train for a round it cannot clip")

    reply = _mod_round(build_policy("none"), train)
    assert reply.has_error() and "does not clip" in reply.error.reason


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    contributions=hnp.arrays(np.float64, (4, 3), elements=st.floats(allow_nan=True, allow_infinity=True)),
    reports=hnp.arrays(np.float64, (4, 2), elements=st.floats(allow_nan=True, allow_infinity=True)),
    bound=st.floats(1e-6, 1e6),
)
def test_whatever_a_transform_returns_the_client_side_keeps_the_bounds(contributions, reports, bound):
    """A plug-in's transform may return anything; what leaves the client side is finite, within
    the client's bound and of report norm at most 1."""

    class Anything(_Hard):
        name = "guard-anything"

        def report_size(self, dim):
            return 2

        def transform(self, updates, norms, cohorts, params):
            return contributions, reports, norms > params["bound"]

    out = Anything().client_side(np.ones((4, 3)), np.zeros(4, dtype=np.int64), {"bound": bound})
    assert np.all(np.isfinite(out.contributions)) and np.all(np.isfinite(out.reports))
    assert np.all(row_norms(out.contributions) <= bound)
    assert np.all(row_norms(out.reports) <= 1.0)


def test_the_flower_reply_check_drops_a_report_above_norm_one():
    policy = LoudReports()
    content = RecordDict(
        {UPDATE: ArrayRecord({CONTRIBUTION: Array(np.zeros(2)), REPORTS: Array(np.array([5.0]))})}
    )
    with pytest.raises(ReplyError, match="norm above 1"):
        check_reply(content, policy=policy, params={"bound": 0.1}, dim=2, cohort=None, num_cohorts=1)
    content[UPDATE][REPORTS] = Array(np.array([1.0]))
    assert check_reply(content, policy=policy, params={"bound": 0.1}, dim=2, cohort=None, num_cohorts=1)


def test_the_flower_mod_projects_what_a_sloppy_policy_sends(server_task_identity):
    register(LoudReports, replace=True)

    def train(message: Message, context: Context) -> Message:
        moved = ArrayRecord({"w": Array(np.full(2, 7.0, dtype=np.float32))})
        return Message(RecordDict({"arrays": moved}), reply_to=message)

    reply = _mod_round(build_policy(LoudReports.name), train)
    assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
    assert np.linalg.norm(reply.content[UPDATE][CONTRIBUTION].numpy()) <= 0.1
    assert np.linalg.norm(reply.content[UPDATE][REPORTS].numpy()) <= 1.0


def test_a_private_policy_may_not_override_the_guarded_steps():
    with pytest.raises(PolicyConfigError, match="overrides client_side"):
        register(OwnClientSide)
    with pytest.raises(PolicyConfigError, match="overrides client_side"):
        DifferentialPrivacy(FedAvg(), OwnClientSide(), num_clients=10, sample_rate=0.5, noise_multiplier=1.0)
    with pytest.raises(PolicyConfigError, match="overrides client_side"):
        build_policy("tests.test_policy_guards:OwnClientSide")


def test_the_command_line_refuses_such_a_policy_in_one_line(cli, tmp_path):
    status, _, err = cli(
        "run", "--scenario", "bimodal-mean", "--out", str(tmp_path / "run"),
        "--set", "policy.name=tests.test_policy_guards:ClipsAtTwiceWhatItNoises",
        "--set", "training.rounds=1", "--set", "federation.num_clients=100",
    )  # fmt: skip
    assert status == 2 and len(err.strip().splitlines()) == 1, err
    assert "contribute up to 0.2" in err and "sensitivity 0.1" in err
