"""The server of user-level DP federated averaging, one round at a time (docs/design.md, section 2).

Built from explicit parts, so any engine -- the in-process and Ray simulations, fairclip's Flower
ServerApp -- drives the same object, and nothing here knows about scenarios or files:

* ``policy`` -- its server side noises the sums with the sensitivity of the round that clipped,
  forms Δ̂ and moves its state; it returns the round's :class:`DPEvent`;
* ``noise`` -- the multipliers σ_Δ, σ_b; ``noise_source(t)`` the Gaussian sampler of round t;
* ``accountant`` -- stepped with each round's event at sampling rate q: ε follows what ran;
* ``optimizer`` -- the server step θ_{t+1} = θ_t + η_s·ρ_t·v_{t+1} on Δ̂;
* ``sampler(t)`` -- the client ids of round t (Poisson sampling with rate q);
* ``evaluator(θ)`` -- (overall, per-cohort) metrics of a model on the server's own test data.

A round: ``sample(t)``, send ``broadcast()`` and ``model`` to the sampled clients, collect their
:class:`RoundSums`, ``release(t, sums)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fairclip.server.optimizer import ServerSGD
from fairclip.strategies import NoiseMultipliers, Policy, ServerRound
from fairclip.strategies.accounting import Accountant
from fairclip.strategies.aggregation import RoundSums
from fairclip.strategies.base import Broadcast, DPEvent, GaussianSampler

Evaluator = Callable[[np.ndarray], tuple[dict[str, float], dict[str, dict[str, float]]]]
"""θ -> (overall metrics, metrics per cohort)."""


@dataclass
class RoundServer:
    """Model θ_t, policy state and privacy spent, moved one released round at a time."""

    policy: Policy
    model: np.ndarray
    noise: NoiseMultipliers
    sample_rate: float
    expected_clients: float
    """m̂ = qN, the public denominator of Δ̂."""
    optimizer: ServerSGD
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

    def __post_init__(self) -> None:
        if self.state is None:
            self.state = self.policy.initial_state(self.model.shape[0])

    def sample(self, round_number: int) -> np.ndarray:
        """Ids of the clients of round ``round_number``."""
        if self.sampler is None:
            raise RuntimeError("this round server has no sampler")
        return self.sampler(round_number)

    def broadcast(self) -> Broadcast:
        """The policy's public parameters of the coming round (for example C_t)."""
        return self.policy.broadcast(self.state)

    def release(self, round_number: int, sums: RoundSums) -> ServerRound:
        """Noise the clients' sums, step the model, move the state and account for the round."""
        released = self.policy.server_side(
            self.state,
            sums.contribution_sum,
            sums.report_sum,
            expected_clients=self.expected_clients,
            num_reports=sums.num_reports,
            noise=self.noise,
            rng=self.noise_source(round_number),
        )
        self.model = self.optimizer.step(self.model, released.estimate, released.server_lr_factor)
        self.state = released.state
        self.accountant.step(released.event, self.sample_rate)
        self.last_event = released.event
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
