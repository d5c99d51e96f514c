"""fairclip's SecAgg+ wired into PolicyStrategy and the ClientApp (issue 69), driven in process.

A fake grid hands each message to the node's ClientApp handler with that node's own context, as
a SuperLink would; nodes can drop out at a given stage. The unmasked sum must equal the plain
path's sum within the quantisation error, the noise must use s(1+ρ), a round beyond the
threshold must release nothing, and the strategy must hold no individual vector or cohort.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Context, Message, RecordDict
from flwr.app.error import Error
from flwr.common.logger import FLOWER_LOGGER

from fairclip.client.app import clients as client_app
from fairclip.client.protocol import MODEL
from fairclip.scenarios.errors import ConfigError
from fairclip.scenarios.flower_config import flower_run
from fairclip.scenarios.tasks import build_task
from fairclip.server.run import Run
from fairclip.server.secure_aggregation import MASKED, SECAGG, UPDATE, SecureAggregation
from fairclip.server.strategy import PolicyStrategy
from fairclip.strategies.secure_sum import DEFAULT_RHO

NUM_CLIENTS = 5


def _run_config(policy: str, secure: bool = True, **extra) -> dict:
    return {
        "scenario": "demo",
        "set": "scenario.cohorts.majority.share=0.6; scenario.cohorts.minority.share=0.4",
        "federation.num_clients": NUM_CLIENTS,
        "federation.sample_rate": 1.0,
        "training.rounds": 2,
        "policy.name": policy,
        "privacy.secure_aggregation": secure,
        "not-private": True,
        **extra,
    }


_RUN_IDS = iter(range(7700, 7800))


class _Grid:
    """Delivers each message to its node's ClientApp handler (train or evaluate, by its type);
    ``drop[node] = kind`` makes that node silent from the stage of that ``kind`` on (``"mask"``:
    it never sends its masked vector). Keeps (for the test, not the server) every masked vector
    and clear vector seen, by (round, node): training's and evaluations' apart."""

    def __init__(
        self,
        run_config: dict,
        nodes: dict[int, int],
        drop: dict[int, str] | None = None,
        superlink_errors: bool = False,
    ):
        self.superlink_errors = superlink_errors
        """Whether a silent node is answered for by the SuperLink: an error from node 1 that
        answers the message sent to it (what Flower does for a node that went offline)."""
        run_id = next(_RUN_IDS)  # the ClientApp caches a run by its id
        self.contexts = {
            node: Context(
                run_id=run_id,
                node_id=node,
                node_config={"partition-id": client, "num-partitions": NUM_CLIENTS},
                state=RecordDict(),
                run_config=run_config,
            )
            for client, node in nodes.items()
        }
        self.drop = dict(drop or {})
        self.silent: set[int] = set()
        self.masked: list[np.ndarray] = []
        self.vectors: dict[tuple[int, int], np.ndarray] = {}
        self.evaluation_vectors: dict[tuple[int, int], np.ndarray] = {}

    def send_and_receive(self, messages, timeout=None):
        replies = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = message.object_id  # as a grid's push does
            node = message.metadata.dst_node_id
            record = message.content.config_records.get(SECAGG)
            kind = None if record is None else record.get("kind")
            if kind is not None and self.drop.get(node) == kind:
                self.silent.add(node)
            if node in self.silent:
                if self.superlink_errors:
                    error = Message(Error(code=2, reason="node unavailable"), reply_to=message)
                    error.metadata.__dict__["_src_node_id"] = 1
                    replies.append(error)
                continue
            context = self.contexts[node]
            evaluate = message.metadata.message_type == "evaluate"
            if kind == "mask":
                round_number = int(record["at_round"])
                if evaluate:
                    vector = client_app._evaluation_vector(context, message.content)
                    self.evaluation_vectors[(round_number, node)] = vector
                else:
                    self.vectors[(round_number, node)] = client_app._vector(context, message.content)
            reply = (client_app.evaluate if evaluate else client_app.train)(message, context)
            if kind == "mask" and not reply.has_error():
                self.masked.append(reply.content.array_records[UPDATE][MASKED].numpy().copy())
            replies.append(reply)
        return replies


def _federation(policy: str, drop=None, superlink_errors: bool = False, secure: bool = True, **extra):
    run_config = _run_config(policy, secure, **extra)
    run = flower_run(run_config)
    task = build_task(run.config, run.data_dir)
    server = Run(run.config, task, seeded=True, not_private=True, simulation=False)
    nodes = {client: 1000 + 7 * client for client in range(NUM_CLIENTS)}
    secagg = SecureAggregation.from_config(run.config, server.policy.num_cohorts, "77") if secure else None
    cohorts = task.client_cohorts if server.policy.needs_cohorts and not secure else None
    strategy = PolicyStrategy(server, nodes, NUM_CLIENTS, cohorts, secure=secagg)
    sums = []
    finish = server.finish_round

    def capture(round_number, round_sums, extra=None):
        sums.append((round_number, round_sums))
        return finish(round_number, round_sums, extra)

    server.finish_round = capture
    grid = _Grid(run_config, nodes, drop, superlink_errors)
    return server, strategy, grid, sums


def _arrays(obj, seen=None):
    """Every numpy array reachable from ``obj`` (attributes, containers, dataclasses)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        yield obj
        return
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from _arrays(key, seen)
            yield from _arrays(value, seen)
    elif isinstance(obj, list | tuple | set | frozenset):
        for value in obj:
            yield from _arrays(value, seen)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from _arrays(getattr(obj, f.name), seen)
    elif (
        hasattr(obj, "__dict__") and not isinstance(obj, type) and type(obj).__module__.startswith("fairclip")
    ):
        yield from _arrays(vars(obj), seen)


@pytest.mark.parametrize("policy", ["bounded", "per-cohort", "reweight", "online", "constant"])
def test_the_secure_sum_is_the_plain_sum_within_rounding_and_the_server_keeps_no_individual_value(
    server_task_identity, policy
):
    server, strategy, grid, sums = _federation(policy)
    strategy.start(grid, ArrayRecord({MODEL: Array(server.model)}), num_rounds=2, timeout=10)
    assert [t for t, _ in sums] == [1, 2] and len(server.rows) == 2
    rho = DEFAULT_RHO
    for round_number, round_sums in sums:
        vectors = [v for (t, _), v in grid.vectors.items() if t == round_number]
        assert len(vectors) == NUM_CLIENTS and round_sums.num_reports == NUM_CLIENTS
        plain = np.sum(vectors, axis=0)
        dim = round_sums.contribution_sum.shape[0]
        sensitivity = server.rows[round_number - 1]["sensitivity"] / (1 + rho)
        error = np.linalg.norm(round_sums.contribution_sum - plain[:dim])
        assert error <= NUM_CLIENTS * rho * sensitivity
        if policy == "online":  # unit directions: quantised like a float segment of bound 1
            assert np.linalg.norm(round_sums.report_sum - plain[dim:]) <= NUM_CLIENTS * rho
        else:  # bits and one-hot counts: exact
            np.testing.assert_array_equal(round_sums.report_sum, plain[dim:])
        if policy in ("per-cohort", "reweight"):  # a cohort enters only as its count's position
            assert plain[dim:].sum() == NUM_CLIENTS
    # the noise is widened to the quantised sensitivity; the accountant's multiplier unchanged
    row = server.rows[0]
    event = server.rounds.last_event
    assert row["noise_std"] == pytest.approx(event.noise_multiplier * row["sensitivity"], rel=1e-12)
    assert event.noise_multiplier == server.plan.noise.update
    assert server.summary["privacy"]["secure_aggregation"]["noise_widening"] == 1 + rho
    # the server's state holds no individual vector, masked or clear, and no cohort
    individual = [*grid.masked, *grid.vectors.values()]
    held = list(_arrays(strategy))
    for array in held:
        for vector in individual:
            assert not (array.shape == vector.shape and np.array_equal(array, vector))
    assert strategy.client_cohorts is None
    assert strategy.secure._pending is None
    assert not any(k.startswith(SECAGG) for c in grid.contexts.values() for k in c.state)


# per-cohort sums a one-hot cohort count beside the update: a dropout must leave both consistent
@pytest.mark.parametrize("policy", ["bounded", "per-cohort"])
def test_one_dropout_after_masking_within_the_threshold_completes_the_round(server_task_identity, policy):
    dropped = 1000 + 7 * 2
    server, strategy, grid, sums = _federation(policy, drop={dropped: "unmask"})
    strategy.start(grid, ArrayRecord({MODEL: Array(server.model)}), num_rounds=2, timeout=10)
    # its masked vector arrived before it dropped: it is in the sum, its self mask rebuilt
    assert [s.num_reports for _, s in sums] == [NUM_CLIENTS, NUM_CLIENTS - 1]
    round_one = np.sum([v for (t, _), v in grid.vectors.items() if t == 1], axis=0)
    dim = sums[0][1].contribution_sum.shape[0]
    bound = server.rows[0]["sensitivity"] / (1 + DEFAULT_RHO)
    error = np.linalg.norm(sums[0][1].contribution_sum - round_one[:dim])
    assert error <= NUM_CLIENTS * DEFAULT_RHO * bound
    np.testing.assert_array_equal(sums[0][1].report_sum, round_one[dim:])
    assert len(server.rows) == 2


@pytest.mark.parametrize("policy", ["bounded", "per-cohort"])
def test_a_dropout_before_the_masked_vector_leaves_it_out_of_the_sum(server_task_identity, policy):
    dropped = 1000 + 7 * 4
    server, strategy, grid, sums = _federation(policy, drop={dropped: "mask"}, superlink_errors=True)
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    FLOWER_LOGGER.addHandler(handler)
    try:
        strategy.start(grid, ArrayRecord({MODEL: Array(server.model)}), num_rounds=1, timeout=10)
    finally:
        FLOWER_LOGGER.removeHandler(handler)
    # Flower's loop ran, but its wall time (which the dropout lengthens) is not logged
    lines = [record.getMessage() for record in records]
    assert any("Final results" in line for line in lines)
    assert not any("finished in" in line for line in lines)
    ((_, round_sums),) = sums
    survivors = np.sum([v for (t, node), v in grid.vectors.items() if t == 1 and node != dropped], axis=0)
    dim = round_sums.contribution_sum.shape[0]
    assert round_sums.num_reports == NUM_CLIENTS - 1
    bound = server.rows[0]["sensitivity"] / (1 + DEFAULT_RHO)
    error = np.linalg.norm(round_sums.contribution_sum - survivors[:dim])
    assert error <= (NUM_CLIENTS - 1) * DEFAULT_RHO * bound
    # the counts are exact: the dead node's cohort bit (per-cohort: its one-hot count) is not in them
    np.testing.assert_array_equal(round_sums.report_sum, survivors[dim:])
    if policy == "per-cohort":
        assert survivors[dim:].sum() == NUM_CLIENTS - 1
    # the SuperLink's error for the offline node is matched to that node, not taken as a stranger's
    assert any(
        e["event"] == "dropped" and e["node"] == dropped and "node unavailable" in e["reason"]
        for e in strategy.events
    )
    assert not any(e["event"] == "unexpected" for e in strategy.events)


def test_dropouts_beyond_the_threshold_skip_the_round_and_release_nothing(server_task_identity):
    drop = {1000 + 7 * c: "mask" for c in (0, 1, 2, 3)}  # one survivor: under t
    server, strategy, grid, sums = _federation("bounded", drop=drop)
    accounted = server.rounds.accountant.rounds
    before = server.model.copy()
    strategy.start(grid, ArrayRecord({MODEL: Array(server.model)}), num_rounds=1, timeout=10)
    assert sums == [] and server.rows == [] and server.rounds.accountant.rounds == accounted
    np.testing.assert_array_equal(server.model, before)
    assert any(e["event"] == "skipped" for e in strategy.events)


def test_a_node_never_tells_its_cohort_under_secure_aggregation(server_task_identity):
    from flwr.app import ConfigRecord

    from fairclip.client.protocol import COHORT, IDENTIFY

    context = _Grid(_run_config("per-cohort"), {1: 1000}).contexts[1000]
    query = Message(RecordDict({IDENTIFY: ConfigRecord({})}), dst_node_id=1000, message_type="query")
    identity = dict(client_app.identify(query, context).content.config_records[IDENTIFY])
    assert COHORT not in identity and identity["partition-id"] == 1


def test_a_plain_train_message_is_refused_under_secure_aggregation(server_task_identity):
    from fairclip.client.protocol import train_content

    context = _Grid(_run_config("bounded"), {0: 1000}).contexts[1000]
    message = Message(train_content(np.zeros(3), {"bound": 1.0}, 1), dst_node_id=1000, message_type="train")
    with pytest.raises(ValueError, match="secure aggregation"):
        client_app.train(message, context)


def test_the_noise_uses_the_quantised_sensitivity():
    from fairclip.strategies import NoiseMultipliers, build_policy

    policy = build_policy("bounded", {"lower_bound": 0.1, "initial_bound": 2.0}, num_cohorts=1)
    state = policy.initial_state(4)
    noise = NoiseMultipliers(1.5, 10.0)
    rng = np.random.default_rng(0)
    plain = policy.server_side(
        state, np.zeros(4), np.zeros(1), expected_clients=3.0, num_reports=3, noise=noise, rng=rng
    )
    secure = policy.server_side(
        state, np.zeros(4), np.zeros(1), expected_clients=3.0, num_reports=3, noise=noise, rng=rng,
        rounding_slack=DEFAULT_RHO,
    )  # fmt: skip
    s_t = policy.sensitivity(state)
    assert secure.noise_std == secure.event.noise_multiplier * s_t * (1 + DEFAULT_RHO)
    assert secure.sensitivity == s_t * (1 + DEFAULT_RHO) and plain.sensitivity == s_t
    assert secure.event == plain.event  # the accountant's multipliers unchanged


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"policy.name": "none"}, "policy none"),
        ({"simulation-diagnostics": True}, "simulation-diagnostics"),
        ({"policy.name": "per-cohort", "policy.same_round": True}, "same_round"),
        ({"privacy.secagg_neighbours": 3}, "even number"),
        ({"privacy.secagg_threshold": 1}, "secagg_threshold"),
        ({"privacy.secagg_threshold": 5}, "needs at least 6 clients"),
        ({"privacy.secagg_neighbours": 2, "privacy.secagg_threshold": 3}, "exceeds"),
        ({"privacy.secagg_rounding_slack": 0.0}, "secagg_rounding_slack"),
        ({"privacy.secagg_stage_timeout": 0}, "secagg_stage_timeout"),
    ],
)
def test_secure_aggregation_settings_are_refused_in_one_line(extra, message):
    with pytest.raises(ConfigError, match=message) as error:
        flower_run(_run_config("bounded", **extra))
    assert "\n" not in str(error.value)


def test_a_simulation_refuses_secure_aggregation():
    """The executors sum in clear: a simulation must not claim secure aggregation."""
    run = flower_run(_run_config("bounded"))
    with pytest.raises(ConfigError, match="Flower apps only"):
        Run(run.config, build_task(run.config, run.data_dir))


EVALUATING = {"evaluation.clients": True, "evaluation.server": False}


def _capture_evaluations(server):
    """Wrap ``server.finish_evaluation``: (round, the model evaluated, the sum, its slack) of each."""
    seen = []
    finish = server.finish_evaluation

    def capture(round_number, total, sampled, rounding_slack=0.0):
        seen.append((round_number, server.model.copy(), np.array(total, copy=True), rounding_slack))
        return finish(round_number, total, sampled, rounding_slack)

    server.finish_evaluation = capture
    return seen


def _each_node_evaluates(task, model, clients, max_examples, loss_bound):
    """The sum of the nodes' evaluation vectors, each formed as its node forms it, from its own
    examples alone (one forward pass over several clients' examples may round float32 logits
    otherwise: a CPU's kernels can depend on the batch's size)."""
    rows = [
        task.evaluation_contributions(model, np.array([int(c)]), max_examples, loss_bound) for c in clients
    ]
    return np.concatenate(rows).sum(axis=0)


@pytest.mark.parametrize(("secure", "policy"), [(False, "bounded"), (True, "bounded"), (True, "per-cohort")])
def test_nodes_evaluate_the_released_model_and_the_server_releases_only_the_noisy_sum(
    server_task_identity, secure, policy
):
    """Issue 69 §2 on the Flower path: after each round, a fresh sample of nodes evaluates the
    released model on its held-out examples; the server sums their vectors (in clear, checked;
    or securely, never seeing one), noises the sum with σ_E·Δ_E (·(1+ρ) for a secure sum),
    accounts it, and publishes each round's row with the noisy per-cohort metrics once they are in."""
    from fairclip.strategies import evaluation as mechanism

    server, strategy, grid, _sums = _federation(policy, secure=secure, **EVALUATING)
    published = []
    strategy.on_round = published.append
    evaluations = _capture_evaluations(server)
    strategy.start(grid, ArrayRecord({MODEL: Array(server.model)}), num_rounds=2, timeout=10)
    evaluation = server.config.evaluation
    m, loss_bound = evaluation.max_examples, evaluation.loss_bound
    assert [t for t, *_ in evaluations] == [1, 2]
    assert server.summary["privacy"]["evaluation_releases"] == 2
    for round_number, model, total, slack in evaluations:
        sample = server.evaluation_sample(round_number)
        exact = _each_node_evaluates(server.task, model, sample, m, loss_bound)
        if secure:  # quantised: within the rounding of each of the n vectors
            assert slack == DEFAULT_RHO
            bound = mechanism.sensitivity(m, loss_bound)
            assert np.linalg.norm(total - exact) <= len(sample) * DEFAULT_RHO * bound
        else:
            assert slack == 0.0
            np.testing.assert_allclose(total, exact, rtol=1e-12, atol=1e-9)
        assert exact[1::3].sum() > 0  # the nodes held examples out and evaluated them
    # each round's row went out once, with its noisy evaluation in it
    assert [row["round"] for row in published] == [1, 2]
    expected_std = evaluation.noise_multiplier * mechanism.sensitivity(m, loss_bound) * (1 + slack)
    for row in published:
        assert row["client_eval_noise_std"] == pytest.approx(expected_std, rel=1e-12)
        assert {"majority/client_accuracy", "minority/client_loss", "client_accuracy_gap"} <= set(row)
        assert {"majority/client_accuracy", "client_accuracy_gap"} <= server.public_columns
        assert not any(key.endswith("_exact") for key in row)  # a deployment has no exact values
    assert set(server.summary["cohorts"]) == {"majority", "minority"}  # the noisy ones: no test set
    if secure:  # the server holds no node's evaluation vector, nor its cohort
        individual = list(grid.evaluation_vectors.values())
        assert len(individual) == 2 * NUM_CLIENTS
        for array in _arrays(strategy):
            assert not any(array.shape == v.shape and np.array_equal(array, v) for v in individual)
        assert strategy.client_cohorts is None and strategy.secure._pending is None


def test_an_evaluation_reply_outside_the_honest_form_is_dropped_and_recorded(server_task_identity):
    """A node whose evaluation vector fills two cohorts' slots (norm possibly above Δ_E) is left
    out of the sum, and the server's internal record says why."""
    from fairclip.client.protocol import evaluation_reply_content

    server, strategy, grid, _sums = _federation("bounded", secure=False, **EVALUATING)
    evaluations = _capture_evaluations(server)
    liar = 1000 + 7 * 3
    deliver = grid.send_and_receive

    def tampering(messages, timeout=None):
        replies = deliver(messages, timeout)
        for reply in replies:
            if reply.metadata.message_type == "evaluate" and reply.metadata.src_node_id == liar:
                reply.content = evaluation_reply_content(np.array([10.0, 10.0, 0.0, 10.0, 10.0, 0.0]))
        return replies

    grid.send_and_receive = tampering
    strategy.start(grid, ArrayRecord({MODEL: Array(server.model)}), num_rounds=1, timeout=10)
    ((round_number, model, total, _slack),) = evaluations
    evaluation = server.config.evaluation
    honest = [int(c) for c in server.evaluation_sample(round_number) if 1000 + 7 * int(c) != liar]
    exact = _each_node_evaluates(server.task, model, honest, evaluation.max_examples, evaluation.loss_bound)
    np.testing.assert_allclose(total, exact, rtol=1e-12, atol=1e-9)
    dropped = [e for e in strategy.events if e["event"] == "dropped"]
    assert len(dropped) == 1 and dropped[0]["node"] == liar
    assert dropped[0]["reason"] == "evaluation: evaluation vector fills 2 cohorts' slots, at most one allowed"


def test_a_node_of_a_run_without_client_evaluation_refuses_to_evaluate(server_task_identity):
    from fairclip.client.protocol import evaluate_content

    context = _Grid(_run_config("bounded", secure=False), {0: 1000}).contexts[1000]
    message = Message(evaluate_content(np.zeros(22), 1), dst_node_id=1000, message_type="evaluate")
    with pytest.raises(ValueError, match="does not have its clients evaluate"):
        client_app.evaluate(message, context)
