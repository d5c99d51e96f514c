"""The classification task without real data: models, local SGD, evaluation, synthetic cohorts, a demo run."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fairclip.scenarios.config import load_config
from fairclip.scenarios.model_names import AUTOENCODERS, IMAGE_MODELS
from fairclip.scenarios.models import MODELS, build_model, load_vector, model_to_vector
from fairclip.scenarios.tasks import build_task
from fairclip.scenarios.tasks.classification import synthetic_data
from fairclip.scenarios.tasks.evaluation import PREDICT_BATCH, evaluate, predict
from fairclip.scenarios.tasks.training import LocalTraining, local_update
from fairclip.sims.executors.loop import simulate

INPUT_SHAPES = {name: (1, 28, 28) if name in IMAGE_MODELS else (10,) for name in MODELS}
"""Each built-in model's input in these tests: the image models take 1×28×28, the others any
flat input."""


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _float32_vector(size: int, seed: int) -> np.ndarray:
    """A random float64 vector whose entries are exactly representable in float32."""
    return np.random.default_rng(seed).normal(0.0, 0.1, size).astype(np.float32).astype(np.float64)


# ----- models ------------------------------------------------------------------------------


def test_every_model_is_covered():
    from fairclip.scenarios.config import BUILTIN_MODELS

    assert set(INPUT_SHAPES) == set(MODELS)
    assert BUILTIN_MODELS == MODELS  # the same names, from a module without torch


@pytest.mark.parametrize("name", MODELS)
def test_model_builds_for_its_input_shape_and_vectors_round_trip(name):
    shape = INPUT_SHAPES[name]
    classes = 2 if name.startswith("binary-") else 10
    torch.manual_seed(0)
    model = build_model(name, shape, classes)
    outputs = (3, *shape) if name in AUTOENCODERS else (3, classes)  # an autoencoder's: its input's
    assert model(torch.zeros(3, *shape)).shape == outputs

    vector = model_to_vector(model)
    parameters = list(model.parameters())
    assert vector.dtype == np.float64
    assert vector.shape == (sum(p.numel() for p in parameters),)
    # Layout: the order of model.parameters(), each flattened.
    first = parameters[0].detach().double().numpy().ravel()
    np.testing.assert_array_equal(vector[: first.size], first)
    last = parameters[-1].detach().double().numpy().ravel()
    np.testing.assert_array_equal(vector[-last.size :], last)

    # A vector loaded into a differently initialised model of the same kind reads back exactly.
    torch.manual_seed(1)
    other = build_model(name, shape, classes)
    assert not np.array_equal(model_to_vector(other), vector)
    load_vector(other, vector)
    np.testing.assert_array_equal(model_to_vector(other), vector)
    inputs = torch.rand(2, *shape, generator=_generator(5))
    with torch.no_grad():  # in evaluation mode: without eicu-mlp's dropout, as evaluation runs
        torch.testing.assert_close(other.eval()(inputs), model.eval()(inputs), rtol=0, atol=0)

    # ... and so does an arbitrary float32-representable vector.
    arbitrary = _float32_vector(vector.size, seed=2)
    load_vector(other, arbitrary)
    np.testing.assert_array_equal(model_to_vector(other), arbitrary)


@pytest.mark.parametrize("name", IMAGE_MODELS)
def test_image_models_reject_flat_inputs(name):
    with pytest.raises(ValueError, match="image inputs"):
        build_model(name, (10,), 2)


def test_the_papers_cnns_have_their_published_sizes():
    """Seed 003's MNIST CNN without pooling (97,114 parameters, issue 21) and seed 000's A.5 CNN."""
    models = {name: build_model(name, (1, 28, 28), 10) for name in IMAGE_MODELS}
    count = {name: sum(p.numel() for p in model.parameters()) for name, model in models.items()}
    assert count["esipova-cnn"] == 97_114
    # conv 1->64 and 64->64 (3x3): 28 -> 26 -> pool 12 -> 10 -> pool 4, so 64 * 4 * 4 = 1,024 inputs
    convolutions = (9 + 1) * 64 + (9 * 64 + 1) * 64
    assert count["zhao-cnn"] == convolutions + (1024 + 1) * 500 + (500 + 1) * 500 + (500 + 1) * 10

    def pools(name):
        return [
            (m.kernel_size, m.stride) for m in models[name].modules() if isinstance(m, torch.nn.MaxPool2d)
        ]

    assert pools("zhao-cnn") == [(3, 2), (3, 2)]
    assert pools("esipova-cnn") == []
    # seed 004's: conv 20@5x5 28 -> 24, pool 12, conv 50@5x5 -> 8, pool 4: 800 inputs to dense 500
    assert count["xu-cnn"] == 431_080 == (25 + 1) * 20 + (500 + 1) * 50 + (800 + 1) * 500 + (500 + 1) * 10
    assert pools("xu-cnn") == [(2, 2), (2, 2)]
    assert count["xu-cnn-normalized"] == count["xu-cnn"]
    # seed 002's: conv 16@8x8 padding 3: 28 -> 27, pool 2 stride 1 -> 26, conv 32@4x4 -> 23
    assert count["galli-cnn"] == 551_322 == (64 + 1) * 16 + (256 + 1) * 32 + (16_928 + 1) * 32 + (32 + 1) * 10
    assert pools("galli-cnn") == [(2, 1)]
    # seed 002's Table 5 gives its output layer a ReLU too: the logits are never negative
    assert isinstance(list(models["galli-cnn"].modules())[-1], torch.nn.ReLU)
    images = torch.rand(64, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    logits = models["galli-cnn"](images)
    assert (logits >= 0).all() and (logits == 0).any() and (logits > 0).any()
    assert (models["xu-cnn"](images) < 0).any()  # the other models' logits are not cut at 0


def test_the_normalized_xu_cnn_is_the_xu_cnn_on_standardised_pixels():
    """Bagdasaryan et al.'s loader standardises MNIST by (0.1307, 0.3081), constants: the model
    computes xu-cnn of (x − 0.1307) / 0.3081 with the same parameters, each example on its own."""
    torch.manual_seed(0)
    plain = build_model("xu-cnn", (1, 28, 28), 10)
    torch.manual_seed(0)
    normalized = build_model("xu-cnn-normalized", (1, 28, 28), 10)
    np.testing.assert_array_equal(model_to_vector(plain), model_to_vector(normalized))
    pixels = torch.rand(3, 1, 28, 28)
    with torch.no_grad():
        expected = plain((pixels - 0.1307) / 0.3081)
        torch.testing.assert_close(normalized(pixels), expected)
        torch.testing.assert_close(normalized(pixels[:1]), expected[:1])


def test_seed_000s_resnet18_is_timms_with_group_normalisation():
    """Seed 000's ResNet-18 (section 4.1, appendix A.5): timm's resnet18 on one-channel 28×28
    images with every BatchNorm2d(C) replaced by GroupNorm(32, C), as Opacus' ModuleValidator.fix
    replaces it in the authors' code; timm's 11,689,512 parameters (3 channels, 1,000 classes)
    less 2/3 of the 7×7 stem and the 1,000-class head."""
    from fairclip.scenarios.models import batch_statistics_layers
    from fairclip.scenarios.tasks.ghost import ghost_layers

    torch.manual_seed(0)
    model = build_model("zhao-resnet18", (1, 28, 28), 10)
    count = sum(p.numel() for p in model.parameters())
    assert count == 11_175_370 == 11_689_512 - 2 * 64 * 49 - (512 * 990 + 990)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.GroupNorm)]
    convolutions = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert len(norms) == len(convolutions) == 20  # stem, 16 in the blocks, 3 projections
    assert all(norm.num_groups == 32 and norm.affine for norm in norms)
    assert all(conv.bias is None for conv in convolutions)
    assert [(c.kernel_size, c.stride) for c in convolutions][:2] == [((7, 7), (2, 2)), ((3, 3), (1, 1))]
    assert not batch_statistics_layers(model)
    assert ghost_layers(model) is not None  # its clients are clipped from per-example norms

    sizes = []
    hooks = [
        getattr(model, name).register_forward_hook(lambda m, a, out: sizes.append(out.shape[-1]))
        for name in ("conv1", "maxpool", "layer1", "layer2", "layer3", "layer4")
    ]
    logits = model(torch.rand(4, 1, 28, 28))
    for hook in hooks:
        hook.remove()
    assert logits.shape == (4, 10) and sizes == [14, 7, 7, 4, 2, 1]
    # Group normalisation works per example: an example's logits do not depend on its batch.
    alone = model(torch.rand(1, 1, 28, 28, generator=_generator(3)))
    batch = torch.cat([torch.rand(1, 1, 28, 28, generator=_generator(3)), torch.rand(5, 1, 28, 28) * 9])
    torch.testing.assert_close(model(batch)[:1], alone, rtol=1e-5, atol=1e-5)
    assert build_model("zhao-resnet18", (3, 32, 32), 100)(torch.rand(2, 3, 32, 32)).shape == (2, 100)


def test_the_eicu_mlp_is_seed_001s_network():
    """Appendix A.2: dense 128, 64, 32 and the output, ReLU after each hidden layer, GroupNorm
    after the first two (32 groups, as Opacus' ModuleValidator.fix), dropout 0.3 after the third."""
    model = build_model("eicu-mlp", (97,), 2)
    layers = [type(layer).__name__ for layer in model]
    assert layers == ["Flatten", *("Linear", "GroupNorm", "ReLU") * 2, "Linear", "ReLU", "Dropout", "Linear"]
    assert [layer.out_features for layer in model if isinstance(layer, torch.nn.Linear)] == [128, 64, 32, 2]
    assert [
        (layer.num_groups, layer.num_channels) for layer in model if isinstance(layer, torch.nn.GroupNorm)
    ] == [
        (32, 128),
        (32, 64),
    ]
    assert model[9].p == 0.3
    assert (
        sum(p.numel() for p in model.parameters())
        == 97 * 128 + 128 + 256 + 128 * 64 + 64 + 128 + 64 * 32 + 32 + 66
    )


def test_dropout_masks_are_drawn_per_call_from_the_seed_the_round_and_the_first_client():
    """A model with dropout trains the same call the same way every time (so a run is the same
    on every executor and after a resume), another round differently, and leaves torch's global
    generator as it found it; the materialised and the per-example-norm paths draw the same masks."""
    from fairclip.strategies.registry import build_policy

    sets = [
        "scenario.examples_per_client=1",
        "federation.num_clients=200",
        "scenario.model=eicu-mlp",
        "seed=4",
    ]
    task = build_task(load_config("demo", None, sets))
    assert task.one_step and task._dropout
    policy = build_policy("constant", {"initial_bound": 1.0}, num_cohorts=2)
    theta, ids = task.initial_model(), np.arange(40)
    state = torch.get_rng_state()
    first = task.per_example_gradients(theta, ids, 3, policy)
    assert torch.equal(torch.get_rng_state(), state)
    np.testing.assert_array_equal(task.per_example_gradients(theta, ids, 3, policy).norms, first.norms)
    assert not np.allclose(task.per_example_gradients(theta, ids, 4, policy).norms, first.norms)
    rows = task.local_updates(theta, ids, 3)
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), first.norms, rtol=1e-4)
    for layer in task.model.modules():  # the same call without dropout: the masks were in use
        if isinstance(layer, torch.nn.Dropout):
            layer.p = 0.0
    assert not np.allclose(task.per_example_gradients(theta, ids, 3, policy).norms, first.norms)


def test_unknown_model_is_refused():
    with pytest.raises(ValueError, match="unknown model"):
        build_model("resnet", (10,), 2)


# ----- local training ----------------------------------------------------------------------


def _client_data(count: int = 32, features: int = 10, classes: int = 2, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(rng.normal(size=(count, features)).astype(np.float32))
    y = torch.from_numpy(rng.integers(0, classes, size=count).astype(np.int64))
    return x, y


def test_local_update_depends_on_the_generator_seed_only():
    x, y = _client_data()
    training = LocalTraining(epochs=2, batch_size=4, lr=0.1)
    torch.manual_seed(0)
    model = build_model("logistic", (10,), 2)
    start = _float32_vector(model_to_vector(model).size, seed=3)
    kept = start.copy()

    first = local_update(model, start, x, y, training, _generator(7))
    np.testing.assert_array_equal(start, kept)  # the global model is not modified
    assert first.dtype == np.float64 and first.shape == start.shape
    assert np.linalg.norm(first) > 0

    # Same seed: identical Δ, even from a model that holds other parameters beforehand.
    torch.manual_seed(1)
    fresh = build_model("logistic", (10,), 2)
    again = local_update(fresh, start, x, y, training, _generator(7))
    np.testing.assert_array_equal(again, first)

    # Another seed shuffles the minibatches differently.
    other = local_update(model, start, x, y, training, _generator(8))
    assert not np.allclose(other, first, rtol=0, atol=1e-7)


def test_local_update_is_theta_after_minus_theta_before():
    x, y = _client_data()
    torch.manual_seed(0)
    model = build_model("mlp", (10,), 2)
    start = model_to_vector(model)
    delta = local_update(model, start, x, y, LocalTraining(1, 8, 0.05), _generator(0))
    np.testing.assert_array_equal(delta, model_to_vector(model) - start)


def test_local_update_of_logistic_regression_is_one_manual_sgd_step():
    features, classes, count, lr = 4, 3, 5, 0.3
    x, y = _client_data(count, features, classes, seed=4)
    model = build_model("logistic", (features,), classes)
    start = _float32_vector(model_to_vector(model).size, seed=9)
    # One batch holding every example: exactly one SGD step on the mean cross-entropy.
    delta = local_update(model, start, x, y, LocalTraining(1, count, lr), _generator(0))

    weight = start[: classes * features].reshape(classes, features)
    bias = start[classes * features :]
    xs = x.numpy().astype(np.float64)
    logits = xs @ weight.T + bias
    probabilities = np.exp(logits - logits.max(axis=1, keepdims=True))
    probabilities /= probabilities.sum(axis=1, keepdims=True)
    residual = probabilities - np.eye(classes)[y.numpy()]
    gradient = np.concatenate([(residual.T @ xs / count).ravel(), residual.mean(axis=0)])
    np.testing.assert_allclose(delta, -lr * gradient, rtol=1e-5, atol=1e-7)


# ----- evaluation --------------------------------------------------------------------------

# logits = (x0, x1, 0.5): class 2 wins when both features are below 0.5.
HAND_WEIGHT = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
HAND_BIAS = np.array([0.0, 0.0, 0.5])
HAND_X = np.array([[2, 0], [0, 2], [0, 0], [1, 0], [0, 1], [-1, -1]], dtype=np.float32)
HAND_Y = np.array([0, 1, 2, 1, 1, 0], dtype=np.int64)
# predictions:     0  1  2  0  1  2  -> correct: 1 1 1 0 1 0


def _hand_model():
    model = build_model("logistic", (2,), 3)
    vector = np.concatenate([HAND_WEIGHT.ravel(), HAND_BIAS])
    return model, vector


def _hand_losses(rows=slice(None)) -> np.ndarray:
    logits = HAND_X[rows].astype(np.float64) @ HAND_WEIGHT.T + HAND_BIAS
    log_norm = np.log(np.exp(logits).sum(axis=1))
    return log_norm - logits[np.arange(len(logits)), HAND_Y[rows]]


def test_evaluate_matches_hand_computed_metrics():
    model, vector = _hand_model()
    weights = {
        "first_half": np.array([1.0, 1, 1, 0, 0, 0]),
        "reweighted": np.array([0.0, 0, 0, 2, 1, 1]),
        "nobody": np.zeros(6),
    }
    overall, cohorts = evaluate(
        model, vector, torch.from_numpy(HAND_X), torch.from_numpy(HAND_Y), weights, num_classes=3
    )
    losses = _hand_losses()
    assert overall["accuracy"] == pytest.approx(4 / 6)
    assert overall["loss"] == pytest.approx(losses.mean(), rel=1e-6)
    assert overall["accuracy_class_0"] == pytest.approx(1 / 2)
    assert overall["accuracy_class_1"] == pytest.approx(2 / 3)
    assert overall["accuracy_class_2"] == pytest.approx(1.0)
    assert overall["macro_accuracy"] == pytest.approx((1 / 2 + 2 / 3 + 1) / 3)
    assert overall["worst_class_accuracy"] == pytest.approx(1 / 2)

    assert set(cohorts) == set(weights)
    assert cohorts["first_half"]["accuracy"] == pytest.approx(1.0)
    assert cohorts["first_half"]["loss"] == pytest.approx(losses[:3].mean(), rel=1e-6)
    # Rows 3, 4, 5 weighted 2:1:1, correct 0, 1, 0.
    assert cohorts["reweighted"]["accuracy"] == pytest.approx(1 / 4)
    reweighted_loss = (2 * losses[3] + losses[4] + losses[5]) / 4
    assert cohorts["reweighted"]["loss"] == pytest.approx(reweighted_loss, rel=1e-6)
    assert math.isnan(cohorts["nobody"]["accuracy"]) and math.isnan(cohorts["nobody"]["loss"])


def test_evaluate_leaves_absent_classes_out_of_macro_and_worst_class():
    model, vector = _hand_model()
    rows = [0, 1, 3, 4, 5]  # no example of class 2
    overall, _ = evaluate(
        model, vector, torch.from_numpy(HAND_X[rows]), torch.from_numpy(HAND_Y[rows]), {}, num_classes=3
    )
    assert "accuracy_class_2" not in overall
    assert overall["accuracy"] == pytest.approx(3 / 5)
    assert overall["macro_accuracy"] == pytest.approx((1 / 2 + 2 / 3) / 2)
    assert overall["worst_class_accuracy"] == pytest.approx(1 / 2)


@pytest.mark.parametrize("name", ["cnn", "tanh-cnn"])
def test_predict_gives_the_plain_forward_pass_of_image_models(name):
    """Batches of PREDICT_BATCH and the channels-last format change nothing but rounding."""
    torch.manual_seed(1)
    model = build_model(name, (1, 28, 28), 10)
    vector = _float32_vector(model_to_vector(model).size, seed=2)
    features = torch.randn(2 * PREDICT_BATCH + 7, 1, 28, 28, generator=_generator(3))
    reference = build_model(name, (1, 28, 28), 10)
    load_vector(reference, vector)
    with torch.no_grad():
        expected = reference(features)
    logits = predict(model, vector, features)
    assert logits.shape == expected.shape
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last)
    # Loading the next vector works on the converted model.
    logits = predict(model, 2 * vector, features[:5])
    load_vector(reference, 2 * vector)
    with torch.no_grad():
        torch.testing.assert_close(logits, reference(features[:5]), rtol=1e-5, atol=1e-5)


# ----- synthetic data ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo_config():
    return load_config("demo", None, [])


@pytest.fixture(scope="module")
def demo_data(demo_config):
    return synthetic_data(demo_config.scenario, 1000, seed=0)


def _signal(x: np.ndarray, y: np.ndarray, feature: int) -> float:
    """Difference of the class-conditional means of one feature."""
    return float(x[y == 1, feature].mean() - x[y == 0, feature].mean())


def test_demo_scenario_is_what_the_data_checks_assume(demo_config):
    spec = demo_config.scenario
    assert list(spec.cohorts) == ["majority", "minority"]
    assert spec.features == 10 and spec.examples_per_client == 32
    assert spec.cohorts["majority"].synthetic.signal_feature == 0
    assert spec.cohorts["minority"].synthetic.signal_feature == 1


def test_synthetic_clients_cohorts_and_examples(demo_data):
    data = demo_data
    assert np.bincount(data.client_cohorts).tolist() == [900, 100]
    assert len(data.client_indices) == 1000
    assert all(len(indices) == 32 for indices in data.client_indices)
    held = np.concatenate(data.client_indices)
    np.testing.assert_array_equal(np.sort(held), np.arange(1000 * 32))  # every example, once
    assert data.train_x.shape == (32000, 10) and data.train_x.dtype == np.float32
    assert data.train_y.dtype == np.int64 and set(np.unique(data.train_y)) == {0, 1}
    assert data.num_classes == 2
    assert 0.45 < data.train_y.mean() < 0.55


def test_synthetic_cohort_label_lives_on_its_own_feature(demo_config, demo_data):
    data = demo_data
    for cohort, (name, spec) in enumerate(demo_config.scenario.cohorts.items()):
        rows = np.concatenate([data.client_indices[c] for c in np.flatnonzero(data.client_cohorts == cohort)])
        x, y = data.train_x[rows], data.train_y[rows]
        strength = spec.synthetic.signal_strength
        own, other = spec.synthetic.signal_feature, 1 - spec.synthetic.signal_feature
        assert _signal(x, y, own) == pytest.approx(2 * strength, abs=0.2), name
        assert abs(_signal(x, y, other)) < 0.1, name
        # The minority's features are shifted by its offset (1.0), the majority's are not.
        background = np.delete(x, own, axis=1)
        assert background.mean() == pytest.approx(spec.synthetic.offset, abs=0.05), name
        assert background.std() == pytest.approx(spec.synthetic.background_noise, rel=0.05), name


def test_synthetic_test_weights_select_only_their_cohorts_rows(demo_config, demo_data):
    data = demo_data
    spec = demo_config.scenario
    per_cohort = spec.test_examples_per_cohort
    assert set(data.cohort_weights) == {"majority", "minority"}
    assert len(data.test_y) == 2 * per_cohort
    majority, minority = data.cohort_weights["majority"], data.cohort_weights["minority"]
    for weights in (majority, minority):
        assert set(np.unique(weights)) == {0.0, 1.0}
        assert weights.sum() == per_cohort
    np.testing.assert_array_equal(majority + minority, np.ones(2 * per_cohort))  # disjoint, covering
    # The rows each cohort selects come from that cohort's distribution.
    for weights, own, offset in ((majority, 0, 0.0), (minority, 1, 1.0)):
        rows = weights == 1
        x, y = data.test_x[rows], data.test_y[rows]
        assert _signal(x, y, own) == pytest.approx(3.0, abs=0.25)
        assert abs(_signal(x, y, 1 - own)) < 0.15
        assert np.delete(x, own, axis=1).mean() == pytest.approx(offset, abs=0.05)


def test_synthetic_data_is_fixed_by_the_seed(demo_config, demo_data):
    again = synthetic_data(demo_config.scenario, 1000, seed=0)
    np.testing.assert_array_equal(again.train_x, demo_data.train_x)
    np.testing.assert_array_equal(again.test_x, demo_data.test_x)
    other = synthetic_data(demo_config.scenario, 1000, seed=1)
    assert not np.array_equal(other.train_x, demo_data.train_x)


# ----- a short demo run --------------------------------------------------------------------


def test_demo_without_clipping_improves_majority_accuracy_over_round_zero():
    config = load_config("demo", None, ["training.rounds=3", "policy.name=none"])
    task = build_task(config)
    _, initial = task.evaluate(task.initial_model())
    result = simulate(config, task)
    assert [row["round"] for row in result.rows] == [1, 2, 3]
    assert all(row["sampled_clients"] > 0 for row in result.rows)
    final = result.rows[-1]
    assert final["majority/accuracy"] > initial["majority"]["accuracy"] + 0.2
    assert final["majority/accuracy"] > 0.85
    assert set(result.summary["cohorts"]) == {"majority", "minority"}
    assert result.summary["cohorts"]["majority"]["accuracy"] == final["majority/accuracy"]
