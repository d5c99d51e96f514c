"""Local training of one client: E epochs of minibatch SGD from θ_t, returning Δ = θ_i − θ_t.

The shuffling of every epoch comes from the client's own generator, seeded by the engine from
(seed, round, client id), so the same client trains identically in any process.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fairclip.client.models import load_vector, model_to_vector


@dataclass(frozen=True)
class LocalTraining:
    """Hyper-parameters of local training."""

    epochs: int
    batch_size: int
    lr: float


def local_update(
    model: nn.Module,
    global_vector: np.ndarray,
    features: torch.Tensor,
    labels: torch.Tensor,
    training: LocalTraining,
    generator: torch.Generator,
) -> np.ndarray:
    """Train ``model`` from ``global_vector`` on one client's data; return Δ as float64."""
    load_vector(model, global_vector)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=training.lr)
    loss_function = nn.CrossEntropyLoss()
    count = labels.shape[0]
    for _ in range(training.epochs):
        order = torch.randperm(count, generator=generator)
        for start in range(0, count, training.batch_size):
            batch = order[start : start + training.batch_size]
            optimizer.zero_grad(set_to_none=True)
            loss_function(model(features[batch]), labels[batch]).backward()
            optimizer.step()
    return model_to_vector(model) - global_vector
