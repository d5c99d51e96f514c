"""Evaluation of the global model: accuracy and loss overall, per class and per cohort.

Per class (seed 000): accuracy of each class, their mean (macro accuracy) and their minimum
(worst-class accuracy). Per cohort: accuracy and loss on the cohort's test distribution, given
as per-example weights over the test set (a cohort defined by a protected attribute weighs its
own rows; a cohort defined by a class mix weighs each class by its share in the cohort).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fairclip.client.models import load_vector


def predict(model: nn.Module, vector: np.ndarray, features: torch.Tensor, batch_size: int = 4096):
    """Logits of the model ``vector`` on ``features``, in batches."""
    load_vector(model, vector)
    model.eval()
    with torch.no_grad():
        return torch.cat([model(features[i : i + batch_size]) for i in range(0, len(features), batch_size)])


def evaluate(
    model: nn.Module,
    vector: np.ndarray,
    features: torch.Tensor,
    labels: torch.Tensor,
    cohort_weights: dict[str, np.ndarray],
    num_classes: int,
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """(overall metrics, per-cohort metrics) of the model ``vector`` on a test set."""
    logits = predict(model, vector, features)
    losses = nn.functional.cross_entropy(logits, labels, reduction="none").numpy().astype(np.float64)
    correct = (logits.argmax(dim=1) == labels).numpy().astype(np.float64)
    label_array = labels.numpy()
    per_class = [correct[label_array == c].mean() for c in range(num_classes) if np.any(label_array == c)]
    overall = {
        "accuracy": float(correct.mean()),
        "loss": float(losses.mean()),
        "macro_accuracy": float(np.mean(per_class)),
        "worst_class_accuracy": float(np.min(per_class)),
    }
    for c in range(num_classes):
        if np.any(label_array == c):
            overall[f"accuracy_class_{c}"] = float(correct[label_array == c].mean())
    cohorts = {}
    for name, weights in cohort_weights.items():
        total = weights.sum()
        cohorts[name] = {
            "accuracy": float(weights @ correct / total) if total > 0 else float("nan"),
            "loss": float(weights @ losses / total) if total > 0 else float("nan"),
        }
    return overall, cohorts
