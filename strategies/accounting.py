"""User-level privacy accounting with Opacus' RDP and PRV accountants.

Each round is a sampled Gaussian mechanism over clients (add/remove one client), sampling
rate q. A policy releases the noisy sum of contributions (sensitivity s_t, noise σ_Δ s_t) and,
if it has reports, the noisy sum of report vectors (each of L2 norm <= 1, noise σ_b). Both
releases of a round form one Gaussian mechanism on the concatenated vector, whose noise
multiplier composes exactly (Gaussian DP; seed 000, Lemma 3.1)::

    σ_eff = (σ_Δ^−2 + σ_b^−2)^−1/2

This covers the count of ``adaptive``/``bounded``/``soft``/``global-adapt``, the count vectors
of ``per-cohort``/``reweight`` (one-hot, sensitivity 1) and the direction vector of ``online``
(σ_b plays σ_q: σ_Δ = (σ_eff^−2 − σ_q^−2)^−1/2, seed 002 Prop. 1). T rounds at rate q with
σ_eff are then accounted by Opacus (``history = [(σ_eff, q, T)]``); nothing is hand-written.

Calibration inverts this: σ_eff for a target ε is found by Opacus' own search
(``get_noise_multiplier``, step for step) over this module's ε, and split as σ_b = k σ_Δ
(k = 10 by default, seed 000 / Esipova et al.), i.e. σ_Δ = σ_eff · sqrt(1 + 1/k²).

The accountants are Opacus' with their repeated work shared (:mod:`fairclip.strategies.accountants`:
one per-step RDP curve per (σ_eff, q), computed only at the orders a conversion can need); every
ε is Opacus' bit for bit (tests/test_accounting.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from opacus.accountants.utils import MAX_SIGMA

from fairclip.strategies.accountants import PRVAccountantSharedRDP, one_blas_thread, rdp_curve, rdp_epsilon
from fairclip.strategies.base import DPEvent, NoiseMultipliers
from fairclip.strategies.errors import PolicyConfigError

ACCOUNTANTS = ("prv", "rdp")
PRV_MAX_ROUNDS = 100_000
"""Most rounds the PRV accountant is asked to account for (Opacus' PRV discretises the privacy
loss of all rounds at once; measured on 2 cores: 10^5 rounds 11 s and 1.6 GB, 10^6 rounds more
than 2 min and 7.5 GB, 10^7 rounds out of 24 GB of memory)."""
DEFAULT_COUNT_RATIO = 10.0
CALIBRATION_TOLERANCE = 0.002
"""Relative tolerance of the search for σ_eff: the calibrated ε is within 0.2 % below target."""


def clear_caches() -> None:
    """Forget every cached ε, calibration and RDP curve (a benchmark repeat pays its own)."""
    for cached in (epsilon, history_epsilon, calibrate, calibrate_effective, rdp_curve):
        cached.cache_clear()


Entry = tuple[float, float, int]
"""One entry of an accountant's history: (σ_eff, q, steps)."""


def evaluation_steps(rounds: int, eval_every: int, rows: int) -> int:
    """At most how many client evaluations (``[evaluation] clients``) a run that stops after
    ``rounds`` rounds (its last, or an earlier one) releases: one after every reporting round.

    A run whose last round is t reports after every k(t)-th round and the last, so ⌈t / k(t)⌉
    times, where k(t) = e·⌈⌈t / R⌉ / e⌉ is the smallest multiple of e = ``eval_every`` that keeps
    the reporting rounds at most R = ``rows``
    (:meth:`fairclip.server.privacy_plan.PrivacyPlan.report_every`). That count is not monotone
    in t (k grows at t = R·e·j), so this returns max over t <= T of ⌈t / k(t)⌉: exact for
    T <= R·e and at every T that reaches the maximum, an upper bound of what a run of T rounds
    releases otherwise, and non-decreasing in T (a budget's bisection needs it)."""
    if rounds <= 0:
        return 0
    most, block = 0, eval_every * rows  # k(t) = e·j for (j − 1)·e·R < t <= j·e·R
    for j in range(1, -(-rounds // block) + 1):
        last = min(j * block, rounds)
        most = max(most, -(-last // (eval_every * j)))
    return most


@lru_cache(maxsize=1024)
def history_epsilon(history: tuple[Entry, ...], delta: float, accountant: str = "prv") -> float:
    """ε at δ of a mixed history ((σ_eff, q, steps), ...) of sampled Gaussian mechanisms, as
    :class:`Accountant` composes it (entries of no steps are left out)."""
    composed = Accountant(accountant)
    composed.history = [(float(s), float(q), int(n)) for s, q, n in history if n > 0]
    return composed.get_epsilon(delta)


def with_evaluation(entry: Entry, evaluation: tuple[float, int, int] | None) -> tuple[Entry, ...]:
    """The history of T training rounds ``entry`` = (σ_eff, q, T) and, where ``evaluation`` =
    (σ_E, eval_every, rows) is given, the client evaluations they release at most
    (:func:`evaluation_steps`, at the same rate q)."""
    if evaluation is None:
        return (entry,)
    sigma_e, every, rows = evaluation
    return (entry, (float(sigma_e), entry[1], evaluation_steps(entry[2], every, rows)))


def effective_noise_multiplier(noise: NoiseMultipliers, releases_reports: bool) -> float:
    """σ_eff of one round run with ``noise``: σ_Δ alone, or (σ_Δ^−2 + σ_b^−2)^−1/2 when reports
    are released (:attr:`DPEvent.effective_noise_multiplier`; 0 where any release is noiseless)."""
    return DPEvent.planned(noise, releases_reports).effective_noise_multiplier


def check_privacy_parameters(sample_rate: float, rounds: int, delta: float, accountant: str) -> None:
    """Raise one clear error for parameters no accountant can take."""
    if accountant not in ACCOUNTANTS:
        raise PolicyConfigError(f"accountant must be one of {', '.join(ACCOUNTANTS)} (got {accountant!r})")
    if not 0 < sample_rate <= 1:
        raise PolicyConfigError(f"sample rate must be in (0, 1] (got {sample_rate:g})")
    if rounds < 0:
        raise PolicyConfigError(f"rounds must be >= 0 (got {rounds})")
    if accountant == "prv" and rounds > PRV_MAX_ROUNDS:
        raise PolicyConfigError(
            f"the PRV accountant cannot account for {rounds} rounds: its memory grows with the rounds "
            f"(1.6 GB and 11 s at 10^5, 7.5 GB and over 2 min at 10^6); at most {PRV_MAX_ROUNDS:,} "
            "rounds, or use the RDP accountant (privacy.accountant = rdp, --accountant rdp)"
        )
    if not 0 < delta < 1:
        raise PolicyConfigError(f"delta must be in (0, 1) (got {delta:g})")


@lru_cache(maxsize=4096)
def epsilon(
    effective_multiplier: float, sample_rate: float, rounds: int, delta: float, accountant: str = "prv"
) -> float:
    """ε at δ after ``rounds`` rounds of the sampled Gaussian mechanism with σ_eff and rate q.

    Infinite when σ_eff = 0 (no noise); 0 after zero rounds.
    """
    check_privacy_parameters(sample_rate, rounds, delta, accountant)
    if rounds == 0:
        return 0.0
    if effective_multiplier <= 0:
        return math.inf
    sigma, q, rounds = float(effective_multiplier), float(sample_rate), int(rounds)
    if accountant == "rdp":  # RDPAccountant with history [(σ, q, T)]: the per-step RDP × T
        return rdp_curve(sigma, q).epsilon(rounds, delta)
    prv_accountant = PRVAccountantSharedRDP()
    prv_accountant.history = [(sigma, q, rounds)]
    with one_blas_thread():
        return float(prv_accountant.get_epsilon(delta=delta))


@lru_cache(maxsize=256)
def calibrate_effective(
    target_epsilon: float,
    sample_rate: float,
    rounds: int,
    delta: float,
    accountant: str = "prv",
    evaluation: tuple[float, int, int] | None = None,
) -> float:
    """σ_eff whose ε after ``rounds`` rounds is at most ``target_epsilon`` (within
    :data:`CALIBRATION_TOLERANCE` of it).

    The search is Opacus' ``get_noise_multiplier`` step for step -- double σ from 20 until
    ε <= target, then bisect until target − ε <= tolerance, returning the upper end -- over
    :func:`epsilon`, which is Opacus' ε bit for bit: so σ_eff is Opacus' own (tests/test_accounting.py
    compares them). Opacus' function builds a fresh accountant that recomputes the RDP curve at
    every step of the search (15 s for one PRV calibration of the demo, 2 s here).

    ``evaluation`` = (σ_E, eval_every, rows): the rounds also release client evaluations
    (:func:`with_evaluation`, charged at their upper bound), and σ_eff is searched for the
    composed history.
    """
    check_privacy_parameters(sample_rate, rounds, delta, accountant)
    if not (math.isfinite(target_epsilon) and target_epsilon > 0):
        raise PolicyConfigError(f"target epsilon must be a finite number > 0 (got {target_epsilon})")
    if rounds == 0:
        raise PolicyConfigError("cannot calibrate noise for 0 rounds")
    tolerance = CALIBRATION_TOLERANCE * target_epsilon

    def epsilon_at(sigma: float) -> float:
        if evaluation is None:
            return epsilon(sigma, sample_rate, rounds, delta, accountant)
        return history_epsilon(with_evaluation((sigma, sample_rate, rounds), evaluation), delta, accountant)

    eps_high, sigma_low, sigma_high = math.inf, 0.0, 10.0
    while eps_high > target_epsilon:
        sigma_high = 2 * sigma_high
        eps_high = epsilon_at(sigma_high)
        if sigma_high > MAX_SIGMA:
            raise PolicyConfigError(
                f"target epsilon {target_epsilon:g} cannot be reached at delta {delta:g} with "
                f"q={sample_rate:g}, T={rounds} (the privacy budget is too low)"
            )
    while target_epsilon - eps_high > tolerance:
        sigma = (sigma_low + sigma_high) / 2
        eps = epsilon_at(sigma)
        if eps < target_epsilon:
            sigma_high, eps_high = sigma, eps
        else:
            sigma_low = sigma
    return sigma_high


@lru_cache(maxsize=256)
def calibrate(
    target_epsilon: float,
    sample_rate: float,
    rounds: int,
    delta: float,
    accountant: str = "prv",
    *,
    releases_reports: bool,
    count_ratio: float = DEFAULT_COUNT_RATIO,
    evaluation: tuple[float, int, int] | None = None,
) -> NoiseMultipliers:
    """Noise multipliers whose ε after ``rounds`` rounds is at most ``target_epsilon``.

    σ_eff comes from :func:`calibrate_effective`; with reports it is split as σ_b = k σ_Δ,
    σ_Δ = σ_eff · sqrt(1 + 1/k²), so that (σ_Δ^−2 + σ_b^−2)^−1/2 = σ_eff.
    """
    if not (math.isfinite(count_ratio) and count_ratio > 0):
        raise PolicyConfigError(f"count noise ratio must be > 0 (got {count_ratio})")
    sigma_eff = calibrate_effective(target_epsilon, sample_rate, rounds, delta, accountant, evaluation)
    if not releases_reports:
        return NoiseMultipliers(update=sigma_eff, report=0.0)
    update = sigma_eff * math.sqrt(1.0 + count_ratio**-2)
    return NoiseMultipliers(update=update, report=count_ratio * update)


def rounds_within_budget(
    budget: float,
    effective_multiplier: float,
    sample_rate: float,
    delta: float,
    accountant: str,
    limit: int,
    evaluation: tuple[float, int, int] | None = None,
) -> int:
    """The largest T <= ``limit`` whose ε is at most ``budget`` (ε is non-decreasing in T),
    counting the client evaluations of ``evaluation`` = (σ_E, eval_every, rows) at their upper bound
    (:func:`with_evaluation`)."""

    def epsilon_after(rounds: int) -> float:
        if evaluation is None:
            return epsilon(effective_multiplier, sample_rate, rounds, delta, accountant)
        entry = (float(effective_multiplier), float(sample_rate), rounds)
        return history_epsilon(with_evaluation(entry, evaluation), delta, accountant)

    if epsilon_after(limit) <= budget:
        return limit
    low, high = 0, limit  # ε(low) <= budget < ε(high)
    while high - low > 1:
        middle = (low + high) // 2
        if epsilon_after(middle) <= budget:
            low = middle
        else:
            high = middle
    return low


@dataclass(frozen=True)
class PrivacyClaim:
    """An ε together with everything it came from (docs/design.md, section 7)."""

    epsilon: float
    delta: float
    accountant: str
    sample_rate: float
    rounds: int
    noise_multiplier: float
    count_noise_multiplier: float | None
    effective_noise_multiplier: float

    @classmethod
    def of(
        cls,
        noise: NoiseMultipliers,
        *,
        releases_reports: bool,
        sample_rate: float,
        rounds: int,
        delta: float,
        accountant: str,
    ) -> PrivacyClaim:
        sigma_eff = effective_noise_multiplier(noise, releases_reports)
        return cls(
            epsilon=epsilon(sigma_eff, sample_rate, rounds, delta, accountant),
            delta=delta,
            accountant=accountant,
            sample_rate=sample_rate,
            rounds=rounds,
            noise_multiplier=noise.update,
            count_noise_multiplier=noise.report if releases_reports else None,
            effective_noise_multiplier=sigma_eff,
        )

    def as_dict(self) -> dict[str, float | int | str | None]:
        """JSON-ready form; an infinite ε becomes the string ``"inf"``."""
        record = dict(self.__dict__)
        if math.isinf(self.epsilon):
            record["epsilon"] = "inf"
        return record


class Accountant:
    """The privacy spent by what ran, Opacus-style: ``step(event, sample_rate)`` after every round,
    ``get_epsilon(delta)`` at any time.

    Each round is a sampled Gaussian mechanism (rate q, multiplier σ_eff of the round's
    :class:`DPEvent`); consecutive rounds with the same (σ_eff, q) are kept as one entry of
    ``history`` [(σ_eff, q, rounds)], as Opacus keeps it. A history of one entry is accounted by
    :func:`epsilon` (the same number the privacy plan gives); a mixed history by Opacus'
    accountant over all entries. RDP composes a mixed history as Opacus' ``RDPAccountant`` does
    (Σ over entries of the per-step RDP × steps, in history order, converted at Opacus' orders),
    with each (σ_eff, q)'s per-step RDP computed once: a policy whose multiplier changes every
    round (``per-cohort`` with ``noise_bound = "initial"``) has thousands of entries, which
    Opacus would recompute at every call (0.06 s each).
    """

    def __init__(self, mechanism: str = "prv") -> None:
        if mechanism not in ACCOUNTANTS:
            raise PolicyConfigError(f"accountant must be one of {', '.join(ACCOUNTANTS)} (got {mechanism!r})")
        self.mechanism = mechanism
        self.history: list[tuple[float, float, int]] = []
        self._per_step_rdp: dict[tuple[float, float], np.ndarray] = {}
        """Opacus' per-step RDP at :data:`ORDERS` of each (σ_eff, q) met (RDP only)."""

    def step(self, event: DPEvent, sample_rate: float) -> None:
        """Account for one round that released ``event`` with clients sampled at rate q."""
        sigma = float(event.effective_noise_multiplier)
        q = float(sample_rate)
        if self.history and self.history[-1][:2] == (sigma, q):
            self.history[-1] = (sigma, q, self.history[-1][2] + 1)
        else:
            self.history.append((sigma, q, 1))

    @property
    def rounds(self) -> int:
        return sum(steps for _, _, steps in self.history)

    def get_epsilon(self, delta: float) -> float:
        """ε at δ of every round stepped so far (0 before the first; ∞ if one had no noise)."""
        if not self.history:
            return 0.0
        if any(sigma <= 0 for sigma, _, _ in self.history):
            return math.inf
        if len(self.history) == 1:
            sigma, q, steps = self.history[0]
            return epsilon(sigma, q, steps, delta, self.mechanism)
        for _, q, steps in self.history:
            check_privacy_parameters(q, steps, delta, self.mechanism)
        if self.mechanism == "rdp":
            composed = sum([self._rdp_per_step(sigma, q) * steps for sigma, q, steps in self.history])
            return rdp_epsilon(composed, delta)
        accountant = PRVAccountantSharedRDP()
        accountant.history = grouped(self.history)
        with one_blas_thread():
            return float(accountant.get_epsilon(delta=delta))

    def _rdp_per_step(self, sigma: float, q: float) -> np.ndarray:
        """Opacus' ``compute_rdp(q, σ, steps=1)`` at :data:`ORDERS`, kept for this accountant."""
        kept = self.__dict__.setdefault("_per_step_rdp", {})  # (an accountant pickled before it)
        per_step = kept.get((sigma, q))
        if per_step is None:
            per_step = kept[(sigma, q)] = rdp_curve(sigma, q).complete()
        return per_step


def grouped(history: list[Entry]) -> list[Entry]:
    """``history`` with the steps of equal (σ_eff, q) added into one entry, in the order each
    first appears: the same composition (composition is commutative), which PRV then discretises
    once per mechanism rather than once per entry (a run that evaluates its clients after every
    round alternates two mechanisms)."""
    steps: dict[tuple[float, float], int] = {}
    for sigma, q, count in history:
        steps[(sigma, q)] = steps.get((sigma, q), 0) + count
    return [(sigma, q, count) for (sigma, q), count in steps.items()]
