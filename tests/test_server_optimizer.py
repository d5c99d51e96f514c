"""The server step: SGD with momentum on the released Δ̂, and an L2 penalty added after the noise."""

from __future__ import annotations

import numpy as np
import pytest

from fairclip.server.optimizer import ServerSGD
from fairclip.sims.config import ConfigError, load_config
from fairclip.sims.engine import simulate
from fairclip.sims.tasks import build_task


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


def test_a_run_with_weight_decay_shrinks_the_model():
    settings = ["strategy.name=constant", "training.rounds=6", "seed=3", "training.server_lr=2.0"]
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
    ],
)
def test_bad_optimizer_and_scaling_settings_are_one_line(override, mentions):
    with pytest.raises(ConfigError) as caught:
        load_config("demo", None, [override])
    assert "\n" not in str(caught.value) and mentions in str(caught.value)
