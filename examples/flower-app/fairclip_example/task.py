"""The app's own model, data and training: nothing here knows about fairclip.

Each node is one client with 24 examples of 6 features. Even partitions are the majority, whose
label follows feature 0; odd partitions the minority, whose label follows feature 1. Data are
generated from the partition id, so every node and the test below see the same examples.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

FEATURES = 6
CLASSES = 2
EXAMPLES = 24


def make_model(
    input_shape: tuple[int, ...] = (FEATURES,), num_classes: int = CLASSES, seed: int = 0
) -> nn.Module:
    """A small MLP, initialised from ``seed`` (every run starts from the same model)."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Flatten(), nn.Linear(int(np.prod(input_shape)), 16), nn.ReLU(), nn.Linear(16, num_classes)
    )


def cohort_of(partition_id: int) -> str:
    return "majority" if partition_id % 2 == 0 else "minority"


def load_data(partition_id: int, examples: int = EXAMPLES) -> tuple[np.ndarray, np.ndarray]:
    """This partition's examples (features float32, integer labels)."""
    rng = np.random.default_rng(1000 + partition_id)
    x = rng.normal(size=(examples, FEATURES)).astype(np.float32)
    signal = 0 if cohort_of(partition_id) == "majority" else 1
    return x, (x[:, signal] > 0).astype(np.int64)


def test_data(examples: int = 400) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A test set of both cohorts: (features, labels, cohort of each example)."""
    rng = np.random.default_rng(99)
    x = rng.normal(size=(2 * examples, FEATURES)).astype(np.float32)
    cohorts = np.repeat(np.array(["majority", "minority"]), examples)
    y = np.where(cohorts == "majority", x[:, 0] > 0, x[:, 1] > 0).astype(np.int64)
    return x, y, cohorts


def train(model: nn.Module, x: np.ndarray, y: np.ndarray, lr: float) -> float:
    """One epoch of SGD on the whole local set in one batch; returns the loss."""
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
    loss.backward()
    optimizer.step()
    return float(loss)


def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    model.eval()
    with torch.no_grad():
        return float((model(torch.from_numpy(x)).argmax(dim=1).numpy() == y).mean())
