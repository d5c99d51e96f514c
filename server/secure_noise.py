"""Gaussian noise from OpenDP's exact sampler, built against floating-point attacks.

Mironov (CCS 2012, "On significance of the least significant bits for differential privacy")
showed that noise drawn as a textbook floating-point sample and added to a value leaks the value
through the pattern of representable results; a numpy ``normal`` draw has the same weakness.
OpenDP's ``make_gaussian`` instead rounds the input to the grid 2^k and adds *discrete* Gaussian
noise on that grid, sampled exactly from operating-system entropy (Canonne, Kamath, Steinke,
NeurIPS 2020), so every output is a multiple of 2^k and no bit depends on the input beyond what
the mechanism releases.

Calibration, for a release of L2 sensitivity s with noise multiplier σ on n coordinates::

    k     = ⌊log2(min(s, σ s))⌋ − GRID_BITS         (grid 2^k: 2^-40 of s and of the noise scale)
    w     = √n · 2^k                                (most the rounding to the grid can widen s)
    scale = σ · (s + w)                             (the std of the discrete Gaussian)

so the release of sensitivity s + w has the privacy of the continuous Gaussian with multiplier σ
that the accountant assumes (zCDP ρ = 1/(2σ²)); every call checks this with OpenDP's own privacy
map before anything is released. The extra noise is w/s ≤ √n · 2^-40 relative, below 1e-9 for a
million coordinates. This sampler cannot be seeded: a run that uses it is not reproducible.
"""

from __future__ import annotations

import math

import numpy as np

from fairclip.strategies.randomness import Stream, rng

GRID_BITS = 40
"""The grid 2^k lies this many binary orders below the noise scale σ·s."""

PRIVACY_MAP_SLACK = 1e-9
"""Relative room for rounding in the comparison of OpenDP's ρ with 1/(2σ²)."""


def secure_sampler(on: bool) -> ExactGaussian | None:
    """OpenDP's exact sampler where ``on`` (secure noise asked for, and a private policy), else
    ``None`` (the noise then comes from :func:`noise_source`'s generators)."""
    return ExactGaussian() if on else None


def noise_source(
    secure: ExactGaussian | None, seed: int | None, round_number: int, stream: Stream = Stream.NOISE
) -> ExactGaussian | np.random.Generator:
    """Where round ``round_number``'s DP noise comes from, for a run (:class:`fairclip.server.run.Run`)
    and the Flower DP wrapper alike: the ``secure`` exact sampler where there is one; else a
    generator seeded by the run's ``seed`` (stream ``NOISE``, round t; ``EVALUATION_NOISE`` for
    the release of the clients' evaluation after it), reproducible and so not private
    (docs/design.md, section 6); else one seeded from the operating system's entropy."""
    if secure is not None:
        return secure
    if seed is not None:
        return rng(seed, stream, round_number)
    return np.random.default_rng()


class ExactGaussian:
    """A :class:`fairclip.strategies.base.GaussianSampler` drawing from OpenDP's exact sampler."""

    name = "opendp-exact-gaussian"

    def __init__(self) -> None:
        import opendp.prelude as dp

        dp.enable_features("contrib")
        self._dp = dp

    def add_noise(
        self, values: np.ndarray, multiplier: float, sensitivity: float
    ) -> tuple[np.ndarray, float]:
        values = np.ascontiguousarray(values, dtype=np.float64)
        if multiplier == 0 or values.size == 0:
            return values.copy(), 0.0
        if not (
            math.isfinite(multiplier) and multiplier > 0 and math.isfinite(sensitivity) and sensitivity > 0
        ):
            raise ValueError(
                f"secure noise needs a finite multiplier and sensitivity > 0 ({multiplier}, {sensitivity})"
            )
        if not np.isfinite(values).all():
            raise ValueError("secure noise refuses non-finite values")
        dp = self._dp
        k = math.floor(math.log2(min(sensitivity, multiplier * sensitivity))) - GRID_BITS
        widening = math.sqrt(values.size) * 2.0**k
        scale = multiplier * (sensitivity + widening)
        space = (
            dp.vector_domain(dp.atom_domain(T=float, nan=False), size=values.size),
            dp.l2_distance(T=float),
        )
        measurement = dp.m.make_gaussian(*space, scale=scale, k=k)
        rho = measurement.map(sensitivity)
        if not rho <= (1 + PRIVACY_MAP_SLACK) / (2 * multiplier**2):
            raise RuntimeError(
                f"OpenDP's Gaussian of scale {scale!r} gives rho={rho!r} at sensitivity {sensitivity!r}, "
                f"above the 1/(2 sigma^2) the accountant assumes for sigma={multiplier!r}"
            )
        return np.asarray(measurement(values), dtype=np.float64), scale
