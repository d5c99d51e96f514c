"""DPSGD-F as its authors ran it: a round's per-cohort bounds from that round's own noisy counts.

A counts-first policy (``per-cohort`` with ``same_round``) asks the same sampled clients twice a
round: their count bits first, then their updates clipped at the bounds those counts set. These
tests check the rule (the authors' code), the privacy mechanics (one noise stream, the counts
accounted when they are released, nothing of the other exchange released), and that the second
exchange clips the very updates of the first on every executor path.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, RecordDict
from hypothesis import given, settings
from hypothesis import strategies as st

from fairclip.client.contributions import contribute
from fairclip.client.protocol import CONTRIBUTION, REPORTS, UPDATE
from fairclip.policies import check_policy
from fairclip.scenarios.config import load_config
from fairclip.scenarios.tasks import build_task
from fairclip.server.replies import ReplyError, check_reply
from fairclip.server.run import Run
from fairclip.sims.executors.local import LocalExecutor
from fairclip.sims.executors.loop import simulate
from fairclip.strategies import NoiseMultipliers, build_policy
from fairclip.strategies.aggregation import CohortDiagnostics, Exchange, RoundSums
from fairclip.strategies.randomness import Stream, rng


def _same_round(num_cohorts: int = 2, bound: float = 1.0):
    return build_policy("per-cohort", {"initial_bound": bound, "same_round": True}, num_cohorts=num_cohorts)


def test_same_round_bounds_follow_the_authors_code():
    """m̃_k, õ_k = max(int(noisy), 0); f_k = m̃_k/b̃_k, 1 for an empty cohort; C_k = C_0 (1 + f_k /
    (mean f + 1e-8))."""
    policy = _same_round(3, bound=2.0)
    state = policy.initial_state(4)
    counts = np.array([1.7, 5.2, -3.0, -0.4, 3.9, 1.0])  # cohort 1 empty after truncation
    bounds = policy.with_counts(state, counts, expected_clients=10.0).bounds
    fractions = np.array([1 / 6, 1.0, 3 / 4])
    expected = 2.0 * (1 + fractions / (fractions.mean() + 1e-8))
    assert bounds == pytest.approx(tuple(expected), rel=1e-12)
    # nothing clipped anywhere: every bound is C_0
    assert policy.with_counts(state, np.array([0.0, 9, 0, 4, 0, 7]), 10.0).bounds == (2.0, 2.0, 2.0)
    # the state between rounds does not move: the next round's counts set the next bounds
    assert policy.next_state(state, np.zeros(4), counts, 10.0) is state
    assert policy.counts_first and not build_policy("per-cohort", num_cohorts=3).counts_first


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(
    num_cohorts=st.integers(1, 5),
    counts=st.lists(st.floats(-1e12, 1e12), min_size=10, max_size=10),
    bound=st.floats(1e-6, 1e6),
)
def test_same_round_bounds_stay_between_c0_and_c0_times_one_plus_k(num_cohorts, counts, bound):
    policy = _same_round(num_cohorts, bound)
    state = policy.with_counts(policy.initial_state(3), np.array(counts[: 2 * num_cohorts]), 50.0)
    assert all(
        math.isfinite(b) and bound <= b <= bound * (1 + num_cohorts) * (1 + 1e-12) for b in state.bounds
    )
    assert policy.sensitivity(state) == max(state.bounds)


def test_same_round_policy_keeps_every_invariant():
    """fairclip's own policy checker, which runs each round's counts first for such a policy."""
    check_policy("per-cohort", {"initial_bound": 0.5, "same_round": True}, max_examples=40)


def _sums(contribution, report) -> RoundSums:
    return RoundSums(
        np.asarray(contribution, float), np.asarray(report, float), 3, CohortDiagnostics.zeros(2)
    )


def _demo_server(*settings: str) -> tuple[Run, object]:
    config = load_config(
        "demo",
        None,
        [
            "policy.name=per-cohort",
            "policy.same_round=true",
            "policy.initial_bound=0.3",
            "training.rounds=3",
            "seed=4",
            *settings,
        ],
    )
    task = build_task(config)
    return Run(config, task), task


def test_counts_and_sum_are_drawn_from_one_noise_stream_and_accounted_at_the_counts():
    server, _ = _demo_server()
    rounds = server.rounds
    dim = server.model.shape[0]
    noise = server.plan.noise
    counts = server.release_counts(1, _sums(np.zeros(dim), [2.0, 1.0, 0.0, 0.0]))
    # ε covers the counts from the moment they are released, before the round's contributions
    assert rounds.accountant.rounds == 1 and rounds.rounds_completed == 0
    released = server.rounds.release(1, _sums(np.zeros(dim), np.zeros(4)))
    assert rounds.accountant.rounds == 1 and rounds.rounds_completed == 1
    stream = rng(server.config.seed, Stream.NOISE, 1)
    expected_counts = np.array([2.0, 1.0, 0.0, 0.0]) + stream.normal(size=4) * noise.report
    np.testing.assert_allclose(counts, expected_counts, rtol=1e-12)
    # the sum's noise continues the same stream: never a second copy of the counts' draws
    expected_sum = stream.normal(size=dim) * noise.update * released.sensitivity
    np.testing.assert_allclose(released.estimate * server.config.expected_clients, expected_sum, rtol=1e-9)
    assert released.sensitivity == max(server.policy.with_counts(None, counts, 1.0).bounds)
    np.testing.assert_array_equal(released.noisy_reports, counts)
    assert released.event.effective_noise_multiplier == pytest.approx(
        (noise.update**-2 + noise.report**-2) ** -0.5
    )


def test_a_counts_first_round_cannot_skip_its_counts():
    server, _ = _demo_server()
    dim = server.model.shape[0]
    with pytest.raises(RuntimeError, match="counts were not released"):
        server.rounds.release(1, _sums(np.zeros(dim), np.zeros(4)))
    with pytest.raises(ValueError, match="released_reports"):
        server.policy.server_side(
            server.state,
            np.zeros(dim),
            np.zeros(4),
            expected_clients=10.0,
            num_reports=1,
            noise=NoiseMultipliers(1.0, 10.0),
            rng=np.random.default_rng(0),
        )
    server.release_counts(1, _sums(np.zeros(dim), np.zeros(4)))
    with pytest.raises(RuntimeError, match="released already"):
        server.release_counts(1, _sums(np.zeros(dim), np.zeros(4)))


@pytest.mark.parametrize(
    ("settings", "workers"),
    [((), 1), ((), 2), (("scenario.examples_per_client=1", "federation.num_clients=400"), 1)],
    ids=["materialised", "two-threads", "one-step"],
)
def test_second_exchange_clips_the_same_updates_at_the_rounds_own_bounds(settings, workers):
    server, task = _demo_server(*settings)
    policy = server.policy
    execute = LocalExecutor(task, policy, workers)
    ids = server.sample(1)
    first = server.broadcast()
    counts = execute(server.model, ids, 1, first, Exchange.COUNTS)
    assert not counts.contribution_sum.any(), "the counts exchange releases no contribution"
    assert counts.contribution_sum.shape == server.model.shape
    server.release_counts(1, counts)
    params = server.broadcast()
    assert params["cohort_bounds"] != first["cohort_bounds"], "the counts must move this round's bounds"
    sums = execute(server.model, ids, 1, params, Exchange.UPDATES)
    assert not sums.report_sum.any(), "the updates exchange releases no report"
    updates = task.local_updates(server.model, ids, 1)
    cohorts = task.client_cohorts[ids]
    exact = contribute(policy, params, updates, cohorts, len(task.cohort_names))
    # (the one-step path's Δ_i is −η∇ℓ_i exactly, the materialised one keeps θ_i's float32 rounding)
    scale = np.abs(exact.contribution_sum).max()
    np.testing.assert_allclose(sums.contribution_sum, exact.contribution_sum, rtol=1e-6, atol=1e-6 * scale)
    np.testing.assert_array_equal(
        counts.report_sum, contribute(policy, first, updates, cohorts, 2).report_sum
    )
    if settings:  # one example per client: the one-step path, clipped from per-example norms
        assert getattr(task, "one_step", False)
    row = server.finish_round(1, sums)
    assert row["clip_bound"] == row["sensitivity"] == max(params["cohort_bounds"])


def test_a_same_round_run_clips_every_round_at_its_own_counts():
    """Over a whole run, each row's bounds are the rule applied to the same row's noisy counts."""
    server, task = _demo_server()
    result = simulate(server.config, task)
    policy = server.policy
    for row in result.rows:
        counts = np.array([row[f"noisy_report_{j}"] for j in range(4)])
        bounds = policy.with_counts(None, counts, 1.0).bounds
        assert (row["cohort_bound_0"], row["cohort_bound_1"]) == pytest.approx(bounds, rel=1e-12)
        assert row["sensitivity"] == pytest.approx(max(bounds), rel=1e-12)
        for name, bound in zip(task.cohort_names, bounds, strict=True):
            if row[f"{name}/sampled"]:
                assert row[f"{name}/norm_after"] <= bound * (1 + 1e-12)


def _reply(**arrays) -> RecordDict:
    return RecordDict(
        {UPDATE: ArrayRecord({k: Array(np.asarray(v, dtype=np.float64)) for k, v in arrays.items()})}
    )


def test_each_exchange_accepts_only_its_own_part():
    policy = _same_round(2, bound=1.0)
    params = policy.broadcast(policy.initial_state(3))
    report, contribution = [0.0, 0.0, 1.0, 0.0], [0.3, 0.0, 0.0]
    common = {"policy": policy, "params": params, "dim": 3, "cohort": 1, "num_cohorts": 2}
    counted = check_reply(_reply(**{REPORTS: report}), exchange=Exchange.COUNTS, **common)
    assert counted.report_sum.tolist() == report and not counted.contribution_sum.any()
    updated = check_reply(_reply(**{CONTRIBUTION: contribution}), exchange=Exchange.UPDATES, **common)
    assert updated.contribution_sum.tolist() == contribution and not updated.report_sum.any()
    with pytest.raises(ReplyError, match="expected"):  # a contribution in the counts exchange
        check_reply(
            _reply(**{REPORTS: report, CONTRIBUTION: contribution}), exchange=Exchange.COUNTS, **common
        )
    with pytest.raises(ReplyError, match="expected"):  # a report in the updates exchange
        check_reply(
            _reply(**{REPORTS: report, CONTRIBUTION: contribution}), exchange=Exchange.UPDATES, **common
        )
    with pytest.raises(ReplyError, match="honest"):  # a count bit in another cohort
        check_reply(_reply(**{REPORTS: [1.0, 0, 0, 0]}), exchange=Exchange.COUNTS, **common)


def test_the_flower_dp_wrapper_refuses_a_counts_first_policy():
    from flwr.serverapp.strategy import FedAvg

    from fairclip.server.dp_strategy import DifferentialPrivacy
    from fairclip.strategies.constant import ConstantClipping

    class CountsFirst(ConstantClipping):
        name = "counts-first-constant"  # a name of its own: "constant" is the built-in's
        counts_first = True

    with pytest.raises(ValueError, match="twice a round"):
        DifferentialPrivacy(FedAvg(), CountsFirst(), num_clients=10, sample_rate=0.5, noise_multiplier=1.0)


class _CountingTask:
    """A node's task whose every training is counted (and gives a different update each time,
    so a second training would show)."""

    def __init__(self) -> None:
        self.cohort_names = ["a", "b"]
        self.client_cohorts = np.array([1])
        self.trained = 0

    def local_updates(self, model, client_ids, round_number):
        self.trained += 1
        return np.full((1, model.shape[0]), 0.2 * self.trained)


def test_a_flower_node_clips_the_update_it_counted(monkeypatch, server_task_identity):
    """The ClientApp keeps its update in the node's context.state between the two exchanges and
    clips that one; with the state lost, it trains again."""
    from flwr.app import Context, Message, MessageType, RecordDict

    from fairclip.client.app import HELD_UPDATE, FairclipClient, LocalClient
    from fairclip.client.protocol import train_content

    policy = _same_round(2, bound=0.3)
    task = _CountingTask()
    node = LocalClient(0, 1, 1, 2, task, policy, simulated=False)
    app = FairclipClient(lambda run_config: None)
    monkeypatch.setattr(app, "local_client", lambda context: node)
    context = Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config={})
    model = np.zeros(4)

    def ask(exchange, params):
        message = Message(
            train_content(model, params, 3, exchange), dst_node_id=7, message_type=MessageType.TRAIN
        )
        return app.train(message, context).content[UPDATE]

    first = policy.broadcast(policy.initial_state(4))
    counted = ask(Exchange.COUNTS, first)
    assert set(counted.keys()) == {REPORTS} and task.trained == 1
    assert counted[REPORTS].numpy().tolist() == [0, 0, 1, 0]  # cohort 1, norm 0.4 above C_0 = 0.3
    assert HELD_UPDATE in context.state
    second = policy.broadcast(policy.with_counts(None, np.array([0.0, 5, 3, 1]), 1.0))
    clipped = ask(Exchange.UPDATES, second)["contribution"].numpy()
    assert task.trained == 1, "the second exchange must not train again"
    assert np.linalg.norm(clipped) == pytest.approx(min(0.4, second["cohort_bounds"][1]), rel=1e-6)
    assert HELD_UPDATE not in context.state
    again = ask(Exchange.UPDATES, second)["contribution"].numpy()  # the state is gone: trains
    assert task.trained == 2 and np.linalg.norm(again) == pytest.approx(min(0.8, second["cohort_bounds"][1]))
