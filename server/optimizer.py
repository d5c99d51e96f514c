"""Server optimizers: SGD with optional momentum, Adam, or Adam with its second moment fixed at
the noise's (AdamWOSM), on the noisy update estimate.

Δ̂_t is an update direction (θ_client − θ), so the optimizers step *along* it; with one local
step of client learning rate 1 (the sample-level case) Δ̂_t = −ĝ_t, the negated noisy mean
gradient of DP-SGD. ρ_t is the policy's server learning-rate factor (1 except for ``online``
with ``adapt_server_lr``). λ (``weight_decay``) is an L2 penalty λ/2·||θ||²: its gradient λθ_t
is public, so it joins the direction after the noise, unclipped: d_t = Δ̂_t − λθ_t.

* ``sgd``:  v_{t+1} = β v_t + d_t,  θ_{t+1} = θ_t + η_s · ρ_t · v_{t+1}.
* ``adam`` (Kingma & Ba 2015, "Adam: a method for stochastic optimization", Algorithm 1, on the
  gradient −d_t; what DP-Adam does with the noisy gradient, e.g. Opacus' optimizer wrapping
  ``torch.optim.Adam``)::

      m_t = β₁ m_{t−1} + (1 − β₁) d_t        u_t = β₂ u_{t−1} + (1 − β₂) d_t²
      θ_{t+1} = θ_t + η_s · ρ_t · (m_t / (1 − β₁^t)) / (sqrt(u_t / (1 − β₂^t)) + ε)

* ``adam-wosm`` (Mohapatra, Sasy, He, Kamath, Thakkar 2022, "The role of adaptive optimizers for
  honest private hyperparameter selection", AAAI: DPAdamWOSM, the baseline of seed 002; its
  second moment is not estimated but fixed at its limit). Under DP noise Adam's second moment
  converges to the noise's variance per coordinate, ξ_t², where ξ_t = σ_Δ·n_t / (Δ̂'s
  denominator: m̂, or m̂·s_t with ``normalize``) is the standard deviation of each coordinate of
  Δ̂'s noise (public: the multiplier, the noise's sensitivity n_t and the denominator), so
  DPAdamWOSM puts ξ_t in place of sqrt(û_t)::

      m_t = β₁ m_{t−1} + (1 − β₁) d_t
      θ_{t+1} = θ_t + η_s · ρ_t · (m_t / (1 − β₁^t)) / (ξ_t + ε)

  Its authors' code (``pyvacy/optim/optimizer.py``, ``AdamWOSM`` with ``cutoff = 0``) divides the
  learning rate by σ·C/B + 1e-8 once, at the run's fixed C; here ξ_t is each round's own, the
  same for a fixed bound.

Anything done here is post-processing of released values and costs no privacy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

SERVER_OPTIMIZERS = ("sgd", "adam", "adam-wosm")


class ServerOptimizer(Protocol):
    """Steps the model along a round's released update estimate Δ̂; ``noise_std`` is ξ_t, the
    standard deviation of each coordinate of Δ̂'s noise (0 without noise)."""

    def step(
        self, model: np.ndarray, estimate: np.ndarray, lr_factor: float = 1.0, noise_std: float = 0.0
    ) -> np.ndarray: ...


@dataclass
class ServerSGD:
    """SGD with momentum ``momentum`` and learning rate ``lr`` on update estimates. Without
    momentum (β = 0) v_{t+1} = d_t: no velocity is kept, so a run's checkpoint
    (:mod:`fairclip.server.checkpoint`) holds no dead copy of the model's size."""

    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0
    velocity: np.ndarray | None = field(default=None, repr=False)

    def step(
        self, model: np.ndarray, estimate: np.ndarray, lr_factor: float = 1.0, noise_std: float = 0.0
    ) -> np.ndarray:
        """The next model from the current one and this round's Δ̂ (``noise_std`` unused)."""
        if self.weight_decay:
            estimate = estimate - self.weight_decay * model
        if not self.momentum:
            self.velocity = None  # one restored from a checkpoint written before it was dropped
            return model + self.lr * lr_factor * estimate
        self.velocity = estimate if self.velocity is None else self.momentum * self.velocity + estimate
        return model + self.lr * lr_factor * self.velocity


@dataclass
class ServerAdam:
    """Adam with learning rate ``lr`` on update estimates (module docstring)."""

    lr: float
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    first: np.ndarray | None = field(default=None, repr=False)
    second: np.ndarray | None = field(default=None, repr=False)
    steps: int = 0

    def step(
        self, model: np.ndarray, estimate: np.ndarray, lr_factor: float = 1.0, noise_std: float = 0.0
    ) -> np.ndarray:
        """The next model from the current one and this round's Δ̂ (``noise_std`` unused)."""
        direction = estimate - self.weight_decay * model if self.weight_decay else estimate
        beta1, beta2 = self.betas
        if self.first is None or self.second is None:
            self.first, self.second = np.zeros_like(direction), np.zeros_like(direction)
        self.steps += 1
        self.first = beta1 * self.first + (1.0 - beta1) * direction
        self.second = beta2 * self.second + (1.0 - beta2) * direction * direction
        corrected_first = self.first / (1.0 - beta1**self.steps)
        corrected_second = self.second / (1.0 - beta2**self.steps)
        return model + self.lr * lr_factor * corrected_first / (np.sqrt(corrected_second) + self.eps)


@dataclass
class ServerAdamWOSM:
    """DPAdamWOSM with learning rate ``lr`` on update estimates: Adam's first moment over ξ_t, the
    noise's standard deviation per coordinate, in place of its second moment (module docstring)."""

    lr: float
    beta1: float = 0.9
    eps: float = 1e-8
    weight_decay: float = 0.0
    first: np.ndarray | None = field(default=None, repr=False)
    steps: int = 0

    def step(
        self, model: np.ndarray, estimate: np.ndarray, lr_factor: float = 1.0, noise_std: float = 0.0
    ) -> np.ndarray:
        """The next model from the current one, this round's Δ̂ and its noise's ξ_t (> 0)."""
        if not noise_std > 0:
            raise ValueError(
                "adam-wosm divides by the noise's standard deviation, and this round added none "
                "(a private policy with privacy.noise_multiplier or privacy.target_epsilon needs it)"
            )
        direction = estimate - self.weight_decay * model if self.weight_decay else estimate
        if self.first is None:
            self.first = np.zeros_like(direction)
        self.steps += 1
        self.first = self.beta1 * self.first + (1.0 - self.beta1) * direction
        corrected_first = self.first / (1.0 - self.beta1**self.steps)
        return model + self.lr * lr_factor * corrected_first / (noise_std + self.eps)


def server_optimizer(
    name: str,
    lr: float,
    *,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
) -> ServerOptimizer:
    """The server optimizer ``name`` (``sgd``, ``adam`` or ``adam-wosm``, which uses β₁ of
    ``betas`` only) with its settings."""
    if name == "sgd":
        return ServerSGD(lr, momentum, weight_decay)
    if name in ("adam", "adam-wosm") and momentum:
        raise ValueError("momentum is SGD's; Adam keeps its own moments (betas)")
    if name == "adam":
        return ServerAdam(lr, betas, eps, weight_decay)
    if name == "adam-wosm":
        return ServerAdamWOSM(lr, betas[0], eps, weight_decay)
    raise ValueError(f"unknown server optimizer {name!r} (known: {', '.join(SERVER_OPTIMIZERS)})")
