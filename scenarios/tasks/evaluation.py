"""Evaluation of the global model: accuracy and loss overall, per class and per cohort.

Per class (seed 000): accuracy of each class, their mean (macro accuracy) and their minimum
(worst-class accuracy); for a binary task, the F1 score of the positive class (scikit-learn's
``f1_score``; seed 001); across cohorts, the worst cohort's accuracy and the gap between the best
and the worst, and the gap between the highest and the lowest cohort loss (``cohort_loss_gap``:
seed 001's subgroup loss disparity, |loss_a − loss_b| for two cohorts). Per cohort: accuracy and
loss on the cohort's test distribution, given as per-example weights over the test set (a cohort
defined by a protected attribute weighs its own rows; a cohort defined by a class mix weighs each
class by its share in the cohort).

The loss is the mean cross-entropy of the rows, each row's times its class's weight w_y where the
training criterion weighs classes (``class_weights``, ``training.class_weights``: seed 001 trains
and evaluates binary cross-entropy whose positive rows weigh 2), so it is the criterion trained on.

An autoencoder (``training.objective = "reconstruction"``, seed 002's Fashion MNIST experiment) is
evaluated by :func:`evaluate_reconstruction`: its loss is the mean squared reconstruction error,
overall, per class and per cohort, and it has no accuracy.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fairclip.scenarios.models import image_layout, load_vector
from fairclip.scenarios.tasks.training import reconstruction_errors

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
    class_weights: tuple[float, ...] | None = None,
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """(overall metrics, per-cohort metrics) of the model ``vector`` on a test set; the losses
    are weighted by ``class_weights`` where given (see the module docstring)."""
    logits = predict(model, vector, features)
    losses = nn.functional.cross_entropy(logits, labels, reduction="none").cpu().numpy().astype(np.float64)
    if class_weights is not None:
        if len(class_weights) != num_classes:
            raise ValueError(f"{len(class_weights)} class weights for {num_classes} classes")
        losses *= np.asarray(class_weights, dtype=np.float64)[labels.cpu().numpy()]
    correct = (logits.argmax(dim=1) == labels).cpu().numpy().astype(np.float64)
    label_array = labels.cpu().numpy()
    per_class = class_means(correct, label_array, num_classes)
    overall = {
        "accuracy": float(correct.mean()),
        "loss": float(losses.mean()),
        "macro_accuracy": float(np.mean(list(per_class.values()))),
        "worst_class_accuracy": float(np.min(list(per_class.values()))),
    }
    overall.update({f"accuracy_class_{c}": value for c, value in per_class.items()})
    if num_classes == 2:  # F1 of the positive class (seed 001 reports it)
        from sklearn.metrics import f1_score

        predictions = logits.argmax(dim=1).cpu().numpy()
        overall["f1"] = float(f1_score(label_array, predictions, pos_label=1, zero_division=0.0))
    cohorts = cohort_means(cohort_weights, {"accuracy": correct, "loss": losses})
    accuracies = _finite(cohorts, "accuracy")
    if accuracies:
        overall["worst_cohort_accuracy"] = float(min(accuracies))
        overall["cohort_accuracy_gap"] = float(max(accuracies) - min(accuracies))
    cohort_losses = _finite(cohorts, "loss")
    if cohort_losses:
        overall["cohort_loss_gap"] = float(max(cohort_losses) - min(cohort_losses))
    return overall, cohorts


def class_means(values: np.ndarray, labels: np.ndarray, num_classes: int) -> dict[int, float]:
    """The mean of each row's value over the rows of each class present in ``labels``."""
    return {c: float(values[labels == c].mean()) for c in range(num_classes) if np.any(labels == c)}


def cohort_means(
    cohort_weights: dict[str, np.ndarray], values: dict[str, np.ndarray]
) -> dict[str, dict[str, float]]:
    """Each cohort's weighted mean of each per-row value (``values``: name -> one value a row),
    the cohort's rows weighted as its test distribution weighs them; NaN for a cohort without
    weight."""
    cohorts = {}
    for name, weights in cohort_weights.items():
        total = weights.sum()
        cohorts[name] = {
            metric: float(weights @ rows / total) if total > 0 else float("nan")
            for metric, rows in values.items()
        }
    return cohorts


def _finite(cohorts: dict[str, dict[str, float]], metric: str) -> list[float]:
    """The cohorts' finite values of ``metric``."""
    return [metrics[metric] for metrics in cohorts.values() if np.isfinite(metrics[metric])]


def evaluate_reconstruction(
    model: nn.Module,
    vector: np.ndarray,
    features: torch.Tensor,
    labels: torch.Tensor,
    cohort_weights: dict[str, np.ndarray],
    num_classes: int,
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """(overall metrics, per-cohort metrics) of the autoencoder ``vector`` on a test set: the
    mean of each row's squared reconstruction error ℓ_i = (1/D) Σ_j (x̂_ij − x_ij)²
    (:func:`fairclip.scenarios.tasks.training.reconstruction_errors`) as ``loss``, overall, per
    class (``loss_class_c``, the label naming the row's class) and per cohort (a cohort's
    rows weighted as in :func:`evaluate`), with the worst cohort's loss
    (``worst_cohort_loss``) and the gap between the highest and the lowest
    (``cohort_loss_gap``). Seed 002 reports the overall loss as "mse"."""
    outputs = predict(model, vector, features)
    losses = reconstruction_errors(outputs, features).cpu().numpy().astype(np.float64)
    overall = {"loss": float(losses.mean())}
    per_class = class_means(losses, labels.cpu().numpy(), num_classes)
    overall.update({f"loss_class_{c}": value for c, value in per_class.items()})
    cohorts = cohort_means(cohort_weights, {"loss": losses})
    cohort_losses = _finite(cohorts, "loss")
    if cohort_losses:
        overall["worst_cohort_loss"] = float(max(cohort_losses))
        overall["cohort_loss_gap"] = float(max(cohort_losses) - min(cohort_losses))
    return overall, cohorts
