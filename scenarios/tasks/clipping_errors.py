"""Seed 003's Table 1 ablation: train with only one of the two errors that clipping makes.

Esipova et al. (ICLR 2023, "Disparate impact in differential privacy from gradient
misalignment", section 4) split what clipping does to a batch's aggregate update into a
*magnitude* error and a *direction* error. With g = Σ Δ_i the sum of the clients' raw updates
and ḡ = Σ c_i the sum of their clipped contributions (before any noise), their authors' code
(``layer6ai-labs/fair-dp``, ``BaseTrainer.expected_loss``) takes

    magnitude error:  g  →  (‖ḡ‖ / ‖g‖) · g       (the length clipping leaves, the true direction)
    direction error:  (‖ḡ‖ / ‖g‖) · g  →  ḡ        (the same length, the clipped direction)

so a run that steps with

    ``magnitude``:  (‖ḡ‖ / ‖g‖) · g      keeps clipping's magnitude error alone, and
    ``direction``:  (‖g‖ / ‖ḡ‖) · ḡ      keeps its direction error alone (ḡ at g's length).

Both need g, which no client sends in a deployment and no DP release covers: this is a
simulation-only, non-private ablation (``training.clipping_error``; the configuration refuses it
with DP noise, and the Flower apps refuse it outright). Where a norm is zero the round steps by
zero (nothing to rescale).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

import numpy as np

from fairclip.strategies.aggregation import RoundSums
from fairclip.strategies.clipping import vector_norm

ClippingError = Literal["both", "direction", "magnitude"]


def keep_one_error(sums: RoundSums, error: ClippingError) -> RoundSums:
    """``sums`` with its contribution sum replaced by the update that keeps only clipping's
    ``error`` (module docstring); ``both`` returns ``sums`` as they are. The sums must carry the
    unclipped total (``CohortDiagnostics.unclipped_total``)."""
    if error == "both":
        return sums
    unclipped = sums.diagnostics.unclipped_total
    if unclipped is None:
        raise RuntimeError(f"clipping_error {error!r}: the clients' sums carry no unclipped total")
    clipped = sums.contribution_sum
    if error == "magnitude":
        kept = _at_length(unclipped, vector_norm(clipped))
    elif error == "direction":
        kept = _at_length(clipped, vector_norm(unclipped))
    else:
        raise ValueError(f"unknown clipping error {error!r} (both, direction, magnitude)")
    return replace(sums, contribution_sum=kept)


def _at_length(direction: np.ndarray, length: float) -> np.ndarray:
    """``direction`` scaled to norm ``length``; zeros where ``direction`` is zero."""
    peak = float(np.abs(direction).max(initial=0.0))
    if peak == 0:
        return np.zeros_like(direction)
    unit = direction / peak
    return unit * (length / vector_norm(unit))
