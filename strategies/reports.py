"""The exact shapes an honest client's report vector a_i can take (docs/design.md, section 2).

A policy's server side only noises the *sum* of reports with the multiplier σ_b, which covers any
report of L2 norm at most 1. A server that receives reports one by one (the Flower path) checks
more than that: each report must be one that an honest client of its policy could have sent, so
that a client cannot count into another cohort's coordinates, send half a bit, or push a
direction of its choosing. A client whose update was not finite sends the zero report
(:meth:`fairclip.strategies.base.Policy.client_side`), so zero is always allowed.

    bit            a_i ∈ {0, 1}                       (``adaptive``, ``bounded``, ``soft``, ``global-adapt``)
    one-hot        a_i ∈ {0} ∪ {e_j : j ∈ J}           (``per-cohort``: J = {2k, 2k+1}; ``reweight``: J = {k})
    unit-or-zero   a_i = 0 or 1 − UNIT_TOLERANCE ≤ ||a_i|| ≤ 1    (``online``)
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from fairclip.strategies.clipping import row_norms

UNIT_TOLERANCE = 1e-6
"""How far below 1 the norm of a unit direction may lie: Δ/||Δ|| is guarded to norm
1 − 2e-9 by the final projection, and rounding moves it by ~1e-16."""


def _finite_vector(report: np.ndarray, length: int | None = None) -> bool:
    shape_ok = report.ndim == 1 and (length is None or report.shape[0] == length)
    return shape_ok and bool(np.isfinite(report).all())


def is_empty(report: np.ndarray) -> bool:
    """A policy that releases no report: the empty vector."""
    return report.ndim == 1 and report.shape[0] == 0


def is_bit(report: np.ndarray) -> bool:
    """One count bit: the vector (0) or (1)."""
    return _finite_vector(report, 1) and float(report[0]) in (0.0, 1.0)


def is_one_hot_or_zero(report: np.ndarray, length: int, allowed: Iterable[int]) -> bool:
    """The zero vector of ``length``, or e_j for one j of ``allowed``."""
    if not _finite_vector(report, length):
        return False
    ones = np.flatnonzero(report)
    if ones.size == 0:
        return True
    return ones.size == 1 and float(report[ones[0]]) == 1.0 and int(ones[0]) in set(allowed)


def is_unit_or_zero(report: np.ndarray) -> bool:
    """The zero vector, or a direction of norm in [1 − UNIT_TOLERANCE, 1] (any length: the
    caller checks the policy's length k)."""
    if not _finite_vector(report):
        return False
    if not report.any():
        return True
    norm = float(row_norms(report[None, :])[0])
    return 1.0 - UNIT_TOLERANCE <= norm <= 1.0
