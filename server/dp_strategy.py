"""A fairclip policy as differential privacy around any Flower strategy, in the user's own app.

Flower's ``DifferentialPrivacyClientSide*`` wrappers turn a strategy into central DP; this one
does so with any fairclip policy (``bounded`` by default) and fairclip's accounting::

    strategy = DifferentialPrivacy(FedAvg(fraction_train=1.0), "bounded", {"lower_bound": 0.05},
                                   num_clients=100, sample_rate=0.5, noise_multiplier=1.0)

and on the client, :func:`fairclip.client.mod.fairclip_mod` clips each update and adds the
policy's report bits. Per round t:

1. ``configure_train`` puts the policy's name, parameters and public broadcast (for example
   C_t) into the train config and lets the inner strategy build its train message. The wrapper
   then sends that message to each connected node kept by its own Poisson sampling with rate q
   -- the only sampling there is: an inner strategy that samples (``fraction_train`` < 1) is
   refused, because a fixed-size sample lets one client push another out, which moves the sum
   by two contributions while the accountant assumes one. The denominator is m̂ = q·N with N
   the population given as ``num_clients``: public and fixed, never the number of nodes that
   happen to be connected, which would give a client's presence away through the release's
   scale.
2. ``aggregate_train`` checks every reply exactly as fairclip's own ServerApp does
   (:func:`fairclip.server.replies.check_reply`: the contribution's norm within the bound sent,
   a report of norm at most 1 that an honest client sends) and drops the rest, sums the
   accepted contributions and reports, and runs the policy's server side: Gaussian noise
   calibrated to the sensitivity of the round that clipped, Δ̂ = S / m̂, the bound update from
   the noisy counts only.
3. The inner strategy then receives *one* synthetic reply holding θ_t + Δ̂ (weight 1), so FedAvg
   returns exactly θ_t + Δ̂ and FedAdam/FedYogi/FedAvgM apply their server optimiser to Δ̂: the
   inner strategy only ever sees the noised release (post-processing).

Nothing leaves the strategy that DP does not cover: the returned metrics are the round's bound,
noise, sensitivity, ε and the policy's public state; replies' own metrics are discarded; the
inner strategy's own log lines of a round (FedAvg's "Sampled n nodes (out of N)") are dropped
below WARNING, and the wrapper logs no count; client-side evaluation (whose metrics DP does not
cover) is not run -- evaluate centrally with ``evaluate_fn`` on the server's data. The
accountant (:class:`Accountant`) is stepped with the :class:`DPEvent` each round released.
Policies that need each client's cohort (``per-cohort``, ``reweight``) need fairclip's own
ServerApp, which learns cohorts; they are refused here.

The noise comes from OpenDP's exact sampler and the sampling from operating-system entropy.
``not_private_seed`` makes both follow a seed instead, for tests and debugging: whoever knows
the seed can subtract the noise, so such a run is not private, and its metrics say so
(``not_private`` = 1, no ``epsilon``; ``mechanism_epsilon`` is the ε the same mechanism would
have with secret randomness). So do the metrics of a wrapper that releases without noise
(``noise_multiplier = 0``), whose ε is infinite; it also warns once, when Flower starts it.
The non-private ``none`` policy is refused: it does not clip, which the mod would refuse.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fairclip.client.protocol import flatten, unflatten, write_policy_config
from fairclip.server.flower_log import WallTimeHidden, inner_strategy_quiet
from fairclip.server.optimizer import ServerSGD
from fairclip.server.replies import check_reply, collect_replies
from fairclip.server.rounds import Rounds
from fairclip.server.secure_noise import noise_source, secure_sampler
from fairclip.strategies import NoiseMultipliers, Policy, PolicyConfigError, build_policy
from fairclip.strategies.accounting import DEFAULT_COUNT_RATIO, Accountant, calibrate, calibrate_effective
from fairclip.strategies.aggregation import sum_replies
from fairclip.strategies.randomness import poisson_sample
from fairclip.strategies.registry import resolve_policy


@dataclass(frozen=True)
class _Round:
    number: int
    nodes: list[int]
    """Node ids connected when the round was configured, in order (a node's index is its
    client id in the sums' order)."""
    sampled: set[int]
    params: dict[str, Any]
    arrays: ArrayRecord
    """θ_t as the inner strategy sent it (keys, shapes and dtypes of the model's arrays)."""
    model: np.ndarray


class DifferentialPrivacy(WallTimeHidden, Strategy):
    """User-level DP with a fairclip clipping policy around an inner Flower strategy.

    ``policy``: a name (built-in, registered plug-in or ``"package.module:Class"``), a
    :class:`Policy` subclass, or an instance of one (:func:`fairclip.policies.resolve_policy`);
    ``params`` the parameters of a name or a class (an instance carries its own: giving both is
    an error). Logs and errors name the policy by its one display name
    (:func:`fairclip.policies.display_name`, also :attr:`policy_name`). ``num_clients`` is N,
    the size of the population the nodes are drawn from (required: the update is divided by the
    public m̂ = q·N, module docstring). ``sample_rate`` q, ``noise_multiplier`` σ_Δ and
    ``count_noise_multiplier`` σ_b (default 10·σ_Δ) set the mechanism; or, as Opacus'
    ``make_private_with_epsilon``, ``target_epsilon`` with ``num_rounds`` T calibrates them:
    σ_eff is the smallest σ whose ε after T rounds is at most the target
    (:func:`~fairclip.strategies.accounting.calibrate`), split σ_b = 10·σ_Δ, and a round past T
    is refused. ε at ``delta`` is accounted with ``accountant`` (``prv`` or ``rdp``). The inner
    ``strategy`` must send its train message to every node (``fraction_train=1.0``): the wrapper
    samples. Noise comes from OpenDP's exact sampler (``secure_noise``, default on).
    ``not_private_seed`` makes sampling and noise reproducible, which makes the run not private
    (module docstring): for tests and debugging only.
    """

    def __init__(
        self,
        strategy: Strategy,
        policy: str | type[Policy] | Policy = "bounded",
        params: Mapping[str, Any] | None = None,
        *,
        num_clients: int | None = None,
        sample_rate: float,
        noise_multiplier: float | None = None,
        count_noise_multiplier: float | None = None,
        target_epsilon: float | None = None,
        num_rounds: int | None = None,
        delta: float = 1e-5,
        accountant: str = "prv",
        secure_noise: bool | None = None,
        not_private_seed: int | None = None,
    ) -> None:
        super().__init__()
        resolved = resolve_policy(policy, register_class=False)
        if resolved.instance is not None:
            if params:
                raise PolicyConfigError(
                    f"policy {resolved.name!r} is an instance, which carries its own parameters: give "
                    "params with a policy name or class, not with an instance"
                )
            self.policy = resolved.instance
        else:
            self.policy = build_policy(resolved.cls, params)
        self.policy_name = resolved.name
        """The policy's one name in every output (:func:`fairclip.policies.display_name`)."""
        name = self.policy_name
        if type(self.policy).__module__ == "__main__":
            log(
                WARNING,
                "fairclip: policy %r is defined in __main__: a node in another process cannot import it "
                "and answers every round with an error; define it in a module the nodes import too",
                name,
            )
        if not self.policy.private:
            raise PolicyConfigError(
                f"policy {name!r} does not clip, and fairclip_mod never sends an update unclipped: "
                "for a non-private baseline, run the inner strategy without the wrapper"
            )
        if self.policy.needs_cohorts:
            raise PolicyConfigError(
                f"policy {name!r} needs each client's cohort: use fairclip's own ServerApp"
            )
        if self.policy.counts_first:
            raise PolicyConfigError(
                f"policy {name!r} asks its clients twice a round (counts first): use fairclip's own ServerApp"
            )
        if self.policy.noises_below_sensitivity and accountant == "prv":
            raise PolicyConfigError(
                f"policy {name!r} noises below its sensitivity (each round with its own "
                "multiplier): account it with accountant='rdp', PRV would compose one mechanism per round"
            )
        if num_clients is None:
            raise PolicyConfigError(
                "num_clients is required: the population size N, so that each round divides by the "
                "public m̂ = sample_rate·N, never by the number of nodes connected (which would reveal "
                "whether a client is among them)"
            )
        if isinstance(num_clients, bool) or not isinstance(num_clients, int) or num_clients < 1:
            raise PolicyConfigError(f"num_clients must be an integer >= 1 (got {num_clients!r})")
        if not 0 < sample_rate <= 1:
            raise PolicyConfigError(f"sample_rate must be in (0, 1] (got {sample_rate})")
        if not 0 < delta < 1:
            raise PolicyConfigError(f"delta must be in (0, 1) (got {delta})")
        _refuse_inner_sampling(strategy)
        if not_private_seed is not None and (
            isinstance(not_private_seed, bool) or not isinstance(not_private_seed, int)
        ):
            raise PolicyConfigError(f"not_private_seed must be an integer (got {not_private_seed!r})")
        self.target_epsilon, self.num_rounds = _check_target(
            self.policy, noise_multiplier, count_noise_multiplier, target_epsilon, num_rounds, name
        )
        if self.target_epsilon is not None:
            # σ_eff now, so that a budget no σ reaches fails here; its split between the update
            # and the reports waits for the model's size (the policy's report length may need it).
            calibrate_effective(self.target_epsilon, sample_rate, self.num_rounds, delta, accountant)
            self.noise: NoiseMultipliers | None = None  # calibrated at the first round
        else:
            count = (
                DEFAULT_COUNT_RATIO * noise_multiplier
                if count_noise_multiplier is None
                else count_noise_multiplier
            )
            self.noise = NoiseMultipliers(float(noise_multiplier), float(count))
        self.strategy = strategy
        self.num_clients = num_clients
        self.sample_rate = float(sample_rate)
        self.delta = float(delta)
        self.accountant = Accountant(accountant)
        self.not_private_seed = not_private_seed
        self._sampler = secure_sampler(
            (not_private_seed is None if secure_noise is None else secure_noise) and self.policy.private
        )
        self.rounds: Rounds | None = None
        """The round server (noise, bound update, accountant), made at the first round, once the
        model's size is known; its optimizer is plain θ_t + Δ̂, the inner strategy steps after."""
        self._round: _Round | None = None
        self.dropped: list[dict[str, Any]] = []
        """Internal record of dropped replies (round, node, reason): not for publication."""

    @property
    def expected_clients(self) -> float:
        """m̂ = q·N, the public denominator of every round's update."""
        return self.sample_rate * self.num_clients

    def summary(self) -> None:
        if self.noise is None:
            noise = f"target ε={self.target_epsilon:g} at δ={self.delta:g} over T={self.num_rounds} rounds"
        else:
            noise = f"σ_Δ={self.noise.update:g}"
        log(
            INFO,
            "\t├──> fairclip DP: policy %r, N=%d, q=%g, %s",
            self.policy_name,
            self.num_clients,
            self.sample_rate,
            noise,
        )
        if self.not_private_seed is not None:
            log(INFO, "\t├──> fairclip DP: NOT PRIVATE (not_private_seed): sampling and noise follow a seed")
        if self.noise is not None and self.noise.update <= 0:
            log(
                WARNING,
                "\t├──> fairclip DP: NOT PRIVATE: policy %r releases its updates without noise "
                "(its rounds report not_private = 1 and no epsilon)",
                self.policy_name,
            )
        self.strategy.summary()

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        model = flatten(arrays)
        # by the rounds released (charged), not the round number: a strategy started again counts
        # from round 1, but its accountant goes on
        released = self.accountant.rounds
        if self.num_rounds is not None and max(server_round, released + 1) > self.num_rounds:
            raise PolicyConfigError(
                f"round {server_round}: the privacy budget (target_epsilon {self.target_epsilon:g}) "
                f"was spent in num_rounds = {self.num_rounds} rounds ({released} released by this "
                f"strategy); start the strategy with num_rounds <= {self.num_rounds}, once"
            )
        if self.rounds is None:
            if self.target_epsilon is not None:
                self.noise = calibrate(
                    self.target_epsilon,
                    self.sample_rate,
                    self.num_rounds,
                    self.delta,
                    self.accountant.mechanism,
                    releases_reports=self.policy.report_size(model.size) > 0,
                )
            self.rounds = Rounds(
                policy=self.policy,
                model=model,
                noise=self.noise,
                sample_rate=self.sample_rate,
                expected_clients=self.expected_clients,
                optimizer=ServerSGD(1.0),
                accountant=self.accountant,
                noise_source=self._noise,
            )
        self.rounds.model = model  # the inner strategy's θ_t
        params = self.rounds.broadcast()
        write_policy_config(config, self.policy, params)
        with inner_strategy_quiet():  # its log names the number of nodes it sampled
            template = _one_message(self.strategy.configure_train(server_round, arrays, config, grid))
        nodes = sorted(int(node) for node in grid.get_node_ids())
        sample = poisson_sample(self.not_private_seed, server_round, len(nodes), self.sample_rate)
        kept = [nodes[int(index)] for index in sample]
        self._round = _Round(server_round, nodes, set(kept), params, arrays, model)
        return [
            Message(
                template.content,
                dst_node_id=node,
                message_type=MessageType.TRAIN,
                ttl=template.metadata.ttl,
                group_id=template.metadata.group_id,
            )
            for node in kept
        ]

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        plan = self._round
        if plan is None or plan.number != server_round:
            raise RuntimeError(f"round {server_round} was not configured")
        dim = plan.model.shape[0]
        index = {node: position for position, node in enumerate(plan.nodes)}
        collected = collect_replies(
            replies,
            index,
            {index[node] for node in plan.sampled},
            lambda content, _client: check_reply(
                content, policy=self.policy, params=plan.params, dim=dim, cohort=None, num_cohorts=1
            ),
        )
        for client, reason in collected.dropped:
            self.dropped.append({"round": server_round, "node": plan.nodes[client], "reason": reason})
        for node in collected.unexpected:
            reason = "a reply from a node that was not sampled"
            self.dropped.append({"round": server_round, "node": node, "reason": reason})
        sums = sum_replies(collected.accepted, max(len(plan.nodes), 1), dim, self.policy.report_size(dim), 1)
        rounds = self.rounds
        rounds.model = plan.model
        released = rounds.release(server_round, sums)
        arrays = unflatten(rounds.model, plan.arrays)  # θ_t + Δ̂
        weight_key = str(getattr(self.strategy, "weighted_by_key", "num-examples"))
        synthetic = Message(
            RecordDict({"arrays": arrays, "metrics": MetricRecord({weight_key: 1})}),
            dst_node_id=0,
            message_type=MessageType.TRAIN,
        )
        with inner_strategy_quiet():
            aggregated, _ = self.strategy.aggregate_train(server_round, [synthetic])
        epsilon = self.accountant.get_epsilon(self.delta)
        metrics = {
            "clip_bound": released.clip_bound,
            "noise_std": released.noise_std,
            "sensitivity": released.sensitivity,
            **released.info,
        }
        if self.not_private_seed is None and math.isfinite(epsilon):
            metrics["epsilon"] = epsilon
        else:  # the seed gives the noise away, or nothing is private (σ = 0)
            metrics.update(not_private=1.0, mechanism_epsilon=epsilon)
        return aggregated, MetricRecord({k: float(v) for k, v in metrics.items() if math.isfinite(v)})

    @property
    def state(self) -> Any:
        """The policy's state (for example the bound of the coming round)."""
        return self.rounds.state if self.rounds is not None else None

    def _noise(self, round_number: int) -> Any:
        return noise_source(self._sampler, self.not_private_seed, round_number)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return []  # client-side metrics are not covered by DP: evaluate centrally (evaluate_fn)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return None


def _refuse_inner_sampling(strategy: Strategy) -> None:
    """Refuse an inner strategy that samples nodes itself (module docstring, step 1)."""
    fraction = getattr(strategy, "fraction_train", 1.0)
    if fraction != 1.0:
        raise PolicyConfigError(
            f"the inner strategy samples its own nodes (fraction_train={fraction!r}): give it "
            "fraction_train=1.0 and set the rate with sample_rate, the wrapper's Poisson sampling, "
            "which is the sampling the accountant assumes"
        )


def _one_message(messages: Iterable[Message]) -> Message:
    """The train message the inner strategy configured: one content for every node it addressed
    (the wrapper sends it to the nodes it samples), else :class:`PolicyConfigError`."""
    messages = list(messages)
    if not messages:
        raise PolicyConfigError("the inner strategy configured no train message (is fraction_train 0?)")
    first = messages[0].content
    if any(message.content is not first and message.content != first for message in messages[1:]):
        raise PolicyConfigError(
            "the inner strategy sends different content to different nodes; the wrapper sends one "
            "train message to every node it samples"
        )
    return messages[0]


__all__ = ["DifferentialPrivacy"]


def _check_target(
    policy: Policy,
    noise_multiplier: float | None,
    count_noise_multiplier: float | None,
    target_epsilon: float | None,
    num_rounds: int | None,
    name: str,
) -> tuple[float | None, int | None]:
    """The wrapper's (target ε, T), after checking that exactly one way to set the noise is given."""
    if (noise_multiplier is None) == (target_epsilon is None):
        raise PolicyConfigError(
            "give either noise_multiplier or target_epsilon (with num_rounds), not both or neither"
        )
    if target_epsilon is None:
        if num_rounds is not None:
            raise PolicyConfigError(
                "num_rounds goes with target_epsilon (it is the T the budget is spent in)"
            )
        if isinstance(noise_multiplier, bool) or not isinstance(noise_multiplier, (int, float)):
            raise PolicyConfigError(f"noise_multiplier must be a number (got {noise_multiplier!r})")
        return None, None
    if not policy.private:
        raise PolicyConfigError(f"policy {name!r} is not private: it has no epsilon to target")
    if count_noise_multiplier is not None:
        raise PolicyConfigError(
            "count_noise_multiplier is calibrated with target_epsilon: give noise multipliers instead"
        )
    if isinstance(target_epsilon, bool) or not isinstance(target_epsilon, (int, float)):
        raise PolicyConfigError(f"target_epsilon must be a number (got {target_epsilon!r})")
    if isinstance(num_rounds, bool) or not isinstance(num_rounds, int) or num_rounds < 1:
        raise PolicyConfigError(f"target_epsilon needs num_rounds, an integer >= 1 (got {num_rounds!r})")
    return float(target_epsilon), num_rounds
