"""Why clipping hurts a cohort (issue 22, item 3; seed 003, section 4): each cohort's direction
and magnitude errors, cos(Σ c_i, Σ Δ_i) and ||Σ c_i|| / ||Σ Δ_i||, as simulation diagnostics."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fairclip
from fairclip.client.contributions import contribute_blocks, contribute_scaled_blocks
from fairclip.scenarios.models import build_model, model_to_vector
from fairclip.scenarios.tasks.ghost import one_step_gradients
from fairclip.scenarios.tasks.training import one_step_updates
from fairclip.sims.sweeps.plots import COHORT_DIRECTIONS_ROUNDS
from fairclip.strategies.aggregation import add_in_order
from fairclip.strategies.registry import build_policy


@given(
    seed=st.integers(0, 2**16),
    bound=st.floats(0.05, 5.0),
    sizes=st.lists(st.integers(0, 6), min_size=1, max_size=4).filter(lambda s: sum(s) > 0),
)
@settings(max_examples=40, deadline=None)
def test_each_cohorts_sums_are_its_raw_updates_and_its_contributions(seed, bound, sizes):
    rng = np.random.default_rng(seed)
    count = sum(sizes)
    updates = rng.normal(size=(count, 7)) * rng.uniform(0.1, 4.0, size=(count, 1))
    cohorts = rng.integers(0, 3, size=count)
    policy = build_policy("constant", {"initial_bound": bound}, num_cohorts=3)
    params = policy.broadcast(policy.initial_state(7))
    blocks = contribute_blocks(policy, params, updates, cohorts, 3, sizes, directions=True)
    total = add_in_order(blocks)
    clipped = policy.client_side(updates, cohorts, params).contributions  # each update clipped to C
    assert np.all(np.linalg.norm(clipped, axis=1) <= bound * (1 + 1e-12))
    diagnostics = total.diagnostics
    for k in range(3):
        mine = cohorts == k
        np.testing.assert_allclose(diagnostics.unclipped_sums[k], updates[mine].sum(0), atol=1e-12)
        np.testing.assert_allclose(diagnostics.clipped_sums[k], clipped[mine].sum(0), atol=1e-12)
        before, after = updates[mine].sum(0), clipped[mine].sum(0)
        if mine.any() and np.linalg.norm(before) > 0:
            cosine = before @ after / (np.linalg.norm(before) * np.linalg.norm(after))
            assert diagnostics.direction_cosine(k) == pytest.approx(cosine, abs=1e-12)
            ratio = np.linalg.norm(after) / np.linalg.norm(before)
            assert diagnostics.magnitude_ratio(k) == pytest.approx(ratio, rel=1e-12)
            assert -1 - 1e-12 <= diagnostics.direction_cosine(k) <= 1 + 1e-12
        else:
            assert math.isnan(diagnostics.magnitude_ratio(k))
    # the cohorts' clipped sums add up to what the server receives
    np.testing.assert_allclose(diagnostics.clipped_sums.sum(0), total.contribution_sum, atol=1e-10)
    # not asked for: not computed, and the sums sent are the same
    plain = add_in_order(contribute_blocks(policy, params, updates, cohorts, 3, sizes))
    assert plain.diagnostics.unclipped_sums is None and math.isnan(plain.diagnostics.direction_cosine(0))
    np.testing.assert_array_equal(plain.contribution_sum, total.contribution_sum)


@pytest.mark.parametrize("path", ["materialised", "one-step"])
def test_a_calls_cohort_sums_ride_on_its_last_block_and_add_up_over_calls(path):
    """Formed once a call, not once a summation block (each row read once): the call's last
    block carries them, its other blocks none; the calls' parts added in block order give the
    cohort sums of all the rows, as a round adds the groups of several calls."""
    torch.manual_seed(0)
    model = build_model("mlp", (1, 6, 6), 10)
    theta = model_to_vector(model)
    count, num_cohorts = 24, 3
    features = torch.randn(count, 1, 6, 6, generator=torch.Generator().manual_seed(5))
    labels = torch.arange(count) % 10
    cohorts = np.arange(count) % num_cohorts
    policy = build_policy("constant", {"initial_bound": 0.05}, num_cohorts=num_cohorts)
    params = policy.broadcast(policy.initial_state(theta.shape[0]))
    updates = one_step_updates(model, theta, features, labels, lr=0.5)

    def call(rows: slice, sizes: list[int]):
        if path == "materialised":
            return contribute_blocks(
                policy, params, updates[rows], cohorts[rows], num_cohorts, sizes, directions=True
            )
        gradients = one_step_gradients(model, theta, features[rows], labels[rows], lr=0.5)
        return contribute_scaled_blocks(
            policy, params, gradients, cohorts[rows], num_cohorts, sizes, directions=True
        )

    first, second = call(slice(0, 10), [4, 0, 6]), call(slice(10, count), [5, 9])
    parts = [*first, *second]
    carried = [part.diagnostics.unclipped_sums is not None for part in parts]
    assert carried == [False, False, True, False, True]
    assert [part.diagnostics.clipped_sums is not None for part in parts] == carried
    total = add_in_order(parts).diagnostics
    clipped = policy.client_side(updates, cohorts, params).contributions
    tolerance = count * float(np.spacing(np.float32(np.abs(theta).max())))
    for k in range(num_cohorts):
        mine = cohorts == k
        np.testing.assert_allclose(total.unclipped_sums[k], updates[mine].sum(0), atol=tolerance)
        np.testing.assert_allclose(total.clipped_sums[k], clipped[mine].sum(0), atol=tolerance)
    # a run that does not track them carries none anywhere
    plain = contribute_blocks(policy, params, updates, cohorts, num_cohorts, [count])
    assert add_in_order(plain).diagnostics.unclipped_sums is None


def test_a_non_finite_update_is_left_out_of_its_cohorts_sums():
    updates = np.array([[3.0, 4.0], [np.nan, 1.0], [0.3, 0.4]])
    cohorts = np.array([0, 0, 1])
    policy = build_policy("constant", {"initial_bound": 1.0}, num_cohorts=2)
    params = policy.broadcast(policy.initial_state(2))
    (sums,) = contribute_blocks(policy, params, updates, cohorts, 2, [3], directions=True)
    np.testing.assert_allclose(sums.diagnostics.unclipped_sums, [[3.0, 4.0], [0.3, 0.4]])
    np.testing.assert_allclose(sums.diagnostics.clipped_sums, [[0.6, 0.8], [0.3, 0.4]])
    assert sums.diagnostics.direction_cosine(0) == pytest.approx(1.0)
    assert sums.diagnostics.magnitude_ratio(0) == pytest.approx(0.2)


def test_the_one_step_path_gives_the_materialised_cohort_sums():
    torch.manual_seed(0)
    model = build_model("mlp", (1, 6, 6), 10)
    theta = model_to_vector(model)
    count, sizes = 20, [7, 0, 13]
    features = torch.randn(count, 1, 6, 6, generator=torch.Generator().manual_seed(2))
    labels = torch.arange(count) % 10
    cohorts = np.arange(count) % 2
    updates = one_step_updates(model, theta, features, labels, lr=0.5)
    gradients = one_step_gradients(model, theta, features, labels, lr=0.5)
    median = float(np.median(gradients.norms))
    policy = build_policy("bounded", {"initial_bound": median, "lower_bound": median / 2}, num_cohorts=2)
    params = policy.broadcast(policy.initial_state(theta.shape[0]))
    tracked = {"directions": True, "unclipped_total": True}  # (the latter: training.clipping_error)
    want = add_in_order(contribute_blocks(policy, params, updates, cohorts, 2, sizes, **tracked))
    have = add_in_order(contribute_scaled_blocks(policy, params, gradients, cohorts, 2, sizes, **tracked))
    tolerance = count * float(np.spacing(np.float32(np.abs(theta).max())))
    np.testing.assert_allclose(
        have.diagnostics.unclipped_sums, want.diagnostics.unclipped_sums, atol=tolerance
    )
    np.testing.assert_allclose(have.diagnostics.clipped_sums, want.diagnostics.clipped_sums, atol=tolerance)
    np.testing.assert_allclose(have.contribution_sum, want.contribution_sum, atol=tolerance)
    np.testing.assert_allclose(have.diagnostics.unclipped_total, updates.sum(0), atol=tolerance)
    np.testing.assert_allclose(want.diagnostics.unclipped_total, updates.sum(0), atol=1e-12)
    for k in range(2):
        assert have.diagnostics.magnitude_ratio(k) == pytest.approx(
            want.diagnostics.magnitude_ratio(k), rel=1e-4
        )


def test_a_run_records_them_without_changing_anything_else():
    settings_ = {"training.rounds": 6, "policy.name": "adaptive"}
    tracked = fairclip.simulate("demo", overrides={**settings_, "training.cohort_directions": True})
    plain = fairclip.simulate("demo", overrides={**settings_, "training.cohort_directions": False})
    np.testing.assert_array_equal(tracked.model, plain.model)
    columns = ["majority/direction_cosine", "majority/magnitude_ratio", "minority/magnitude_ratio"]
    assert tracked.rounds[columns].notna().all().all()
    assert not any(column.endswith("/direction_cosine") for column in plain.rounds.columns)
    shared = [c for c in plain.rounds.columns]
    pd.testing.assert_frame_equal(tracked.rounds[shared], plain.rounds[shared])
    # adaptive clipping shortens the minority's aggregate (its updates are larger) and keeps its
    # direction: the demo's disparate impact is a magnitude error
    last = tracked.rounds.iloc[-1]
    assert last["minority/magnitude_ratio"] < 0.8 < last["majority/magnitude_ratio"]
    assert last["minority/direction_cosine"] > 0.99


def test_the_compare_report_plots_them_or_says_why_not(tmp_path):
    common = dict(strategies=["constant", "adaptive"], epsilons=[4.0], overrides={"training.rounds": 3})
    fairclip.compare("demo", out=tmp_path / "on", **common)
    assert (tmp_path / "on" / COHORT_DIRECTIONS_ROUNDS).read_bytes()[:4] == b"\x89PNG"
    assert f"![{COHORT_DIRECTIONS_ROUNDS}]" in (tmp_path / "on" / "report.md").read_text()
    off = {**common, "overrides": {"training.rounds": 3, "training.cohort_directions": False}}
    fairclip.compare("demo", out=tmp_path / "off", **off)
    assert not (tmp_path / "off" / COHORT_DIRECTIONS_ROUNDS).exists()
    assert "training.cohort_directions = true" in (tmp_path / "off" / "report.md").read_text()
