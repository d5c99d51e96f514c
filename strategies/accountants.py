"""Opacus' RDP and PRV accountants without their repeated work: every ε is Opacus' bit for bit.

A run asks Opacus for ε of one sampled Gaussian mechanism (σ, q) at several T and δ. Opacus
computes, every time, the per-step RDP ρ(α) at its 151 default orders (the 90 fractional ones by
a series: 0.06 s), and PRV's safe domain does it twice. Here:

* :class:`RdpCurve` holds Opacus' ρ(α) of one (σ, q), each order computed at most once a process
  and only where it can decide a conversion (below);
* :class:`PRVAccountantSharedRDP` is Opacus' ``PRVAccountant`` whose safe domain reads the curves.

Which orders are needed. Opacus converts RDP to (ε, δ) as (Balle et al. 2020, Theorem 21)::

    ε = min_α  T·ρ(α) + c_δ(α),    c_δ(α) = −(log δ + log α)/(α − 1) + log((α − 1)/α)

RDP is non-decreasing in the order (van Erven & Harremoës 2014, Theorem 3) and non-negative, so
for a fractional α, T·ρ(⌊α⌋) + c_δ(α) <= T·ρ(α) + c_δ(α), with ρ(⌊α⌋) at an integer order
(Opacus' exact finite sum, cheap; 0 below order 2). The integer orders are computed first; a
fractional order whose lower bound exceeds the best ε found by more than :data:`MARGIN` cannot
be the minimum and stays uncomputed (+∞ in the vector handed to Opacus' conversion); every other
order holds Opacus' own value, so the minimum -- and ε -- is Opacus'. For W1's claim (σ = 1,
q = 0.1, T = 5) 37 of the 90 fractional orders are computed: 0.011 s instead of 0.066 s.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache

import numpy as np
from opacus.accountants import PRVAccountant, RDPAccountant
from opacus.accountants.analysis import rdp as rdp_analysis
from opacus.accountants.analysis.prv import Domain
from scipy.fft import irfft, rfft
from threadpoolctl import threadpool_limits

ORDERS = tuple(RDPAccountant.DEFAULT_ALPHAS)
"""Opacus' default RDP orders, exactly as its accountants use them."""

MARGIN = 1e-6
"""Relative margin by which a fractional order's lower bound must exceed the best ε to be skipped:
far above the error of Opacus' series (terms below e^−30 are dropped)."""

# RDP's hint that a larger order might be tighter: the ε it reports stays valid. A filter for the
# whole process rather than ``warnings.catch_warnings``, which is not thread-safe (the executors
# compute a run's final ε in a background thread).
warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")
# PRV at sample rate q = 1 (every client in every round) evaluates log(1 − q) = −∞ inside an
# ``np.where`` whose other branch it keeps: numpy warns, the privacy curve is exact and finite.
warnings.filterwarnings(
    "ignore", message="divide by zero encountered in log", module=r"opacus\.accountants\.analysis\.prv"
)


def rdp_epsilon(rdp: np.ndarray, delta: float) -> float:
    """ε of an RDP vector over :data:`ORDERS` at δ, as ``RDPAccountant.get_epsilon`` converts it."""
    eps, _ = rdp_analysis.get_privacy_spent(orders=list(ORDERS), rdp=rdp, delta=delta)
    return float(eps)


def _conversion_terms(delta: float) -> np.ndarray:
    """c_δ(α) of every order, with Opacus' expression."""
    orders = np.atleast_1d(list(ORDERS))
    return -(np.log(delta) + np.log(orders)) / (orders - 1) + np.log((orders - 1) / orders)


class RdpCurve:
    """Opacus' per-step RDP ρ(α) of the sampled Gaussian mechanism (σ, q) at :data:`ORDERS`,
    each order computed when a conversion first needs it (module docstring)."""

    def __init__(self, noise_multiplier: float, sample_rate: float):
        self.noise_multiplier = noise_multiplier
        self.sample_rate = sample_rate
        self._values = np.full(len(ORDERS), np.nan)
        self._lock = threading.Lock()
        integer = [index for index, order in enumerate(ORDERS) if float(order).is_integer()]
        for index in integer:
            self._compute(index)
        # ρ at the largest integer order below each order (0 below the smallest): a lower bound
        self._lower = np.zeros(len(ORDERS))
        for index, order in enumerate(ORDERS):
            below = [i for i in integer if ORDERS[i] < order]
            self._lower[index] = self._values[below[-1]] if below else 0.0

    @property
    def computed_orders(self) -> int:
        return int(np.count_nonzero(~np.isnan(self._values)))

    def _compute(self, index: int) -> None:
        self._values[index] = rdp_analysis.compute_rdp(
            q=self.sample_rate, noise_multiplier=self.noise_multiplier, steps=1, orders=[ORDERS[index]]
        )[0]

    def for_conversion(self, steps: int, delta: float) -> np.ndarray:
        """ρ with every order that can be the minimiser of ε at (``steps``, δ) computed, the
        others +∞: ``rdp_epsilon(result * steps, δ)`` is Opacus' ε."""
        with self._lock:
            missing = np.isnan(self._values)
            terms = _conversion_terms(delta)
            best = np.min(self._values[~missing] * steps + terms[~missing])
            needed = missing
            if np.isfinite(best):  # skip only orders whose finite lower bound is beyond the best
                bounds = self._lower * steps + terms
                needed = missing & ~(np.isfinite(bounds) & (bounds > best + MARGIN * (1.0 + abs(best))))
            for index in np.flatnonzero(needed):
                self._compute(int(index))
            return np.where(np.isnan(self._values), np.inf, self._values)

    def complete(self) -> np.ndarray:
        """ρ at every order (Opacus' ``compute_rdp(steps=1)``)."""
        with self._lock:
            for index in np.flatnonzero(np.isnan(self._values)):
                self._compute(int(index))
            return self._values.copy()

    def epsilon(self, steps: int, delta: float) -> float:
        """``RDPAccountant`` ε after ``steps`` steps, history [(σ, q, steps)]."""
        return rdp_epsilon(self.for_conversion(steps, delta) * steps, delta)


@lru_cache(maxsize=256)
def rdp_curve(noise_multiplier: float, sample_rate: float) -> RdpCurve:
    """The process's one :class:`RdpCurve` of (σ, q)."""
    return RdpCurve(noise_multiplier, sample_rate)


class PRVAccountantSharedRDP(PRVAccountant):
    """Opacus' PRV accountant, whose safe domain reads each mechanism's :class:`RdpCurve`.

    Opacus (``compute_safe_domain_size``, Gopi et al. 2021, Remark 5.6) takes the domain
    half-width L = max(ε_RDP(all steps, δ_err/4), max_i ε_RDP(step i, δ_err/(8T)), ε_err) + 3,
    asking two RDP accountants for the same per-step RDP. Here both read the curve, composed as
    Opacus composes it (ρ × steps, summed over the history), so L, the mesh and ε are Opacus'.
    """

    def _get_domain(self, prvs, num_self_compositions, eps_error, delta_error) -> Domain:
        total = sum(num_self_compositions)
        curves = [rdp_curve(prv.noise_multiplier, prv.sample_rate) for prv in prvs]
        if len(curves) == 1:
            half_width = curves[0].epsilon(total, delta_error / 4)
        else:
            composed = sum(
                [c.complete() * steps for c, steps in zip(curves, num_self_compositions, strict=True)]
            )
            half_width = rdp_epsilon(composed, delta_error / 4)
        for curve in curves:
            half_width = max(half_width, curve.epsilon(1, delta_error / (8 * total)))
        half_width = max(half_width, eps_error) + 3
        mesh_size = eps_error / np.sqrt(total * np.log(12 / delta_error) / 2)
        return Domain.create_aligned(-half_width, half_width, mesh_size)


FFT_PLAN_FLUSH_LENGTHS = range(64, 80)
"""Sixteen short transform lengths (pocketfft caches no plan below 50) that push the longest
plans out of pocketfft's cache (:func:`release_fft_plans`)."""


def release_fft_plans() -> None:
    """Free the FFT plans PRV's composition leaves behind. scipy's pocketfft keeps the plans of
    the last 16 transform lengths in a static cache, each about as large as its transform (for
    the Bluestein lengths PRV's domains have, several times larger); a run that reports ε at
    about 100 rounds composes 100 lengths, and the 16 largest stayed: 1.6 GB at 1,500 rounds
    of ``bimodal-mean``, against 0.2 GB for one ε of 1,500 rounds. Transforms of 16 short
    lengths replace them (the cache is least-recently-used); the ε computed is untouched."""
    for length in FFT_PLAN_FLUSH_LENGTHS:
        irfft(rfft(np.zeros(length)), length)


_one_accountant_at_a_time = threading.RLock()


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """Run an accountant with a single BLAS thread, one accountant at a time.

    PRV's discretisation takes a dot product over its grid; with numpy's default OpenBLAS pool
    (a thread a core) the pool's threads kept spinning after it, and a final claim computed
    beside the clients' training took 0.16 CPU-s instead of 0.08 on this 2-core machine, taken
    from the clients' cores. threadpoolctl's limit is process-wide and is only restored reliably
    by the thread that set it, hence the lock (an accountant call takes 0.01-0.2 s). At the end,
    the FFT plans the call left are freed (:func:`release_fft_plans`).
    """
    with _one_accountant_at_a_time, threadpool_limits(limits=1, user_api="blas"):
        try:
            yield
        finally:
            release_fft_plans()
