"""Server optimizer: SGD with optional momentum on the noisy update estimate.

    v_{t+1} = β v_t + Δ̂_t − λ θ_t          θ_{t+1} = θ_t + η_s · ρ_t · v_{t+1}

Δ̂_t is an update direction (θ_client − θ), so it is added. ρ_t is the policy's server
learning-rate factor (1 except for ``online`` with ``adapt_server_lr``). λ (``weight_decay``) is
an L2 penalty λ/2·||θ||²: its gradient λθ_t is public, so it is added after the noise, unclipped.
Anything done here is post-processing of released values and costs no privacy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class ServerSGD:
    """SGD with momentum ``momentum`` and learning rate ``lr`` on update estimates."""

    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0
    velocity: np.ndarray | None = field(default=None, repr=False)

    def step(self, model: np.ndarray, estimate: np.ndarray, lr_factor: float = 1.0) -> np.ndarray:
        """The next model from the current one and this round's Δ̂."""
        if self.weight_decay:
            estimate = estimate - self.weight_decay * model
        self.velocity = estimate if self.velocity is None else self.momentum * self.velocity + estimate
        return model + self.lr * lr_factor * self.velocity
