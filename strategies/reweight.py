"""``reweight``: clip at C_0, then reweight each cohort to an equal share (Naïve, seed 004).

Xu, Du, Wu, KDD 2021 (the naïve reweighting baseline of DPSGD-F). Client i of cohort k(i)::

    Δ̄_i = θ_{t,k(i)} · Δ_i · min(1, C_0 / ||Δ_i||)
    report: one-hot e_k (the per-cohort participation count)

Server, with σ_b on each of the K counts (L2 sensitivity 1)::

    b̃_k = Σ_{i in k} 1 + N(0, σ_b²)
    θ_{t+1,k} = (m̂ / K) / max(b̃_k, 1)               s_t = C_0 · max_k θ_{t,k}

A cohort that is rare in the sample gets a large weight, and the noise grows with the
largest weight: the price of naïve reweighting that seed 004 shows. b̃_k is floored at 1 before
division (post-processing). Which round's counts set the weights (``same_round``):

* previous round (default, the federated form): the weights of round t+1 come from the counts
  of round t (θ_1 = 1 for all cohorts);
* same round (``same_round = true``, seed 004's Algorithm 3, lines 6-13: the batch is weighted
  by its own noisy counts): the sampled clients first send their cohort bits, the server releases
  the noisy counts and broadcasts the round's θ_k, then the same clients send their weighted
  contributions (:attr:`Policy.counts_first`, as ``per-cohort`` with ``same_round``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fairclip.strategies import reports
from fairclip.strategies.base import Broadcast, Policy, RowScales
from fairclip.strategies.params import PolicyParams, PositiveFinite


@dataclass(frozen=True)
class CohortWeightsState:
    """The weight θ_{t,k} of each cohort."""

    weights: tuple[float, ...]


class CohortReweighting(Policy):
    """Hard clipping at C_0, each contribution multiplied by its cohort's weight."""

    name = "reweight"
    needs_cohorts = True

    class Params(PolicyParams):
        initial_bound: PositiveFinite = 1.0
        """C_0."""
        same_round: bool = False
        """Weight each round by its own noisy counts (two exchanges per round)."""

    initial_bound: float
    same_round: bool

    @property
    def counts_first(self) -> bool:
        return self.same_round

    def initial_state(self, dim: int) -> CohortWeightsState:
        return CohortWeightsState((1.0,) * self.num_cohorts)

    def broadcast(self, state: CohortWeightsState) -> Broadcast:
        return {"bound": self.initial_bound, "cohort_weights": list(state.weights)}

    def sensitivity(self, state: CohortWeightsState) -> float:
        return self.initial_bound * max(state.weights)

    def clip_bound(self, state: CohortWeightsState) -> float:
        return self.initial_bound

    def contribution_bounds(self, params: Broadcast, cohorts: np.ndarray) -> np.ndarray:
        return float(params["bound"]) * np.asarray(params["cohort_weights"], dtype=np.float64)[cohorts]

    integer_reports = True
    """Bits or one-hot counts: summed exactly under secure aggregation."""

    def report_size(self, dim: int) -> int:
        return self.num_cohorts

    def report_is_valid(self, report: np.ndarray, cohort: int | None) -> bool:
        if cohort is None or not 0 <= cohort < self.num_cohorts:
            return False
        return reports.is_one_hot_or_zero(report, self.num_cohorts, (cohort,))

    def scales(self, norms, cohorts, params) -> RowScales:
        bound = float(params["bound"])
        weights = np.asarray(params["cohort_weights"], dtype=np.float64)[cohorts]
        reports = np.zeros((norms.shape[0], self.num_cohorts))
        reports[np.arange(norms.shape[0]), cohorts] = 1.0
        return RowScales(weights, reports, norms > bound, clip=np.full(norms.shape[0], bound))

    def with_counts(self, state, noisy_reports, expected_clients) -> CohortWeightsState:
        """The weights of a same-round round from its own noisy counts."""
        return self._weights(noisy_reports, expected_clients)

    def next_state(self, state, estimate, noisy_reports, expected_clients) -> CohortWeightsState:
        if self.same_round:  # the next round's weights come from the next round's counts
            return state
        return self._weights(noisy_reports, expected_clients)

    def _weights(self, noisy_reports: np.ndarray, expected_clients: float) -> CohortWeightsState:
        """θ_k = (m̂ / K) / max(b̃_k, 1)."""
        sizes = np.maximum(np.asarray(noisy_reports, dtype=np.float64), 1.0)
        weights = (expected_clients / self.num_cohorts) / sizes
        return CohortWeightsState(tuple(float(w) for w in weights))

    def round_info(self, state: CohortWeightsState) -> dict[str, float]:
        return {f"cohort_weight_{k}": weight for k, weight in enumerate(state.weights)}
