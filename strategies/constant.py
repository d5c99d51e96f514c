"""``constant``: hard clipping at a fixed bound (Abadi et al. 2016; McMahan et al. 2018).

    Δ̄_i = Δ_i · min(1, C / ||Δ_i||)          s_t = C for every round

McMahan, Ramage, Talwar, Zhang, "Learning Differentially Private Recurrent Language Models",
ICLR 2018 (DP-FedAvg); Abadi et al., "Deep Learning with Differential Privacy", CCS 2016.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fairclip.strategies.base import Broadcast, Policy, RowScales
from fairclip.strategies.params import PolicyParams, PositiveFinite


@dataclass(frozen=True)
class BoundState:
    """The clipping bound C_t of the current round."""

    bound: float


class ConstantClipping(Policy):
    """Hard clipping at the fixed bound ``initial_bound``."""

    name = "constant"

    class Params(PolicyParams):
        initial_bound: PositiveFinite = 1.0
        """C_0."""

    initial_bound: float

    def initial_state(self, dim: int) -> BoundState:
        return BoundState(self.initial_bound)

    def broadcast(self, state: BoundState) -> Broadcast:
        return {"bound": state.bound}

    def sensitivity(self, state: BoundState) -> float:
        return state.bound

    def contribution_bounds(self, params: Broadcast, cohorts: np.ndarray) -> np.ndarray:
        return np.full(cohorts.shape[0], float(params["bound"]))

    def scales(self, norms, cohorts, params) -> RowScales:
        bound = float(params["bound"])
        n = norms.shape[0]
        return RowScales(np.ones(n), np.zeros((n, 0)), norms > bound, clip=np.full(n, bound))
