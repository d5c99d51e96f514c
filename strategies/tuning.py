"""The privacy cost of hyperparameter tuning by random search (Papernot & Steinke 2022).

Tuning runs a DP training procedure Q several times -- each *trial* a full run with
hyperparameters drawn at random from a grid -- and releases the best trial. Counting only the
best run's ε understates the cost (the choice of the best leaks); composing all trials
overstates it. Papernot & Steinke ("Hyperparameter tuning with Rényi differential privacy",
ICLR 2022) draw the *number* of trials K at random and bound the whole procedure A in RDP:

* **Truncated negative binomial** K ~ D_{η,γ} (η > −1, γ ∈ (0, 1); here η ≥ 0), with
  P[K = k] = (1−γ)^k / (γ^{−η} − 1) · Π_{ℓ<k} (ℓ+η)/(ℓ+1) for k >= 1 (η = 0: the logarithmic
  distribution P[K = k] = (1−γ)^k / (k log(1/γ)); η = 1: geometric) and
  E[K] = η(1−γ) / (γ(1−γ^η)) (η = 0: (1/γ − 1)/log(1/γ)). Their Theorem 2: if Q is
  (λ, ε(λ))-RDP and (λ̂, ε(λ̂))-RDP, A is (λ, ε′(λ))-RDP with::

      ε′(λ) = ε(λ) + (1+η)(1 − 1/λ̂) ε(λ̂) + (1+η) log(1/γ)/λ̂ + log E[K] / (λ − 1)

  for every λ̂ >= 1; :func:`selection_rdp` takes the best λ̂ among the orders given.

* **Poisson** K ~ Poisson(μ) (their Theorem 6): if Q is (λ, ε(λ))-RDP and (ε̂, δ̂)-DP with
  e^ε̂ <= 1 + 1/(λ−1), A is (λ, ε′(λ))-RDP with::

      ε′(λ) = ε(λ) + μ δ̂ + log(μ) / (λ − 1)

  where δ̂(λ) is the least δ at which Q's RDP gives ε̂ = log(1 + 1/(λ−1)) by the conversion
  Opacus uses (Balle et al. 2020, Theorem 21), inverted in closed form per order::

      δ(α) = exp((α−1)(ρ(α) − ε̂ + log((α−1)/α)) − log α),   δ̂ = min(1, min_α δ(α))

  K = 0 can happen: then nothing is released (and no trial runs).

Q here is "draw a grid point, train it with DP", whose RDP at each order is at most the largest
over the grid points' runs (:func:`trial_rdp`: Opacus' per-round RDP of the sampled Gaussian
mechanism × T, at Opacus' default orders). The total ε at δ is then Opacus' RDP conversion of
ε′ (:func:`tuning_epsilon`). Which trial is best is decided on the evaluation split, which this
bound (like the paper's experiments) treats as public.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from scipy import stats

from fairclip.strategies.accountants import ORDERS, rdp_curve, rdp_epsilon
from fairclip.strategies.errors import PolicyConfigError

DISTRIBUTIONS = ("tnb", "poisson")
MIN_ETA = 1e-3
"""Smallest positive η: below it 1 − γ^η loses its digits (the law is then the logarithmic, η = 0)."""


MAX_EXPECTED_TRIALS = 10_000
"""Largest mean number of trials a search may draw: each trial is a whole run, and a larger draw
overflows the trials' table before any run starts."""


@dataclass(frozen=True)
class TrialCount:
    """The distribution of the number of trials K: ``tnb`` (η, γ) or ``poisson`` (μ)."""

    distribution: str = "tnb"
    eta: float = 1.0
    gamma: float = 0.2
    mu: float = 5.0

    def __post_init__(self) -> None:
        if self.distribution not in DISTRIBUTIONS:
            raise PolicyConfigError(
                f"trial distribution must be one of {', '.join(DISTRIBUTIONS)} (got {self.distribution!r})"
            )
        if self.distribution == "tnb":
            if not (math.isfinite(self.eta) and (self.eta == 0 or self.eta >= MIN_ETA)):
                raise PolicyConfigError(
                    f"tnb eta must be 0 (the logarithmic law) or a finite number >= {MIN_ETA:g} "
                    f"(got {self.eta})"
                )
            if not 0 < self.gamma < 1:
                raise PolicyConfigError(f"tnb gamma must be in (0, 1) (got {self.gamma})")
        elif not (math.isfinite(self.mu) and self.mu > 0):
            raise PolicyConfigError(f"poisson mu must be a finite number > 0 (got {self.mu})")
        if not self.expected <= MAX_EXPECTED_TRIALS:
            raise PolicyConfigError(
                f"the number of trials K would be {self.expected:.3g} on average (each a whole run); "
                f"at most {MAX_EXPECTED_TRIALS:,} on average"
            )

    def _scipy(self) -> stats.rv_discrete:
        if self.distribution == "poisson":
            return stats.poisson(self.mu)
        if self.eta == 0:
            return stats.logser(1.0 - self.gamma)  # support k >= 1 already
        return stats.nbinom(self.eta, self.gamma)  # failures before η successes: truncated below

    def _truncated(self) -> bool:
        return self.distribution == "tnb" and self.eta > 0

    def pmf(self, k: int | np.ndarray) -> np.ndarray:
        """P[K = k]."""
        k = np.asarray(k)
        base = self._scipy()
        if not self._truncated():
            return base.pmf(k)
        return np.where(k >= 1, base.pmf(k) / base.sf(0), 0.0)

    @property
    def expected(self) -> float:
        """E[K] (the paper's closed forms; scipy's mean, renormalised, agrees)."""
        if self.distribution == "poisson":
            return self.mu
        gamma, eta = self.gamma, self.eta
        if eta == 0:
            return (1.0 / gamma - 1.0) / math.log(1.0 / gamma)
        return eta * (1.0 - gamma) / (gamma * -math.expm1(eta * math.log(gamma)))

    def sample(self, rng: np.random.Generator) -> int:
        """One draw of K."""
        return int(self.samples(rng, 1)[0])

    def samples(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """``size`` draws of K (inverse CDF of scipy's distribution, conditioned on K >= 1 for
        the truncated negative binomial)."""
        base = self._scipy()
        low = base.cdf(0) if self._truncated() else 0.0
        u = low + (1.0 - low) * rng.random(size)
        return base.ppf(u).astype(int)

    def describe(self) -> str:
        if self.distribution == "poisson":
            return f"Poisson(mu={self.mu:g}), E[K]={self.expected:.3g}"
        return (
            f"truncated negative binomial(eta={self.eta:g}, gamma={self.gamma:g}), E[K]={self.expected:.3g}"
        )


def trial_rdp(plans: Iterable[tuple[float, float, int]]) -> np.ndarray:
    """RDP of one trial at :data:`ORDERS`: the largest, order by order, over the grid's runs,
    each given as (σ_eff, q, T) -- Opacus' per-round RDP × T (∞ for a run without noise)."""
    worst = np.zeros(len(ORDERS))
    for sigma, q, rounds in plans:
        if rounds == 0:
            continue
        if sigma <= 0:
            return np.full(len(ORDERS), math.inf)
        worst = np.maximum(worst, rdp_curve(float(sigma), float(q)).complete() * int(rounds))
    return worst


def poisson_delta_hat(rdp: np.ndarray, orders: np.ndarray, order: float) -> float:
    """δ̂ at which a mechanism of RDP ``rdp`` (at ``orders``) is (log(1 + 1/(λ−1)), δ̂)-DP, for
    λ = ``order``: the least δ of the conversion above, at most 1."""
    epsilon_hat = math.log1p(1.0 / (order - 1.0))
    alphas = orders[orders > 1]
    rho = rdp[orders > 1]
    with np.errstate(over="ignore", invalid="ignore"):
        log_delta = (alphas - 1) * (rho - epsilon_hat + np.log((alphas - 1) / alphas)) - np.log(alphas)
    finite = log_delta[np.isfinite(log_delta)]
    if finite.size == 0:
        return 1.0
    return float(min(1.0, math.exp(min(0.0, float(finite.min())))))


def selection_rdp(rdp: np.ndarray, trials: TrialCount, orders: Iterable[float] = ORDERS) -> np.ndarray:
    """ε′(λ) of the tuning procedure at each of ``orders`` (Theorems 2 and 6 above) for a trial
    of RDP ``rdp`` at the same orders."""
    alphas = np.asarray(list(orders), dtype=float)
    rdp = np.asarray(rdp, dtype=float)
    if rdp.shape != alphas.shape:
        raise ValueError(f"rdp has {rdp.size} values for {alphas.size} orders")
    if not np.all(alphas > 1):
        raise ValueError("RDP orders must be > 1")
    if trials.distribution == "poisson":
        delta_hat = np.array([poisson_delta_hat(rdp, alphas, a) for a in alphas])
        return rdp + trials.mu * delta_hat + math.log(trials.mu) / (alphas - 1)
    eta, log_inv_gamma = trials.eta, math.log(1.0 / trials.gamma)
    with np.errstate(invalid="ignore"):
        at_hat = (1 + eta) * (1 - 1 / alphas) * rdp + (1 + eta) * log_inv_gamma / alphas
    best_hat = float(np.nanmin(at_hat)) if np.any(np.isfinite(at_hat)) else math.inf
    return rdp + best_hat + math.log(trials.expected) / (alphas - 1)


def tuning_epsilon(rdp: np.ndarray, trials: TrialCount, delta: float) -> float:
    """ε at δ of the whole tuning procedure whose trials have RDP ``rdp`` at :data:`ORDERS`
    (Opacus' conversion of :func:`selection_rdp`)."""
    if not 0 < delta < 1:
        raise PolicyConfigError(f"delta must be in (0, 1) (got {delta:g})")
    if np.all(np.isinf(rdp)):
        return math.inf
    return rdp_epsilon(selection_rdp(rdp, trials), delta)
