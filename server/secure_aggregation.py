"""fairclip's SecAgg+ on the Message API: the server's side of one round (issue 69).

With ``privacy.secure_aggregation = true`` the round's train exchange becomes the four stages
of :mod:`fairclip.strategies.secagg_protocol`, every message a plain ``train`` message with a
:data:`SECAGG` config record naming its stage:

* stages 0 (keys) and 1 (encrypted shares) go out on the grid inside ``configure_train``, as a
  counts-first round's first exchange does;
* stage 2 is the round's own train messages: θ_t, the policy's broadcast, the ciphertexts
  addressed to the node and the layout of the masked vector (each segment's length, L2 bound
  and kind, and ρ; the field's bits are in the stage-0 config). A node replies with one uint64
  array (:data:`MASKED`) and nothing else;
* stage 3 (unmask) goes out in ``aggregate_train`` on the grid kept from ``configure_train``.

The masked vector is [contribution (d floats, L2 bound = the policy's sensitivity of the round)]
+ [reports (the policy's ``report_size``: bits or one-hot counts, summed exactly; ``online``'s
unit direction quantised like a float segment of bound 1)]. ``per-cohort`` and ``reweight``
learn a node's cohort only as the position of its one-hot count inside that sum: under secure
aggregation nodes never disclose their cohort (:func:`fairclip.server.nodes.identify_nodes`).

The unmasked sum, decoded and projected onto the public set (:meth:`Layout.release`), becomes
the round's :class:`RoundSums` (``num_reports`` = the survivors); the policy then noises it with
the quantised sensitivity s·(1+ρ) (:meth:`Policy.server_side`'s ``rounding_slack``).

**A skipped round** (too few survivors, a share that does not combine, anything
:class:`SkippedRound` reports) releases nothing: no noise is drawn, the model and the policy's
state stay as they were, no row is written, and the accountant is **not** stepped, since nothing
computed from that round's contributions or reports left the server. The skip, its stage and
reason go to the server-internal events only. (That a round was skipped is visible -- the round
has no row -- and depends on how many sampled nodes stayed: availability, not data.)

What this object keeps between ``configure`` and ``aggregate`` is the protocol's server state
(public keys, ciphertexts, commitments) and the grid; it keeps no masked vector after summing,
no individual vector in clear (it never sees one), and no node's cohort; everything is dropped
once the round is unmasked or skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Message, MessageType, RecordDict

from fairclip.client.secure_aggregation import (
    AT_EXCHANGE,
    AT_ROUND,
    MASKED,
    SECAGG,
    UPDATE,
    layout_fields,
)
from fairclip.strategies import evaluation as client_evaluation
from fairclip.strategies.aggregation import CLIENT_DIAGNOSTICS, CohortDiagnostics, RoundSums
from fairclip.strategies.secagg_protocol import (
    EncryptedShares,
    ExchangeConfig,
    KeysAdvert,
    SkippedRound,
    UnmaskReply,
    default_threshold,
    server_collect_masked,
    server_forward,
    server_setup,
    server_share_keys,
    server_unmask,
)
from fairclip.strategies.secagg_records import from_fields, to_fields
from fairclip.strategies.secure_sum import Layout, Segment

TRAINING, EVALUATION = 0, 1
"""The secure sums of a round: its training exchange, and the clients' evaluation after it."""
EXCHANGE_NAMES = {TRAINING: "training", EVALUATION: "evaluation"}

Record = Callable[[int, int | None, str, str], None]
"""(round, node, event, reason) -> None: the strategy's server-internal record."""


def layout_for(policy: Any, state: Any, dim: int, rho: float) -> Layout:
    """The masked vector of one client in a round clipped with ``state``: the contribution (its
    L2 bound the policy's sensitivity of that state), then the reports where the policy has any."""
    segments = [Segment(int(dim), float(policy.sensitivity(state)))]
    size = int(policy.report_size(dim))
    if size:
        segments.append(Segment(size, 1.0, integer=bool(policy.integer_reports)))
    return Layout(tuple(segments), float(rho))


def evaluation_layout(num_cohorts: int, max_examples: int, loss_bound: float, rho: float) -> Layout:
    """The masked vector of one client's evaluation (``[evaluation] clients``): its 3K values
    as one float segment of L2 bound Δ_E = m·sqrt(2 + L²) (:mod:`fairclip.strategies.evaluation`)."""
    bound = client_evaluation.sensitivity(int(max_examples), float(loss_bound))
    return Layout((Segment(3 * int(num_cohorts), bound),), float(rho))


def summary_of(config: Any, policy: Any, dim: int) -> dict[str, Any]:
    """What the run's privacy summary says of its secure aggregation (all public)."""
    privacy = config.privacy
    layout = layout_for(policy, policy.initial_state(dim), dim, privacy.secagg_rounding_slack)
    return {
        "protocol": "SecAgg+ (fairclip, Bell et al. 2020)",
        "rounding_slack": privacy.secagg_rounding_slack,
        "noise_widening": 1.0 + privacy.secagg_rounding_slack,
        "sensitivity": "quantised: s(1+rho) per float segment; integer counts exact",
        "reports": (
            "none" if not policy.report_size(dim) else "exact" if policy.integer_reports else "quantised"
        ),
        "modulus_bits": layout.field(config.federation.num_clients).bits,
        "neighbours": privacy.secagg_neighbours or "all",
        "threshold": privacy.secagg_threshold or "default",
        "skipped_rounds": "release nothing and are not accounted",
    }


@dataclass(frozen=True)
class _Pending:
    """A round between its stage 2 and stage 3: the protocol's state, its layout and the grid."""

    round: int
    state: Any
    layout: Layout
    grid: Any
    sent: tuple[Message, ...] = ()
    """The stage-2 messages (θ_t, the broadcast, ciphertexts: nothing a node sent in clear),
    whose ids the grid sets when it sends them."""
    exchange: int = TRAINING
    message_type: str = MessageType.TRAIN


class SecureAggregation:
    """The server side of fairclip's secure sum over ``num_clients`` clients (module docstring)."""

    def __init__(
        self,
        num_clients: int,
        num_cohorts: int,
        *,
        rounding_slack: float,
        neighbours: int = 0,
        threshold: int | None = None,
        stage_timeout: float = 120.0,
        run_label: str = "fairclip",
    ) -> None:
        self.num_clients = int(num_clients)
        self.num_cohorts = int(num_cohorts)
        self.rho = float(rounding_slack)
        self.neighbours = int(neighbours) or None
        self.threshold = threshold
        self.stage_timeout = float(stage_timeout)
        self.run_label = str(run_label)
        self.record: Record = lambda *_: None
        self._pending: _Pending | None = None

    @classmethod
    def from_config(cls, config: Any, num_cohorts: int, run_label: str = "fairclip") -> SecureAggregation:
        privacy = config.privacy
        return cls(
            config.federation.num_clients,
            num_cohorts,
            rounding_slack=privacy.secagg_rounding_slack,
            neighbours=privacy.secagg_neighbours,
            threshold=privacy.secagg_threshold,
            stage_timeout=privacy.secagg_stage_timeout,
            run_label=run_label,
        )

    def exchange_config(
        self, round_number: int, nodes: int, layout: Layout, exchange: int = TRAINING
    ) -> ExchangeConfig:
        others = nodes - 1 if self.neighbours is None else min(self.neighbours, nodes - 1)
        threshold = self.threshold or default_threshold(max(others, 2))
        bits = layout.field(self.num_clients).bits
        label = self.run_label
        return ExchangeConfig(label, int(round_number), int(exchange), threshold, bits, layout.length)

    # ----- stages 0-2: inside configure_train ---------------------------------------------
    def configure(
        self,
        grid: Any,
        round_number: int,
        nodes: Iterable[int],
        layout: Layout,
        content: Callable[[], RecordDict],
        *,
        exchange: int = TRAINING,
        message_type: str = MessageType.TRAIN,
    ) -> list[Message]:
        """Run stages 0 and 1 with ``nodes`` on ``grid``; return the stage-2 messages (``content()``
        -- θ_t, the broadcast, the round -- plus each node's ciphertexts and the layout), or
        ``[]`` where the round is skipped. ``exchange`` numbers the secure sum within its round
        (:data:`TRAINING`, :data:`EVALUATION`), and every stage's message is of
        ``message_type`` (a node answers an evaluation's stages with its evaluate handler)."""
        self._pending = None
        nodes = sorted(int(u) for u in nodes)
        config = self.exchange_config(round_number, len(nodes), layout, exchange)
        stage = (exchange, message_type)
        step = server_setup(config, nodes, self.neighbours)
        if isinstance(step, SkippedRound):
            return self._skip(round_number, step, exchange)
        state, setups = step
        adverts = self._exchange(grid, round_number, 0, setups, KeysAdvert, *stage)
        step = server_share_keys(state, adverts)
        if isinstance(step, SkippedRound):
            return self._skip(round_number, step, exchange)
        state, requests = step
        shares = self._exchange(grid, round_number, 1, requests, EncryptedShares, *stage)
        step = server_forward(state, shares)
        if isinstance(step, SkippedRound):
            return self._skip(round_number, step, exchange)
        state, masks = step
        extra = layout_fields(layout)
        messages = []
        for node in sorted(masks):
            record = content()
            record[SECAGG] = ConfigRecord(
                {**to_fields(masks[node]), **extra, AT_ROUND: int(round_number), AT_EXCHANGE: exchange}
            )
            messages.append(Message(record, dst_node_id=node, message_type=message_type))
        self._pending = _Pending(int(round_number), state, layout, grid, tuple(messages), *stage)
        return messages

    # ----- stage 3: inside aggregate_train ------------------------------------------------
    def aggregate(self, round_number: int, replies: Iterable[Message]) -> RoundSums | None:
        """Collect the masked vectors, unmask their sum; the round's sums, or ``None`` where the
        round is skipped (nothing to release)."""
        pending, self._pending = self._pending, None
        if pending is None or pending.round != round_number:
            return None  # skipped in configure (recorded there)
        field = pending.state.config.field
        masked: dict[int, np.ndarray] = {}
        active = {int(u) for u in pending.state.active}
        name = EXCHANGE_NAMES[pending.exchange]
        for node, content in self._replies(round_number, f"{name} stage 2", replies, active, pending.sent):
            vector = _masked_vector(content)
            if vector is None:
                reason = f"secagg {name} stage 2: not one uint64 masked array"
                self.record(round_number, node, "dropped", reason)
                continue
            masked[node] = vector
        step = server_collect_masked(pending.state, masked)
        masked.clear()  # summed (or refused): no individual masked vector is kept
        if isinstance(step, SkippedRound):
            self._skip(round_number, step, pending.exchange)
            return None
        state, requests = step
        shares = self._exchange(
            pending.grid, round_number, 3, requests, UnmaskReply, pending.exchange, pending.message_type
        )
        result = server_unmask(state, shares)
        del state, shares
        if isinstance(result, SkippedRound):
            self._skip(round_number, result, pending.exchange)
            return None
        values, moved = pending.layout.release(field, result.total, self.num_clients)
        if moved:
            self.record(round_number, None, "projected", "the decoded secure sum left the public set")
        self.record(
            round_number,
            None,
            "secure-sum",
            f"{name}: {len(result.survivors)} survivors, {len(result.dropped)} dropped after masking",
        )
        dim = pending.layout.segments[0].length
        unknown = np.full(self.num_cohorts, np.nan)
        return RoundSums(
            values[:dim].copy(),
            values[dim:].copy(),
            len(result.survivors),
            CohortDiagnostics(**{d.name: unknown.copy() for d in CLIENT_DIAGNOSTICS}),
        )

    # ----- transport ----------------------------------------------------------------------
    def _exchange(
        self,
        grid: Any,
        round_number: int,
        stage: int,
        requests: Mapping[int, Any],
        expected: type,
        exchange: int = TRAINING,
        message_type: str = MessageType.TRAIN,
    ) -> dict[int, Any]:
        """Send one stage's requests; the parsed replies of the expected kind, by node."""
        messages = [
            Message(
                RecordDict(
                    {
                        SECAGG: ConfigRecord(
                            {**to_fields(request), AT_ROUND: int(round_number), AT_EXCHANGE: exchange}
                        )
                    }
                ),
                dst_node_id=int(node),
                message_type=message_type,
            )
            for node, request in sorted(requests.items())
        ]
        replies = grid.send_and_receive(messages, timeout=self.stage_timeout) if messages else []
        parsed = {}
        where = f"{EXCHANGE_NAMES[exchange]} stage {stage}"
        for node, content in self._replies(round_number, where, replies, set(requests), messages):
            try:
                if set(content.keys()) != {SECAGG} or SECAGG not in content.config_records:
                    raise ValueError("the reply holds more than its secure aggregation record")
                parsed[node] = from_fields(dict(content.config_records[SECAGG]), expected)
            except ValueError as error:
                self.record(round_number, node, "dropped", f"secagg {where}: {error}")
        return parsed

    def _replies(
        self,
        round_number: int,
        where: str,
        replies: Iterable[Message],
        asked: set[int],
        sent: Iterable[Message] = (),
    ) -> list[tuple[int, RecordDict]]:
        """(node, content) of the replies of the nodes ``asked``, once each; the rest recorded.
        An error the SuperLink sends for a node (one that went offline) comes from the SuperLink's
        own id: it is matched to its node through the message it answers (``sent``)."""
        sent_to = {m.metadata.message_id: int(m.metadata.dst_node_id) for m in sent if m.metadata.message_id}
        by_node: dict[int, list[Message]] = {}
        for reply in replies:
            node = int(reply.metadata.src_node_id)
            if reply.has_error() and reply.metadata.reply_to_message_id in sent_to:
                node = sent_to[reply.metadata.reply_to_message_id]
            if node not in asked:
                self.record(round_number, node, "unexpected", f"secagg {where}: a node not asked")
                continue
            by_node.setdefault(node, []).append(reply)
        out = []
        for node in sorted(asked):
            got = by_node.get(node, [])
            if not got:
                self.record(round_number, node, "missing", f"secagg {where}: no reply")
            elif len(got) > 1:
                self.record(round_number, node, "dropped", f"secagg {where}: {len(got)} replies")
            elif got[0].has_error():
                self.record(round_number, node, "dropped", f"secagg {where}: {got[0].error.reason}")
            else:
                out.append((node, got[0].content))
        return out

    def _skip(self, round_number: int, skipped: SkippedRound, exchange: int = TRAINING) -> list:
        self._pending = None
        name = EXCHANGE_NAMES[exchange]
        self.record(
            round_number,
            None,
            "skipped",
            f"secure aggregation ({name}) stopped at stage {skipped.stage}: {skipped.reason}; "
            "nothing released",
        )
        return []


def _masked_vector(content: RecordDict) -> np.ndarray | None:
    """The one uint64 array of a stage-2 reply, or ``None`` where the reply holds anything else."""
    try:
        if set(content.keys()) != {UPDATE} or set(content.array_records[UPDATE].keys()) != {MASKED}:
            return None
        vector = content.array_records[UPDATE][MASKED].numpy()
    except Exception:
        return None
    return vector if vector.dtype == np.uint64 and vector.ndim == 1 else None


def secure_train_messages(
    strategy: Any, grid: Any, round_number: int, sampled: np.ndarray, params: dict[str, Any]
) -> list[Message]:
    """``PolicyStrategy.configure_train`` under secure aggregation: stages 0-1 with the sampled
    clients' nodes, and the stage-2 messages (θ_t, ``params``, the round) to the nodes still in."""
    from fairclip.client.protocol import train_content

    server = strategy.server
    dim = server.model.shape[0]
    layout = layout_for(server.policy, server.state, dim, strategy.secure.rho)
    nodes = [strategy.nodes[int(c)] for c in sampled if int(c) in strategy.nodes]
    model = server.model
    return strategy.secure.configure(
        grid, round_number, nodes, layout, lambda: train_content(model, params, round_number)
    )


def secure_evaluation_messages(
    strategy: Any, grid: Any, round_number: int, sampled: np.ndarray
) -> list[Message]:
    """``PolicyStrategy.configure_evaluate`` under secure aggregation: stages 0-1 of the
    evaluation's secure sum (exchange :data:`EVALUATION`) with the sampled clients' nodes, and
    the stage-2 messages (the released model, the round) to the nodes still in."""
    from fairclip.client.protocol import evaluate_content

    server, secure = strategy.server, strategy.secure
    evaluation = server.config.evaluation
    cohorts, m, loss_bound = len(server.task.cohort_names), evaluation.max_examples, evaluation.loss_bound
    layout = evaluation_layout(cohorts, m, loss_bound, secure.rho)
    nodes = [strategy.nodes[int(c)] for c in sampled if int(c) in strategy.nodes]
    model = server.model
    return secure.configure(
        grid,
        round_number,
        nodes,
        layout,
        lambda: evaluate_content(model, round_number),
        exchange=EVALUATION,
        message_type=MessageType.EVALUATE,
    )
