"""Populations of any size: Poisson sampling without touching every client, cohorts as id
ranges, and synthetic clients whose examples are generated from their id."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from fairclip.scenarios.config import load_config
from fairclip.scenarios.data.generated_clients import CohortRanges, GeneratedClients, generates_clients
from fairclip.scenarios.tasks import build_task
from fairclip.sims.executors.loop import simulate
from fairclip.strategies.randomness import DENSE_SAMPLING_MAX, Stream, poisson_sample, rng


def test_populations_up_to_the_dense_limit_keep_their_seeded_samples():
    """Up to :data:`DENSE_SAMPLING_MAX` clients a round's sample is what it always was: one
    uniform draw per client, u_i < q (so earlier runs reproduce)."""
    for num_clients in (1, 1000, 123457):
        for round_number in (1, 7):
            expected = np.flatnonzero(rng(3, Stream.SAMPLING, round_number).random(num_clients) < 0.05)
            np.testing.assert_array_equal(poisson_sample(3, round_number, num_clients, 0.05), expected)


def test_large_populations_are_poisson_samples():
    """Beyond the dense limit: the sample size is Binomial(N, q) (mean and variance over 300
    rounds), the ids are distinct, sorted, inside the population and uniform over it (χ² over
    20 bins of all ids drawn), and a seed gives the same sample again."""
    num_clients, rate, rounds = 4 * DENSE_SAMPLING_MAX + 17, 3e-5, 300
    samples = [poisson_sample(11, r, num_clients, rate) for r in range(1, rounds + 1)]
    sizes = np.array([len(s) for s in samples])
    mean, variance = num_clients * rate, num_clients * rate * (1 - rate)
    assert abs(sizes.mean() - mean) < 4 * np.sqrt(variance / rounds)
    assert stats.chi2(rounds - 1).ppf(1e-4) < sizes.var(ddof=1) * (rounds - 1) / variance
    assert sizes.var(ddof=1) * (rounds - 1) / variance < stats.chi2(rounds - 1).ppf(1 - 1e-4)
    for sample in samples:
        assert np.all(np.diff(sample) > 0) and sample[0] >= 0 and sample[-1] < num_clients
    counts = np.histogram(np.concatenate(samples), bins=20, range=(0, num_clients))[0]
    assert stats.chisquare(counts).pvalue > 1e-4
    np.testing.assert_array_equal(poisson_sample(11, 5, num_clients, rate), samples[4])
    assert not np.array_equal(samples[3], samples[4])


def test_cohort_ranges_index_like_the_array_they_replace():
    sizes = [3, 0, 5, 2]
    ranges = CohortRanges(np.cumsum(sizes))
    labels = np.repeat(np.arange(4), sizes)
    ids = np.array([0, 2, 3, 7, 8, 9, 4])
    np.testing.assert_array_equal(ranges[ids], labels[ids])
    assert int(ranges[8]) == 3 and len(ranges) == 10 and ranges.shape == (10,)
    assert list(ranges.members(2)) == [3, 4, 5, 6, 7] and list(ranges.members(1)) == []
    with pytest.raises(IndexError):
        ranges[np.array([10])]


def _demo(num_clients: int, *extra: str):
    return load_config("demo", None, [f"federation.num_clients={num_clients}", *extra])


def test_generated_clients_draw_the_same_examples_however_they_are_asked():
    """Client i's examples come from its own generator: the same alone or in any batch, and
    from its cohort's distribution (the label is the sign along the cohort's signal feature)."""
    config = _demo(10**9)
    spec = config.scenario
    assert generates_clients(spec, 10**9) and not generates_clients(spec, 1000)
    clients = GeneratedClients(spec, 10**9, seed=4)
    alone_x, alone_y = clients.examples(np.array([700_000_000]))
    batch_x, batch_y = clients.examples(np.array([5, 700_000_000, 999_999_999]))
    per_client = spec.examples_per_client
    np.testing.assert_array_equal(batch_x[per_client : 2 * per_client], alone_x)
    np.testing.assert_array_equal(batch_y[per_client : 2 * per_client], alone_y)
    assert not np.array_equal(batch_x[:per_client], alone_x)
    for cohort, distribution in enumerate(clients.distributions):
        members = clients.client_cohorts.members(cohort)
        x, y = clients.examples(np.arange(members.start, members.start + 200))
        signal = x[:, distribution.signal_feature] - distribution.offset
        agreement = np.mean(np.sign(signal) == 2 * y - 1)
        assert agreement > 0.6, (cohort, agreement)


def test_a_run_over_ten_billion_clients_costs_what_its_sampled_clients_cost():
    """10¹⁰ clients (80 GB as one int64 label each, so nothing of that size may exist): the run
    samples about 40 clients a round, generates their examples, trains and evaluates."""
    config = _demo(10**10, "federation.sample_rate=4e-9", "training.rounds=2", "privacy.noise_multiplier=0.5")
    task = build_task(config)
    assert isinstance(task.client_cohorts, CohortRanges) and len(task.client_cohorts) == 10**10
    result = simulate(config, task)
    assert [row["round"] for row in result.rows] == [1, 2]
    assert all(20 <= row["sampled_clients"] <= 70 for row in result.rows)
    assert np.isfinite(result.model).all() and np.abs(result.model - task.initial_model()).max() > 0


def _bimodal(num_clients: int, *extra: str):
    return load_config("bimodal-mean", None, [f"federation.num_clients={num_clients}", *extra])


def test_held_points_are_the_seeded_draw_they_always_were():
    """A population small enough to hold draws z with one generator, as before (so earlier runs
    reproduce bit for bit): x_i = c_k + spread_k · z_i, cohorts in contiguous id ranges."""
    config = _bimodal(1001)
    task = build_task(config)
    assert not task.draws_points and isinstance(task.client_cohorts, CohortRanges)
    z = rng(config.seed, Stream.DATA).standard_normal((1001, 1))
    cohorts = task.client_cohorts[np.arange(1001)]
    expected = task.centres[cohorts] + task.spreads[cohorts][:, None] * z
    np.testing.assert_array_equal(task.client_points(np.arange(1001)), expected)
    assert np.bincount(cohorts).tolist() == [601, 400]


def test_drawn_points_are_the_same_however_they_are_asked_and_follow_their_cohort():
    config = _bimodal(10**9, "scenario.dimension=2")
    task = build_task(config)
    assert task.draws_points and len(task.client_cohorts) == 10**9
    alone = task.client_points(np.array([700_000_000]))
    batch = task.client_points(np.array([3, 700_000_000, 999_999_999]))
    np.testing.assert_array_equal(batch[1:2], alone)
    for cohort in range(2):
        members = task.client_cohorts.members(cohort)
        points = task.client_points(np.arange(members.start, members.start + 2000))
        spread = task.spreads[cohort]
        # the mean of 2,000 draws lies within 5 standard errors of the centre; the spread is kept
        assert np.abs(points.mean(0) - task.centres[cohort]).max() < 5 * spread / np.sqrt(2000)
        assert points.std(0, ddof=1) == pytest.approx([spread, spread], rel=0.1)


def test_a_billion_point_mean_estimation_runs_from_the_command_line(cli, tmp_path):
    """Issue 20, W3: bimodal-mean over 10⁹ clients (8 GB of points if held) runs, its losses the
    expectations over each cohort's distribution."""
    import json

    out = tmp_path / "billion"
    status, _, err = cli(
        "run",
        "--scenario",
        "bimodal-mean",
        "--set",
        "federation.num_clients=1000000000",
        "--set",
        "federation.sample_rate=0.000002",
        "--set",
        "training.rounds=3",
        "--set",
        "policy.name=bounded",
        "--out",
        str(out),
    )
    assert status == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds_completed"] == 3 and summary["points"] == "drawn per sampled client"
    estimate = summary["estimate"][0]
    assert 0 < estimate < 1
    near_one = summary["cohorts"]["near_one"]
    assert near_one["distance"] == pytest.approx(1 - estimate)
    assert near_one["loss"] == pytest.approx(0.5 * ((1 - estimate) ** 2 + 0.01**2))
    assert summary["population_mean"] == [pytest.approx(0.4)]


def test_a_billion_client_classification_run_is_not_refused_by_the_memory_check(cli, tmp_path):
    """The memory check counts a generated population's sampled clients, not all of them (it
    used to refuse 10⁹ demo clients as 4,700 GB while the executor needed 0.4 GB)."""
    out = tmp_path / "demo"
    status, _, err = cli(
        "run",
        "--scenario",
        "demo",
        "--set",
        "federation.num_clients=1000000000",
        "--set",
        "federation.sample_rate=0.0000001",
        "--set",
        "training.rounds=1",
        "--out",
        str(out),
    )
    assert status == 0, err
    assert (out / "summary.json").is_file()
