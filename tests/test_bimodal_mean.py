"""Seed 000, Figure 1 (left), through the command line: unbounded adaptive clipping lets the
majority's small updates drag the bound down, so the mean estimate stays far below the true
mean 0.4; the lower bound C_LB = 1 keeps it within 0.05 of it (noise off, τ = 1, γ = 0.5)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

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
