"""``per-cohort``: a clipping bound per cohort from noisy clipped counts (DPSGD-F, seed 004).

Xu, Du, Wu, "Removing Disparate Impact on Model Accuracy in Differentially Private Stochastic
Gradient Descent", KDD 2021 (DPSGD-F), as written in Esipova et al. 2023, Algorithm 3.
Client i of cohort k(i), round t::

    Δ̄_i = Δ_i · min(1, C_{t,k(i)} / ||Δ_i||)
    report: one-hot e_{2k+0} if ||Δ_i|| > C_0 (counts m_k), e_{2k+1} otherwise (counts o_k)

Server, with σ_1 = σ_b on each of the 2K counts (a client adds 1 to exactly one count, so the
count vector has L2 sensitivity 1)::

    m̃_k, õ_k = counts + N(0, σ_1²), clamped >= 0;   b̃_k = m̃_k + õ_k;   m̃ = Σ_k m̃_k
    C_{t+1,k} = C_0 · (1 + (m̃_k / b̃_k) / (m̃ / m̂))          s_t = max_k C_{t,k}

The sum is noised with s_t = max_k C_{t,k} as in seed 004's paper (seed 003's Algorithm 3
noises with C_0, which adds too little noise when some C_k > C_0; fairclip does not copy that).

Two ways to run a round:

* **previous round** (``same_round = false``, the default, the federated form): the bounds of
  round t+1 come from the counts of round t, so clients need one message per round, like
  ``adaptive``. The per-cohort fraction m̃_k/b̃_k is clamped to [0, 1] and taken as 0 when
  b̃_k = 0; the overall fraction m̃/m̂ is clamped to [1/m̂, 1], which caps each C_k at
  C_0 (1 + m̂). All bounds start at C_0.
* **same round** (``same_round = true``, DPSGD-F as its authors ran it, seed 004's Algorithm 1
  and the code of Esipova et al., ``layer6ai-labs/fair-dp``, ``DpsgdFTrainer``): the bounds
  that clip round t come from round t's own noisy counts. In a federation that is one more
  exchange per round (:attr:`Policy.counts_first`): the sampled clients first send only their
  count bits, the server releases the noisy counts and broadcasts the round's C_k, then the same
  clients send their clipped updates. Both releases are accounted, as one round of
  σ_eff = (σ^-2 + σ_1^-2)^-1/2. In this mode the authors' code is followed, each choice being
  post-processing of the released counts::

      m̃_k, õ_k = max(int(count + N(0, σ_1²)), 0)          (int truncates toward zero)
      f_k = m̃_k / b̃_k,  and f_k = 1 where b̃_k = 0     ("0/0 = 1": an empty cohort counts as clipped)
      C_{t,k} = C_0 · (1 + f_k / (mean_k f_k + 1e-8))   (the mean of the cohorts' fractions, not m̃/m̂)

  so every C_k is at most C_0 (1 + K). The noise is still calibrated to max_k C_k over all
  cohorts; the authors' code takes the maximum over the cohorts present in the batch, which
  depends on the batch and is not what their paper's analysis covers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fairclip.strategies import reports
from fairclip.strategies.base import Broadcast, Policy, RowScales
from fairclip.strategies.params import PolicyParams, PositiveFinite


@dataclass(frozen=True)
class CohortBoundsState:
    """The bound C_{t,k} of each cohort."""

    bounds: tuple[float, ...]


class PerCohortClipping(Policy):
    """Hard clipping at each cohort's own bound, set from noisy per-cohort clipped counts."""

    name = "per-cohort"
    needs_cohorts = True

    class Params(PolicyParams):
        initial_bound: PositiveFinite = 1.0
        """C_0."""
        same_round: bool = False
        """Clip each round at the bounds of its own noisy counts (two exchanges per round)."""

    initial_bound: float
    same_round: bool

    @property
    def counts_first(self) -> bool:
        return self.same_round

    def initial_state(self, dim: int) -> CohortBoundsState:
        return CohortBoundsState((self.initial_bound,) * self.num_cohorts)

    def broadcast(self, state: CohortBoundsState) -> Broadcast:
        return {"bound": self.initial_bound, "cohort_bounds": list(state.bounds)}

    def sensitivity(self, state: CohortBoundsState) -> float:
        return max(state.bounds)

    def contribution_bounds(self, params: Broadcast, cohorts: np.ndarray) -> np.ndarray:
        return np.asarray(params["cohort_bounds"], dtype=np.float64)[cohorts]

    def report_size(self, dim: int) -> int:
        return 2 * self.num_cohorts

    def report_is_valid(self, report: np.ndarray, cohort: int | None) -> bool:
        if cohort is None or not 0 <= cohort < self.num_cohorts:
            return False
        return reports.is_one_hot_or_zero(report, 2 * self.num_cohorts, (2 * cohort, 2 * cohort + 1))

    def scales(self, norms, cohorts, params) -> RowScales:
        own_bounds = self.contribution_bounds(params, cohorts)
        above_base = norms > float(params["bound"])
        reports = np.zeros((norms.shape[0], self.report_size(0)))
        reports[np.arange(norms.shape[0]), 2 * cohorts + (~above_base).astype(np.int64)] = 1.0
        return RowScales(np.ones(norms.shape[0]), reports, norms > own_bounds, clip=own_bounds)

    def with_counts(self, state, noisy_reports, expected_clients) -> CohortBoundsState:
        """The bounds of a same-round round from its own noisy counts, as the authors' code."""
        released = np.asarray(noisy_reports, dtype=np.float64).reshape(self.num_cohorts, 2)
        counts = np.maximum(np.trunc(released), 0.0)
        above, below = counts[:, 0], counts[:, 1]
        sizes = above + below
        fraction = np.divide(above, sizes, out=np.ones_like(above), where=sizes > 0)
        bounds = self.initial_bound * (1.0 + fraction / (fraction.mean() + 1e-8))
        return CohortBoundsState(tuple(float(b) for b in bounds))

    def next_state(self, state, estimate, noisy_reports, expected_clients) -> CohortBoundsState:
        if self.same_round:  # the next round's bounds come from the next round's counts
            return state
        counts = np.maximum(np.asarray(noisy_reports, dtype=np.float64).reshape(self.num_cohorts, 2), 0.0)
        above, below = counts[:, 0], counts[:, 1]
        sizes = above + below
        cohort_fraction = np.divide(above, sizes, out=np.zeros_like(above), where=sizes > 0)
        cohort_fraction = np.clip(cohort_fraction, 0.0, 1.0)
        overall_fraction = min(max(above.sum() / expected_clients, 1.0 / expected_clients), 1.0)
        bounds = self.initial_bound * (1.0 + cohort_fraction / overall_fraction)
        return CohortBoundsState(tuple(float(b) for b in bounds))

    def round_info(self, state: CohortBoundsState) -> dict[str, float]:
        return {f"cohort_bound_{k}": bound for k, bound in enumerate(state.bounds)}
