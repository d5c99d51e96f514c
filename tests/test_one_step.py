"""The sample-level fast path: one-example, one-step clients via per-sample gradients."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from fairclip.scenarios.config import load_config
from fairclip.scenarios.errors import ConfigError
from fairclip.scenarios.models import build_model, load_vector, model_to_vector
from fairclip.scenarios.tasks import build_task
from fairclip.scenarios.tasks.training import LocalTraining, local_update, one_step_updates
from fairclip.sims.executors.loop import simulate


@pytest.mark.parametrize(
    ("name", "shape", "classes"),
    [
        ("logistic", (6,), 2),
        ("mlp", (6,), 3),
        ("tanh-cnn", (1, 28, 28), 10),
        ("cnn", (1, 28, 28), 10),
        ("esipova-cnn", (1, 28, 28), 10),
        ("zhao-cnn", (1, 28, 28), 10),
    ],
)
def test_per_sample_updates_equal_one_local_step_each(name, shape, classes):
    torch.manual_seed(0)
    model = build_model(name, shape, classes)
    theta = model_to_vector(model) + np.random.default_rng(1).normal(0, 0.01, model_to_vector(model).shape)
    features = torch.randn(37, *shape)
    labels = torch.randint(0, classes, (37,))
    fast = one_step_updates(model, theta, features, labels, lr=0.3, micro_batch=8)
    training = LocalTraining(epochs=1, batch_size=4, lr=0.3)
    for i in range(37):
        slow = local_update(model, theta, features[i : i + 1], labels[i : i + 1], training, torch.Generator())
        np.testing.assert_allclose(fast[i], slow, rtol=1e-5, atol=1e-7)
    assert np.abs(fast).sum() > 0


def _plain_sgd_update(name, theta, features, labels, lr, steps):
    """Full-batch SGD on a model in the default (contiguous) memory format: the reference."""
    model = build_model(name, (1, 28, 28), 10)
    load_vector(model, theta)
    for _ in range(steps):
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(features), labels).backward()
        with torch.no_grad():
            for parameter in model.parameters():
                parameter -= lr * parameter.grad
    assert all(parameter.is_contiguous() for parameter in model.parameters())
    return model_to_vector(model) - theta


@pytest.mark.parametrize(
    "name", ["cnn", "tanh-cnn", "esipova-cnn", "zhao-cnn", "xu-cnn", "xu-cnn-normalized", "galli-cnn"]
)
def test_channels_last_training_equals_the_default_layout(name):
    """Both client paths train images in the channels-last format (``image_layout``): their
    updates equal plain SGD in the default layout (the format Opacus' hooks get wrong)."""
    torch.manual_seed(0)
    model = build_model(name, (1, 28, 28), 10)
    theta = model_to_vector(model) + np.random.default_rng(2).normal(0, 0.05, model_to_vector(model).shape)
    features = torch.randn(12, 1, 28, 28, generator=torch.Generator().manual_seed(3))
    labels = torch.arange(12) % 10
    full_batch = LocalTraining(epochs=2, batch_size=12, lr=0.4)
    trained = local_update(model, theta, features, labels, full_batch, torch.Generator())
    first = next(module for module in model.modules() if isinstance(module, torch.nn.Conv2d))
    assert first.weight.is_contiguous(memory_format=torch.channels_last)
    reference = _plain_sgd_update(name, theta, features, labels, lr=0.4, steps=2)
    # float32 rounding is relative to the update's largest entries (A.5 CNN: up to 124 here)
    np.testing.assert_allclose(trained, reference, rtol=1e-4, atol=1e-6 * max(1.0, np.abs(reference).max()))
    per_sample = one_step_updates(model, theta, features, labels, lr=0.4, micro_batch=5)
    for i in range(12):
        reference = _plain_sgd_update(name, theta, features[i : i + 1], labels[i : i + 1], lr=0.4, steps=1)
        scale = max(1.0, np.abs(reference).max())
        np.testing.assert_allclose(per_sample[i], reference, rtol=1e-4, atol=1e-6 * scale)
    assert np.abs(per_sample).sum() > 0


ONE_STEP_DEMO = [
    "scenario.examples_per_client=1",
    "federation.num_clients=400",
    "federation.sample_rate=0.2",
    "training.rounds=4",
    "training.local_epochs=1",
    "policy.name=bounded",
    "privacy.noise_multiplier=0.7",
]
"""The demo with one example per client and one local step, with noise: the one-step path."""


def test_one_step_path_gives_the_generic_result_with_noise():
    config = load_config("demo", None, ONE_STEP_DEMO)
    fast_task = build_task(config)
    assert fast_task.one_step
    fast = simulate(config, fast_task)
    slow_task = build_task(config)
    slow_task.one_step = False
    slow = simulate(config, slow_task)
    assert [r["sampled_clients"] for r in fast.rows] == [r["sampled_clients"] for r in slow.rows]
    for key in ("clip_bound", "noise_std", "accuracy", "loss", "clipped_fraction"):
        np.testing.assert_allclose(
            [r[key] for r in fast.rows], [r[key] for r in slow.rows], rtol=1e-6, atol=1e-9, err_msg=key
        )
    assert fast.rows[-1]["noise_std"] > 0
    np.testing.assert_allclose(fast.model, slow.model, rtol=1e-6, atol=1e-8)


def test_one_step_rows_sets_the_call_size_and_changes_a_run_by_rounding_only():
    """``training.one_step_rows`` is the executors' group size; 3 and the default 32 give the same
    run to float rounding (the same samples, bounds and noise), and 0 is refused in one line."""
    runs = {}
    for rows in (3, 32):
        config = load_config("demo", None, [*ONE_STEP_DEMO, f"training.one_step_rows={rows}"])
        task = build_task(config)
        assert task.rows_per_call == rows
        runs[rows] = simulate(config, task)
    assert [r["sampled_clients"] for r in runs[3].rows] == [r["sampled_clients"] for r in runs[32].rows]
    for key in ("clip_bound", "noise_std", "accuracy", "clipped_fraction"):
        np.testing.assert_allclose(
            [r[key] for r in runs[3].rows], [r[key] for r in runs[32].rows], rtol=1e-6, atol=1e-9, err_msg=key
        )
    np.testing.assert_allclose(runs[3].model, runs[32].model, rtol=1e-6, atol=1e-8)
    several = load_config("demo", None, ["training.one_step_rows=3"])
    assert build_task(several).rows_per_call == 1  # clients with several examples train one by one
    with pytest.raises(ConfigError, match="one_step_rows") as caught:
        load_config("demo", None, ["training.one_step_rows=0"])
    assert "\n" not in str(caught.value)


def test_unset_one_step_rows_is_32_on_the_cpu_and_1024_on_a_gpu():
    """The default call size follows the device the task trains on; a value set wins on both."""
    from fairclip.scenarios.tasks.classification import rows_per_one_step_call

    config = load_config("demo", None, [*ONE_STEP_DEMO, "training.device=cpu"])
    assert config.training.one_step_rows is None
    assert build_task(config).rows_per_call == 32
    assert rows_per_one_step_call(torch.device("cpu")) == 32
    gpu_rows = rows_per_one_step_call(torch.device("cuda")), rows_per_one_step_call(torch.device("cuda", 1))
    assert gpu_rows == (1024, 1024)
    chosen = load_config("demo", None, [*ONE_STEP_DEMO, "training.device=cpu", "training.one_step_rows=256"])
    assert build_task(chosen).rows_per_call == 256


def test_groups_are_bounded_by_update_memory_only_where_the_updates_are_formed():
    """One-step clients of a row-scaling policy are clipped from their norms: their calls form
    no update rows, so the executors' groups are not bounded by GROUP_BYTES (update length 0);
    a policy that needs the rows, or ``per_example = materialize``, forms them."""
    from fairclip.sims.executors.local import update_length
    from fairclip.strategies import build_policy

    config = load_config("demo", None, [*ONE_STEP_DEMO, "training.device=cpu"])
    task = build_task(config)
    row_scaling = build_policy("constant", {"initial_bound": 1.0})
    assert row_scaling.row_scaling and task.one_step
    assert update_length(task, row_scaling, 4321) == 0
    materialised = build_task(load_config("demo", None, [*ONE_STEP_DEMO, "training.per_example=materialize"]))
    assert update_length(materialised, row_scaling, 4321) == 4321
    several = build_task(load_config("demo", None, ["federation.num_clients=50", "training.local_epochs=1"]))
    assert update_length(several, row_scaling, 4321) == 4321
    assert update_length(object(), row_scaling, 4321) == 4321  # a task without forms_updates


def test_clients_with_several_examples_do_not_take_the_fast_path():
    config = load_config("demo", None, ["federation.num_clients=50", "training.local_epochs=1"])
    assert not build_task(config).one_step


def test_read_only_model_vector_is_copied_not_shared():
    """A Ray actor receives θ_t as a read-only array from the object store: both client paths
    take it without touching it, and a float64 model does not alias it."""
    torch.manual_seed(0)
    model = build_model("mlp", (6,), 3).double()
    theta = model_to_vector(model)
    theta.setflags(write=False)
    before = theta.copy()
    features, labels = torch.randn(5, 6, dtype=torch.float64), torch.randint(0, 3, (5,))
    training = LocalTraining(epochs=2, batch_size=2, lr=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's "given NumPy array is not writable"
        update = local_update(model, theta, features, labels, training, torch.Generator().manual_seed(0))
        fast = one_step_updates(model, theta, features, labels, lr=0.5)
    assert np.array_equal(theta, before)
    assert np.abs(update).sum() > 0 and np.abs(fast).sum() > 0
