"""Seed 003's Table 1 ablation (issue 22, item 3): non-private runs that step with only the
magnitude error or only the direction error of clipping (``training.clipping_error``)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import fairclip
from fairclip.client.contributions import contribute_blocks
from fairclip.scenarios.config import load_config
from fairclip.scenarios.errors import ConfigError
from fairclip.scenarios.flower_config import flower_run
from fairclip.scenarios.tasks import build_task
from fairclip.scenarios.tasks.clipping_errors import keep_one_error
from fairclip.sims.executors.local import LocalExecutor
from fairclip.sims.executors.loop import simulate
from fairclip.strategies.aggregation import CohortDiagnostics, RoundSums, add_in_order
from fairclip.strategies.registry import build_policy

vectors = arrays(np.float64, 6, elements=st.floats(-1e3, 1e3, allow_nan=False))


def _sums(clipped: np.ndarray, unclipped: np.ndarray | None) -> RoundSums:
    diagnostics = CohortDiagnostics.zeros(1)
    diagnostics.unclipped_total = unclipped
    return RoundSums(clipped, np.zeros(1), 3, diagnostics)


def _parallel(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a / np.abs(a).max(), b / np.abs(b).max()  # at any scale
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@example(clipped=np.full(6, 3.00753085e-159), unclipped=np.ones(6))  # found by a CI run
@example(clipped=np.ones(6), unclipped=np.full(6, 3.00753085e-159))
@given(clipped=vectors, unclipped=vectors)
@settings(max_examples=200, deadline=None)
def test_each_mode_keeps_one_error_only(clipped, unclipped):
    """At any scale: entries near 1e-159, whose squares lose their digits, too (math.hypot
    scales before it squares)."""
    clipped_norm, unclipped_norm = math.hypot(*clipped), math.hypot(*unclipped)
    sums = _sums(clipped, unclipped)
    assert keep_one_error(sums, "both") is sums
    magnitude = keep_one_error(sums, "magnitude").contribution_sum
    direction = keep_one_error(sums, "direction").contribution_sum
    if unclipped_norm > 0:  # the true direction, at the clipped length
        assert math.hypot(*magnitude) == pytest.approx(clipped_norm, rel=1e-9, abs=1e-12)
        if clipped_norm > 1e-6:
            assert _parallel(magnitude, unclipped) == pytest.approx(1.0, abs=1e-9)
    else:
        assert not magnitude.any()
    if clipped_norm > 0:  # the clipped direction, at the true length
        assert math.hypot(*direction) == pytest.approx(unclipped_norm, rel=1e-9, abs=1e-12)
        if unclipped_norm > 1e-6:
            assert _parallel(direction, clipped) == pytest.approx(1.0, abs=1e-9)
    else:
        assert not direction.any()
    # the rest of what the clients sent is untouched
    assert keep_one_error(sums, "direction").diagnostics is sums.diagnostics


def test_a_mode_without_the_unclipped_total_is_an_error():
    with pytest.raises(RuntimeError, match="no unclipped total"):
        keep_one_error(_sums(np.ones(6), None), "magnitude")


def test_the_unclipped_total_sums_the_raw_updates_that_contribute():
    updates = np.array([[3.0, 4.0], [np.nan, 1.0], [0.3, 0.4], [1.5e308, 1.5e308]])
    policy = build_policy("constant", {"initial_bound": 1.0}, num_cohorts=2)
    params = policy.broadcast(policy.initial_state(2))
    cohorts = np.array([0, 0, 1, 1])
    blocks = contribute_blocks(
        policy, params, updates, cohorts, 2, [2, 2], directions=True, unclipped_total=True
    )
    total = add_in_order(blocks)
    # the NaN row and the row whose norm overflows contribute nothing, so neither is summed,
    # in the total or in its cohort's sum
    np.testing.assert_allclose(total.diagnostics.unclipped_total, [3.3, 4.4])
    np.testing.assert_allclose(total.diagnostics.unclipped_sums, [[3.0, 4.0], [0.3, 0.4]])
    np.testing.assert_allclose(total.contribution_sum, [0.9, 1.2])
    plain = add_in_order(contribute_blocks(policy, params, updates, cohorts, 2, [2, 2]))
    assert plain.diagnostics.unclipped_total is None
    np.testing.assert_array_equal(plain.contribution_sum, total.contribution_sum)


def _first_step(extra: list[str], error: str, bound: float = 0.05) -> np.ndarray:
    config = load_config(
        "demo",
        None,
        [
            *extra,
            "policy.name=constant",
            f"policy.initial_bound={bound}",
            "privacy.noise_multiplier=0",
            "training.rounds=1",
            f"training.clipping_error={error}",
            "seed=3",
        ],
    )
    task = build_task(config)
    start = task.initial_model()
    return simulate(config, task, LocalExecutor).model - start


@pytest.mark.parametrize("clients", ["materialised", "one-step"])
def test_a_run_steps_with_the_error_it_keeps(clients):
    """One round from the same θ_0 and the same sampled clients: a bound no update reaches steps
    along g, clipping along ḡ; ``magnitude`` along g at ḡ's length, ``direction`` along ḡ at g's
    (every step divided by the same m̂)."""
    extra = ["scenario.examples_per_client=1", "federation.num_clients=400"] if clients == "one-step" else []
    unclipped = _first_step(extra, "both", bound=1e9)
    clipped = _first_step(extra, "both")
    magnitude = _first_step(extra, "magnitude")
    direction = _first_step(extra, "direction")
    assert _parallel(unclipped, clipped) < 1 - 1e-4  # clipping turns the aggregate (100 × the tolerance)
    assert np.linalg.norm(clipped) < 0.5 * np.linalg.norm(unclipped)  # and shortens it
    assert _parallel(magnitude, unclipped) == pytest.approx(1.0, abs=1e-6)
    assert np.linalg.norm(magnitude) == pytest.approx(np.linalg.norm(clipped), rel=1e-6)
    assert _parallel(direction, clipped) == pytest.approx(1.0, abs=1e-6)
    assert np.linalg.norm(direction) == pytest.approx(np.linalg.norm(unclipped), rel=1e-6)


def test_the_ray_backend_gives_the_same_ablation(ray_session):
    from fairclip.sims.executors.ray import RayExecutor

    config = load_config(
        "demo",
        None,
        [
            "policy.name=adaptive",
            "privacy.noise_multiplier=0",
            "training.rounds=3",
            "training.clipping_error=direction",
            "seed=5",
        ],
    )
    local = simulate(config, build_task(config), LocalExecutor)
    executor = RayExecutor.start(config, None, num_actors=2)
    try:
        remote = simulate(config, build_task(config), lambda _task, _policy: executor)
    finally:
        executor.stop()
    pd.testing.assert_frame_equal(pd.DataFrame(local.rows), pd.DataFrame(remote.rows), check_exact=True)
    np.testing.assert_array_equal(local.model, remote.model)


def test_an_ablation_is_non_private_and_says_so():
    run = fairclip.simulate(
        "demo",
        overrides={
            "policy.name": "bounded",
            "privacy.noise_multiplier": 0.0,
            "training.rounds": 2,
            "training.clipping_error": "magnitude",
        },
    )
    assert run.summary["epsilon"] == float("inf") or run.summary["epsilon"] == "inf"
    assert run.summary["config"]["training"]["clipping_error"] == "magnitude"


@pytest.mark.parametrize(
    "privacy", [["privacy.noise_multiplier=0.5"], ["privacy.target_epsilon=4"]], ids=["noise", "target"]
)
def test_an_ablation_with_dp_noise_is_refused(privacy):
    with pytest.raises(
        ConfigError, match=r"training\.clipping_error: 'direction' steps with the unclipped sum"
    ):
        load_config("demo", None, ["policy.name=constant", "training.clipping_error=direction", *privacy])
    # the non-private reference of a comparison does not clip, so the key changes nothing there
    load_config("demo", None, ["policy.name=none", "training.clipping_error=direction", *privacy])


def test_the_cli_refuses_it_in_one_line(cli, tmp_path):
    status, _, err = cli(
        "run",
        "--scenario",
        "demo",
        "--set",
        "training.clipping_error=magnitude",
        "--set",
        "privacy.noise_multiplier=1",
        "--out",
        str(tmp_path / "run"),
    )
    assert status == 2 and err.strip().count("\n") == 0 and "training.clipping_error" in err
    assert not (tmp_path / "run").exists()


def test_flower_refuses_the_ablation():
    with pytest.raises(ConfigError, match="simulation-only ablation"):
        flower_run(
            {
                "scenario": "flower-local",
                "set": "training.clipping_error=direction; privacy.noise_multiplier=0",
            }
        )
