"""``none``: no clipping and no noise -- plain unweighted FedAvg, the non-private reference.

    Δ̂_t = (1/n_t) Σ_{i ∈ S_t} Δ_i        (n_t = number of clients that reported)

Every disparate-impact figure of fairclip (privacy cost π_k, excessive risk R_k) is measured
against this policy run on the same scenario and seed. Its ε is infinite.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fairclip.strategies.base import (
    Broadcast,
    GaussianSampler,
    NoiseMultipliers,
    Policy,
    RowScales,
    ServerRound,
)


@dataclass(frozen=True)
class NoState:
    """``none`` keeps no state."""


class NoClipping(Policy):
    """Identity client transform; the server averages over the clients that reported."""

    name = "none"
    private = False

    def initial_state(self, dim: int) -> NoState:
        return NoState()

    def broadcast(self, state: NoState) -> Broadcast:
        return {}

    def sensitivity(self, state: NoState) -> float:
        return float("inf")

    def contribution_bounds(self, params: Broadcast, cohorts: np.ndarray) -> np.ndarray:
        return np.full(cohorts.shape[0], np.inf)

    def scales(self, norms, cohorts, params) -> RowScales:
        n = norms.shape[0]
        return RowScales(np.ones(n), np.zeros((n, 0)), np.zeros(n, dtype=bool))

    def server_side(
        self,
        state: NoState,
        contribution_sum: np.ndarray,
        report_sum: np.ndarray | None,
        *,
        expected_clients: float,
        num_reports: int,
        noise: NoiseMultipliers,
        rng: np.random.Generator | GaussianSampler,
        released_reports: np.ndarray | None = None,
    ) -> ServerRound:
        estimate = contribution_sum / num_reports if num_reports > 0 else np.zeros_like(contribution_sum)
        return ServerRound(
            estimate=estimate,
            state=state,
            sensitivity=float("inf"),
            clip_bound=float("inf"),
            server_lr_factor=1.0,
            noise_std=0.0,
            noisy_reports=None,
        )
