"""Class-weighted losses (``training.class_weights``): seed 001 trains Adult with binary
cross-entropy whose positive examples weigh 2, on every client path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fairclip.client.contributions import contribute_blocks, contribute_scaled_blocks
from fairclip.scenarios.config import ConfigError, load_config
from fairclip.scenarios.models import build_model, model_to_vector
from fairclip.scenarios.tasks import build_task
from fairclip.scenarios.tasks.ghost import one_step_gradients
from fairclip.scenarios.tasks.training import LocalTraining, local_update, one_step_updates, weighted_losses
from fairclip.sims.executors.loop import simulate
from fairclip.strategies.aggregation import add_in_order
from fairclip.strategies.registry import build_policy

WEIGHTS = (1.0, 2.0)


def _data(count: int = 24, features: int = 5):
    generator = torch.Generator().manual_seed(4)
    return torch.randn(count, features, generator=generator), torch.arange(count) % 2


def test_weights_one_and_p_are_binary_cross_entropy_with_positive_weight_p():
    torch.manual_seed(0)
    model = build_model("binary-logistic", (5,), 2)
    x, y = _data()
    logits = model(x)
    ours = weighted_losses(logits, y, WEIGHTS)
    theirs = torch.nn.functional.binary_cross_entropy_with_logits(
        logits[:, 1], y.float(), pos_weight=torch.tensor(2.0), reduction="none"
    )
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(weighted_losses(logits, y, None), ours / torch.tensor(WEIGHTS)[y])


def test_one_step_updates_scale_with_their_class_weight():
    torch.manual_seed(1)
    model = build_model("binary-mlp", (5,), 2)
    theta = model_to_vector(model)
    x, y = _data()
    plain = one_step_updates(model, theta, x, y, lr=0.3)
    weighted = one_step_updates(model, theta, x, y, lr=0.3, class_weights=WEIGHTS)
    expected = plain * np.asarray(WEIGHTS)[y.numpy()][:, None]
    tolerance = 4 * float(np.spacing(np.float32(np.abs(theta).max())))
    np.testing.assert_allclose(weighted, expected, atol=tolerance)
    assert np.abs(weighted[y.numpy() == 1]).max() > 100 * tolerance


def test_the_one_step_path_clips_the_weighted_gradients_as_the_materialised_one():
    torch.manual_seed(2)
    model = build_model("binary-mlp", (5,), 2)
    theta = model_to_vector(model)
    x, y = _data()
    updates = one_step_updates(model, theta, x, y, lr=0.3, class_weights=WEIGHTS)
    gradients = one_step_gradients(model, theta, x, y, lr=0.3, class_weights=WEIGHTS)
    np.testing.assert_allclose(gradients.norms, np.linalg.norm(updates, axis=1), rtol=1e-5)
    policy = build_policy("constant", {"initial_bound": float(np.median(gradients.norms))}, num_cohorts=2)
    params = policy.broadcast(policy.initial_state(theta.shape[0]))
    cohorts, sizes = y.numpy(), [10, 14]
    want = add_in_order(contribute_blocks(policy, params, updates, cohorts, 2, sizes))
    have = add_in_order(contribute_scaled_blocks(policy, params, gradients, cohorts, 2, sizes))
    tolerance = 24 * float(np.spacing(np.float32(np.abs(theta).max())))
    np.testing.assert_allclose(have.contribution_sum, want.contribution_sum, atol=tolerance)


def test_local_training_minimises_the_mean_weighted_loss():
    """Minibatch SGD on (1/b)·Σ w_{y_i} ℓ_i: one full-batch step equals the step of torch's
    BCE-with-logits mean with ``pos_weight``."""
    torch.manual_seed(3)
    model = build_model("binary-logistic", (5,), 2)
    theta = model_to_vector(model)
    x, y = _data(12)
    ours = local_update(model, theta, x, y, LocalTraining(1, 12, 0.5, WEIGHTS), torch.Generator())
    reference = build_model("binary-logistic", (5,), 2)
    torch.nn.utils.vector_to_parameters(torch.tensor(theta, dtype=torch.float32), reference.parameters())
    loss = torch.nn.functional.binary_cross_entropy_with_logits(
        reference(x)[:, 1], y.float(), pos_weight=torch.tensor(2.0)
    )
    loss.backward()
    step = -0.5 * torch.cat([p.grad.reshape(-1) for p in reference.parameters()]).double().numpy()
    np.testing.assert_allclose(ours, step, rtol=1e-5, atol=1e-7)


def test_a_weighted_run_differs_and_wrong_weights_are_refused():
    settings = ["policy.name=constant", "training.rounds=3", "seed=1", "privacy.noise_multiplier=0.5"]
    one_step = ["scenario.examples_per_client=1", "federation.num_clients=300", "scenario.model=binary-mlp"]
    models = {}
    for weights in ("[1.0, 1.0]", "[1.0, 2.0]"):
        config = load_config("demo", None, [*settings, *one_step, f"training.class_weights={weights}"])
        models[weights] = simulate(config, build_task(config)).model
    plain_config = load_config("demo", None, [*settings, *one_step])
    np.testing.assert_allclose(models["[1.0, 1.0]"], simulate(plain_config, build_task(plain_config)).model)
    assert np.abs(models["[1.0, 2.0]"] - models["[1.0, 1.0]"]).max() > 1e-4
    with pytest.raises(ConfigError, match="3 weights for 2 classes"):
        build_task(load_config("demo", None, ["training.class_weights=[1.0, 2.0, 3.0]"]))
    with pytest.raises(ConfigError, match="mean-estimation task has no classes"):
        load_config("bimodal-mean", None, ["training.class_weights=[1.0, 2.0]"])
    with pytest.raises(ConfigError, match="class_weights"):
        load_config("demo", None, ["training.class_weights=[1.0, -2.0]"])


def test_binary_evaluation_reports_the_positive_class_f1():
    """Seed 001 reports F1 beside accuracy: 2·TP / (2·TP + FP + FN) of class 1 on the test set."""
    from fairclip.scenarios.tasks.evaluation import evaluate, predict

    torch.manual_seed(5)
    model = build_model("binary-logistic", (5,), 2)
    theta = model_to_vector(model)
    x, y = _data(200)
    overall, _ = evaluate(model, theta, x, y, {"all": np.ones(200)}, num_classes=2)
    predicted = predict(model, theta, x).argmax(dim=1).numpy()
    truth = y.numpy()
    tp = int(((predicted == 1) & (truth == 1)).sum())
    fp = int(((predicted == 1) & (truth == 0)).sum())
    fn = int(((predicted == 0) & (truth == 1)).sum())
    assert tp + fp > 0 and tp + fn > 0
    assert overall["f1"] == pytest.approx(2 * tp / (2 * tp + fp + fn))
    ten, _ = evaluate(build_model("logistic", (5,), 10), np.zeros(60), x, y % 10, {"all": np.ones(200)}, 10)
    assert "f1" not in ten


def test_evaluation_loss_is_the_weighted_criterion_and_the_cohort_loss_gap_its_spread():
    """Seed 001 evaluates the criterion it trains (BCE with positive weight 2) and compares the
    subgroups' losses: ``loss`` is the mean of w_y·ℓ over the rows, each cohort's over its rows,
    and ``cohort_loss_gap`` is |loss_a − loss_b|; a task without class weights is unchanged."""
    from fairclip.scenarios.tasks.evaluation import evaluate

    torch.manual_seed(6)
    model = build_model("binary-mlp", (5,), 2)
    theta = model_to_vector(model)
    x, y = _data(40)
    first = (np.arange(40) < 15).astype(np.float64)
    cohorts = {"first": first, "rest": 1.0 - first}
    reference = build_model("binary-mlp", (5,), 2)
    torch.nn.utils.vector_to_parameters(torch.tensor(theta, dtype=torch.float32), reference.parameters())
    with torch.no_grad():
        logits = reference(x)[:, 1]
    rows = torch.nn.functional.binary_cross_entropy_with_logits(
        logits, y.float(), pos_weight=torch.tensor(2.0), reduction="none"
    ).double()
    overall, per_cohort = evaluate(model, theta, x, y, cohorts, num_classes=2, class_weights=WEIGHTS)
    assert overall["loss"] == pytest.approx(float(rows.mean()), rel=1e-5)
    assert per_cohort["first"]["loss"] == pytest.approx(float(rows[:15].mean()), rel=1e-5)
    assert per_cohort["rest"]["loss"] == pytest.approx(float(rows[15:].mean()), rel=1e-5)
    gap = abs(float(rows[:15].mean()) - float(rows[15:].mean()))
    assert gap > 1e-3 and overall["cohort_loss_gap"] == pytest.approx(gap, rel=1e-4)
    plain, _ = evaluate(model, theta, x, y, cohorts, num_classes=2)
    unweighted = torch.nn.functional.binary_cross_entropy_with_logits(logits, y.float()).item()
    assert plain["loss"] == pytest.approx(unweighted, rel=1e-5) and plain["loss"] < overall["loss"]
    with pytest.raises(ValueError, match="3 class weights for 2 classes"):
        evaluate(model, theta, x, y, cohorts, num_classes=2, class_weights=(1.0, 2.0, 3.0))


def test_a_task_with_class_weights_evaluates_the_weighted_loss():
    one_step = ["scenario.examples_per_client=1", "federation.num_clients=60", "scenario.model=binary-mlp"]
    plain = build_task(load_config("demo", None, one_step))
    weighted = build_task(load_config("demo", None, [*one_step, "training.class_weights=[1.0, 2.0]"]))
    theta = plain.initial_model()
    np.testing.assert_array_equal(theta, weighted.initial_model())
    (plain_overall, plain_cohorts), (overall, cohorts) = plain.evaluate(theta), weighted.evaluate(theta)
    assert overall["accuracy"] == plain_overall["accuracy"]
    labels = plain.test_y.cpu().numpy()
    assert 0 < labels.mean() < 1
    assert plain_overall["loss"] < overall["loss"] < 2 * plain_overall["loss"]
    assert set(cohorts) == set(plain_cohorts) and "cohort_loss_gap" in overall
