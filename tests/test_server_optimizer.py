"""The server step: SGD with momentum, Adam or AdamWOSM on the released Δ̂, and an L2 penalty added
after the noise."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fairclip.scenarios.config import ConfigError, load_config
from fairclip.scenarios.tasks import build_task
from fairclip.server.optimizer import ServerAdam, ServerAdamWOSM, ServerSGD, server_optimizer
from fairclip.sims.executors.loop import simulate


def test_weight_decay_adds_the_penalty_gradient_to_the_released_estimate():
    """v_{t+1} = β v_t + Δ̂_t − λ θ_t,  θ_{t+1} = θ_t + η ρ v_{t+1}."""
    theta, estimate = np.array([2.0, -1.0]), np.array([0.5, 0.5])
    plain = ServerSGD(0.1).step(theta, estimate)
    decayed = ServerSGD(0.1, weight_decay=0.2)
    first = decayed.step(theta, estimate, lr_factor=2.0)
    np.testing.assert_allclose(plain, theta + 0.1 * estimate)
    np.testing.assert_allclose(first, theta + 0.2 * (estimate - 0.2 * theta))
    momentum = ServerSGD(0.1, momentum=0.5, weight_decay=0.2)
    one = momentum.step(theta, estimate)
    two = momentum.step(one, estimate)
    velocity = 0.5 * (estimate - 0.2 * theta) + (estimate - 0.2 * one)
    np.testing.assert_allclose(two, one + 0.1 * velocity)


@settings(max_examples=50, deadline=None)
@given(
    values=st.lists(st.floats(-1e3, 1e3), min_size=6, max_size=6),
    lr=st.floats(0.01, 10.0),
    factor=st.floats(0.1, 2.0),
    decay=st.sampled_from([0.0, 0.01]),
)
def test_sgd_without_momentum_steps_along_the_estimate_and_keeps_no_velocity(values, lr, factor, decay):
    """β = 0: θ_{t+1} = θ_t + η ρ d_t, bit for bit the step that kept v_{t+1} = 0·v_t + d_t, and
    nothing of the model's size is left on the optimizer (a checkpoint pickles it whole), also
    after a step from one restored with an old checkpoint's velocity."""
    theta, first, second = (np.array(values[i : i + 2]) for i in (0, 2, 4))
    optimizer = ServerSGD(lr, weight_decay=decay)
    one = optimizer.step(theta, first, lr_factor=factor)
    d_one = first - decay * theta if decay else first
    np.testing.assert_array_equal(one, theta + lr * factor * d_one)
    assert optimizer.velocity is None
    optimizer.velocity = d_one  # what a checkpoint of the earlier code held
    two = optimizer.step(one, second)
    d_two = second - decay * one if decay else second
    np.testing.assert_array_equal(two, one + lr * (0.0 * d_one + d_two))
    assert optimizer.velocity is None


def test_a_run_with_weight_decay_shrinks_the_model():
    settings = ["policy.name=constant", "training.rounds=6", "seed=3", "training.server_lr=2.0"]
    norms = {}
    for decay in (0.0, 0.5):
        config = load_config("demo", None, [*settings, f"training.weight_decay={decay}"])
        norms[decay] = float(np.linalg.norm(simulate(config, build_task(config)).model))
    assert norms[0.5] < 0.8 * norms[0.0]


@pytest.mark.parametrize(
    ("override", "mentions"),
    [
        ("training.weight_decay=-0.1", "weight_decay"),
        ("scenario.feature_scaling=minmax", "adult dataset only"),
        ("scenario.protected=age", "adult dataset only"),
        ("scenario.protected=marital-status", "dutch dataset only"),
        ("scenario.split_seed=0", "adult and dutch datasets only"),
        ("scenario.split_seed=-1", "split_seed"),
        ("training.server_optimizer=rmsprop", "server_optimizer"),
        ("training.server_beta2=1.0", "server_beta2"),
        ("training.server_optimizer=adam", "server_momentum is SGD's"),
        ("training.server_optimizer=adam-wosm", "server_momentum is SGD's"),
    ],
)
def test_bad_optimizer_and_scaling_settings_are_one_line(override, mentions):
    extra = ["training.server_momentum=0.5"] if "=adam" in override else []
    with pytest.raises(ConfigError) as caught:
        load_config("demo", None, [override, *extra])
    assert "\n" not in str(caught.value) and mentions in str(caught.value)


@given(
    seed=st.integers(0, 2**16),
    beta1=st.floats(0.0, 0.99),
    beta2=st.floats(0.5, 0.9999),
    weight_decay=st.sampled_from([0.0, 0.01, 0.3]),
    lr_factors=st.lists(st.sampled_from([1.0, 0.5, 2.0]), min_size=1, max_size=6),
)
@settings(max_examples=60, deadline=None)
def test_server_adam_is_torchs_adam_on_the_negated_estimates(seed, beta1, beta2, weight_decay, lr_factors):
    """DP-Adam: Adam (with L2 weight decay) on the gradient −Δ̂_t, as ``torch.optim.Adam`` steps
    it; ρ_t scales the learning rate of its step."""
    rng = np.random.default_rng(seed)
    theta = rng.normal(size=7)
    reference = torch.nn.Parameter(torch.tensor(theta.copy()))
    adam = torch.optim.Adam([reference], lr=0.05, betas=(beta1, beta2), eps=1e-8, weight_decay=weight_decay)
    ours = ServerAdam(0.05, (beta1, beta2), 1e-8, weight_decay)
    model = theta
    for factor in lr_factors:
        estimate = rng.normal(size=7) * rng.uniform(0.01, 3.0)
        for group in adam.param_groups:
            group["lr"] = 0.05 * factor
        reference.grad = torch.tensor(-estimate)
        adam.step()
        model = ours.step(model, estimate, lr_factor=factor)
        np.testing.assert_allclose(model, reference.detach().numpy(), rtol=1e-10, atol=1e-12)


@given(
    seed=st.integers(0, 2**16),
    beta1=st.floats(0.0, 0.99),
    weight_decay=st.sampled_from([0.0, 0.01]),
    lr_factors=st.lists(st.sampled_from([1.0, 0.5, 2.0]), min_size=1, max_size=6),
)
@settings(max_examples=60, deadline=None)
def test_server_adam_wosm_is_its_authors_step_on_the_negated_estimates(seed, beta1, weight_decay, lr_factors):
    """DPAdamWOSM as its authors' ``AdamWOSM`` (``cutoff = 0``) steps the gradient g = −Δ̂_t:
    m_t = β₁ m_{t−1} + (1 − β₁) g_t, θ_{t+1} = θ_t − (α / (ξ_t + ε)) / (1 − β₁^t) · m_t, with the
    L2 term added to g; ρ_t scales α. Written out here from their update, not from fairclip's."""
    rng = np.random.default_rng(seed)
    theta = rng.normal(size=5)
    ours = ServerAdamWOSM(0.003, beta1, 1e-8, weight_decay)
    model, reference, exp_avg = theta, theta.copy(), np.zeros(5)
    for step, factor in enumerate(lr_factors, start=1):
        estimate = rng.normal(size=5)
        noise_std = float(rng.uniform(1e-3, 2.0))
        gradient = -estimate + weight_decay * reference
        exp_avg = beta1 * exp_avg + (1 - beta1) * gradient
        reference = reference - (0.003 * factor / (noise_std + 1e-8)) / (1 - beta1**step) * exp_avg
        model = ours.step(model, estimate, lr_factor=factor, noise_std=noise_std)
        np.testing.assert_allclose(model, reference, rtol=1e-10, atol=1e-12)


@given(
    seed=st.integers(0, 2**16),
    scale=st.floats(1e-3, 1e3),
    steps=st.integers(1, 5),
)
@settings(max_examples=50, deadline=None)
def test_server_adam_wosm_steps_the_same_when_the_bound_scales_everything(seed, scale, steps):
    """A bound c times larger scales the clipped sum and its noise (so Δ̂ and ξ_t) by c; the step
    over ξ_t does not change, as Adam's does not (exactly with ε = 0)."""
    rng = np.random.default_rng(seed)
    theta = rng.normal(size=4)
    small, large = ServerAdamWOSM(0.01, eps=0.0), ServerAdamWOSM(0.01, eps=0.0)
    one, other = theta, theta
    for _ in range(steps):
        estimate, noise_std = rng.normal(size=4), float(rng.uniform(0.1, 1.0))
        one = small.step(one, estimate, noise_std=noise_std)
        other = large.step(other, scale * estimate, noise_std=scale * noise_std)
    np.testing.assert_allclose(one, other, rtol=1e-9, atol=1e-12)


def test_server_adam_wosm_refuses_a_round_without_noise():
    with pytest.raises(ValueError, match="added none"):
        ServerAdamWOSM(0.01).step(np.zeros(2), np.ones(2), noise_std=0.0)


@pytest.mark.parametrize(
    "settings_",
    [
        ["policy.name=none"],
        ["policy.name=constant", "privacy.noise_multiplier=0"],
    ],
)
def test_adam_wosm_without_noise_is_refused_before_the_run(settings_):
    with pytest.raises(ConfigError) as caught:
        load_config("demo", None, [*settings_, "training.server_optimizer=adam-wosm"])
    message = str(caught.value)
    assert "\n" not in message and "adam-wosm" in message and "noise" in message


def test_the_factory_names_each_optimizer():
    assert isinstance(server_optimizer("sgd", 0.1, momentum=0.9), ServerSGD)
    wosm = server_optimizer("adam-wosm", 0.001, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)
    assert isinstance(wosm, ServerAdamWOSM) and (wosm.beta1, wosm.eps, wosm.weight_decay) == (0.8, 1e-6, 0.1)
    with pytest.raises(ValueError, match="momentum is SGD's"):
        server_optimizer("adam-wosm", 0.01, momentum=0.5)
    adam = server_optimizer("adam", 0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)
    assert isinstance(adam, ServerAdam) and adam.betas == (0.8, 0.99) and adam.eps == 1e-6
    with pytest.raises(ValueError, match="momentum is SGD's"):
        server_optimizer("adam", 0.01, momentum=0.5)
    with pytest.raises(ValueError, match="unknown server optimizer"):
        server_optimizer("lamb", 0.01)


SAMPLE_LEVEL_STEP = [
    "scenario.examples_per_client=1",
    "federation.num_clients=400",
    "training.client_lr=1.0",
    "training.rounds=1",
    "policy.name=constant",
    "policy.initial_bound=0.7",
    "privacy.noise_multiplier=0.5",
    "training.server_lr=0.01",
    "seed=2",
]
"""One round of a sample-level demo run (client lr 1, so Δ̂ = −ĝ): C 0.7, σ 0.5, η_s 0.01."""


def _one_step(optimizer: str):
    """The model's change over one :data:`SAMPLE_LEVEL_STEP` round with the server optimizer
    ``optimizer``, its ε, and its configuration."""
    config = load_config("demo", None, [*SAMPLE_LEVEL_STEP, f"training.server_optimizer={optimizer}"])
    task = build_task(config)
    result = simulate(config, task)
    return result.model - task.initial_model(), result.summary["epsilon"], config


def test_a_sample_level_run_with_server_adam_is_dp_adam():
    """One step of a sample-level run moves every parameter by about η_s (Adam's first step is
    ±η_s·ĝ/(|ĝ| + ε)), unlike SGD's step; ε is the same."""
    adam_step, adam_epsilon, _ = _one_step("adam")
    sgd_step, sgd_epsilon, _ = _one_step("sgd")
    np.testing.assert_allclose(np.abs(adam_step), 0.01, rtol=1e-3)
    assert np.all(np.sign(adam_step) == np.sign(sgd_step))
    assert adam_epsilon == sgd_epsilon


def test_a_sample_level_run_with_adam_wosm_steps_sgds_step_over_the_noise_std():
    """One step of a sample-level run with ``adam-wosm`` is SGD's step at the same η_s divided by
    ξ = σ·C / m̂, the standard deviation of Δ̂'s noise per coordinate (its first bias-corrected
    moment is d_1 itself); the same draws, so the same ε."""
    wosm_step, wosm_epsilon, config = _one_step("adam-wosm")
    sgd_step, sgd_epsilon, _ = _one_step("sgd")
    noise_std = 0.5 * 0.7 / config.expected_clients
    np.testing.assert_allclose(wosm_step, sgd_step / (noise_std + 1e-8), rtol=1e-5)
    assert wosm_epsilon == sgd_epsilon
