"""Any fairclip policy as a Flower strategy (``flwr.serverapp.strategy.Strategy``).

The adapter adds transport only. Sampling, the policy's public parameters, noise with the
sensitivity of the round that clipped, noisy counts, bound updates, the server optimizer, the
accountant and per-cohort evaluation all come from the run's :class:`RoundServer` -- the same
object the local and Ray engines drive (:class:`fairclip.sims.engine.RunServer`). Per round:

1. ``configure_train``: Poisson-sample client ids, send each sampled node θ_t and the public
   policy parameters (for example C_t).
2. ``aggregate_train``: check every reply (:func:`fairclip.server.replies.check_reply`), drop and
   count bad ones, sum the rest in the engines' order, and hand the sums to the server, which
   noises them, steps the model, moves the bound and evaluates.

Flower's own ``DifferentialPrivacy*AdaptiveClipping`` wrappers are deliberately not used: they
weight by number of examples, count clipped updates but apply the rule for unclipped ones, and
noise with the updated bound (DESIGN section 2). Evaluation is centralised on the server's
per-cohort test sets, so no evaluation messages are sent to clients.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from logging import INFO, WARNING
from typing import Any, Protocol

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fairclip.client.contributions import RoundSums
from fairclip.client.protocol import MODEL, train_content
from fairclip.server.replies import ReplyError, check_reply, sum_replies
from fairclip.strategies import Policy


class RoundServer(Protocol):
    """What the adapter needs from a run's server (see :class:`fairclip.sims.engine.RunServer`)."""

    policy: Policy
    model: np.ndarray

    def sample(self, round_number: int) -> np.ndarray: ...

    def broadcast(self) -> dict[str, Any]: ...

    def finish_round(
        self, round_number: int, sums: RoundSums, extra: dict[str, Any] | None = None
    ) -> dict[str, Any]: ...


class PolicyStrategy(Strategy):
    """A fairclip policy run over Flower nodes; ``nodes`` maps client id to node id."""

    def __init__(
        self,
        server: RoundServer,
        nodes: dict[int, int],
        client_cohorts: np.ndarray,
        on_round: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.server = server
        self.nodes = dict(nodes)
        self.clients_of_node = {node: client for client, node in self.nodes.items()}
        self.client_cohorts = np.asarray(client_cohorts, dtype=np.int64)
        self.num_cohorts = server.policy.num_cohorts
        self.on_round = on_round
        self._round: tuple[int, np.ndarray, dict[str, Any]] | None = None

    def summary(self) -> None:
        log(INFO, "fairclip policy %r over %d nodes", self.server.policy.name, len(self.nodes))

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        sampled = self.server.sample(server_round)
        params = self.server.broadcast()
        self._round = (server_round, sampled, params)
        log(INFO, "round %d: %d clients sampled", server_round, len(sampled))
        return [
            Message(
                train_content(self.server.model, params, server_round),
                dst_node_id=self.nodes[int(client)],
                message_type=MessageType.TRAIN,
            )
            for client in sampled
        ]

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        if self._round is None or self._round[0] != server_round:
            raise RuntimeError(f"round {server_round} was not configured")
        _, sampled, params = self._round
        policy = self.server.policy
        dim = self.server.model.shape[0]
        report_size = policy.report_size(dim)
        expected = {int(client) for client in sampled}
        accepted: dict[int, RoundSums] = {}
        dropped = 0
        for reply in replies:
            client = self.clients_of_node.get(reply.metadata.src_node_id)
            try:
                if client not in expected or client in accepted:
                    raise ReplyError("reply from a node that was not sampled, or a second reply")
                if reply.has_error():
                    raise ReplyError(f"client error: {reply.error.reason}")
                cohort = int(self.client_cohorts[client])
                bound = float(policy.contribution_bounds(params, np.array([cohort]))[0])
                accepted[client] = check_reply(
                    reply.content,
                    dim=dim,
                    report_size=report_size,
                    bound=bound,
                    cohort=cohort,
                    num_cohorts=self.num_cohorts,
                )
            except ReplyError as error:
                dropped += 1
                log(WARNING, "round %d: dropped the reply of node %s: %s", server_round, client, error)
        sums = sum_replies(accepted, len(self.client_cohorts), dim, report_size, self.num_cohorts)
        extra = {"accepted_replies": len(accepted), "dropped_replies": dropped}
        row = self.server.finish_round(server_round, sums, extra)
        if self.on_round is not None:
            self.on_round(row)
        metrics = {
            key: float(value)
            for key, value in row.items()
            if isinstance(value, int | float) and math.isfinite(value) and "/" not in key
        }
        return ArrayRecord({MODEL: Array(self.server.model)}), MetricRecord(metrics)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return None
