"""A Flower ClientApp mod that clips with a fairclip policy in the user's own ClientApp.

Add it to an existing app, with :class:`fairclip.server.dp_strategy.DifferentialPrivacy` on the
server::

    app = ClientApp(mods=[fairclip_mod])

For every train message that carries fairclip's policy (``fairclip.policy`` in its config
record), the mod lets the app train as it always does, then replaces the reply by what
fairclip's own ClientApp sends (:func:`fairclip.client.protocol.reply_content`): the update
Δ_i = θ_i − θ_t (float64, flattened in the record's key order) through the policy's client side
(:meth:`Policy.client_side`: the contribution within the round's bound, the report bits), and
nothing else -- the app's own metrics (loss, number of examples) are not covered by DP and do
not leave the node. A train message without fairclip's config, or a reply whose arrays do not
match what was sent, gets an error reply: the update is never sent unclipped. Other messages
pass through untouched.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Context, Message, MessageType
from flwr.clientapp.typing import ClientAppCallable

from fairclip.client.contributions import contribute
from fairclip.client.errors import ModError
from fairclip.client.protocol import flatten, read_policy_config, reply_content
from fairclip.strategies import build_policy
from fairclip.strategies.registry import display_name


def fairclip_mod(message: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Clip the app's update with the round's fairclip policy (module docstring)."""
    if message.metadata.message_type != MessageType.TRAIN:
        return call_next(message, context)
    try:
        sent = _single(message.content.array_records, "array")
        config = _single(message.content.config_records, "config")
        policy_config = read_policy_config(config)
        if policy_config is None:
            raise ModError("the train config holds no fairclip policy: is the server strategy fairclip's?")
        reference, params, broadcast = policy_config
        policy = build_policy(reference, params)
        if not policy.private:
            name = display_name(type(policy))
            raise ModError(
                f"the server asks for policy {name!r}, which does not clip: "
                "this mod never sends an update unclipped"
            )
        if policy.needs_cohorts:
            name = display_name(type(policy))
            raise ModError(f"policy {name!r} needs cohorts, which this mod does not send")
    except Exception as error:
        return _error(message, error)
    reply = call_next(message, context)
    if reply.has_error():
        return reply
    try:
        trained = _single(reply.content.array_records, "array")
        if list(trained.keys()) != list(sent.keys()):
            raise ModError("the app's reply holds other arrays than it was sent")
        update = flatten(trained) - flatten(sent)
        sums = contribute(policy, broadcast, update[None, :], np.zeros(1, dtype=np.int64), 1)
    except Exception as error:
        return _error(message, error)
    return Message(reply_content(sums, with_diagnostics=False), reply_to=message)


def _single(records, kind: str):
    if len(records) != 1:
        raise ModError(f"expected exactly one {kind} record, found {len(records)}")
    return next(iter(records.values()))


def _error(message: Message, error: Exception) -> Message:
    from flwr.app import Error

    return Message(Error(code=0, reason=f"fairclip_mod: {type(error).__name__}: {error}"), reply_to=message)
