"""``per-cohort``: a clipping bound per cohort from noisy clipped counts (DPSGD-F, seed 004).

Xu, Du, Wu, "Removing Disparate Impact on Model Accuracy in Differentially Private Stochastic
Gradient Descent", KDD 2021 (DPSGD-F, seed 004, Algorithm 2), and the same method as its
re-implementers ran it (Esipova et al. 2023, seed 003, Algorithm 3 and their code
``layer6ai-labs/fair-dp``, ``DpsgdFTrainer``). Client i of cohort k(i), round t::

    Δ̄_i = Δ_i · min(1, C_{t,k(i)} / ||Δ_i||)
    report: one-hot e_{2k+0} if ||Δ_i|| > C_0 (counts m_k), e_{2k+1} otherwise (counts o_k)

Server, with σ_1 = σ_b on each of the 2K counts (a client adds 1 to exactly one count, so the
count vector has L2 sensitivity 1)::

    m̃_k, õ_k = counts + N(0, σ_1²);   b̃_k = m̃_k + õ_k;   m̃ = Σ_k m̃_k;   f_k = m̃_k / b̃_k

and the bounds from them by one of two rules (``rule``), each choice below being
post-processing of the released counts:

* ``"xu"``, seed 004's Algorithm 2 (line 14) as the paper writes it::

      C_k = C_0 · (1 + f_k / (m̃ / m̂))

  with the batch size b of the paper's fixed batches taken as the public expected batch m̂ = qN
  (a Poisson batch's size is private). The paper is silent on noisy counts outside their range;
  here the counts are clamped to >= 0, f_k = 1 where b̃_k = 0 (an empty cohort counts as
  clipped, "0/0 = 1", as in seed 003's re-implementation of the authors' code and in the public
  adaptations of that code; for a small cohort under count noise, such as seed 004's class 8, an
  empty release is frequent, and 0 there would hold its bound at C_0 in those rounds), and
  m̃ / m̂ is clamped to [1/m̂, 1] (without noise it lies in [0, 1]; below one clipped update per
  round it is noise), so C_0 <= C_k <= C_0 (1 + m̂).
* ``"esipova"``, seed 003's Algorithm 3 as its authors' code computes it::

      m̃_k, õ_k = max(int(count + N(0, σ_1²)), 0)          (int truncates toward zero)
      f_k = m̃_k / b̃_k,  and f_k = 1 where b̃_k = 0     ("0/0 = 1": an empty cohort counts as clipped)
      C_k = C_0 · (1 + f_k / (mean_k f_k + 1e-8))      (the mean of the cohorts' fractions, not m̃/m̂)

  so C_0 <= C_k <= C_0 (1 + K).

Which round's counts set the bounds (``same_round``):

* **previous round** (``same_round = false``, the default, the federated form): the bounds of
  round t+1 come from the counts of round t, so clients need one message per round, like
  ``adaptive``. All bounds start at C_0.
* **same round** (``same_round = true``, DPSGD-F as both papers run it: Algorithm 2 clips the
  batch with the bounds of its own counts): in a federation that is one more exchange per round
  (:attr:`Policy.counts_first`): the sampled clients first send only their count bits, the
  server releases the noisy counts and broadcasts the round's C_k, then the same clients send
  their clipped updates. Both releases are accounted, as one round of
  σ_eff = (σ_Δ^-2 + σ_1^-2)^-1/2 (σ_Δ the update release's multiplier, below).

``rule`` left unset keeps what each mode always did: ``"esipova"`` in the same-round mode,
``"xu"`` in the previous-round mode.

The noise (``noise_bound``): the sensitivity of the sum is s_t = max_k C_{t,k}.

* ``"max"`` (default; seed 004's Algorithm 2, line 19-20, and its section 5.2: "it accounts for
  the worst clipping bound max_k C_k"): noise N(0, (σ_Δ s_t)² I), multiplier σ_Δ.
* ``"initial"`` (seed 003's Algorithm 3 and its authors' code: N(0, (σ_Δ C_0)² I) while
  clients clip at C_k >= C_0): the noise scale n_t = C_0 is below the sensitivity whenever some
  C_k > C_0, so the round is accounted as what it is, a Gaussian mechanism of multiplier
  σ_Δ · C_0 / max_k C_k (:meth:`Policy.round_event`), which changes every round. ε is then the
  accountant's over those multipliers (RDP only; no budget or target ε can be planned for it,
  :func:`fairclip.server.privacy_plan.plan_privacy`). The multiplier of a same-round round is
  chosen from that round's released counts: ε is the accountant's reading of the multipliers
  that ran, not a bound fixed before the run (which would need the smallest possible one,
  σ_Δ / (1 + K) under ``"esipova"``, σ_Δ / (1 + m̂) under ``"xu"``).

Seed 003's code takes max_k C_k over the cohorts present in the batch, which depends on the
batch; fairclip takes it over all cohorts, which is what seed 004's analysis (section 5.2) covers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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
        rule: Literal["esipova", "xu"] | None = None
        """How the bounds follow from the counts: ``"xu"`` (seed 004's Algorithm 2) or
        ``"esipova"`` (seed 003's code); unset: ``"esipova"`` with ``same_round``, else ``"xu"``."""
        noise_bound: Literal["max", "initial"] = "max"
        """Noise with max_k C_k (the sensitivity) or with C_0 (seed 003's Algorithm 3, accounted
        with the smaller multiplier it amounts to)."""

    initial_bound: float
    same_round: bool
    rule: str | None
    noise_bound: str

    @property
    def bound_rule(self) -> str:
        """The rule in force: ``rule``, or the mode's own when it is unset."""
        if self.rule is not None:
            return self.rule
        return "esipova" if self.same_round else "xu"

    @property
    def counts_first(self) -> bool:
        return self.same_round

    @property
    def noises_below_sensitivity(self) -> bool:
        return self.noise_bound == "initial"

    def initial_state(self, dim: int) -> CohortBoundsState:
        return CohortBoundsState((self.initial_bound,) * self.num_cohorts)

    def broadcast(self, state: CohortBoundsState) -> Broadcast:
        return {"bound": self.initial_bound, "cohort_bounds": list(state.bounds)}

    def sensitivity(self, state: CohortBoundsState) -> float:
        return max(state.bounds)

    def noise_scale(self, state: CohortBoundsState) -> float:
        largest = max(state.bounds)
        return min(self.initial_bound, largest) if self.noise_bound == "initial" else largest

    def contribution_bounds(self, params: Broadcast, cohorts: np.ndarray) -> np.ndarray:
        return np.asarray(params["cohort_bounds"], dtype=np.float64)[cohorts]

    integer_reports = True
    """Bits or one-hot counts: summed exactly under secure aggregation."""

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
        """The bounds of a same-round round from its own noisy counts."""
        return self._bounds(noisy_reports, expected_clients)

    def next_state(self, state, estimate, noisy_reports, expected_clients) -> CohortBoundsState:
        if self.same_round:  # the next round's bounds come from the next round's counts
            return state
        return self._bounds(noisy_reports, expected_clients)

    def _bounds(self, noisy_reports: np.ndarray, expected_clients: float) -> CohortBoundsState:
        """C_k of every cohort from the released counts [m̃_0, õ_0, m̃_1, õ_1, ...] (module
        docstring, by :attr:`bound_rule`)."""
        released = np.asarray(noisy_reports, dtype=np.float64).reshape(self.num_cohorts, 2)
        if self.bound_rule == "esipova":
            counts = np.maximum(np.trunc(released), 0.0)
            above, below = counts[:, 0], counts[:, 1]
            sizes = above + below
            fraction = np.divide(above, sizes, out=np.ones_like(above), where=sizes > 0)
            bounds = self.initial_bound * (1.0 + fraction / (fraction.mean() + 1e-8))
        else:
            counts = np.maximum(released, 0.0)
            above, below = counts[:, 0], counts[:, 1]
            sizes = above + below
            cohort_fraction = np.divide(above, sizes, out=np.ones_like(above), where=sizes > 0)
            cohort_fraction = np.clip(cohort_fraction, 0.0, 1.0)
            overall_fraction = min(max(above.sum() / expected_clients, 1.0 / expected_clients), 1.0)
            bounds = self.initial_bound * (1.0 + cohort_fraction / overall_fraction)
        return CohortBoundsState(tuple(float(b) for b in bounds))

    def round_info(self, state: CohortBoundsState) -> dict[str, float]:
        return {f"cohort_bound_{k}": bound for k, bound in enumerate(state.bounds)}
