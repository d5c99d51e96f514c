"""``global-adapt``: global scaling with an adaptive threshold (Esipova et al. 2023, seed 003).

Esipova, Ghomi, Luo, Cresswell, "Disparate Impact in Differential Privacy from Gradient
Misalignment", ICLR 2023, Algorithm 2 (DPSGD-Global-Adapt)::

    Δ̄_i = Δ_i · C_0 / max(||Δ_i||, Z'_t),   Z'_t = max(Z_t, C_0)      s_t = C_0
    b_i = 1[ ||Δ_i|| > τ · Z_t ]

    Z_{t+1} = Z_t · exp(−η_Z + b̃),   b̃ = clamp((Σ b_i + N(0, σ_b²)) / m̂, 0, 1)

Where Z_t >= C_0, which Algorithm 2 requires, these are its two cases: the common scale C_0 / Z_t
at or below Z_t, clipping to C_0 above it (instead of the dropping of ``global``). Updates under
Z_t keep their relative sizes (one common scale, so no misalignment). Z shrinks by exp(−η_Z) per
round unless a fraction above η_Z of the updates exceeds τ·Z_t, so the adaptive rule can take it
below C_0; there the scale is plain clipping at C_0, min(1, C_0 / ||Δ_i||), never a factor above
1, as the authors' code computes it (``layer6ai-labs/fair-dp``,
``DPSGD_Global_Adaptive_Optimizer``: the scale C_0/Z applies only where it is at most the clipping
factor). The count keeps Z_t itself. Defaults: Z_0 = 50, η_Z = 0.1, τ = 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fairclip.strategies import reports
from fairclip.strategies.base import Broadcast, Policy, RowScales, exponential_step, noisy_fraction
from fairclip.strategies.params import NonNegativeFinite, PolicyParams, PositiveFinite


@dataclass(frozen=True)
class ThresholdState:
    """The scaling threshold Z_t of the current round."""

    scale_threshold: float


class GlobalAdaptiveScaling(Policy):
    """Global scaling below Z_t, clipping to C_0 above it, Z_t adapted from a noisy count."""

    name = "global-adapt"

    class Params(PolicyParams):
        initial_bound: PositiveFinite = 1.0
        """C."""
        scale_threshold: PositiveFinite = 50.0
        """Z_0, the starting threshold."""
        threshold_lr: NonNegativeFinite = 0.1
        """η_Z."""
        threshold_multiplier: PositiveFinite = 1.0
        """Multiplies Z_t in the report indicator."""

    initial_bound: float
    scale_threshold: float
    threshold_lr: float
    threshold_multiplier: float

    def initial_state(self, dim: int) -> ThresholdState:
        return ThresholdState(self.scale_threshold)

    def broadcast(self, state: ThresholdState) -> Broadcast:
        return {
            "bound": self.initial_bound,
            "scale_threshold": state.scale_threshold,
            "threshold_multiplier": self.threshold_multiplier,
        }

    def sensitivity(self, state: ThresholdState) -> float:
        return self.initial_bound

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
        threshold = float(params["scale_threshold"])
        divisor = np.maximum(norms, max(threshold, bound))  # Z' = max(Z, C_0): never scale up
        above = norms > float(params["threshold_multiplier"]) * threshold
        return RowScales(bound / divisor, above[:, None].astype(np.float64), above)

    def next_state(self, state: ThresholdState, estimate, noisy_reports, expected_clients) -> ThresholdState:
        fraction = min(max(noisy_fraction(noisy_reports, expected_clients), 0.0), 1.0)
        return ThresholdState(exponential_step(state.scale_threshold, -self.threshold_lr + fraction))

    def round_info(self, state: ThresholdState) -> dict[str, float]:
        return {"scale_threshold": state.scale_threshold}
