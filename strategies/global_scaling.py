"""``global``: global clipping with a fixed threshold (Bu, Wang, Zha, Karypis 2021; seed 003).

Bu et al., "On the Convergence and Calibration of Deep Learning with Differential Privacy"
(global clipping), as written in Esipova et al. 2023 (seed 003)::

    Δ̄_i = Δ_i · C_0 / Z      if ||Δ_i|| <= Z
    Δ̄_i = 0                  otherwise                 s_t = C_0

Every kept update is scaled by the same factor C_0 / Z, so the direction of the sum is not
distorted by per-client clipping; updates above Z are dropped. Z is fixed.
"""

from __future__ import annotations

import numpy as np

from fairclip.strategies.base import Broadcast, Policy, RowScales
from fairclip.strategies.params import PolicyParams, PositiveFinite


class GlobalScaling(Policy):
    """Scale every update by C_0 / Z; drop those with norm above Z."""

    name = "global"

    class Params(PolicyParams):
        initial_bound: PositiveFinite = 1.0
        """C."""
        scale_threshold: PositiveFinite = 50.0
        """Z."""

    initial_bound: float
    scale_threshold: float

    def initial_state(self, dim: int) -> None:
        return None

    def broadcast(self, state: None) -> Broadcast:
        return {"bound": self.initial_bound, "scale_threshold": self.scale_threshold}

    def sensitivity(self, state: None) -> float:
        return self.initial_bound

    def contribution_bounds(self, params: Broadcast, cohorts: np.ndarray) -> np.ndarray:
        return np.full(cohorts.shape[0], float(params["bound"]))

    def scales(self, norms, cohorts, params) -> RowScales:
        threshold = float(params["scale_threshold"])
        above = norms > threshold
        factors = np.where(above, 0.0, float(params["bound"]) / threshold)
        return RowScales(factors, np.zeros((norms.shape[0], 0)), above)

    def round_info(self, state: None) -> dict[str, float]:
        return {"scale_threshold": self.scale_threshold}
