"""Synthetic 28×28 images and the W1 CNN: torch and numpy only (pfl's workers import this)."""

from __future__ import annotations

import numpy as np
from torch import nn

IMAGE_SHAPE = (1, 28, 28)
NUM_CLASSES = 10
MINORITY_SHIFT = 0.5


def w1_cnn(num_classes: int = NUM_CLASSES) -> nn.Module:
    """The W1 model: conv 16 and conv 32 (3×3, padding 1, ReLU, max-pool 2), dense 64, dense 10."""
    return nn.Sequential(
        nn.Conv2d(IMAGE_SHAPE[0], 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 7 * 7, 64),
        nn.ReLU(),
        nn.Linear(64, num_classes),
    )


def synthetic_images(
    num_clients: int, per_client: int, test_per_cohort: int, seed: int, minority_share: float = 0.1
) -> dict[str, np.ndarray]:
    """Training images per client (client i owns rows i*per_client ...), cohorts and a test set."""
    generator = np.random.default_rng([seed, 6])
    prototypes = generator.standard_normal((NUM_CLASSES, *IMAGE_SHAPE)).astype(np.float32)
    minority = max(1, round(num_clients * minority_share)) if num_clients > 1 else 0
    client_cohorts = np.zeros(num_clients, dtype=np.int64)
    client_cohorts[num_clients - minority :] = 1

    def draw(count: int, cohort: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        labels = generator.integers(0, NUM_CLASSES, size=count)
        x = prototypes[labels] + generator.standard_normal((count, *IMAGE_SHAPE), dtype=np.float32)
        x += (MINORITY_SHIFT * cohort).astype(np.float32)[:, None, None, None]
        return x.astype(np.float32), labels.astype(np.int64)

    train_x, train_y = draw(num_clients * per_client, np.repeat(client_cohorts, per_client))
    test_cohort = np.repeat(np.arange(2), test_per_cohort)
    test_x, test_y = draw(2 * test_per_cohort, test_cohort)
    return {
        "train_x": train_x,
        "train_y": train_y,
        "client_cohorts": client_cohorts,
        "test_x": test_x,
        "test_y": test_y,
        "test_cohort": test_cohort,
    }
