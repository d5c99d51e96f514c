"""Any fairclip policy as a Flower strategy (``flwr.serverapp.strategy.Strategy``).

The adapter adds transport only. Sampling, the policy's public parameters, noise with the
sensitivity of the round that clipped, noisy counts, bound updates, the server optimizer, the
accountant and per-cohort evaluation all come from the run's :class:`Rounds` -- the same
object the local and Ray executors drive (:class:`fairclip.server.run.Run`). Per round:

1. ``configure_train``: Poisson-sample client ids, send each sampled node θ_t and the public
   policy parameters (for example C_t).
   A policy that releases its counts first (``per-cohort`` with ``same_round``) first asks the
   same clients for their counts alone, through the grid (one more exchange, checked and
   recorded the same way), releases them, and only then sends the round's own bounds.
2. ``aggregate_train``: check every reply (:func:`fairclip.server.replies.check_reply`), drop and
   count bad ones -- any failure to read or check a reply, a node that replies twice (dropped
   once, counted once), a node that was not sampled -- sum the rest in the executors' order, and
   hand the sums to the server, which noises them, steps the model, moves the bound and evaluates.

What leaves the strategy is public: the MetricRecord returned to Flower (which Flower logs and
keeps in its history) holds only the round's public values (bound, noise, ε, policy state,
evaluation of the released model). Exact counts -- sampled, accepted, dropped, missing replies --
and the reasons for each dropped reply go to the server's internal record only
(:attr:`PolicyStrategy.events`, ``server-internal/`` of the run's outputs), never to the log:
Flower forwards a ServerApp's log, DEBUG lines included, to ``flwr log``.

Flower's own ``DifferentialPrivacy*AdaptiveClipping`` wrappers are deliberately not used: they
weight by number of examples, count clipped updates but apply the rule for unclipped ones, and
noise with the updated bound (docs/design.md, section 2).

Evaluation runs on the server's per-cohort test sets (``[evaluation] server``) and, with
``[evaluation] clients``, on the nodes' own held-out examples: after each round that released a
model, ``configure_evaluate`` sends it to a fresh Poisson sample of clients (the run's
:meth:`Run.evaluation_sample`), and ``aggregate_evaluate`` checks each reply's evaluation vector
(:func:`fairclip.server.replies.check_evaluation_reply`), sums the rest in the executors' blocks
and hands the sum to :meth:`Run.finish_evaluation`, which noises it and steps the same
accountant. Under secure aggregation the vectors are summed with a second secure sum of the
round (exchange 1), and the server never sees one. A round's row is published once its
evaluation is in.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from logging import INFO
from typing import Any, Protocol

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fairclip.client.protocol import MODEL, evaluate_content, train_content
from fairclip.server.flower_log import WallTimeHidden
from fairclip.server.replies import Collected, check_evaluation_reply, check_reply, collect_replies
from fairclip.server.secure_aggregation import (
    SecureAggregation,
    secure_evaluation_messages,
    secure_train_messages,
)
from fairclip.strategies import Policy
from fairclip.strategies import evaluation as client_evaluation
from fairclip.strategies.aggregation import Exchange, RoundSums, shard_ids, sum_replies
from fairclip.strategies.registry import display_name

REPLY_TIMEOUT_SECONDS = 600.0
"""How long a round waits for replies; a client that has not answered by then is left out."""

EVENT_COLUMNS = ["round", "node", "client", "event", "reason"]
"""Columns of the internal record of dropped and unexpected replies."""


class RunDriver(Protocol):
    """What the adapter needs from a run's server (see :class:`fairclip.server.run.Run`)."""

    policy: Policy
    model: np.ndarray
    public_columns: set[str]
    """The columns of a round's row that may be published."""

    state: Any
    """The policy state that clips the coming round."""

    def sample(self, round_number: int) -> np.ndarray: ...

    def broadcast(self) -> dict[str, Any]: ...

    def release_counts(self, round_number: int, sums: RoundSums) -> np.ndarray: ...

    def finish_round(
        self, round_number: int, sums: RoundSums, extra: dict[str, Any] | None = None
    ) -> dict[str, Any]: ...


class EvaluatingRunDriver(RunDriver, Protocol):
    """A run's server whose clients evaluate the released model (``[evaluation] clients``)."""

    config: Any
    task: Any
    rows: list[dict[str, Any]]

    def evaluates_clients(self, round_number: int) -> bool: ...

    def evaluation_sample(self, round_number: int) -> np.ndarray: ...

    def finish_evaluation(
        self, round_number: int, total: np.ndarray, sampled: int, rounding_slack: float = 0.0
    ) -> dict[str, Any]: ...


@dataclass(frozen=True)
class _Round:
    number: int
    sampled: np.ndarray
    params: dict[str, Any]
    started: float
    exchange: Exchange = Exchange.ROUND
    counts: dict[str, Any] | None = None
    """Reply counts of a counts-first round's first exchange (server-internal)."""


@dataclass(frozen=True)
class _Evaluation:
    """The clients' evaluation after a round, between its configure and aggregate."""

    number: int
    sampled: np.ndarray
    row: dict[str, Any]
    """The round's row, published once the evaluation is in."""


@dataclass
class _Collected:
    """The checked replies of one exchange: accepted sums by client, and how many were dropped
    or unexpected."""

    accepted: dict[int, RoundSums]
    dropped: int
    unexpected: int


class PolicyStrategy(WallTimeHidden, Strategy):
    """A fairclip policy run over Flower nodes.

    ``nodes`` maps client id to node id (a client without a node never replies) for the
    ``num_clients`` clients of the federation; ``client_cohorts`` holds each client's cohort
    where the policy needs it, else ``None``; ``diagnostics_allowed`` accepts the
    simulation-only diagnostics record (a run that enables ``simulation-diagnostics``), which is
    otherwise a reason to drop a reply.
    """

    def __init__(
        self,
        server: RunDriver,
        nodes: dict[int, int],
        num_clients: int,
        client_cohorts: np.ndarray | None = None,
        on_round: Callable[[dict[str, Any]], None] | None = None,
        *,
        diagnostics_allowed: bool = False,
        reply_timeout: float = REPLY_TIMEOUT_SECONDS,
        secure: SecureAggregation | None = None,
    ) -> None:
        self.server = server
        self.secure = secure
        """fairclip's SecAgg+ (:mod:`fairclip.server.secure_aggregation`), or ``None``: clear replies."""
        self.reply_timeout = float(reply_timeout)
        """How long the first exchange of a counts-first round waits for replies (the second
        waits as long as ``start``'s ``timeout`` says)."""
        self.nodes = dict(nodes)
        self.clients_of_node = {node: client for client, node in self.nodes.items()}
        self.client_cohorts = None if client_cohorts is None else np.asarray(client_cohorts, dtype=np.int64)
        if server.policy.needs_cohorts and self.client_cohorts is None and secure is None:
            raise ValueError(f"policy {server.policy.name!r} needs each client's cohort")
        self.num_cohorts = server.policy.num_cohorts
        self.on_round = on_round
        self.diagnostics_allowed = diagnostics_allowed
        self.num_clients = int(num_clients)
        self.events: list[dict[str, Any]] = []
        """Internal record: one row per dropped or unexpected reply (:data:`EVENT_COLUMNS`)."""
        self._round: _Round | None = None
        self._evaluation: _Evaluation | None = None
        if secure is not None:
            secure.record = lambda t, node, event, reason: self._record(  # "": a round's event
                t, "" if node is None else node, self.clients_of_node.get(node, ""), event, reason
            )

    def summary(self) -> None:
        policy = display_name(type(self.server.policy))
        log(INFO, "fairclip policy %r over %d nodes", policy, len(self.nodes))

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        started = time.monotonic()
        sampled = self.server.sample(server_round)
        if self.secure is not None:  # stages 0-1 here; stage 2 is the round's train messages
            params = self.server.broadcast()
            self._round = _Round(server_round, sampled, params, started)
            return secure_train_messages(self, grid, server_round, sampled, params)
        exchange, counts = Exchange.ROUND, None
        if self.server.policy.counts_first:  # first exchange: the same clients' counts alone
            first = self.server.broadcast()
            replies = grid.send_and_receive(
                self._messages(sampled, first, server_round, Exchange.COUNTS), timeout=self.reply_timeout
            )
            collected = self._collect(replies, server_round, sampled, first, Exchange.COUNTS)
            self.server.release_counts(server_round, self._sum(collected))
            exchange, counts = Exchange.UPDATES, self._reply_counts(collected, sampled, "count_")
        params = self.server.broadcast()
        self._round = _Round(server_round, sampled, params, started, exchange, counts)
        return self._messages(sampled, params, server_round, exchange)

    def _messages(
        self, sampled: np.ndarray, params: dict[str, Any], server_round: int, exchange: Exchange
    ) -> list[Message]:
        """θ_t and ``params`` to every sampled client that has a node."""
        reachable = [int(client) for client in sampled if int(client) in self.nodes]
        return [
            Message(
                train_content(self.server.model, params, server_round, exchange),
                dst_node_id=self.nodes[client],
                message_type=MessageType.TRAIN,
            )
            for client in reachable
        ]

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        if self._round is None or self._round.number != server_round:
            raise RuntimeError(f"round {server_round} was not configured")
        plan = self._round
        if self.secure is not None:
            sums = self.secure.aggregate(server_round, replies)
            if sums is None:  # skipped: nothing released, nothing accounted (secure_aggregation)
                return None, None
            row = self.server.finish_round(
                server_round, sums, {"reply_wait_seconds": time.monotonic() - plan.started}
            )
            self._round_released(server_round, row)
            return ArrayRecord({MODEL: Array(self.server.model)}), MetricRecord(self.public_metrics(row))
        collected = self._collect(replies, server_round, plan.sampled, plan.params, plan.exchange)
        extra = {
            **self._reply_counts(collected, plan.sampled),
            **(plan.counts or {}),
            "reply_wait_seconds": time.monotonic() - plan.started,
        }
        row = self.server.finish_round(server_round, self._sum(collected), extra)
        self._round_released(server_round, row)
        return ArrayRecord({MODEL: Array(self.server.model)}), MetricRecord(self.public_metrics(row))

    def _round_released(self, server_round: int, row: dict[str, Any]) -> None:
        """Publish the round's row now, or once the clients' evaluation that follows it is in."""
        evaluates = getattr(self.server, "evaluates_clients", None)
        if evaluates is not None and evaluates(server_round):
            self._evaluation = _Evaluation(server_round, np.empty(0, dtype=np.int64), row)
        elif self.on_round is not None:
            self.on_round(row)

    def _collect(
        self,
        replies: Iterable[Message],
        server_round: int,
        sampled: np.ndarray,
        params: dict[str, Any],
        exchange: Exchange,
    ) -> _Collected:
        """Check the replies of one exchange: drop and record bad ones, keep the rest."""
        dim = self.server.model.shape[0]
        collected = collect_replies(
            replies,
            self.clients_of_node,
            {int(client) for client in sampled},
            lambda content, client: self._check(content, client, params, dim, exchange),
        )
        prefix = "counts: " if exchange is Exchange.COUNTS else ""
        self._record_rejected(server_round, collected, prefix, "reply from a node that was not sampled")
        return _Collected(collected.accepted, len(collected.dropped), len(collected.unexpected))

    def _record_rejected(self, server_round: int, collected: Collected, prefix: str, unexpected: str) -> None:
        """Record an exchange's replies from nodes not sampled (``unexpected``) and its dropped
        replies (their reasons after ``prefix``) in the server-internal events."""
        for node in collected.unexpected:
            self._record(server_round, node, self.clients_of_node.get(node), "unexpected", unexpected)
        for client, reason in collected.dropped:
            self._record(server_round, self.nodes[client], client, "dropped", f"{prefix}{reason}")

    def _sum(self, collected: _Collected) -> RoundSums:
        dim = self.server.model.shape[0]
        report_size = self.server.policy.report_size(dim)
        return sum_replies(collected.accepted, self.num_clients, dim, report_size, self.num_cohorts)

    @staticmethod
    def _reply_counts(collected: _Collected, sampled: np.ndarray, prefix: str = "") -> dict[str, Any]:
        """Exact reply counts of one exchange (server-internal columns)."""
        accepted, dropped = len(collected.accepted), collected.dropped
        return {
            f"{prefix}accepted_replies": accepted,
            f"{prefix}dropped_replies": dropped,
            f"{prefix}missing_replies": len(sampled) - accepted - dropped,
            f"{prefix}unexpected_replies": collected.unexpected,
        }

    def public_metrics(self, row: dict[str, Any]) -> dict[str, float]:
        """The finite numbers of ``row`` that may be published, without per-cohort columns."""
        public = self.server.public_columns
        return {
            key: float(value)
            for key, value in row.items()
            if key in public and "/" not in key and _finite_number(value)
        }

    def _check(
        self, content: RecordDict, client: int, params: dict[str, Any], dim: int, exchange: Exchange
    ) -> RoundSums:
        cohort = int(self.client_cohorts[client]) if self.server.policy.needs_cohorts else None
        return check_reply(
            content,
            policy=self.server.policy,
            params=params,
            dim=dim,
            cohort=cohort,
            num_cohorts=self.num_cohorts,
            diagnostics_allowed=self.diagnostics_allowed,
            exchange=exchange,
        )

    def _record(
        self, round_number: int, node: int | None, client: int | None, event: str, reason: str
    ) -> None:
        self.events.append(
            {"round": round_number, "node": node, "client": client, "event": event, "reason": reason}
        )

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The released model to a fresh sample of clients, after a round that evaluates
        clients and released a model (none otherwise)."""
        pending = self._evaluation
        if pending is None or pending.number != server_round:
            return []
        server: EvaluatingRunDriver = self.server  # type: ignore[assignment]
        sampled = np.asarray(server.evaluation_sample(server_round), dtype=np.int64)
        self._evaluation = _Evaluation(server_round, sampled, pending.row)
        if self.secure is not None:  # stages 0-1 here; stage 2 is these messages
            return secure_evaluation_messages(self, grid, server_round, sampled)
        return [
            Message(
                evaluate_content(server.model, server_round),
                dst_node_id=self.nodes[int(client)],
                message_type=MessageType.EVALUATE,
            )
            for client in sampled
            if int(client) in self.nodes
        ]

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Sum the sampled clients' evaluation vectors (checked; securely where the run sums so),
        release the sum through the run (noise, accountant, the row's public columns), and
        publish the round's row. A secure sum that is skipped releases nothing."""
        pending, self._evaluation = self._evaluation, None
        if pending is None or pending.number != server_round:
            return None
        server: EvaluatingRunDriver = self.server  # type: ignore[assignment]
        total, slack = self._evaluation_sum(server, server_round, replies, pending.sampled)
        row = pending.row
        if total is not None:
            row = server.finish_evaluation(server_round, total, len(pending.sampled), slack)
        if self.on_round is not None:
            self.on_round(row)
        if total is None:
            return None
        names = ("client_accuracy_gap", "client_eval_noise_std", "epsilon")
        return MetricRecord({k: float(row[k]) for k in names if _finite_number(row.get(k))})

    def _evaluation_sum(
        self, server: EvaluatingRunDriver, server_round: int, replies: Iterable[Message], sampled: np.ndarray
    ) -> tuple[np.ndarray | None, float]:
        """(Σ of the evaluation vectors, the rounding slack of its sum); ``None`` where a secure
        sum was skipped."""
        evaluation = server.config.evaluation
        num_cohorts = len(server.task.cohort_names)
        if self.secure is not None:
            sums = self.secure.aggregate(server_round, replies)
            if sums is None:
                return None, 0.0
            return sums.contribution_sum, self.secure.rho
        m, loss_bound = evaluation.max_examples, evaluation.loss_bound
        collected = collect_replies(
            replies,
            self.clients_of_node,
            {int(client) for client in sampled},
            lambda content, _client: check_evaluation_reply(
                content, num_cohorts=num_cohorts, max_examples=m, loss_bound=loss_bound
            ),
        )
        unexpected = "evaluation: a node that was not sampled"
        self._record_rejected(server_round, collected, "evaluation: ", unexpected)
        ids = np.array(sorted(collected.accepted), dtype=np.int64)
        blocks = [
            client_evaluation.block_sum(
                np.array([collected.accepted[int(c)] for c in block]).reshape(-1, 3 * num_cohorts),
                num_cohorts,
                m,
                loss_bound,
            )
            for block in shard_ids(ids, self.num_clients)
        ]
        return client_evaluation.add_blocks(blocks, num_cohorts), 0.0


def _finite_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
