"""Populations of any size: Poisson sampling without touching every client, cohorts as id
ranges, and synthetic clients whose examples are generated from their id."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from fairclip.sims.config import load_config
from fairclip.sims.engine import simulate
from fairclip.sims.generated_clients import CohortRanges, GeneratedClients, generates_clients
from fairclip.sims.tasks import build_task
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
