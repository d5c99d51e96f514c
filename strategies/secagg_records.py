"""The secure aggregation messages and a client's state as flat dicts of Flower config values.

Each message of :mod:`fairclip.strategies.secagg_protocol` (and a :class:`ClientState`, which a
node keeps in ``context.state`` between stages) becomes a dict whose values a Flower
``ConfigRecord`` holds (int, str, bytes, lists of int or bytes; node ids as uint64 ints), with a
``kind`` entry naming the message; the masked vector itself travels as a uint64 array. Pure:
no Flower import. :func:`from_fields` reads what a peer sent and raises :class:`ValueError`
(one line) on anything malformed, which the receiver treats as no reply (the server) or a
refusal (a client).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fairclip.strategies.secagg_protocol import (
    ClientState,
    EncryptedShares,
    ExchangeConfig,
    KeysAdvert,
    MaskRequest,
    Setup,
    ShareKeysRequest,
    UnmaskReply,
    UnmaskRequest,
)

CONFIG_FIELDS = ("run", "round", "exchange", "threshold", "bits", "length")

Message = Setup | KeysAdvert | ShareKeysRequest | EncryptedShares | MaskRequest | UnmaskRequest | UnmaskReply


def to_fields(message: Message) -> dict[str, Any]:
    """``message`` as a flat dict of config values (keys sorted by node where it maps nodes)."""
    if isinstance(message, Setup):
        return {"kind": "setup", **_config(message.config), "neighbours": sorted(message.neighbours)}
    if isinstance(message, KeysAdvert):
        return {"kind": "keys", "pk1": message.pk1, "pk2": message.pk2}
    if isinstance(message, ShareKeysRequest):
        nodes = sorted(message.keys)
        return {
            "kind": "share-keys",
            "nodes": nodes,
            "pk1": [message.keys[v].pk1 for v in nodes],
            "pk2": [message.keys[v].pk2 for v in nodes],
        }
    if isinstance(message, EncryptedShares):
        return {
            "kind": "shares",
            **_nodes_bytes(message.ciphertexts, "ciphertexts"),
            "commitment": message.commitment,
        }
    if isinstance(message, MaskRequest):
        return {"kind": "mask", **_nodes_bytes(message.ciphertexts, "ciphertexts")}
    if isinstance(message, UnmaskRequest):
        return {"kind": "unmask", "alive": sorted(message.alive), "dead": sorted(message.dead)}
    if isinstance(message, UnmaskReply):
        return {
            "kind": "unmask-shares",
            **_nodes_bytes(message.b_shares, "b_shares", "b_nodes"),
            **_nodes_bytes(message.sk1_shares, "sk1_shares", "sk1_nodes"),
        }
    raise TypeError(f"not a secure aggregation message: {type(message).__name__}")


KINDS = {
    "setup": Setup,
    "keys": KeysAdvert,
    "share-keys": ShareKeysRequest,
    "shares": EncryptedShares,
    "mask": MaskRequest,
    "unmask": UnmaskRequest,
    "unmask-shares": UnmaskReply,
}


def from_fields(fields: Mapping[str, Any], expected: type | None = None) -> Message:
    """The message :func:`to_fields` wrote; :class:`ValueError` where ``fields`` is not one (or
    not of the ``expected`` kind)."""
    kind = KINDS.get(fields.get("kind")) if isinstance(fields, Mapping) else None
    if kind is None or (expected is not None and kind is not expected):
        raise ValueError(f"not a secure aggregation message of kind {getattr(expected, '__name__', 'any')}")
    if kind is Setup:
        return Setup(_read_config(fields), frozenset(_ints(fields, "neighbours")))
    if kind is KeysAdvert:
        return KeysAdvert(_bytes(fields, "pk1"), _bytes(fields, "pk2"))
    if kind is ShareKeysRequest:
        nodes = _ints(fields, "nodes")
        pk1, pk2 = _bytes_list(fields, "pk1", len(nodes)), _bytes_list(fields, "pk2", len(nodes))
        return ShareKeysRequest({v: KeysAdvert(a, b) for v, a, b in zip(nodes, pk1, pk2, strict=True)})
    if kind is EncryptedShares:
        return EncryptedShares(_read_nodes_bytes(fields, "ciphertexts"), _bytes(fields, "commitment"))
    if kind is MaskRequest:
        return MaskRequest(_read_nodes_bytes(fields, "ciphertexts"))
    if kind is UnmaskRequest:
        return UnmaskRequest(frozenset(_ints(fields, "alive")), frozenset(_ints(fields, "dead")))
    return UnmaskReply(
        _read_nodes_bytes(fields, "b_shares", "b_nodes"), _read_nodes_bytes(fields, "sk1_shares", "sk1_nodes")
    )


def state_to_fields(state: ClientState) -> dict[str, Any]:
    """A client's state, to keep in its node's ``context.state`` (it holds the node's secrets:
    never send it)."""
    nodes = sorted(state.keys)
    held = sorted(state.shares)
    return {
        "node": state.node,
        **_config(state.config),
        "neighbours": sorted(state.neighbours),
        "stage": state.stage,
        "sk1": state.sk1,
        "sk2": state.sk2,
        "pk1": state.pk1,
        "pk2": state.pk2,
        "seed": state.seed,
        "key_nodes": nodes,
        "key_pk1": [state.keys[v].pk1 for v in nodes],
        "key_pk2": [state.keys[v].pk2 for v in nodes],
        "masked_with": sorted(state.masked_with),
        "held_nodes": held,
        "held_b": [state.shares[v][0] for v in held],
        "held_sk1": [state.shares[v][1] for v in held],
    }


def state_from_fields(fields: Mapping[str, Any]) -> ClientState:
    """The state :func:`state_to_fields` wrote (:class:`ValueError` where it is not one)."""
    nodes, held = _ints(fields, "key_nodes"), _ints(fields, "held_nodes")
    pk1, pk2 = _bytes_list(fields, "key_pk1", len(nodes)), _bytes_list(fields, "key_pk2", len(nodes))
    held_b, held_sk1 = _bytes_list(fields, "held_b", len(held)), _bytes_list(fields, "held_sk1", len(held))
    return ClientState(
        node=_int(fields, "node"),
        config=_read_config(fields),
        neighbours=frozenset(_ints(fields, "neighbours")),
        stage=_int(fields, "stage"),
        sk1=_bytes(fields, "sk1"),
        sk2=_bytes(fields, "sk2"),
        pk1=_bytes(fields, "pk1"),
        pk2=_bytes(fields, "pk2"),
        seed=_bytes(fields, "seed"),
        keys={v: KeysAdvert(a, b) for v, a, b in zip(nodes, pk1, pk2, strict=True)},
        masked_with=frozenset(_ints(fields, "masked_with")),
        shares={v: (b, s) for v, b, s in zip(held, held_b, held_sk1, strict=True)},
    )


def _config(config: ExchangeConfig) -> dict[str, Any]:
    return {name: getattr(config, name) for name in CONFIG_FIELDS}


def _read_config(fields: Mapping[str, Any]) -> ExchangeConfig:
    run = fields.get("run")
    if not isinstance(run, str):
        raise ValueError("a secure aggregation config names its run")
    try:
        return ExchangeConfig(run, *(_int(fields, name) for name in CONFIG_FIELDS[1:]))
    except ValueError as error:  # PolicyConfigError: a config a peer should not have sent
        raise ValueError(f"an invalid secure aggregation config: {error}") from None


def _nodes_bytes(mapping: Mapping[int, bytes], values: str, nodes: str = "nodes") -> dict[str, Any]:
    order = sorted(mapping)
    return {nodes: order, values: [mapping[v] for v in order]}


def _read_nodes_bytes(fields: Mapping[str, Any], values: str, nodes: str = "nodes") -> dict[int, bytes]:
    ids = _ints(fields, nodes)
    return dict(zip(ids, _bytes_list(fields, values, len(ids)), strict=True))


def _int(fields: Mapping[str, Any], name: str) -> int:
    value = fields.get(name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"secure aggregation field {name!r} is not an integer")
    return value


def _ints(fields: Mapping[str, Any], name: str) -> list[int]:
    value = fields.get(name)
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ValueError(f"secure aggregation field {name!r} is not a list of node ids")
    if len(set(value)) != len(value) or any(v < 0 or v >= 2**64 for v in value):
        raise ValueError(f"secure aggregation field {name!r} repeats a node id or holds one out of range")
    return value


def _bytes(fields: Mapping[str, Any], name: str) -> bytes:
    value = fields.get(name)
    if not isinstance(value, bytes):
        raise ValueError(f"secure aggregation field {name!r} is not bytes")
    return value


def _bytes_list(fields: Mapping[str, Any], name: str, length: int) -> list[bytes]:
    value = fields.get(name)
    if not isinstance(value, list) or len(value) != length or not all(isinstance(v, bytes) for v in value):
        raise ValueError(f"secure aggregation field {name!r} is not a list of {length} byte strings")
    return value
