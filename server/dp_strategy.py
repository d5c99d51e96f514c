"""A fairclip policy as differential privacy around any Flower strategy, in the user's own app.

Flower's ``DifferentialPrivacyClientSide*`` wrappers turn a strategy into central DP; this one
does so with any fairclip policy (``bounded`` by default) and fairclip's accounting::

    strategy = DifferentialPrivacy(FedAvg(fraction_train=1.0), "bounded", {"lower_bound": 0.05},
                                   sample_rate=0.5, noise_multiplier=1.0)

and on the client, :func:`fairclip.client.mod.fairclip_mod` clips each update and adds the
policy's report bits. Per round t:

1. ``configure_train`` puts the policy's name, parameters and public broadcast (for example
   C_t) into the train config, lets the inner strategy configure its messages, and keeps each
   node with probability q (Poisson sampling; seeded when a ``seed`` is given). m̂ = q·n, with n
   the number of nodes the inner strategy configured (public), is the denominator.
2. ``aggregate_train`` checks every reply exactly as fairclip's own ServerApp does
   (:func:`fairclip.server.replies.check_reply`: the contribution's norm within the bound sent,
   an honest report) and drops the rest, sums the accepted contributions and reports, and runs
   the policy's server side: Gaussian noise calibrated to the sensitivity of the round that
   clipped, Δ̂ = S / m̂, the bound update from the noisy counts only.
3. The inner strategy then receives *one* synthetic reply holding θ_t + Δ̂ (weight 1), so FedAvg
   returns exactly θ_t + Δ̂ and FedAdam/FedYogi/FedAvgM apply their server optimiser to Δ̂: the
   inner strategy only ever sees the noised release (post-processing).

Nothing leaves the strategy that DP does not cover: the returned metrics are the round's bound,
noise, sensitivity, ε and the policy's public state; replies' own metrics are discarded, and
client-side evaluation (whose metrics DP does not cover) is not run -- evaluate centrally with
``evaluate_fn`` on the server's data. The accountant (:class:`Accountant`) is stepped with the
:class:`DPEvent` each round released. Policies that need each client's cohort (``per-cohort``,
``reweight``) need fairclip's own ServerApp, which learns cohorts; they are refused here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from logging import INFO
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fairclip.client.protocol import flatten, unflatten, write_policy_config
from fairclip.server.optimizer import ServerSGD
from fairclip.server.replies import ReplyError, check_reply
from fairclip.server.round_server import RoundServer
from fairclip.strategies import NoiseMultipliers, Policy, build_policy
from fairclip.strategies.accounting import DEFAULT_COUNT_RATIO, Accountant
from fairclip.strategies.aggregation import RoundSums, sum_replies
from fairclip.strategies.randomness import Stream, rng


@dataclass(frozen=True)
class _Round:
    number: int
    nodes: list[int]
    """Node ids of the round's candidates, in order (a node's index is its client id here)."""
    sampled: set[int]
    params: dict[str, Any]
    arrays: ArrayRecord
    """θ_t as the inner strategy sent it (keys, shapes and dtypes of the model's arrays)."""
    model: np.ndarray
    expected_clients: float


class DifferentialPrivacy(Strategy):
    """User-level DP with a fairclip clipping policy around an inner Flower strategy.

    ``policy``: a strategy name (built-in or plug-in) or a :class:`Policy`; ``params`` its
    parameters. ``sample_rate`` q, ``noise_multiplier`` σ_Δ and ``count_noise_multiplier`` σ_b
    (default 10·σ_Δ) set the mechanism; ε at ``delta`` is accounted with ``accountant`` (``prv``
    or ``rdp``). ``seed`` makes sampling and noise reproducible (numpy's sampler); without one,
    noise comes from OpenDP's exact sampler (``secure_noise``, default: on without a seed).
    """

    def __init__(
        self,
        strategy: Strategy,
        policy: str | Policy = "bounded",
        params: Mapping[str, Any] | None = None,
        *,
        sample_rate: float,
        noise_multiplier: float,
        count_noise_multiplier: float | None = None,
        delta: float = 1e-5,
        accountant: str = "prv",
        seed: int | None = None,
        secure_noise: bool | None = None,
    ) -> None:
        super().__init__()
        if isinstance(policy, Policy):
            if params:
                raise ValueError("give params with a policy name, not with a Policy object")
            self.policy = policy
        else:
            self.policy = build_policy(policy, params)
        if self.policy.needs_cohorts:
            raise ValueError(
                f"policy {self.policy.name!r} needs each client's cohort: use fairclip's own ServerApp"
            )
        if self.policy.counts_first:
            raise ValueError(
                f"policy {self.policy.name!r} asks its clients twice a round (counts first): "
                "use fairclip's own ServerApp"
            )
        if not 0 < sample_rate <= 1:
            raise ValueError(f"sample_rate must be in (0, 1] (got {sample_rate})")
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1) (got {delta})")
        count = (
            DEFAULT_COUNT_RATIO * noise_multiplier
            if count_noise_multiplier is None
            else count_noise_multiplier
        )
        self.noise = NoiseMultipliers(float(noise_multiplier), float(count))
        self.strategy = strategy
        self.sample_rate = float(sample_rate)
        self.delta = float(delta)
        self.accountant = Accountant(accountant)
        self.seed = seed
        self._sampler = None
        if (seed is None if secure_noise is None else secure_noise) and self.policy.private:
            from fairclip.server.secure_noise import ExactGaussian

            self._sampler = ExactGaussian()
        self.rounds: RoundServer | None = None
        """The round server (noise, bound update, accountant), made at the first round, once the
        model's size is known; its optimizer is plain θ_t + Δ̂, the inner strategy steps after."""
        self._round: _Round | None = None
        self.dropped: list[dict[str, Any]] = []
        """Internal record of dropped replies (round, node, reason): not for publication."""

    def summary(self) -> None:
        log(
            INFO,
            "\t├──> fairclip DP: policy %r, q=%g, σ_Δ=%g",
            self.policy.name,
            self.sample_rate,
            self.noise.update,
        )
        self.strategy.summary()

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        model = flatten(arrays)
        if self.rounds is None:
            self.rounds = RoundServer(
                policy=self.policy,
                model=model,
                noise=self.noise,
                sample_rate=self.sample_rate,
                expected_clients=1.0,
                optimizer=ServerSGD(1.0),
                accountant=self.accountant,
                noise_source=self._noise,
            )
        self.rounds.model = model  # the inner strategy's θ_t
        params = self.rounds.broadcast()
        write_policy_config(config, self.policy, params)
        candidates = sorted(self.strategy.configure_train(server_round, arrays, config, grid), key=_node)
        nodes = [_node(message) for message in candidates]
        if self.seed is not None:
            draws = rng(self.seed, Stream.SAMPLING, server_round).random(len(candidates))
        else:
            draws = np.random.default_rng().random(len(candidates))
        kept = [message for message, draw in zip(candidates, draws, strict=True) if draw < self.sample_rate]
        self._round = _Round(
            server_round,
            nodes,
            {_node(message) for message in kept},
            params,
            arrays,
            model,
            self.sample_rate * max(len(candidates), 1),
        )
        return kept

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        plan = self._round
        if plan is None or plan.number != server_round:
            raise RuntimeError(f"round {server_round} was not configured")
        dim = plan.model.shape[0]
        index = {node: position for position, node in enumerate(plan.nodes)}
        accepted: dict[int, RoundSums] = {}
        for reply in replies:
            node = _source(reply)
            try:
                if node not in plan.sampled or index[node] in accepted:
                    raise ReplyError("a reply from a node that was not sampled, or a second one")
                if reply.has_error():
                    raise ReplyError(f"client error: {reply.error.reason}")
                accepted[index[node]] = check_reply(
                    reply.content, policy=self.policy, params=plan.params, dim=dim, cohort=None, num_cohorts=1
                )
            except Exception as error:  # any failure to read or check a reply drops it
                self.dropped.append({"round": server_round, "node": node, "reason": str(error)})
        sums = sum_replies(accepted, max(len(plan.nodes), 1), dim, self.policy.report_size(dim), 1)
        rounds = self.rounds
        rounds.model, rounds.expected_clients = plan.model, plan.expected_clients
        released = rounds.release(server_round, sums)
        arrays = unflatten(rounds.model, plan.arrays)  # θ_t + Δ̂
        weight_key = str(getattr(self.strategy, "weighted_by_key", "num-examples"))
        synthetic = Message(
            RecordDict({"arrays": arrays, "metrics": MetricRecord({weight_key: 1})}),
            dst_node_id=0,
            message_type=MessageType.TRAIN,
        )
        aggregated, _ = self.strategy.aggregate_train(server_round, [synthetic])
        metrics = {
            "clip_bound": released.clip_bound,
            "noise_std": released.noise_std,
            "sensitivity": released.sensitivity,
            "epsilon": self.accountant.get_epsilon(self.delta),
            **released.info,
        }
        return aggregated, MetricRecord({k: float(v) for k, v in metrics.items() if math.isfinite(v)})

    @property
    def state(self) -> Any:
        """The policy's state (for example the bound of the coming round)."""
        return self.rounds.state if self.rounds is not None else None

    def _noise(self, round_number: int) -> Any:
        if self._sampler is not None:
            return self._sampler
        if self.seed is not None:
            return rng(self.seed, Stream.NOISE, round_number)
        return np.random.default_rng()

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return []  # client-side metrics are not covered by DP: evaluate centrally (evaluate_fn)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return None


def _node(message: Message) -> int:
    return int(message.metadata.dst_node_id)


def _source(message: Message) -> int | None:
    try:
        return int(message.metadata.src_node_id)
    except Exception:  # a reply without readable metadata is dropped
        return None


__all__ = ["DifferentialPrivacy"]
