"""Image-shaped synthetic data and the W1 model, brought to fairclip as plug-ins.

fairclip's ``synthetic`` dataset is flat (``features`` values, 2 classes) and
``fairclip.scenarios.models`` has no CNN of the W1 shape, so the benchmarks bring their own the way
a user would (docs/plugins.md), without touching fairclip's code:

* :func:`image_dataset`: a loader ``(num_clients, seed, **options) -> FederatedDataset`` of
  28×28 single-channel images of 10 classes (class prototype + Gaussian noise; a 10 % minority
  cohort is shifted by ``MINORITY_SHIFT``), named by a ``federated-dataset`` scenario;
* :func:`w1_cnn_model`: the W1 CNN as a model factory ``(input_shape, num_classes)``: two 3×3
  convolutions of 16 and 32 channels (ReLU, 2×2 max-pooling each), a hidden layer of 64 and 10
  logits (105,866 parameters on 1×28×28 inputs).

Training, clipping and evaluation are fairclip's own; only the data and the model differ.
:func:`image_config` builds the run configuration as a dictionary and validates it
(:func:`fairclip.scenarios.config.validate`), no ``--set`` strings.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .images import IMAGE_SHAPE, NUM_CLASSES, synthetic_images, w1_cnn

PREFIX = "bench-image"
DATASET = f"{__name__}:image_dataset"
BENCH_MODELS = {
    "w1-cnn": f"{__name__}:w1_cnn_model",
    **{name: name for name in ("tanh-cnn", "esipova-cnn", "zhao-cnn", "cnn", "logistic", "mlp")},
}
"""Benchmark model name -> the scenario's ``model`` reference (a built-in name or import path)."""


def w1_cnn_model(input_shape: tuple[int, ...], num_classes: int) -> torch.nn.Module:
    """The W1 CNN as a fairclip model factory (for 1×28×28 inputs only)."""
    if tuple(input_shape) != IMAGE_SHAPE:
        raise ValueError(f"the W1 CNN takes {IMAGE_SHAPE} images, not {tuple(input_shape)}")
    return w1_cnn(num_classes)


def build_bench_model(name: str) -> torch.nn.Module:
    """A benchmark model by name, for the contenders that are not fairclip (Opacus, pfl)."""
    if name == "w1-cnn":
        return w1_cnn()
    # in the workload's own child process only (torch, ray, flwr: not in `fairclip bench`'s)
    from fairclip.scenarios.models import build_model

    return build_model(name, IMAGE_SHAPE, NUM_CLASSES)


def image_dataset(num_clients: int, seed: int, *, per_client: int, test_per_cohort: int):
    """:func:`synthetic_images` as a :class:`fairclip.FederatedDataset` (cohorts ``majority``
    and ``minority``; client i holds rows ``i * per_client ...``)."""
    # in the workload's own child process only (torch, ray, flwr: not in `fairclip bench`'s)
    from fairclip.scenarios.data.federated_dataset import FederatedDataset

    data = synthetic_images(num_clients, per_client, test_per_cohort, seed)
    return FederatedDataset(
        train_x=data["train_x"],
        train_y=data["train_y"],
        client_indices=[np.arange(i * per_client, (i + 1) * per_client) for i in range(num_clients)],
        client_cohorts=data["client_cohorts"],
        test_x=data["test_x"],
        test_y=data["test_y"],
        cohort_weights={
            name: (data["test_cohort"] == k).astype(np.float64)
            for k, name in enumerate(["majority", "minority"])
        },
        num_classes=NUM_CLASSES,
    )


def image_run(
    *,
    num_clients: int,
    sample_rate: float,
    rounds: int,
    per_client: int,
    model: str,
    policy: str,
    batch_size: int = 32,
    client_lr: float = 0.05,
    test_per_cohort: int = 250,
    eval_every: int = 1,
    policy_params: dict[str, Any] | None = None,
    training: dict[str, Any] | None = None,
    privacy: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The raw configuration (as a scenario file holds it) of an image benchmark run: the
    ``demo`` scenario's privacy and server settings, with the image data and a benchmark model."""
    if model not in BENCH_MODELS:
        raise ValueError(f"benchmark model {model!r} unknown (known: {', '.join(BENCH_MODELS)})")
    return {
        "seed": 0,
        "scenario": {
            "name": f"{PREFIX}-{model}",
            "description": f"synthetic 28x28 images, {model}",
            "task": "federated-dataset",
            "dataset": DATASET,
            "options": {"per_client": per_client, "test_per_cohort": test_per_cohort},
            "model": BENCH_MODELS[model],
        },
        "federation": {"num_clients": num_clients, "sample_rate": sample_rate},
        "training": {
            "rounds": rounds,
            "local_epochs": 1,
            "batch_size": batch_size,
            "client_lr": client_lr,
            "server_lr": 1.0,
            "eval_every": eval_every,
            **(training or {}),
        },
        "policy": {"name": policy, **({policy: policy_params} if policy_params else {})},
        "privacy": {"noise_multiplier": 1.0, "delta": 1e-5, **(privacy or {})},
    }


def image_config(raw: dict[str, Any]):
    """The validated :class:`fairclip.scenarios.config.RunConfig` of :func:`image_run`'s output."""
    # in the workload's own child process only (torch, ray, flwr: not in `fairclip bench`'s)
    from fairclip.scenarios.config import validate

    return validate(raw)


def build_task(config):
    """fairclip's own task builder (the scenario names the image loader and model)."""
    # in the workload's own child process only (torch, ray, flwr: not in `fairclip bench`'s)
    from fairclip.scenarios.tasks import build_task as fairclip_build_task

    return fairclip_build_task(config)


# ----- Ray ------------------------------------------------------------------------------------


def ray_executor(config, num_actors: int):
    """fairclip's :class:`RayExecutor` with ``num_actors`` actors."""
    # in the workload's own child process only (torch, ray, flwr: not in `fairclip bench`'s)
    from fairclip.sims.executors.ray import RayExecutor

    return RayExecutor.start(config, None, num_actors)
