"""W6, the cost of secure aggregation (issue 69): one round's exchange of fairclip's SecAgg+
against the plain deployment's, for three model sizes of the secure-noise table
(docs/explanation/deployment-reveals.md): ``logistic`` (the ``demo`` scenario, d = 22), ``cnn``
(MNIST, d = 26,010) and ``mlp`` (MNIST, d = 269,322).

Both contenders run the code a deployment runs, in one process, with every message serialised
to Flower's wire format and back (``flwr.common.serde``: the protobuf a SuperLink relays), so
the bytes are the messages' payloads on the wire:

* ``plain``: the server sends each of n clients θ_t and the policy's broadcast
  (:func:`fairclip.client.protocol.train_content`); each replies with its clipped contribution
  and report vector (:func:`fairclip.client.protocol.reply_content`); the server sums them.
* ``secure``: the server's :class:`fairclip.server.secure_aggregation.SecureAggregation` runs
  the four stages with each node's :func:`fairclip.client.secure_aggregation.answer` (keys,
  encrypted shares, the masked vector, the unmasking shares) and unmasks the sum.

The policy is ``bounded`` (its report is one bit); no client drops out. The clients' vectors are
given (norm at the bound): local training, identical in both, is not timed, nor are network
latency and Flower's process starts, which a real deployment adds to both. Rounds per second
of the exchange (the fastest of the repeats) and bytes per client per round, sent (up) and
received (down). Figures for the record: the issue sets no target.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import numpy as np

from .common import Measurement

UNIT = "rounds/s"
MODEL_SIZES = {"logistic": 22, "cnn": 26_010, "mlp": 269_322}
"""The parameters of each model (the secure-noise table's rows of those names)."""
MODES = ("plain", "secure")
CLIENTS = {False: 10, True: 5}
"""Clients per round (full run, ``--quick``)."""
REPEATS = {False: 5, True: 1}


def contender_name(model: str, mode: str) -> str:
    return f"{model}/{mode}"


class WireGrid:
    """A grid that hands each message to its node's handler through Flower's wire format, and
    counts each node's bytes: ``down`` (messages to it), ``up`` (its replies)."""

    def __init__(self, handler: Any) -> None:
        self.handler = handler
        self.up: Counter[int] = Counter()
        self.down: Counter[int] = Counter()

    @staticmethod
    def _through_the_wire(content: Any) -> tuple[Any, int]:
        from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
        from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict

        wire = recorddict_to_proto(content).SerializeToString()
        return recorddict_from_proto(ProtoRecordDict.FromString(wire)), len(wire)

    def send_and_receive(self, messages: Any, timeout: float | None = None) -> list[Any]:
        replies = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = message.object_id  # as a grid's push does
            node = int(message.metadata.dst_node_id)
            message.content, size = self._through_the_wire(message.content)
            self.down[node] += size
            reply = self.handler(node, message)
            if not reply.has_error():
                reply.content, size = self._through_the_wire(reply.content)
                self.up[node] += size
            replies.append(reply)
        return replies


def _set_task_identity() -> None:
    """Messages need the identity a ServerApp process has; this process is none."""
    from flwr.supercore.task_identity import TaskIdentity

    for attribute, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 1)):
        setattr(TaskIdentity, attribute, value)


def _vectors(dim: int, bound: float, nodes: list[int], seed: int) -> dict[int, np.ndarray]:
    """Each node's clipped contribution (L2 norm ``bound``) and its report bit."""
    generator = np.random.default_rng(seed)
    vectors = {}
    for node in nodes:
        contribution = generator.normal(size=dim)
        contribution *= bound / np.linalg.norm(contribution)
        vectors[node] = np.concatenate([contribution, [float(generator.integers(0, 2))]])
    return vectors


def plain_round(dim: int, nodes: list[int], seed: int) -> tuple[float, WireGrid, np.ndarray]:
    """One plain round's exchange: (seconds, grid with its byte counts, the sum)."""
    from flwr.app import Message, MessageType

    from fairclip.client.protocol import CONTRIBUTION, REPORTS, UPDATE, reply_content, train_content
    from fairclip.strategies.aggregation import CLIENT_DIAGNOSTICS, CohortDiagnostics, RoundSums

    vectors = _vectors(dim, 1.0, nodes, seed)
    no_diagnostics = CohortDiagnostics(**{d.name: np.zeros(1) for d in CLIENT_DIAGNOSTICS})

    def handler(node: int, message: Any) -> Any:
        vector = vectors[node]
        sums = RoundSums(vector[:dim], vector[dim:], 1, no_diagnostics)
        return Message(reply_content(sums, with_diagnostics=False), reply_to=message)

    grid = WireGrid(handler)
    model = np.zeros(dim)
    started = time.perf_counter()
    messages = [
        Message(train_content(model, {"bound": 1.0}, 1), dst_node_id=node, message_type=MessageType.TRAIN)
        for node in nodes
    ]
    replies = grid.send_and_receive(messages)
    total = np.zeros(dim + 1)
    for reply in replies:
        record = reply.content.array_records[UPDATE]
        total += np.concatenate([record[CONTRIBUTION].numpy(), record[REPORTS].numpy()])
    return time.perf_counter() - started, grid, total


def secure_round(dim: int, nodes: list[int], seed: int) -> tuple[float, WireGrid, np.ndarray]:
    """One secure round's exchange (all four stages): (seconds, grid, the unmasked sum)."""
    from flwr.app import Context, RecordDict

    from fairclip.client.protocol import train_content
    from fairclip.client.secure_aggregation import answer
    from fairclip.server.secure_aggregation import SecureAggregation, layout_for
    from fairclip.strategies import build_policy
    from fairclip.strategies.secure_sum import DEFAULT_RHO

    policy = build_policy("bounded", {"lower_bound": 0.1, "initial_bound": 1.0}, num_cohorts=1)
    state = policy.initial_state(dim)
    bound = float(policy.sensitivity(state))
    layout = layout_for(policy, state, dim, DEFAULT_RHO)
    vectors = _vectors(dim, bound, nodes, seed)
    contexts = {
        node: Context(run_id=1, node_id=node, node_config={}, state=RecordDict(), run_config={})
        for node in nodes
    }

    def handler(node: int, message: Any) -> Any:
        return answer(message, contexts[node], lambda _content: vectors[node])

    grid = WireGrid(handler)
    secure = SecureAggregation(len(nodes), 1, rounding_slack=DEFAULT_RHO, stage_timeout=60.0, run_label="w6")
    model = np.zeros(dim)
    started = time.perf_counter()
    messages = secure.configure(grid, 1, nodes, layout, lambda: train_content(model, {"bound": bound}, 1))
    sums = secure.aggregate(1, grid.send_and_receive(messages))
    seconds = time.perf_counter() - started
    if sums is None or sums.num_reports != len(nodes):
        raise RuntimeError("the secure round did not complete")
    total = np.concatenate([sums.contribution_sum, sums.report_sum])
    expected = np.sum(list(vectors.values()), axis=0)
    if np.linalg.norm(total[:dim] - expected[:dim]) > len(nodes) * DEFAULT_RHO * bound:
        raise RuntimeError("the secure sum is not the plain sum within its rounding")
    return seconds, grid, total


def run_model(model: str, quick: bool) -> dict[str, Measurement]:
    """The model's two contenders, in alternating order over the repeats (each after one
    unmeasured round)."""
    from .common import alternate, self_peak_rss_bytes

    started = time.perf_counter()
    _set_task_identity()
    dim = MODEL_SIZES[model]
    nodes = [1000 + 7 * i for i in range(CLIENTS[quick])]
    rounds = {"plain": plain_round, "secure": secure_round}
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    grids: dict[str, WireGrid] = {}
    for mode in MODES:
        rounds[mode](dim, nodes, seed=0)  # unmeasured: first imports and allocations
    for repeat in range(REPEATS[quick]):
        for mode in alternate(MODES, repeat):
            seconds, grid, _ = rounds[mode](dim, nodes, seed=1 + repeat)
            times[mode].append(seconds)
            grids[mode] = grid
    total_s = time.perf_counter() - started
    peak = self_peak_rss_bytes()
    results = {}
    for mode in MODES:
        grid, best = grids[mode], min(times[mode])
        details = {
            "model": model,
            "parameters": dim,
            "clients": len(nodes),
            "repeats": REPEATS[quick],
            "bytes_up_per_client": float(np.mean([grid.up[n] for n in nodes])),
            "bytes_down_per_client": float(np.mean([grid.down[n] for n in nodes])),
            "round_s_all": times[mode],
        }
        measurement = Measurement(1.0 / best, UNIT, best, total_s, 1.0, peak, details)
        results[contender_name(model, mode)] = measurement
    return results


CONTENDERS = {model: (lambda quick, model=model: run_model(model, quick)) for model in MODEL_SIZES}
