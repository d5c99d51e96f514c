"""Which connected node is which client: the *identify* exchange at the start of a run.

The server waits for ``federation.num_clients`` nodes and asks each for its identity
(:func:`fairclip.client.protocol.identity_content`): its ``partition-id`` and ``num-partitions``,
and its cohort only where the policy needs it (``per-cohort``, ``reweight``; docs/design.md, section 3).
A node whose answer is anything else -- an error, a missing record, a value that is not an integer
in range, a cohort label the policy does not need, a partition another node claims too -- is
*refused*: one clear log line, and the run goes on without it (its client never replies, like a
client that is never sampled, which costs utility but not privacy).

Which node may hold which partition: what the server can verify is only what it is told, so an
authenticated node (TLS, SuperNode key) is trusted about its partition and its cohort -- but no
node may take a partition from another:

* where the operator registered the nodes (``flwr supernode register`` prints each key's node
  id) and names them in ``node-partitions`` (node id -> partition id), each listed node holds
  its partition and no other node can claim it: a node that claims another's partition, or a
  listed node that claims another partition than its own, is refused alone;
* otherwise (a simulation, or an operator who lists none), the first node whose answer claims a
  partition holds it, and a later claimant is refused alone. Refusing both, as the server did
  before, let any authenticated node evict an honest one by claiming its partition; now it can
  take only a partition nobody claimed before it, and a deployment that must rule that out too
  lists its nodes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.common import log
from flwr.serverapp import Grid

from fairclip.client.protocol import COHORT, IDENTIFY, NUM_PARTITIONS, PARTITION_ID
from fairclip.server.errors import FederationError, IdentityError

NODE_COLUMNS = ["node", "client", "cohort"]
"""Columns of the internal record of the nodes that joined (``cohort`` only where needed)."""


PROBE_SECONDS = 30.0
"""At least this long the first node connected may take to answer whether the federation has
another size (a simulated node starts its ClientApp first), however short the node wait."""


@dataclass
class Federation:
    """The nodes that joined, by client id, and those that were refused."""

    nodes: dict[int, int]
    """client id -> node id."""
    cohorts: np.ndarray | None
    """Each client's cohort index (-1 for a client without a node), only where the policy needs it."""
    refused: dict[int, str] = field(default_factory=dict)
    """node id -> why it was refused."""

    def table(self) -> list[dict[str, Any]]:
        """One row per joined node for the server's internal record."""
        return [
            {
                "node": node,
                "client": client,
                "cohort": None if self.cohorts is None else int(self.cohorts[client]),
            }
            for client, node in sorted(self.nodes.items())
        ]


def read_identity(
    content: Any, num_clients: int, num_cohorts: int, needs_cohort: bool
) -> tuple[int, int | None]:
    """(client id, cohort or ``None``) from an identity answer, or :class:`IdentityError`."""
    try:
        configs = dict(content.config_records)
        others = set(content.array_records) | set(content.metric_records)
    except AttributeError:
        raise IdentityError("the answer is not a record dictionary") from None
    if set(configs) != {IDENTIFY} or others:
        raise IdentityError(
            f"the answer holds records {sorted(set(configs) | others)}, expected [{IDENTIFY!r}]"
        )
    identity = dict(configs[IDENTIFY])
    expected = {PARTITION_ID, NUM_PARTITIONS} | ({COHORT} if needs_cohort else set())
    if COHORT in identity and not needs_cohort:
        raise IdentityError("it sent a cohort label, which this run's policy does not need")
    if set(identity) != expected:
        raise IdentityError(f"its identity holds {sorted(identity)}, expected {sorted(expected)}")
    for key, value in identity.items():
        if type(value) is not int:
            raise IdentityError(f"{key} must be an integer (got {value!r})")
    client, total = identity[PARTITION_ID], identity[NUM_PARTITIONS]
    if total != num_clients:
        raise IdentityError(f"num-partitions={total}, but federation.num_clients={num_clients}")
    if not 0 <= client < num_clients:
        raise IdentityError(f"partition-id={client} outside 0..{num_clients - 1}")
    cohort = identity.get(COHORT)
    if cohort is not None and not 0 <= cohort < num_cohorts:
        raise IdentityError(f"cohort={cohort} outside 0..{num_cohorts - 1}")
    return client, cohort


def check_federation_size(grid: Grid, node_ids: list[int], num_clients: int, timeout: float) -> None:
    """Fail at once, rather than after the whole wait, where the nodes already connected form a
    complete federation of another size: one of them says it is a partition of
    ``num-partitions`` = the number of nodes connected, which differs from ``num_clients`` (a
    local simulation with another ``num-supernodes``). In a deployment, where nodes join one by
    one, a node's answer that disagrees is left to the identify exchange, which refuses it."""
    query = Message(
        RecordDict({IDENTIFY: ConfigRecord({})}), dst_node_id=node_ids[0], message_type=MessageType.QUERY
    )
    for reply in grid.send_and_receive([query], timeout=timeout):
        if reply.has_error():
            continue
        try:
            total = dict(reply.content.config_records[IDENTIFY]).get(NUM_PARTITIONS)
        except (AttributeError, KeyError, TypeError):
            continue
        if type(total) is int and total == len(node_ids) and total != num_clients:
            raise FederationError(
                f"the federation has {total} nodes (num-partitions={total}), but "
                f"federation.num_clients={num_clients}: run as many nodes as clients (a local "
                f'simulation: --federation-config "num-supernodes={num_clients}") or set '
                f"federation.num_clients={total}"
            )


CLIENTAPP_FAILED = "its ClientApp failed"
"""How a refusal whose reason is the node's own error text begins."""


def public_reason(reason: str) -> str:
    """A refusal's reason as the public log gives it: a ClientApp's own error text may describe
    its data (a data file with the wrong number of labels names how many it holds), so the log
    says only that the ClientApp failed; ``server-internal/refused_nodes.csv`` keeps the text."""
    if reason.startswith(CLIENTAPP_FAILED):
        return f"{CLIENTAPP_FAILED} (its message is in server-internal/refused_nodes.csv)"
    return reason


def identify_nodes(
    grid: Grid,
    num_clients: int,
    num_cohorts: int,
    wait_seconds: float,
    needs_cohorts: bool,
    registered: dict[int, int] | None = None,
) -> Federation:
    """Wait for ``num_clients`` nodes, ask each who it is, and refuse those that answer wrongly.
    ``registered`` (node id -> partition id, the run's ``node-partitions``) binds those nodes to
    their partitions (module docstring); without it the first claimant of a partition holds it.

    Raises :class:`FederationError` when not exactly ``num_clients`` nodes connect in
    ``wait_seconds``, or when every node is refused.
    """
    registered = dict(registered or {})
    owners = {partition: node for node, partition in registered.items()}
    deadline = time.monotonic() + wait_seconds
    node_ids = list(grid.get_node_ids())
    probed = False
    while len(node_ids) < num_clients and time.monotonic() < deadline:
        if node_ids and not probed:
            check_federation_size(
                grid, node_ids, num_clients, max(PROBE_SECONDS, deadline - time.monotonic())
            )
            probed = True
        time.sleep(1.0)
        node_ids = list(grid.get_node_ids())
    if len(node_ids) != num_clients:
        raise FederationError(f"{len(node_ids)} nodes connected, but federation.num_clients={num_clients}")
    query = [
        Message(RecordDict({IDENTIFY: ConfigRecord({})}), dst_node_id=node, message_type=MessageType.QUERY)
        for node in node_ids
    ]
    held: dict[int, tuple[int, int | None]] = {}
    """partition id -> (node, cohort) of the node that holds it, in the order the answers came."""
    refused: dict[int, str] = {}
    answered: set[int] = set()
    for reply in grid.send_and_receive(query, timeout=wait_seconds):
        node = int(reply.metadata.src_node_id)
        try:
            if node in answered:
                raise IdentityError("it answered twice")
            answered.add(node)
            if reply.has_error():
                raise IdentityError(f"{CLIENTAPP_FAILED}: {reply.error.reason}")
            client, cohort = read_identity(reply.content, num_clients, num_cohorts, needs_cohorts)
            owner = owners.get(client)
            if node in registered and registered[node] != client:
                raise IdentityError(
                    f"partition-id={client}, but node-partitions gives it partition-id={registered[node]}"
                )
            if owner is not None and owner != node:
                raise IdentityError(f"partition-id={client} belongs to node {owner} (node-partitions)")
            if client in held:
                first = held[client][0]
                raise IdentityError(f"partition-id={client} is held by node {first}, which claimed it first")
            held[client] = (node, cohort)
        except IdentityError as error:
            refused[node] = str(error)
    for node in node_ids:
        if node not in answered:
            refused[node] = f"no answer within {wait_seconds:g} s"
    nodes: dict[int, int] = {}
    cohorts = np.full(num_clients, -1, dtype=np.int64) if needs_cohorts else None
    for client, (node, cohort) in sorted(held.items()):
        if node in refused:  # answered twice: its claim does not count
            continue
        nodes[client] = node
        if cohorts is not None:
            cohorts[client] = cohort
    for node, reason in sorted(refused.items()):
        log(WARNING, "fairclip: refused node %s: %s", node, public_reason(reason))
    if not nodes:
        raise FederationError(f"every node was refused ({len(refused)} of {len(node_ids)}); see the log")
    missing = sorted(set(range(num_clients)) - set(nodes))
    if missing:
        log(WARNING, "fairclip: no node for partition-id(s) %s: those clients never reply", missing)
    log(INFO, "fairclip: %d of %d nodes joined", len(nodes), len(node_ids))
    return Federation(nodes, cohorts, refused)
