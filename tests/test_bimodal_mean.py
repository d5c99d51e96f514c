"""Seed 000, Figure 1 (left), through the command line: unbounded adaptive clipping lets the
majority's small updates drag the bound down, so the mean estimate stays far below the true
mean 0.4; the lower bound C_LB = 1 keeps it within 0.05 of it (noise off, τ = 1, γ = 0.5)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

TRUE_MEAN = 0.4


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from fairclip.cli import main

    out = tmp_path_factory.mktemp("bimodal")
    summaries = {}
    for strategy in ("adaptive", "bounded"):
        main(
            [
                "run",
                "--scenario",
                "bimodal-mean",
                "--set",
                f"policy.name={strategy}",
                "--out",
                str(out / strategy),
            ]
        )
        summaries[strategy] = json.loads((out / strategy / "summary.json").read_text())
    return out, summaries


def test_configuration_is_the_papers(runs):
    _, summaries = runs
    for summary in summaries.values():
        strategy = summary["config"]["policy"]
        assert strategy["threshold_multiplier"] == 1.0
        assert strategy["target_quantile"] == 0.5
        assert summary["config"]["privacy"]["noise_multiplier"] == 0.0
        assert summary["epsilon"] == "inf"
    assert summaries["bounded"]["config"]["policy"]["lower_bound"] == 1.0


def test_adaptive_ends_far_below_the_true_mean(runs):
    _, summaries = runs
    estimate = summaries["adaptive"]["estimate"][0]
    assert estimate < TRUE_MEAN / 4
    assert summaries["adaptive"]["final_clip_bound"] < 0.2


def test_bounded_ends_near_the_true_mean(runs):
    _, summaries = runs
    assert abs(summaries["bounded"]["estimate"][0] - TRUE_MEAN) < 0.05
    assert summaries["bounded"]["final_clip_bound"] >= 1.0


def test_summary_reports_distance_to_each_cohort_centre(runs):
    _, summaries = runs
    summary = summaries["bounded"]
    estimate = summary["estimate"][0]
    assert summary["cohorts"]["near_zero"]["distance"] == pytest.approx(abs(estimate - 0.0))
    assert summary["cohorts"]["near_one"]["distance"] == pytest.approx(abs(estimate - 1.0))


def test_rounds_csv_has_one_row_per_round_and_the_required_columns(runs):
    out, _ = runs
    rounds = pd.read_csv(out / "adaptive" / "rounds.csv")
    assert list(rounds["round"]) == list(range(1, 201))
    for column in (
        "clip_bound",
        "noise_std",
        "clipped_fraction",
        "epsilon",
        "near_one/clipped_fraction",
    ):
        assert column in rounds.columns
    # The bound only shrinks below the majority's distance once it clips the minority.
    assert rounds["clip_bound"].iloc[-1] < rounds["clip_bound"].iloc[0]
    assert (rounds["noise_std"] == 0).all()
    assert not list(out.glob("**/*.tmp"))


def _task(*overrides: str):
    from fairclip.scenarios.config import load_config
    from fairclip.scenarios.tasks import build_task

    config = load_config("bimodal-mean", None, list(overrides))
    return build_task(config)


@settings(max_examples=60, deadline=None)
@given(
    client=st.integers(0, 9),
    point=st.floats(-1e3, 1e3, allow_nan=False),
    estimate=st.floats(-10, 10, allow_nan=False),
)
def test_a_neighbouring_population_gets_the_same_published_evaluation(client, point, estimate):
    """DP covers the released estimate and nothing else: what a run publishes beside it must be
    post-processing. Replace one client's point and every metric and summary entry of the same
    estimate stays as it was (they used to be the clients' exact loss and mean)."""
    task, neighbour = _task("federation.num_clients=10"), _task("federation.num_clients=10")
    assert not task.draws_points
    neighbour.points[client] = point
    model = np.array([estimate])
    assert task.evaluate(model) == neighbour.evaluate(model)
    assert task.summary(model) == neighbour.summary(model)


def test_a_three_client_run_publishes_only_functions_of_its_estimate():
    """End to end, with one client in the minority cohort (where its cohort's exact loss would be
    its own point's distance to the estimate): every published mean-estimation column follows
    from the released estimate and the scenario's settings (centres 0 and 1, spreads 0.01)."""
    from fairclip.api import simulate_config
    from fairclip.scenarios.config import load_config

    overrides = [
        "federation.num_clients=3",
        "federation.sample_rate=1.0",
        "training.rounds=3",
        "privacy.noise_multiplier=1.0",
        "policy.name=bounded",
    ]
    result = simulate_config(load_config("bimodal-mean", None, overrides))
    published = {"estimate", "loss", "distance_to_mean", "near_zero/loss", "near_one/loss"}
    assert published | {"near_one/distance"} <= result.public_columns
    mean = (2 * 0.0 + 1 * 1.0) / 3  # cohort sizes 2 and 1 of three clients (shares 0.6, 0.4)
    for row in result.rows:
        mu = row["estimate"]
        near_zero, near_one = 0.5 * (mu**2 + 0.01**2), 0.5 * ((mu - 1) ** 2 + 0.01**2)
        assert row["near_zero/loss"] == pytest.approx(near_zero, rel=1e-12)
        assert row["near_one/loss"] == pytest.approx(near_one, rel=1e-12)
        assert row["near_one/distance"] == pytest.approx(abs(mu - 1), rel=1e-12)
        assert row["loss"] == pytest.approx((2 * near_zero + near_one) / 3, rel=1e-12)
        assert row["distance_to_mean"] == pytest.approx(abs(mu - mean), rel=1e-12)
    assert result.summary["population_mean"] == [pytest.approx(mean)]
