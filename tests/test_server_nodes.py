"""The identify exchange: which node is which client, and which nodes the server refuses.

Issue 17, points 2, 6 and 7: the server learns a node's cohort only for the policies that need
it; an identity answer that is malformed refuses that node with one log line instead of ending
the run with a KeyError or ValueError; a partition claimed twice is refused.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from flwr.app import ConfigRecord, Error, Message, RecordDict

from fairclip.client.protocol import IDENTIFY, identity_content
from fairclip.server.nodes import FederationError, identify_nodes


class FakeGrid:
    """A grid whose nodes answer the identify query with what ``answers`` gives per node."""

    def __init__(self, answers: dict[int, object]) -> None:
        self.answers = answers

    def get_node_ids(self):
        return list(self.answers)

    def send_and_receive(self, messages, timeout=None):
        replies = []
        for message in messages:
            answer = self.answers[message.metadata.dst_node_id]
            for content in answer if isinstance(answer, list) else [answer]:
                if content is None:
                    continue
                replies.append(Message(content, reply_to=message))
        return replies


def _identity(partition: int, cohort: int | None = None, total: int = 4) -> RecordDict:
    return identity_content(partition, total, cohort)


def _raw_identity(values: dict) -> RecordDict:
    return RecordDict({IDENTIFY: ConfigRecord(values)})


def test_honest_nodes_join_without_telling_their_cohort(server_task_identity):
    grid = FakeGrid({10 + i: _identity(i) for i in range(4)})
    federation = identify_nodes(grid, 4, 2, 1.0, needs_cohorts=False)
    assert federation.nodes == {i: 10 + i for i in range(4)}
    assert federation.cohorts is None and federation.refused == {}
    assert all(row["cohort"] is None for row in federation.table())


def test_policies_that_need_cohorts_learn_them(server_task_identity):
    grid = FakeGrid({10 + i: _identity(i, cohort=i % 2) for i in range(4)})
    federation = identify_nodes(grid, 4, 2, 1.0, needs_cohorts=True)
    np.testing.assert_array_equal(federation.cohorts, [0, 1, 0, 1])


def test_bad_identities_refuse_their_node_and_the_run_goes_on(server_task_identity, caplog):
    answers = {
        10: _identity(0, total=7),
        11: RecordDict(),  # no identity record: a KeyError before
        12: _raw_identity({"partition-id": "abc", "num-partitions": 7}),  # a ValueError before
        13: _raw_identity({"partition-id": 1.0, "num-partitions": 7}),  # int(1.0) == 1 before
        14: _identity(2, cohort=1, total=7),  # a cohort label that `bounded` does not need
        15: Error(code=0, reason="ClientApp raised"),
        16: None,  # never answers
    }
    grid = FakeGrid(answers)
    with caplog.at_level(logging.WARNING):
        federation = identify_nodes(grid, 7, 2, 0.5, needs_cohorts=False)
    assert federation.nodes == {0: 10}
    assert set(federation.refused) == {11, 12, 13, 14, 15, 16}
    assert "cohort label" in federation.refused[14] and "integer" in federation.refused[12]
    assert "ClientApp raised" in federation.refused[15] and "no answer" in federation.refused[16]
    refused_lines = [r.getMessage() for r in caplog.records if "refused node" in r.getMessage()]
    assert len(refused_lines) == 6, refused_lines
    # a ClientApp's own error text may describe its data: only the internal record keeps it
    assert not any("ClientApp raised" in line for line in refused_lines), refused_lines
    assert any("node 15: its ClientApp failed (its message is in server-internal" in x for x in refused_lines)


def test_a_partition_claimed_twice_stays_with_its_first_claimant(server_task_identity):
    """Issue 68: refusing both claimants let any authenticated node evict an honest one by
    claiming its partition (with three nodes the honest one was evicted); the first claimant
    keeps it and only the later one is refused."""
    grid = FakeGrid({10: _identity(0), 11: _identity(1), 12: _identity(1), 13: _identity(3)})
    federation = identify_nodes(grid, 4, 2, 1.0, needs_cohorts=False)
    assert federation.nodes == {0: 10, 1: 11, 3: 13}
    assert set(federation.refused) == {12}
    assert "partition-id=1 is held by node 11, which claimed it first" in federation.refused[12]


def test_a_registered_partition_cannot_be_taken_whoever_answers_first(server_task_identity):
    """With node-partitions, a hostile node that answers first still cannot take a registered
    node's partition, and a registered node claiming another partition is refused alone."""
    grid = FakeGrid({12: _identity(1), 11: _identity(1), 10: _identity(0), 13: _identity(2)})
    federation = identify_nodes(grid, 4, 2, 1.0, needs_cohorts=False, registered={11: 1, 13: 3})
    assert federation.nodes == {0: 10, 1: 11}
    assert "partition-id=1 belongs to node 11 (node-partitions)" in federation.refused[12]
    assert "node-partitions gives it partition-id=3" in federation.refused[13]


def test_node_partitions_are_read_strictly():
    from fairclip.scenarios.errors import ConfigError
    from fairclip.scenarios.flower_config import parse_node_partitions

    assert parse_node_partitions("") == {}
    assert parse_node_partitions("123:0, 456:1") == {123: 0, 456: 1}
    for bad in ("123", "a:1", "1:2,1:3", "1:2,3:2", "1:-1"):
        with pytest.raises(ConfigError, match="node-partitions"):
            parse_node_partitions(bad)


def test_a_node_that_answers_twice_is_refused(server_task_identity):
    grid = FakeGrid({10: _identity(0, total=2), 11: [_identity(1, total=2), _identity(1, total=2)]})
    federation = identify_nodes(grid, 2, 2, 1.0, needs_cohorts=False)
    assert federation.nodes == {0: 10} and "twice" in federation.refused[11]


def test_per_cohort_refuses_a_node_without_a_cohort_or_with_one_out_of_range(server_task_identity):
    grid = FakeGrid({10: _identity(0, cohort=1, total=3), 11: _identity(1, total=3), 12: _identity(2, 5, 3)})
    federation = identify_nodes(grid, 3, 2, 1.0, needs_cohorts=True)
    assert federation.nodes == {0: 10} and set(federation.refused) == {11, 12}


def test_every_node_refused_or_the_wrong_number_connected_is_an_error(server_task_identity):
    with pytest.raises(FederationError, match="every node was refused"):
        identify_nodes(FakeGrid({10: RecordDict(), 11: RecordDict()}), 2, 1, 1.0, needs_cohorts=False)
    with pytest.raises(FederationError, match=r"1 nodes connected, but federation\.num_clients=2"):
        identify_nodes(FakeGrid({10: _identity(0, total=2)}), 2, 1, 0.1, needs_cohorts=False)


def test_a_complete_federation_of_another_size_is_refused_at_once(server_task_identity):
    """Issue 18, point 13: Flower's default local simulation (2 nodes, each a partition of 2)
    against a scenario of 1000 clients fails as soon as a node answers, not after the wait."""
    import time

    grid = FakeGrid({10: _identity(0, total=2), 11: _identity(1, total=2)})
    started = time.monotonic()
    with pytest.raises(FederationError, match=r"the federation has 2 nodes .*num-supernodes=1000"):
        identify_nodes(grid, 1000, 2, 300.0, needs_cohorts=False)
    assert time.monotonic() - started < 5


def test_a_node_of_a_deployment_still_joining_does_not_end_the_wait(server_task_identity):
    """One node of three connected, saying it is a partition of 3: the server keeps waiting
    (here until its short wait ends) instead of judging the federation by the first node."""
    grid = FakeGrid({10: _identity(0, total=3)})
    with pytest.raises(FederationError, match=r"1 nodes connected, but federation\.num_clients=3"):
        identify_nodes(grid, 3, 2, 1.5, needs_cohorts=False)
