"""Evaluation of the global model: accuracy and loss overall, per class and per cohort.

Per class (seed 000): accuracy of each class, their mean (macro accuracy) and their minimum
(worst-class accuracy); for a binary task, the F1 score of the positive class (scikit-learn's
``f1_score``; seed 001); across cohorts, the worst cohort's accuracy and the gap between the best
and the worst. Per cohort: accuracy and loss on the cohort's test distribution, given
as per-example weights over the test set (a cohort defined by a protected attribute weighs its
own rows; a cohort defined by a class mix weighs each class by its share in the cohort).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fairclip.client.models import image_layout, load_vector

PREDICT_BATCH = 256
"""Examples per forward pass. Small batches keep a CNN's activations in cache: the 10,000 MNIST
test images through the tanh CNN took 6.2 s in batches of 4,096 and 3.2 s in batches of 256 (one
thread, 2-core EPYC)."""


def predict(model: nn.Module, vector: np.ndarray, features: torch.Tensor, batch_size: int = PREDICT_BATCH):
    """Logits of the model ``vector`` on ``features``, in batches.

    ``model`` is overwritten with ``vector`` (and for images moved to the faster channels-last
    format: :func:`image_layout`), so give it a model kept for evaluation.
    """
    load_vector(model, vector)
    model.eval()
    batches = (features[i : i + batch_size] for i in range(0, len(features), batch_size))
    with torch.no_grad():
        return torch.cat([model(image_layout(model, batch)) for batch in batches])


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
    losses = nn.functional.cross_entropy(logits, labels, reduction="none").cpu().numpy().astype(np.float64)
    correct = (logits.argmax(dim=1) == labels).cpu().numpy().astype(np.float64)
    label_array = labels.cpu().numpy()
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
    if num_classes == 2:  # F1 of the positive class (seed 001 reports it)
        from sklearn.metrics import f1_score

        predictions = logits.argmax(dim=1).cpu().numpy()
        overall["f1"] = float(f1_score(label_array, predictions, pos_label=1, zero_division=0.0))
    cohorts = {}
    for name, weights in cohort_weights.items():
        total = weights.sum()
        cohorts[name] = {
            "accuracy": float(weights @ correct / total) if total > 0 else float("nan"),
            "loss": float(weights @ losses / total) if total > 0 else float("nan"),
        }
    accuracies = [metrics["accuracy"] for metrics in cohorts.values() if np.isfinite(metrics["accuracy"])]
    if accuracies:
        overall["worst_cohort_accuracy"] = float(min(accuracies))
        overall["cohort_accuracy_gap"] = float(max(accuracies) - min(accuracies))
    return overall, cohorts
