"""my_research.py: a clipping policy of my own, for fairclip.

LinearQuantile clips every update at a bound C_t and moves the bound *linearly* towards the
γ-quantile of the update norms (Andrew et al. 2021 propose this rule beside the geometric one
that fairclip's `adaptive` uses). Each client reports one bit, whether its update was above the
bound; the server sees only the noisy sum of the bits:

    Δ̄_i = Δ_i · min(1, C_t / ||Δ_i||)          b_i = 1[ ||Δ_i|| > C_t ]
    C_{t+1} = max(C_min, C_t + η · (b̃ − γ))      b̃ = clamp((Σ b_i + N(0, σ_b²)) / m̂, 0, 1)
"""

from dataclasses import dataclass

import numpy as np

from fairclip.policies import Fraction, Policy, PolicyParams, PositiveFinite, RowScales


@dataclass(frozen=True)
class Bound:
    """The state between rounds: the bound C_t (immutable)."""

    value: float


class LinearQuantile(Policy):
    """Hard clipping; the bound moves linearly towards a quantile of the update norms."""

    name = "linear-quantile"

    class Params(PolicyParams):
        initial_bound: PositiveFinite = 1.0
        """C_0."""
        target_quantile: Fraction = 0.5
        """γ, the fraction of updates the bound aims to leave above it."""
        step: PositiveFinite = 0.1
        """η, how far the bound moves in one round."""
        min_bound: PositiveFinite = 0.01
        """C_min: the bound never goes below it."""

    def initial_state(self, dim):
        return Bound(self.initial_bound)

    def broadcast(self, state):
        return {"bound": state.value}  # what the clients are told this round (public)

    def sensitivity(self, state):
        return state.value  # no contribution is longer than the bound: the noise scales with it

    def contribution_bounds(self, params, cohorts):
        return np.full(cohorts.shape[0], float(params["bound"]))

    def scales(self, norms, cohorts, params):
        # The client transform, decided from the norms alone: clip at C_t, report 1 if above it.
        bound = float(params["bound"])
        above = norms > bound
        n = norms.shape[0]
        return RowScales(np.ones(n), above[:, None].astype(np.float64), above, clip=np.full(n, bound))

    def report_size(self, dim):
        return 1  # one bit per client, released with noise σ_b

    def report_is_valid(self, report, cohort):
        return report.shape == (1,) and report[0] in (0.0, 1.0)  # what an honest client sends

    def next_state(self, state, estimate, noisy_reports, expected_clients):
        # Only released values: the noisy count of updates above the bound, over the public m̂.
        above = min(max(float(noisy_reports[0]) / expected_clients, 0.0), 1.0)
        return Bound(max(self.min_bound, state.value + self.step * (above - self.target_quantile)))
