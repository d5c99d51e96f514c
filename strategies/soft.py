"""``soft``: tanh soft clipping, fixed or with the adaptive bound (SoftAdaClip, seed 001).

Client i, round t::

    Δ̄_i = Δ_i · tanh(C_t / (||Δ_i|| + ε))        ε = ``tanh_epsilon`` (1e-6)
    b_i = 1[ ||Δ_i|| > τ · C_t ]                  (only with ``adaptive = true``; τ = 1)

Since tanh(x) <= x, ||Δ̄_i|| = ||Δ_i|| tanh(C_t / (||Δ_i|| + ε)) < C_t, so the sensitivity is C_t.
Small updates are scaled almost linearly (factor ≈ C_t / ||Δ_i||, then saturating) instead of
being left untouched, and large ones approach norm C_t smoothly. With ``adaptive = true`` the
bound follows the geometric rule of ``adaptive``
(C_{t+1} = max(C_LB, C_t · exp(η_C · (b̃ − γ)))); with ``adaptive = false`` it is fixed
(seed 001, Algorithm 3) and no count is released.
"""

from __future__ import annotations

import numpy as np
from pydantic import model_validator

from fairclip.strategies import reports
from fairclip.strategies.base import Broadcast, Policy, RowScales, geometric_update, noisy_fraction
from fairclip.strategies.constant import BoundState
from fairclip.strategies.params import (
    Fraction,
    NonNegativeFinite,
    PolicyParams,
    PositiveFinite,
    lower_bound_within,
)


class SoftClipping(Policy):
    """tanh clipping; the bound is adaptive unless ``adaptive = false``."""

    name = "soft"

    class Params(PolicyParams):
        initial_bound: PositiveFinite = 1.0
        """C_0."""
        adaptive: bool = True
        """Whether the bound adapts (as ``adaptive``); false keeps it at C_0."""
        target_quantile: Fraction = 0.5
        """γ."""
        threshold_multiplier: PositiveFinite = 1.0
        """τ."""
        bound_lr: NonNegativeFinite = 0.2
        """η_C."""
        lower_bound: NonNegativeFinite = 0.0
        """C_LB (0: no floor), at most C_0."""
        tanh_epsilon: PositiveFinite = 1e-6
        """ε of the tanh transform's small-norm guard."""

        @model_validator(mode="after")
        def _floor_within_start(self) -> SoftClipping.Params:
            lower_bound_within(self.lower_bound, self.initial_bound)
            return self

    initial_bound: float
    adaptive: bool
    target_quantile: float
    threshold_multiplier: float
    bound_lr: float
    lower_bound: float
    tanh_epsilon: float

    def initial_state(self, dim: int) -> BoundState:
        return BoundState(self.initial_bound)

    def broadcast(self, state: BoundState) -> Broadcast:
        return {
            "bound": state.bound,
            "threshold_multiplier": self.threshold_multiplier,
            "tanh_epsilon": self.tanh_epsilon,
        }

    def sensitivity(self, state: BoundState) -> float:
        return state.bound

    def contribution_bounds(self, params: Broadcast, cohorts: np.ndarray) -> np.ndarray:
        return np.full(cohorts.shape[0], float(params["bound"]))

    integer_reports = True
    """Bits or one-hot counts: summed exactly under secure aggregation."""

    def report_size(self, dim: int) -> int:
        return 1 if self.adaptive else 0

    def report_is_valid(self, report: np.ndarray, cohort: int | None) -> bool:
        return reports.is_bit(report) if self.adaptive else reports.is_empty(report)

    def scales(self, norms, cohorts, params) -> RowScales:
        bound = float(params["bound"])
        factors = np.tanh(bound / (norms + float(params["tanh_epsilon"])))
        above = norms > float(params["threshold_multiplier"]) * bound
        reports = above[:, None].astype(np.float64) if self.adaptive else np.zeros((norms.shape[0], 0))
        return RowScales(factors, reports, above)

    def next_state(self, state: BoundState, estimate, noisy_reports, expected_clients) -> BoundState:
        if not self.adaptive:
            return state
        fraction = noisy_fraction(noisy_reports, expected_clients)
        return BoundState(
            geometric_update(state.bound, fraction, self.target_quantile, self.bound_lr, self.lower_bound)
        )
