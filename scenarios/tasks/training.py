"""Local training of one client: E epochs of minibatch SGD from θ_t, returning Δ = θ_i − θ_t.

The shuffling of every epoch comes from the client's own generator, seeded by the executor from
(seed, round, client id), so the same client trains identically in any process.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fairclip.scenarios.models import has_dropout, image_layout, load_vector, model_to_vector


@dataclass(frozen=True)
class LocalTraining:
    """Hyper-parameters of local training."""

    epochs: int
    batch_size: int
    lr: float
    class_weights: tuple[float, ...] | None = None
    """w_y: each example's loss is multiplied by its class's weight (``training.class_weights``)."""
    reconstruction: bool = False
    """Each example's loss is its reconstruction error (:func:`reconstruction_errors`), not the
    cross-entropy of its label (``training.objective = "reconstruction"``)."""


def weighted_losses(
    logits: torch.Tensor, labels: torch.Tensor, class_weights: tuple[float, ...] | None
) -> torch.Tensor:
    """Each example's cross-entropy ℓ_i times its class's weight w_{y_i}. Seed 001's binary
    cross-entropy with positive weight p is this with w = (1, p) on a model with logits (0, z)
    (``binary-*`` models): for y = 1 the loss is −p·log σ(z), for y = 0 −log(1 − σ(z))."""
    losses = nn.functional.cross_entropy(logits, labels, reduction="none")
    if class_weights is None:
        return losses
    weights = torch.as_tensor(class_weights, dtype=losses.dtype, device=losses.device)
    return losses * weights.index_select(0, labels)


def reconstruction_errors(outputs: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """Each example's mean squared reconstruction error, ℓ_i = (1/D) Σ_j (x̂_ij − x_ij)² over
    its D input values, where x̂_i is the model's output for x_i (an autoencoder, seed 002's
    Fashion MNIST experiment: ``training.objective = "reconstruction"``). The label plays no
    part; it still names the example's class for the per-cohort evaluation."""
    if outputs.shape != features.shape:
        raise ValueError(
            f"a reconstruction needs outputs of the input's shape {tuple(features.shape[1:])}, "
            f"got {tuple(outputs.shape[1:])}"
        )
    return (outputs - features).square().flatten(1).mean(1)


def example_losses(
    outputs: torch.Tensor,
    features: torch.Tensor,
    labels: torch.Tensor,
    class_weights: tuple[float, ...] | None = None,
    reconstruction: bool = False,
) -> torch.Tensor:
    """Each example's training loss: its reconstruction error where ``reconstruction``
    (:func:`reconstruction_errors`), else its class-weighted cross-entropy
    (:func:`weighted_losses`)."""
    if reconstruction:
        return reconstruction_errors(outputs, features)
    return weighted_losses(outputs, labels, class_weights)


def local_update(
    model: nn.Module,
    global_vector: np.ndarray,
    features: torch.Tensor,
    labels: torch.Tensor,
    training: LocalTraining,
    generator: torch.Generator,
) -> np.ndarray:
    """Train ``model`` from ``global_vector`` on one client's data; return Δ as float64. Images
    train in the channels-last memory format (:func:`image_layout`)."""
    load_vector(model, global_vector)
    features = image_layout(model, features)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=training.lr)
    loss_function = nn.CrossEntropyLoss()
    count = labels.shape[0]
    for _ in range(training.epochs):
        order = torch.randperm(count, generator=generator).to(features.device)
        for start in range(0, count, training.batch_size):
            batch = order[start : start + training.batch_size]
            optimizer.zero_grad(set_to_none=True)
            logits = model(features[batch])
            if training.class_weights is None and not training.reconstruction:
                loss = loss_function(logits, labels[batch])
            else:  # the mean of the example losses (not torch's weight-normalised mean)
                loss = example_losses(
                    logits, features[batch], labels[batch], training.class_weights, training.reconstruction
                ).mean()
            loss.backward()
            optimizer.step()
    return model_to_vector(model) - global_vector


ONE_STEP_MICRO_BATCH = 128
"""Examples per vectorised per-sample-gradient call of :func:`one_step_updates`; memory grows with
it (one gradient per example of the micro-batch), not with the number of sampled clients."""


def prepare_training() -> None:
    """Import what ``torch.optim`` and ``torch.func.grad`` import on first use (``torch._dynamo``:
    1.0-1.6 s here), so that a task pays it when it is built, not in its first round."""
    import torch._dynamo  # noqa: F401


def one_step_updates(
    model: nn.Module,
    global_vector: np.ndarray,
    features: torch.Tensor,
    labels: torch.Tensor,
    lr: float,
    micro_batch: int = ONE_STEP_MICRO_BATCH,
    class_weights: tuple[float, ...] | None = None,
    reconstruction: bool = False,
) -> np.ndarray:
    """Δ_i of many one-example, one-step clients at once (the sample-level special case).

    A client with one example (x_i, y_i) that takes one local SGD step has
    Δ_i = θ_i − θ_t with θ_i = θ_t − η_l ∇_θ ℓ(θ_t; x_i, y_i): a per-sample gradient of the
    example's loss (:func:`example_losses`). They are
    computed with ``torch.func`` (``vmap`` of ``grad``) in micro-batches, and the step is taken in
    the model's float32 exactly as :func:`local_update` takes it, so both paths agree to rounding.
    Row i belongs to example i. Where the policy is row-scaling and the model's layers allow,
    the executors do not call this: :mod:`fairclip.scenarios.tasks.ghost` clips these clients from their
    per-example norms without forming the rows.
    """
    from torch.func import functional_call, grad, vmap

    load_vector(model, global_vector)
    start_point = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    features = image_layout(model, features)  # tanh CNN, 256 examples: 136 -> 105 ms
    model.train()
    names = [name for name, _ in model.named_parameters()]
    params = {name: parameter.detach() for name, parameter in model.named_parameters()}
    buffers = {name: buffer.detach() for name, buffer in model.named_buffers()}

    def example_loss(parameters, x, y):
        logits = functional_call(model, (parameters, buffers), (x.unsqueeze(0),))
        if class_weights is None and not reconstruction:
            return nn.functional.cross_entropy(logits, y.unsqueeze(0))
        return example_losses(logits, x.unsqueeze(0), y.unsqueeze(0), class_weights, reconstruction).sum()

    # a dropout layer draws each example's own mask (the caller seeds the draws)
    randomness = "different" if has_dropout(model) else "error"
    per_example_grads = vmap(grad(example_loss), in_dims=(None, 0, 0), randomness=randomness)
    count = labels.shape[0]
    updates = np.empty((count, global_vector.shape[0]))
    global_tensor = torch.tensor(global_vector, dtype=torch.float64)  # a copy: θ_t may be read-only
    for start in range(0, count, micro_batch):
        stop = min(start + micro_batch, count)
        grads = per_example_grads(params, features[start:stop], labels[start:stop])
        flat = torch.cat([grads[name].reshape(stop - start, -1) for name in names], dim=1)
        stepped = start_point.unsqueeze(0) - lr * flat
        # θ_i (float32, exact in float64) − θ_t in float64, written in place: one pass
        torch.sub(stepped.cpu(), global_tensor, out=torch.from_numpy(updates[start:stop]))
    return updates
