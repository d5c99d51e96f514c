"""``adaptive``: hard clipping at a bound that tracks a quantile of the update norms.

Andrew, Thakkar, McMahan, Ramaswamy, "Differentially Private Learning with Adaptive
Clipping", NeurIPS 2021 (τ = 1); Esipova, Ghomi, Luo, Cresswell, "Disparate Impact in
Differential Privacy from Gradient Misalignment", ICLR 2023 (threshold multiplier τ).

Client i, round t (bound C_t broadcast by the server)::

    Δ̄_i = Δ_i · min(1, C_t / ||Δ_i||)
    b_i = 1[ ||Δ_i|| > τ · C_t ]                 (report: counts updates *above* τ·C_t)

Server, after noise (B = Σ b_i + N(0, σ_b²), b̃ = clamp(B / m̂, 0, 1))::

    C_{t+1} = max(C_LB, C_t · exp(η_C · (b̃ − γ)))

γ is the target fraction of updates above τ·C; too many above makes the bound grow. With
τ = 1 this is Andrew et al.'s rule written for clipped rather than unclipped updates
(γ = 1 − γ'). The noise of round t uses C_t, the bound that clipped round t. Here C_LB = 0;
``bounded`` is the same policy with C_LB > 0.
"""

from __future__ import annotations

import numpy as np

from fairclip.strategies import reports
from fairclip.strategies.base import Broadcast, Policy, RowScales, geometric_update, noisy_fraction
from fairclip.strategies.constant import BoundState
from fairclip.strategies.params import Fraction, NonNegativeFinite, PolicyParams, PositiveFinite


class AdaptiveClipping(Policy):
    """Hard clipping with the geometric bound update of Andrew et al. (C_LB = 0)."""

    name = "adaptive"

    class Params(PolicyParams):
        initial_bound: PositiveFinite = 1.0
        """C_0."""
        target_quantile: Fraction = 0.5
        """γ, the fraction of updates the bound aims to leave above τ·C_t."""
        threshold_multiplier: PositiveFinite = 2.5
        """τ: a client reports whether ||Δ_i|| > τ·C_t."""
        bound_lr: NonNegativeFinite = 0.2
        """η_C."""

    initial_bound: float
    target_quantile: float
    threshold_multiplier: float
    bound_lr: float
    lower_bound: float

    def __init__(self, *, num_cohorts: int = 1, **params: object) -> None:
        super().__init__(num_cohorts=num_cohorts, **params)
        self.lower_bound = float(getattr(self.params, "lower_bound", 0.0))
        """The floor C_LB of the bound (0: none; ``bounded`` sets one)."""

    def initial_state(self, dim: int) -> BoundState:
        return BoundState(self.initial_bound)

    def broadcast(self, state: BoundState) -> Broadcast:
        return {"bound": state.bound, "threshold_multiplier": self.threshold_multiplier}

    def sensitivity(self, state: BoundState) -> float:
        return state.bound

    def contribution_bounds(self, params: Broadcast, cohorts: np.ndarray) -> np.ndarray:
        return np.full(cohorts.shape[0], float(params["bound"]))

    integer_reports = True
    """Bits or one-hot counts: summed exactly under secure aggregation."""

    def report_size(self, dim: int) -> int:
        return 1

    def report_is_valid(self, report: np.ndarray, cohort: int | None) -> bool:
        return reports.is_bit(report)

    def scales(self, norms, cohorts, params) -> RowScales:
        bound = float(params["bound"])
        above = norms > float(params["threshold_multiplier"]) * bound
        n = norms.shape[0]
        return RowScales(np.ones(n), above[:, None].astype(np.float64), above, clip=np.full(n, bound))

    def next_state(self, state: BoundState, estimate, noisy_reports, expected_clients) -> BoundState:
        fraction = noisy_fraction(noisy_reports, expected_clients)
        return BoundState(
            geometric_update(state.bound, fraction, self.target_quantile, self.bound_lr, self.lower_bound)
        )
