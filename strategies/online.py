"""``online``: online sensitivity optimisation of the clipping bound (OSO, seed 002).

Client i, round t::

    Δ̄_i = Δ_i · min(1, C_t / ||Δ_i||)
    q_i  = Δ_i / ||Δ_i||  if ||Δ_i|| > C_t, else 0        (report: unit direction, norm <= 1)

Server, with σ_q = σ_b on the summed directions (L2 sensitivity 1)::

    q̃_t = (Σ q_i + N(0, σ_q² I)) / m̂
    C_{t+1} = C_t · exp(ρ_c · sign(⟨Δ̂_t, q̃_{t−1}⟩))                  s_t = C_t
    ρ_{t+1} = ρ_t · exp(ρ_r · sign(⟨Δ̂_t, Δ̂_{t−1}⟩))   (optional server learning-rate factor)

If the current update points along the directions that were clipped last round, clipping
biased the step and the bound grows; otherwise it shrinks. The paper writes the rule with
gradients g̃_tᵀq̃_{t−1}; with updates Δ ∝ −g both factors flip sign, so the product is the same.
The q release composes with the update release: for an effective multiplier σ the update
noise is σ_Δ = (σ^−2 − σ_q^−2)^−1/2 (seed 002, Proposition 1; see ``accounting``).
Defaults: C_0 = 0.1, ρ_c = ρ_r = 2.5e-3.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fairclip.strategies import reports
from fairclip.strategies.base import Broadcast, Policy, RowScales, exponential_step
from fairclip.strategies.clipping import inner
from fairclip.strategies.params import NonNegativeFinite, PolicyParams, PositiveFinite


@dataclass(frozen=True)
class OnlineState:
    """C_t, the server learning-rate factor ρ_t, and last round's released vectors."""

    bound: float
    lr_factor: float = 1.0
    previous_direction: np.ndarray | None = None
    previous_estimate: np.ndarray | None = None


def _sign_of_inner(a: np.ndarray, b: np.ndarray | None) -> float:
    """sign(⟨a, b⟩), 0 without a previous vector; each vector is scaled by its largest entry
    first, so that the inner product of huge vectors cannot overflow to inf − inf = nan."""
    if b is None:
        return 0.0
    scales = [float(np.max(np.abs(v), initial=0.0)) for v in (a, b)]
    if not all(0.0 < scale < np.inf for scale in scales):
        return 0.0
    return float(np.sign(inner(a / scales[0], b / scales[1])))


class OnlineSensitivityClipping(Policy):
    """Hard clipping; the bound follows the sign of ⟨Δ̂_t, q̃_{t−1}⟩."""

    name = "online"

    class Params(PolicyParams):
        initial_bound: PositiveFinite = 0.1
        """C_0."""
        bound_lr: NonNegativeFinite = 2.5e-3
        """ρ_C."""
        adapt_server_lr: bool = False
        """Whether the server learning rate adapts too."""
        server_lr_rate: NonNegativeFinite = 2.5e-3
        """ρ_η."""

    initial_bound: float
    bound_lr: float
    adapt_server_lr: bool
    server_lr_rate: float

    def initial_state(self, dim: int) -> OnlineState:
        return OnlineState(bound=self.initial_bound)

    def broadcast(self, state: OnlineState) -> Broadcast:
        return {"bound": state.bound}

    def sensitivity(self, state: OnlineState) -> float:
        return state.bound

    def contribution_bounds(self, params: Broadcast, cohorts: np.ndarray) -> np.ndarray:
        return np.full(cohorts.shape[0], float(params["bound"]))

    def report_size(self, dim: int) -> int:
        return dim

    def report_is_valid(self, report: np.ndarray, cohort: int | None) -> bool:
        return reports.is_unit_or_zero(report)

    def scales(self, norms, cohorts, params) -> RowScales:
        bound = float(params["bound"])
        above = norms > bound
        directions = np.zeros(norms.shape[0])
        directions[above] = 1.0 / norms[above]  # q_i = Δ_i / ||Δ_i||
        n = norms.shape[0]
        return RowScales(np.ones(n), None, above, clip=np.full(n, bound), report_scales=directions)

    def next_state(self, state: OnlineState, estimate, noisy_reports, expected_clients) -> OnlineState:
        direction = np.asarray(noisy_reports, dtype=np.float64) / expected_clients
        sign = _sign_of_inner(estimate, state.previous_direction)
        bound = exponential_step(state.bound, self.bound_lr * sign)
        lr_factor = state.lr_factor
        if self.adapt_server_lr:
            sign = _sign_of_inner(estimate, state.previous_estimate)
            lr_factor = exponential_step(lr_factor, self.server_lr_rate * sign)
        return OnlineState(
            bound=bound,
            lr_factor=lr_factor,
            previous_direction=direction,
            previous_estimate=np.array(estimate, dtype=np.float64),
        )

    def server_lr_factor(self, state: OnlineState) -> float:
        return state.lr_factor

    def round_info(self, state: OnlineState) -> dict[str, float]:
        return {"server_lr_factor": state.lr_factor}
