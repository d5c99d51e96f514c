"""Image-shaped synthetic data and the W1 model, for the workloads that fairclip's scenarios
cannot express yet.

fairclip's ``synthetic`` dataset is flat (``features`` values, 2 classes) and
``fairclip.client.models`` has no CNN of the W1 shape, so the benchmarks bring their own:

* :func:`w1_cnn`: two 3×3 convolutions of 16 and 32 channels (ReLU, 2×2 max-pooling each), a
  hidden layer of 64 and 10 logits (105,866 parameters on 1×28×28 inputs).
* :class:`ImageTask`: a :class:`fairclip.sims.classification.ClassificationTask` whose clients
  hold 28×28 single-channel images of 10 classes (class prototype + Gaussian noise; a 10 %
  minority cohort is shifted by ``MINORITY_SHIFT``). Training, clipping and evaluation are
  fairclip's own code; only the data and the model differ.

The task is selected by the scenario's name: a classification config whose ``scenario.name``
starts with ``bench-image`` becomes an :class:`ImageTask` (see :func:`build_task`), with
``scenario.examples_per_client`` images per client and the model named in
:data:`BENCH_MODELS` by ``scenario.description``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from .images import IMAGE_SHAPE, NUM_CLASSES, synthetic_images, w1_cnn

PREFIX = "bench-image"
BENCH_MODELS = ("w1-cnn", "tanh-cnn", "cnn", "logistic", "mlp")


def build_bench_model(name: str) -> torch.nn.Module:
    if name == "w1-cnn":
        return w1_cnn()
    from fairclip.client.models import build_model

    return build_model(name, IMAGE_SHAPE, NUM_CLASSES)


def _classification_task_class():
    from fairclip.sims.classification import ClassificationTask

    return ClassificationTask


class ImageTask(_classification_task_class()):
    """fairclip's classification task on synthetic 28×28 images with a benchmark model."""

    def __init__(self, config, model_name: str):
        from fairclip.sims.federated_dataset import FederatedDataset

        num_clients, per_client = config.federation.num_clients, config.scenario.examples_per_client
        data = synthetic_images(
            num_clients, per_client, config.scenario.test_examples_per_cohort, config.seed
        )
        cohort_names = ["majority", "minority"]
        federated = FederatedDataset(
            train_x=data["train_x"],
            train_y=data["train_y"],
            client_indices=[np.arange(i * per_client, (i + 1) * per_client) for i in range(num_clients)],
            client_cohorts=data["client_cohorts"],
            test_x=data["test_x"],
            test_y=data["test_y"],
            cohort_weights={
                name: (data["test_cohort"] == k).astype(np.float64) for k, name in enumerate(cohort_names)
            },
            num_classes=NUM_CLASSES,
        )
        self._hold(
            federated,
            cohort_names,
            config.training,
            config.seed,
            lambda _shape, _classes: build_bench_model(model_name),
        )


def is_image_config(config) -> bool:
    return getattr(config.scenario, "task", "") == "classification" and config.scenario.name.startswith(
        PREFIX
    )


def image_model_name(config) -> str:
    name = config.scenario.description or "w1-cnn"
    if name not in BENCH_MODELS:
        raise ValueError(f"benchmark model {name!r} unknown (known: {', '.join(BENCH_MODELS)})")
    return name


def build_task(config, data_dir: Path | None = None):
    """:func:`fairclip.sims.tasks.build_task`, plus the benchmark image scenarios."""
    if is_image_config(config):
        return ImageTask(config, image_model_name(config))
    from fairclip.sims import tasks

    return _ORIGINAL_BUILD_TASK.get("f", tasks.build_task)(config, data_dir)


_ORIGINAL_BUILD_TASK: dict[str, Any] = {}


def patch_fairclip_build_task() -> None:
    """Make ``fairclip.sims.tasks.build_task`` understand the image scenarios (for the Flower
    apps, which import it from there at call time)."""
    from fairclip.sims import tasks

    if "f" not in _ORIGINAL_BUILD_TASK:
        _ORIGINAL_BUILD_TASK["f"] = tasks.build_task
        tasks.build_task = build_task


def image_settings(
    *,
    num_clients: int,
    sample_rate: float,
    rounds: int,
    per_client: int,
    model: str,
    strategy: str,
    batch_size: int = 32,
    client_lr: float = 0.05,
    test_per_cohort: int = 250,
    extra: list[str] | None = None,
) -> list[str]:
    """``--set`` assignments that turn the ``demo`` scenario into an image benchmark scenario."""
    return [
        f'scenario.name="{PREFIX}-{model}"',
        f'scenario.description="{model}"',
        f"scenario.examples_per_client={per_client}",
        f"scenario.test_examples_per_cohort={test_per_cohort}",
        f"federation.num_clients={num_clients}",
        f"federation.sample_rate={sample_rate}",
        f"training.rounds={rounds}",
        "training.local_epochs=1",
        f"training.batch_size={batch_size}",
        f"training.client_lr={client_lr}",
        f'strategy.name="{strategy}"',
        *(extra or []),
    ]


def image_config(settings: list[str]):
    from fairclip.sims.config import load_config

    return load_config("demo", None, settings)


# ----- Ray ------------------------------------------------------------------------------------


def ray_executor(config, num_actors: int):
    """fairclip's :class:`RayExecutor`, its actors holding an :class:`ImageTask` each."""
    from fairclip.sims.ray_engine import RayExecutor

    return RayExecutor.start(config, None, num_actors, task_builder=build_task)
