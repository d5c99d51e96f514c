"""A node's side of fairclip's SecAgg+ (:mod:`fairclip.server.secure_aggregation`); the wire names
and the layout both sides read live here (the server imports the client, never the other way).

Every stage arrives as a plain ``train`` message with the :data:`SECAGG` config record naming
it (``kind``). The node's protocol state (its key pairs, b_u, the shares it holds) lives in its
``context.state`` under ``fairclip.secagg/<round>/<exchange>`` between stages, and is deleted
once it has answered the unmask stage (or refused one). At stage 2 the node computes exactly
what it sends today (``contribute``: the policy's contribution and report vector), quantises it
with the layout it was sent (stochastic rounding from operating-system entropy) and replies with
one uint64 masked array, nothing else. A stage it refuses (:class:`ProtocolAbortError`, or a
malformed message) is answered with an error: the server counts the node as dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.app.error import Error

from fairclip.client.protocol import UPDATE
from fairclip.strategies.secagg_protocol import (
    MaskRequest,
    ProtocolAbortError,
    Setup,
    ShareKeysRequest,
    UnmaskRequest,
    client_mask,
    client_setup,
    client_share_keys,
    client_unmask,
)
from fairclip.strategies.secagg_records import from_fields, state_from_fields, state_to_fields, to_fields
from fairclip.strategies.secure_sum import Layout, Segment

SECAGG = "fairclip.secagg"
"""The config record of every secure aggregation message (its ``kind`` names the stage)."""
MASKED = "masked"
"""A stage-2 reply: ``content[UPDATE][MASKED]``, one uint64 array, and nothing else."""
AT_ROUND, AT_EXCHANGE = "at_round", "at_exchange"
"""Fields of every server message naming the round and exchange (the node keys its state by them)."""
LAYOUT_FIELDS = ("segment_lengths", "segment_bounds", "segment_integer", "rho")


def layout_fields(layout: Layout) -> dict[str, Any]:
    """``layout`` as config values: each segment's length, L2 bound and kind, and ρ."""
    return {
        "segment_lengths": [s.length for s in layout.segments],
        "segment_bounds": [float(s.bound) for s in layout.segments],
        "segment_integer": [int(s.integer) for s in layout.segments],
        "rho": float(layout.rho),
    }


def read_layout(fields: Mapping[str, Any]) -> Layout:
    """The layout :func:`layout_fields` wrote (:class:`ValueError` on anything else)."""
    try:
        lengths, bounds, kinds = (list(fields[name]) for name in LAYOUT_FIELDS[:3])
        rho = float(fields["rho"])
        if not len(lengths) == len(bounds) == len(kinds) >= 1:
            raise ValueError
        return Layout(
            tuple(Segment(int(n), float(b), bool(k)) for n, b, k in zip(lengths, bounds, kinds, strict=True)),
            rho,
        )
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"an invalid secure aggregation layout ({error or 'malformed'})") from None


REFUSED = 4690
"""The error code of a stage a node refuses."""


def is_secure(message: Message) -> bool:
    """Whether ``message`` is a stage of secure aggregation."""
    return SECAGG in message.content.config_records


def state_key(round_number: int, exchange: int) -> str:
    return f"{SECAGG}/{int(round_number)}/{int(exchange)}"


def answer(message: Message, context: Context, vector: Callable[[RecordDict], np.ndarray]) -> Message:
    """This node's reply to one stage; ``vector(content)`` computes its unmasked float vector
    (contribution, then reports) from a stage-2 message's train instruction."""
    fields = dict(message.content.config_records[SECAGG])
    key = None
    try:
        round_number, exchange = fields.get(AT_ROUND), fields.get(AT_EXCHANGE)
        if not (isinstance(round_number, int) and isinstance(exchange, int)):
            raise ValueError("a secure aggregation message names its round and exchange")
        key = state_key(round_number, exchange)
        kind = fields.get("kind")
        if kind == "setup":
            for old in [k for k in context.state if k.startswith(SECAGG + "/")]:
                del context.state[old]  # a round this node dropped out of
            setup = from_fields(fields, Setup)
            if setup.config.round != round_number or setup.config.exchange != exchange:
                raise ValueError("a setup for another round")
            state, reply = client_setup(int(context.node_id), setup)
            _keep(context, key, state)
            return _reply(message, to_fields(reply))
        state = _held(context, key)
        if kind == "share-keys":
            state, reply = client_share_keys(state, from_fields(fields, ShareKeysRequest))
            _keep(context, key, state)
            return _reply(message, to_fields(reply))
        if kind == "mask":
            layout = read_layout(fields)
            if layout.length != state.config.length:
                raise ValueError("a layout of another length than the exchange's")
            request = from_fields(fields, MaskRequest)
            q = layout.quantise(
                np.asarray(vector(message.content), dtype=np.float64), np.random.default_rng()
            )
            state, masked = client_mask(state, request, q)
            _keep(context, key, state)
            content = RecordDict({UPDATE: ArrayRecord({MASKED: Array(np.ascontiguousarray(masked))})})
            return Message(content, reply_to=message)
        if kind == "unmask":
            _state, reply = client_unmask(state, from_fields(fields, UnmaskRequest))
            del context.state[key]
            return _reply(message, to_fields(reply))
        raise ValueError(f"not a secure aggregation stage: {kind!r}")
    except (ProtocolAbortError, ValueError) as error:
        if key is not None and key in context.state:
            del context.state[key]
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        return Message(Error(code=REFUSED, reason=f"secure aggregation refused: {reason}"), reply_to=message)


def _keep(context: Context, key: str, state) -> None:
    context.state[key] = ConfigRecord(state_to_fields(state))


def _held(context: Context, key: str):
    if key not in context.state:
        raise ProtocolAbortError("no secure aggregation state for this round (a stage out of order)")
    return state_from_fields(dict(context.state[key]))


def _reply(message: Message, fields: dict) -> Message:
    return Message(RecordDict({SECAGG: ConfigRecord(fields)}), reply_to=message)
