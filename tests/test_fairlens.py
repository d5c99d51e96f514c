"""FairLens as seed 003 ran it (its Algorithm 4, appendix B.5): ``training.objective = "fairlens"``.

The batch term r = γ_1 ∇R_1 + γ_2 ∇R_2 (:mod:`fairclip.scenarios.tasks.fairlens`) against finite differences
and a direct computation, the clients' updates it shifts, the runs it is refused in, and the
privacy claim its runs make (none)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from fairclip.scenarios.config import load_config
from fairclip.scenarios.data.federated_dataset import FederatedDataset
from fairclip.scenarios.errors import ConfigError
from fairclip.scenarios.flower_config import flower_run
from fairclip.scenarios.models import build_model, load_vector, model_to_vector
from fairclip.scenarios.tasks import fairlens
from fairclip.scenarios.tasks.classification import ClassificationTask
from fairclip.scenarios.tasks.training import one_step_updates
from fairclip.server.run import COUPLED_CLIENTS_NOTE
from fairclip.sims.executors.loop import simulate
from fairclip.sims.executors.ray import RayExecutor

BOUND = 0.3
FAIRLENS = ["training.objective=fairlens", "policy.name=constant", "policy.initial_bound=0.3"]
ONE_STEP = ["scenario.partition=per-example", "training.local_epochs=1"]


def _batch(count: int = 24, features: int = 5, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(count, features, generator=generator, dtype=torch.float64)
    y = torch.randint(0, 2, (count,), generator=generator)
    groups = torch.arange(count) % 2
    return x, y, groups


def _model(name: str, features: int = 5) -> nn.Module:
    torch.manual_seed(1)
    if name == "small-mlp-tanh":  # mlp-tanh's shape, small enough for finite differences
        return nn.Sequential(
            nn.Linear(features, 4), nn.Tanh(), nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2)
        ).double()
    return build_model(name, (features,), 2).double()


def _by_hand(model: nn.Module, vector: np.ndarray, x, y, groups, bound: float) -> tuple[float, float]:
    """R_1 and R_2 of Algorithm 4 with one autograd call per example."""
    load_vector(model, vector)
    grads = []
    for i in range(len(y)):
        model.zero_grad()
        nn.functional.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).clone())
    g = torch.stack(grads)
    clipped = g * torch.clamp(bound / g.norm(dim=1), max=1.0)[:, None]
    a, b = groups == 0, groups == 1
    r1 = abs(float((g[a].mean(0) - g[b].mean(0)) @ (clipped.mean(0) - g.mean(0))))
    with torch.no_grad():
        f = torch.softmax(model(x), dim=1)[:, 1]
    r2 = 0.5 * sum(float(f[m].mean() * (1 - f[m].mean())) for m in (a, b))
    return r1, r2


@pytest.mark.parametrize("name", ["logistic", "sigmoid-logistic", "small-mlp-tanh"])
def test_the_regularisers_are_algorithm_4s(name):
    model = _model(name)
    vector = model_to_vector(model)
    x, y, groups = _batch()
    norms = []
    for i in range(len(y)):  # the bound clips some examples and not others
        model.zero_grad()
        nn.functional.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        norms.append(float(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).norm()))
    bound = float(np.median(norms))
    found = fairlens.regularizer_values(model, vector, x, y, groups, bound)
    assert found == pytest.approx(_by_hand(model, vector, x, y, groups, bound), rel=1e-9)
    assert found[0] > 0


@pytest.mark.parametrize("name", ["logistic", "sigmoid-logistic", "small-mlp-tanh"])
def test_the_batch_term_is_the_gradient_of_the_weighted_regularisers(name):
    """r = γ_1 ∇R_1 + γ_2 ∇R_2, second order through the clipping: the factored path for Linear
    models, the generic ``torch.func`` path and central finite differences agree."""
    model = _model(name)
    vector = model_to_vector(model)
    x, y, groups = _batch()
    objective = fairlens.FairLens(1.5, 2.0, BOUND)
    term = objective.shift(model, vector, x, y, groups)
    (r1, r2), leaves = fairlens._regularizers_at(
        model, vector, x, y, groups, BOUND, differentiable=True, generic=True
    )
    generic = torch.cat([g.reshape(-1) for g in torch.autograd.grad(1.5 * r1 + 2.0 * r2, leaves)])
    np.testing.assert_allclose(term, generic.numpy(), rtol=1e-9, atol=1e-12)

    def weighted(point: np.ndarray) -> float:
        r1, r2 = fairlens.regularizer_values(model, point, x, y, groups, BOUND)
        return 1.5 * r1 + 2.0 * r2

    step = 1e-6
    numeric = np.array(
        [
            (weighted(vector + step * e) - weighted(vector - step * e)) / (2 * step)
            for e in np.eye(vector.size)
        ]
    )
    np.testing.assert_allclose(term, numeric, atol=1e-7)
    assert np.linalg.norm(term) > 1e-3


def test_a_batch_without_one_group_has_no_gradient_gap_term():
    model = _model("logistic")
    vector = model_to_vector(model)
    x, y, _ = _batch()
    only_a = torch.zeros(len(y), dtype=torch.int64)
    r1, r2 = fairlens.regularizer_values(model, vector, x, y, only_a, BOUND)
    with torch.no_grad():
        f = float(torch.softmax(model(x), dim=1)[:, 1].mean())
    assert r1 == 0 and r2 == pytest.approx(0.5 * f * (1 - f), rel=1e-12)
    empty = fairlens.regularizer_gradient(
        model, vector, x[:0], y[:0], only_a[:0], fairlens.FairLens(1.0, 1.0, BOUND)
    )
    assert empty.shape == vector.shape and not empty.any()


def test_weights_and_bound_are_checked():
    with pytest.raises(ValueError, match="gradient weight"):
        fairlens.FairLens(-1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="bound C_0"):
        fairlens.FairLens(1.0, 1.0, 0.0)
    assert fairlens.linear_layers(build_model("esipova-cnn", (1, 28, 28), 10)) is None


def _tiny_task(config) -> ClassificationTask:
    """A task of 40 one-example clients in two cohorts (no data files needed)."""
    generator = np.random.default_rng(0)
    count = 40
    data = FederatedDataset(
        train_x=generator.normal(size=(count, 5)).astype(np.float32),
        train_y=generator.integers(0, 2, count),
        client_indices=[np.array([i]) for i in range(count)],
        client_cohorts=np.arange(count) % 2,
        test_x=generator.normal(size=(20, 5)).astype(np.float32),
        test_y=generator.integers(0, 2, 20),
        cohort_weights={"female": (np.arange(20) % 2 == 0) * 1.0, "male": (np.arange(20) % 2 == 1) * 1.0},
        num_classes=2,
    )
    return ClassificationTask.from_dataset(data, config.training, config.seed, "logistic")


def _config(*extra: str):
    sets = [*FAIRLENS, *ONE_STEP, "federation.num_clients=40", "federation.sample_rate=0.5"]
    return load_config("dutch", None, [*sets, "training.rounds=3", "training.client_lr=1.0", *extra])


def test_each_client_steps_with_its_own_gradient_plus_the_batch_term():
    config = _config()
    task = _tiny_task(config)
    objective = fairlens.FairLens(1.0, 1.0, BOUND)
    task.use_objective(objective)
    assert task.forms_updates(None)  # no ghost clipping: the rows are not scalings of ∇ℓ_i
    model = task.initial_model()
    ids = np.array([3, 4, 7, 10, 11, 20])
    with pytest.raises(RuntimeError, match="begin_round"):
        task.local_updates(model, ids, 1)
    task.begin_round(model, ids, 1)
    features, labels = task._examples(ids)
    groups = torch.as_tensor(task.client_cohorts[ids])
    term = objective.shift(task.model, model, features, labels, groups)
    plain = one_step_updates(task.model, model, features, labels, 1.0)
    np.testing.assert_allclose(task.local_updates(model, ids, 1), plain - term[None, :], rtol=0, atol=1e-12)
    # a worker view shares the round's term; another round's is not used
    np.testing.assert_allclose(task.worker().local_updates(model, ids[:2], 1), (plain - term)[:2], atol=1e-12)
    with pytest.raises(RuntimeError, match="round 2"):
        task.local_updates(model, ids, 2)


def test_a_fairlens_run_claims_no_epsilon():
    config = _config("privacy.noise_multiplier=1.0", "training.train_loss=true")
    task = _tiny_task(config)
    task.use_objective(fairlens.FairLens(1.0, 1.0, BOUND))
    result = simulate(config, task)
    privacy = result.summary["privacy"]
    assert math.isinf(float(result.summary["epsilon"])) and privacy["guarantee"] is False
    assert privacy["not_private"] == COUPLED_CLIENTS_NOTE
    assert 0 < float(privacy["mechanism_epsilon"]) < math.inf
    assert set(result.summary["cohorts"]["male"]) >= {"accuracy", "loss", "train_loss"}
    plain = load_config("dutch", None, [*ONE_STEP, "policy.name=constant", "training.rounds=1"])
    assert plain.training.objective == "cross-entropy" and not plain.training.train_loss


def test_train_loss_is_each_cohorts_training_cross_entropy():
    config = _config()
    task = _tiny_task(config)
    model = task.initial_model()
    losses = task.train_losses(model)
    load_vector(task.model, model)
    with torch.no_grad():
        each = nn.functional.cross_entropy(task.model(task.train_x), task.train_y, reduction="none").numpy()
    for index, name in enumerate(task.cohort_names):
        assert losses[name] == pytest.approx(each[task.client_cohorts == index].mean(), rel=1e-6)


def test_train_loss_limit_averages_a_seeded_subset_of_each_cohorts_examples():
    """training.train_loss_limit: each cohort's mean over at most that many of its own examples,
    the same subset on every call; a limit above a cohort's size changes nothing."""
    config = _config()
    task = _tiny_task(config)
    model = task.initial_model()
    load_vector(task.model, model)
    with torch.no_grad():
        each = nn.functional.cross_entropy(task.model(task.train_x), task.train_y, reduction="none").numpy()
    sizes = [int((task.client_cohorts == index).sum()) for index in range(len(task.cohort_names))]
    limit = min(sizes) // 2
    assert limit >= 2
    limited = task.train_losses(model, limit=limit)
    assert limited == task.train_losses(model, limit=limit)
    assert task.train_losses(model, limit=max(sizes)) == pytest.approx(task.train_losses(model))
    for index, name in enumerate(task.cohort_names):
        own = np.sort(each[task.client_cohorts == index])
        # a mean of `limit` of the cohort's losses lies between the means of its lowest and highest `limit`
        assert own[:limit].mean() - 1e-9 <= limited[name] <= own[-limit:].mean() + 1e-9


def test_train_loss_limit_without_train_loss_is_refused():
    with pytest.raises(ConfigError, match=r"train_loss_limit applies only with training\.train_loss"):
        load_config("dutch", None, [*ONE_STEP, "policy.name=constant", "training.train_loss_limit=10"])


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["policy.name=bounded", "policy.lower_bound=0.1"], "policy.name must be constant"),
        (["scenario.partition=cohort"], "one-example, one-step clients"),
        (["training.local_epochs=2"], "one-example, one-step clients"),
        (["training.class_weights=[1.0, 2.0]"], "class_weights must be unset"),
        (["training.fairlens_weights=[1.0]"], "fairlens_weights"),
    ],
)
def test_fairlens_is_refused_where_algorithm_4_is_not_defined(sets, message):
    with pytest.raises(ConfigError, match=message):
        load_config("dutch", None, [*FAIRLENS, *ONE_STEP, *sets])


def test_fairlens_needs_two_cohorts_and_a_classification_task():
    three = (
        'scenario.cohorts={a = {share = 0.5, attribute = "female"}, b = {share = 0.3, attribute = "male"}, '
    )
    three += 'c = {share = 0.2, attribute = "male"}}'
    with pytest.raises(ConfigError, match="exactly two cohorts"):
        load_config("dutch", None, [*FAIRLENS, *ONE_STEP, three])
    with pytest.raises(ConfigError, match="classification scenario"):
        load_config("bimodal-mean", None, FAIRLENS)
    with pytest.raises(ConfigError, match="train_loss needs a classification task"):
        load_config("bimodal-mean", None, ["training.train_loss=true"])


def test_the_cli_refuses_it_in_one_line(cli, tmp_path):
    status, _, err = cli(
        "run", "--scenario", "dutch", "--set", "training.objective=fairlens", "--out", str(tmp_path)
    )
    assert status == 2 and err.strip().count("\n") == 0 and "training.objective = fairlens" in err


def test_flower_and_ray_refuse_it():
    with pytest.raises(ConfigError, match=r"training\.objective = fairlens"):
        flower_run({"scenario": "flower-local", "set": "training.objective=fairlens"})
    with pytest.raises(ConfigError, match=r"training\.objective = reconstruction runs in simulations only"):
        flower_run({"scenario": "flower-local", "set": "training.objective=reconstruction"})
    with pytest.raises(ConfigError, match="simulation-only diagnostic"):
        flower_run({"scenario": "flower-local", "set": "training.train_loss=true"})
    with pytest.raises(ConfigError, match="in-process executor"):
        RayExecutor.start(_config(), None, 2)
