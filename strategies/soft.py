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

from fairclip.strategies import checks, reports
from fairclip.strategies.base import Broadcast, Policy, geometric_update, noisy_fraction
from fairclip.strategies.constant import BoundState


class SoftClipping(Policy):
    """tanh clipping; the bound is adaptive unless ``adaptive = false``."""

    name = "soft"

    def __init__(
        self,
        *,
        initial_bound: float = 1.0,
        adaptive: bool = True,
        target_quantile: float = 0.5,
        threshold_multiplier: float = 1.0,
        bound_lr: float = 0.2,
        lower_bound: float = 0.0,
        tanh_epsilon: float = 1e-6,
        num_cohorts: int = 1,
        normalize: bool = False,
    ):
        super().__init__(num_cohorts=num_cohorts, normalize=normalize)
        self.initial_bound = checks.positive("initial_bound", initial_bound)
        self.adaptive = checks.flag("adaptive", adaptive)
        self.target_quantile = checks.fraction("target_quantile", target_quantile)
        self.threshold_multiplier = checks.positive("threshold_multiplier", threshold_multiplier)
        self.bound_lr = checks.non_negative("bound_lr", bound_lr)
        self.lower_bound = checks.non_negative("lower_bound", lower_bound)
        self.tanh_epsilon = checks.positive("tanh_epsilon", tanh_epsilon)
        checks.lower_bound_within(self.lower_bound, self.initial_bound)

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

    def report_size(self, dim: int) -> int:
        return 1 if self.adaptive else 0

    def report_is_valid(self, report: np.ndarray, cohort: int | None) -> bool:
        return reports.is_bit(report) if self.adaptive else reports.is_empty(report)

    def transform(self, updates, norms, cohorts, params):
        bound = float(params["bound"])
        factors = np.tanh(bound / (norms + float(params["tanh_epsilon"])))
        above = norms > float(params["threshold_multiplier"]) * bound
        reports = above[:, None].astype(np.float64) if self.adaptive else np.zeros((updates.shape[0], 0))
        return updates * factors[:, None], reports, above

    def next_state(self, state: BoundState, estimate, noisy_reports, expected_clients) -> BoundState:
        if not self.adaptive:
            return state
        fraction = noisy_fraction(noisy_reports, expected_clients)
        return BoundState(
            geometric_update(state.bound, fraction, self.target_quantile, self.bound_lr, self.lower_bound)
        )
