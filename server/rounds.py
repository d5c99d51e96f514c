"""The server of user-level DP federated averaging, one round at a time (docs/design.md, section 2).

Built from explicit parts, so whatever drives the rounds -- the in-process and Ray simulations,
fairclip's Flower ServerApp -- drives the same object, and nothing here knows about scenarios or files:

* ``policy`` -- its server side noises the sums with the sensitivity of the round that clipped,
  forms Δ̂ and moves its state; it returns the round's :class:`DPEvent`;
* ``noise`` -- the multipliers σ_Δ, σ_b; ``noise_source(t)`` the Gaussian sampler of round t;
* ``accountant`` -- stepped with each round's event at sampling rate q: ε follows what ran;
* ``optimizer`` -- the server step θ_{t+1} = θ_t + η_s·ρ_t·v_{t+1} on Δ̂;
* ``sampler(t)`` -- the client ids of round t (Poisson sampling with rate q);
* ``evaluator(θ)`` -- (overall, per-cohort) metrics of a model on the server's own test data.

A round: ``sample(t)``, send ``broadcast()`` and ``model`` to the sampled clients, collect their
:class:`RoundSums`, ``release(t, sums)``. A policy that releases its counts first
(:attr:`Policy.counts_first`) has two exchanges with the same clients: ``broadcast()``, collect
their report sums, ``release_counts(t, sums)``; then ``broadcast()`` again (now the round's own
bounds), collect their contributions, ``release(t, sums)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fairclip.server.optimizer import ServerOptimizer
from fairclip.strategies import NoiseMultipliers, Policy, ServerRound
from fairclip.strategies.accounting import Accountant
from fairclip.strategies.aggregation import RoundSums
from fairclip.strategies.base import Broadcast, CountRelease, DPEvent, GaussianSampler, as_sampler
from fairclip.strategies.errors import NotFiniteError

Evaluator = Callable[[np.ndarray], tuple[dict[str, float], dict[str, dict[str, float]]]]
"""θ -> (overall metrics, metrics per cohort)."""


@dataclass
class Rounds:
    """Model θ_t, policy state and privacy spent, moved one released round at a time."""

    policy: Policy
    model: np.ndarray
    noise: NoiseMultipliers
    sample_rate: float
    expected_clients: float
    """m̂ = qN, the public denominator of Δ̂."""
    optimizer: ServerOptimizer
    accountant: Accountant
    noise_source: Callable[[int], np.random.Generator | GaussianSampler]
    sampler: Callable[[int], np.ndarray] | None = None
    """``None`` where something else samples (the inner strategy of a Flower app)."""
    evaluator: Evaluator | None = None
    """``None`` where something else evaluates."""
    state: Any = field(default=None)
    rounds_completed: int = 0
    last_event: DPEvent | None = None
    """What the last released round released (``None`` before the first)."""
    pending: _CountedRound | None = None
    """A counts-first round whose counts are released and whose contributions are not yet."""
    rounding_slack: float | None = None
    """ρ where the sums are secure sums of quantised vectors: the noise then uses the quantised
    sensitivity s·(1+ρ) (:meth:`Policy.server_side`); ``None``: exact sums."""

    def __post_init__(self) -> None:
        if self.state is None:
            self.state = self.policy.initial_state(self.model.shape[0])

    def sample(self, round_number: int) -> np.ndarray:
        """Ids of the clients of round ``round_number``."""
        if self.sampler is None:
            raise RuntimeError("this round server has no sampler")
        return self.sampler(round_number)

    def broadcast(self) -> Broadcast:
        """The policy's public parameters of the coming exchange (for example C_t; after
        :meth:`release_counts`, the bounds its counts set for this round), checked against the
        sensitivity of the state that clips with them (:meth:`Policy.checked_broadcast`)."""
        return self.policy.checked_broadcast(self.pending.counts.state if self.pending else self.state)

    def release_counts(self, round_number: int, sums: RoundSums) -> np.ndarray:
        """The first exchange of a counts-first round: noise the report sum, keep the state that
        clips this round, and return the noisy counts. The accountant is stepped with the whole
        round's event here, at its first release, so ε covers the counts even if the round is
        cut off before its contributions arrive."""
        if self.pending is not None:
            raise RuntimeError(f"round {self.pending.number}'s counts are released already")
        noise = as_sampler(self.noise_source(round_number))
        counts = self.policy.count_side(
            self.state, sums.report_sum, expected_clients=self.expected_clients, noise=self.noise, rng=noise
        )
        # the whole round's event, with the noise scale of the state that clips it
        event = self.policy.round_event(counts.state, self.noise, releases_reports=True)
        self.accountant.step(event, self.sample_rate)
        self.last_event = event
        self.pending = _CountedRound(round_number, counts, noise)
        return counts.noisy_reports

    def release(self, round_number: int, sums: RoundSums) -> ServerRound:
        """Noise the clients' sums, step the model, move the state and account for the round."""
        counted = self.pending
        if self.policy.counts_first and (counted is None or counted.number != round_number):
            raise RuntimeError(f"round {round_number}'s counts were not released first")
        # (released_reports only where there are some: a policy's own server_side may predate it)
        counts = {"released_reports": counted.counts.noisy_reports} if counted else {}
        if self.rounding_slack is not None:  # only then: a policy's own server_side may predate it
            counts["rounding_slack"] = self.rounding_slack
        released = self.policy.server_side(
            counted.counts.state if counted else self.state,
            sums.contribution_sum,
            sums.report_sum,
            expected_clients=self.expected_clients,
            num_reports=sums.num_reports,
            noise=self.noise,
            rng=counted.noise if counted else self.noise_source(round_number),
            **counts,
        )
        if counted is None:  # a counts-first round was accounted at its first release
            self.accountant.step(released.event, self.sample_rate)
        self.pending = None
        self.last_event = released.event
        # the checks below read released values only, and the round is accounted before they can
        # stop the run: a model that is not finite, or a state whose bound is not a finite
        # number > 0 (PolicyError), ends it here, the round not taken
        model = self.optimizer.step(
            self.model, released.estimate, released.server_lr_factor, released.estimate_noise_std
        )
        if not np.isfinite(model).all():
            raise NotFiniteError(
                f"round {round_number}: the model is not finite after the server step (is the server "
                "learning rate too large?); the run cannot learn"
            )
        self.policy.checked_broadcast(released.state)
        self.model = model
        self.state = released.state
        self.rounds_completed = round_number
        return released

    def evaluate(self) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
        """The current model's metrics, overall and per cohort."""
        if self.evaluator is None:
            raise RuntimeError("this round server has no evaluator")
        return self.evaluator(self.model)

    @property
    def clip_bound(self) -> float:
        """The bound that will clip the coming round."""
        return float(self.policy.clip_bound(self.state))


@dataclass(frozen=True)
class _CountedRound:
    """A counts-first round between its two exchanges: its number, what its counts released,
    and the noise stream the rest of the round draws from (the one that noised the counts)."""

    number: int
    counts: CountRelease
    noise: GaussianSampler
