"""``training.objective = "reconstruction"``: an autoencoder's clients step on each example's mean
squared reconstruction error, and it is evaluated by that error overall, per class and per
cohort (seed 002's Fashion MNIST experiment; the ``galli-fashion-mnist`` setups)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

import fairclip
from fairclip.scenarios.config import load_config
from fairclip.scenarios.errors import ConfigError
from fairclip.scenarios.models import build_model, load_vector, model_to_vector
from fairclip.scenarios.tasks import build_task
from fairclip.scenarios.tasks.classification import checked_model
from fairclip.scenarios.tasks.evaluation import evaluate_reconstruction
from fairclip.scenarios.tasks.ghost import one_step_gradients
from fairclip.scenarios.tasks.training import (
    LocalTraining,
    local_update,
    one_step_updates,
    reconstruction_errors,
)
from fairclip.sims.reproduce import planning
from fairclip.sims.reproduce.setups import Run


def _images(count: int, size: int = 12, seed: int = 0) -> torch.Tensor:
    return torch.rand(count, 1, size, size, generator=torch.Generator().manual_seed(seed))


def _manual_sgd(model: nn.Module, theta: np.ndarray, features: torch.Tensor, lr: float) -> np.ndarray:
    """One full-batch SGD step on torch's own mean squared error of the batch against itself."""
    load_vector(model, theta)
    model.zero_grad()
    nn.functional.mse_loss(model(features), features).backward()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter -= lr * parameter.grad
    return model_to_vector(model) - theta


def test_galli_autoencoder_is_table_6():
    """Seed 002's Table 6: four 3×3 convolutions (8, 16, 32, 64), four 3×3 transposed ones (32,
    16, 8, 1), LeakyReLU and a sigmoid output; Table 1's 48,705 parameters; the input's shape."""
    model = build_model("galli-autoencoder", (1, 28, 28), 10)
    assert sum(p.numel() for p in model.parameters()) == 48_705
    layers = [m for m in model if isinstance(m, nn.Conv2d | nn.ConvTranspose2d)]
    assert [type(m) for m in layers] == [nn.Conv2d] * 4 + [nn.ConvTranspose2d] * 4
    assert [m.out_channels for m in layers] == [8, 16, 32, 64, 32, 16, 8, 1]
    assert all(m.kernel_size == (3, 3) and m.stride == (1, 1) for m in layers)
    activations = [m for m in model if not isinstance(m, nn.Conv2d | nn.ConvTranspose2d)]
    assert [type(m) for m in activations] == [nn.LeakyReLU] * 7 + [nn.Sigmoid]
    outputs = model(_images(3, size=28))
    assert outputs.shape == (3, 1, 28, 28) and bool(((outputs > 0) & (outputs < 1)).all())


def test_reconstruction_errors_are_each_examples_mean_squared_error():
    outputs, features = _images(5, seed=1), _images(5, seed=2)
    expected = nn.functional.mse_loss(outputs, features, reduction="none").flatten(1).mean(1)
    torch.testing.assert_close(reconstruction_errors(outputs, features), expected)
    assert reconstruction_errors(features, features).abs().max() == 0
    with pytest.raises(ValueError, match="input's shape"):
        reconstruction_errors(outputs[:, :, :5], features)


def test_both_client_paths_step_on_the_reconstruction_error():
    """A client's local SGD and the one-step path (per-example gradients by torch.func) each
    equal a plain SGD step on torch's MSE of the output against the input: the label is unused."""
    torch.manual_seed(0)
    model = build_model("galli-autoencoder", (1, 12, 12), 10)
    reference = build_model("galli-autoencoder", (1, 12, 12), 10)
    theta = model_to_vector(model)
    features = _images(6)
    labels = torch.arange(6) % 10
    training = LocalTraining(epochs=1, batch_size=6, lr=0.5, reconstruction=True)
    trained = local_update(model, theta, features, labels, training, torch.Generator())
    expected = _manual_sgd(reference, theta, features, 0.5)
    np.testing.assert_allclose(trained, expected, rtol=1e-4, atol=1e-7)
    shuffled = local_update(model, theta, features, labels.flip(0), training, torch.Generator())
    np.testing.assert_allclose(shuffled, trained, rtol=1e-5, atol=1e-8)  # labels play no part
    per_example = one_step_updates(model, theta, features, labels, 0.5, micro_batch=4, reconstruction=True)
    for i in range(6):
        expected = _manual_sgd(reference, theta, features[i : i + 1], 0.5)
        np.testing.assert_allclose(per_example[i], expected, rtol=1e-4, atol=1e-7)
    assert np.abs(per_example).sum() > 0


def _padded_autoencoder() -> nn.Module:
    """A user's autoencoder of ordinary convolutions only."""
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.Tanh(), nn.Conv2d(4, 1, 3, padding=1), nn.Sigmoid()
    )


@pytest.mark.parametrize("name", ["padded convolutions", "galli-autoencoder"])
def test_the_norm_only_path_clips_the_reconstruction_errors_gradients(name):
    """Clipping from per-example norms without forming the gradients
    (:mod:`fairclip.scenarios.tasks.ghost`) takes the reconstruction error too, on a user's
    convolutional autoencoder and on seed 002's, whose transposed convolutions it takes as the
    weight gradients of their adjoint convolutions: its norms and clipped sums equal those of the
    gradients torch.func forms."""
    torch.manual_seed(3)
    model = _padded_autoencoder() if name == "padded convolutions" else build_model(name, (1, 12, 12), 10)
    theta = model_to_vector(model)
    features = _images(7, seed=4)
    labels = torch.zeros(7, dtype=torch.long)
    rows = one_step_updates(model, theta, features, labels, 0.8, reconstruction=True)
    gradients = one_step_gradients(model, theta, features, labels, 0.8, reconstruction=True)
    assert gradients is not None
    np.testing.assert_allclose(gradients.norms, np.linalg.norm(rows, axis=1), rtol=1e-5)
    factors = np.minimum(1.0, np.median(gradients.norms) / gradients.norms)[None, :]
    # each materialised row carries θ_i's float32 rounding (half an ulp of the largest |θ_j|)
    rounding = 7 * float(np.spacing(np.float32(np.abs(theta).max())))
    np.testing.assert_allclose(
        gradients.weighted_sums(slice(0, 7), factors)[0], factors[0] @ rows, rtol=1e-4, atol=rounding
    )


def test_evaluation_is_the_reconstruction_error_by_class_and_cohort():
    """Outputs that are the bias b for every row: each row's error is mean((b − x)²)."""
    model = nn.Linear(2, 2)
    vector = np.array([0.0, 0.0, 0.0, 0.0, 0.5, 1.0])  # W = 0, b = (0.5, 1)
    features = torch.tensor([[0.5, 1.0], [1.5, 1.0], [0.5, 0.0], [0.5, 3.0]])
    labels = torch.tensor([0, 0, 1, 2])
    errors = np.array([0.0, 0.5, 0.5, 2.0])  # mean over the two values of (b − x)²
    cohorts = {"a": np.array([1.0, 1.0, 0.0, 0.0]), "b": np.array([0.0, 0.0, 1.0, 1.0])}
    overall, per_cohort = evaluate_reconstruction(model, vector, features, labels, cohorts, num_classes=4)
    assert overall["loss"] == pytest.approx(errors.mean())
    assert overall["loss_class_0"] == pytest.approx(0.25) and overall["loss_class_2"] == pytest.approx(2.0)
    assert "loss_class_3" not in overall and "accuracy" not in overall  # no row of class 3; no accuracy
    assert per_cohort == {"a": {"loss": pytest.approx(0.25)}, "b": {"loss": pytest.approx(1.25)}}
    assert overall["worst_cohort_loss"] == pytest.approx(1.25)
    assert overall["cohort_loss_gap"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["training.class_weights=[1.0, 2.0]"], "training.class_weights: training.objective"),
        (["evaluation.clients=true"], "evaluation.clients counts correct predictions"),
    ],
)
def test_what_a_reconstruction_cannot_use_is_refused_in_one_line(sets, message):
    with pytest.raises(ConfigError, match=message) as error:
        load_config("demo", None, ["training.objective=reconstruction", *sets])
    assert "\n" not in str(error.value)


def test_a_mean_estimation_has_nothing_to_reconstruct():
    with pytest.raises(ConfigError, match="needs a classification task's examples"):
        load_config("bimodal-mean", None, ["training.objective=reconstruction"])


def test_a_model_must_reconstruct_exactly_when_the_objective_says_so():
    """A classifier trained to reconstruct, or an autoencoder given labels to predict, is refused
    when the task is built, not deep in torch at the first step."""
    config = load_config("demo", None, ["training.objective=reconstruction"])
    with pytest.raises(ConfigError, match="output has its input's shape"):
        build_task(config)
    autoencoder = build_model("galli-autoencoder", (1, 28, 28), 10)
    with pytest.raises(ValueError, match=r"gives \(1, 28, 28\) outputs per example"):
        checked_model(autoencoder, (1, 28, 28), 10)
    assert checked_model(autoencoder, (1, 28, 28), 10, reconstruction=True) is autoencoder


def test_a_grid_of_losses_is_chosen_by_its_lowest():
    runs = [Run(f"k{lr}", "p", 1.0, 0, {}, {"lr": lr}) for lr in (1, 2, 3)]
    summaries = {"k1": {"overall": {"loss": 0.3}}, "k2": {"overall": {"loss": 0.1}}, "k3": {"overall": {}}}
    assert planning.choose(runs, summaries, "loss") == {("p", 1.0): {"lr": 2}}
    summaries["k2"]["overall"]["loss"] = math.nan  # a diverged run never wins
    assert planning.choose(runs, summaries, "loss") == {("p", 1.0): {"lr": 1}}


def make_autoencoder(input_shape, num_classes):
    """A user's own autoencoder of 8 features."""
    return nn.Sequential(nn.Linear(input_shape[0], 3), nn.Tanh(), nn.Linear(3, input_shape[0]))


def _two_cohorts(clients: int = 60, per_client: int = 8) -> fairclip.FederatedDataset:
    """Cohort a's points near (1, ..., 1), cohort b's near (−1, ..., −1) in 8 features."""
    rng = np.random.default_rng(0)
    cohort_of_client = np.array(["a" if c % 2 else "b" for c in range(clients)])
    owner = np.repeat(np.arange(clients), per_client)

    def points(cohorts):
        centre = np.where(cohorts == "a", 1.0, -1.0)[:, None]
        return (centre + 0.3 * rng.normal(size=(len(cohorts), 8))).astype(np.float32)

    test_cohorts = np.repeat(np.array(["a", "b"]), 100)
    return fairclip.FederatedDataset.from_arrays(
        points(cohort_of_client[owner]),
        (cohort_of_client[owner] == "a").astype(np.int64),
        clients=owner,
        cohorts=cohort_of_client,
        test_x=points(test_cohorts),
        test_y=(test_cohorts == "a").astype(np.int64),
        test_cohorts=test_cohorts,
    )


def test_a_users_autoencoder_learns_under_dp_end_to_end():
    """A user's data and autoencoder with DP noise: the test error falls over the run, the
    summary reports it per cohort and has no accuracy, and the run has its ε."""
    scenario = fairclip.Scenario(
        "two-cohort-autoencoder",
        dataset=_two_cohorts(),
        model=make_autoencoder,
        sample_rate=0.5,
        rounds=40,
        settings={
            "training.objective": "reconstruction",
            "training.client_lr": 0.5,
            "policy.name": "constant",
            "policy.initial_bound": 1.0,
            "privacy.noise_multiplier": 0.3,
        },
    )
    result = fairclip.simulate(scenario)
    losses = result.rounds["loss"].to_numpy()
    assert losses[-1] < 0.5 * losses[0]
    overall = result.summary["overall"]
    assert "accuracy" not in overall and overall["loss"] == pytest.approx(losses[-1])
    assert sorted(result.cohorts.index) == ["a", "b"] and (result.cohorts["loss"] > 0).all()
    assert (result.rounds["noise_std"] > 0).all() and math.isfinite(result.epsilon)
