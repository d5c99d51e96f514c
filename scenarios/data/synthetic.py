"""Embedded synthetic classification data (no download), one distribution per cohort.

Binary labels y ∈ {0, 1} with sign s = 2y − 1, each class with probability 1/2. A client of
cohort k draws its examples as

    x_{j_k} = s · a_k + σ_k · z_{j_k} + o_k,     x_j = β_k · z_j + o_k  (j ≠ j_k),    z ~ N(0, I_d)

so each cohort's label lives along its own feature j_k (strength a_k, noise σ_k, background
noise β_k, offset o_k).
One linear model can classify every cohort at once (weights along all the j_k), but a cohort
whose direction the majority does not share must be learnt from its own clients' updates: when
clipping shrinks those updates, that cohort pays (the disparate impact of seeds 000 and 003).
"""

from __future__ import annotations

import numpy as np

from fairclip.scenarios.config import SyntheticCohortSpec


def sample_cohort(
    spec: SyntheticCohortSpec, features: int, count: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``count`` examples (float32 features, int64 labels) of one cohort's distribution."""
    labels = rng.integers(0, 2, size=count)
    signs = 2.0 * labels - 1.0
    scale = np.full(features, spec.background_noise)
    scale[spec.signal_feature] = spec.noise
    x = scale * rng.standard_normal((count, features)) + spec.offset
    x[:, spec.signal_feature] += signs * spec.signal_strength
    return x.astype(np.float32), labels.astype(np.int64)
