"""Local work of a mean-estimation client: its update is its point minus the model.

For the ``bimodal-mean`` scenario (seed 000, Figure 1) the model is a point μ and client i holds
x_i; one local step of gradient descent on ½||x_i − μ||² with learning rate 1 gives
Δ_i = x_i − μ.
"""

from __future__ import annotations

import numpy as np


def local_updates(points: np.ndarray, model: np.ndarray) -> np.ndarray:
    """Δ_i = x_i − μ for each row x_i of ``points``."""
    return np.asarray(points, dtype=np.float64) - np.asarray(model, dtype=np.float64)[None, :]
