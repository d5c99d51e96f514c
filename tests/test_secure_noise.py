"""Secure noise: OpenDP's exact Gaussian sampler (Mironov 2012) in place of numpy's draws.

OpenDP's sampler cannot be seeded, so these statistical tests draw fresh noise each run; their
thresholds sit 6 standard errors out (a false alarm about once in 10⁸ runs).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from fairclip.server.secure_noise import GRID_BITS, ExactGaussian
from fairclip.strategies import NoiseMultipliers, build_policy

SAMPLER = ExactGaussian()


@pytest.mark.parametrize(("multiplier", "sensitivity"), [(1.3, 0.7), (0.5, 1e-4), (12.0, 3e3)])
def test_exact_noise_has_the_calibrated_variance_and_is_gaussian(multiplier, sensitivity):
    n = 20_000
    values = np.full(n, 0.3)
    noisy, std = SAMPLER.add_noise(values, multiplier, sensitivity)
    target = multiplier * sensitivity
    assert target <= std <= target * (1 + math.sqrt(n) * 2.0**-GRID_BITS)
    noise = noisy - values
    variance = noise.var(ddof=1)
    assert abs(variance / std**2 - 1) < 6 * math.sqrt(2 / (n - 1)), variance / std**2
    assert abs(noise.mean()) < 6 * std / math.sqrt(n)
    assert stats.kstest(noise / std, "norm").pvalue > 1e-6
    # every output lies on the grid 2^k: no bit below it depends on the input
    k = math.floor(math.log2(min(sensitivity, target))) - GRID_BITS
    assert np.all(np.mod(noisy / 2.0**k, 1.0) == 0.0)


def test_opendp_privacy_map_matches_the_continuous_gaussian_it_replaces():
    import opendp.prelude as dp

    dp.enable_features("contrib")
    for multiplier, sensitivity, n in ((1.0, 1.0, 1), (0.7, 2.5, 10_000), (30.0, 1e-6, 1_000_000)):
        k = math.floor(math.log2(min(sensitivity, multiplier * sensitivity))) - GRID_BITS
        scale = multiplier * (sensitivity + math.sqrt(n) * 2.0**k)
        space = dp.vector_domain(dp.atom_domain(T=float, nan=False), size=n), dp.l2_distance(T=float)
        rho = dp.m.make_gaussian(*space, scale=scale, k=k).map(sensitivity)
        assert rho <= (1 + 1e-9) / (2 * multiplier**2)
        assert rho >= (1 - 1e-6) / (2 * multiplier**2), "the widening should cost next to nothing"


def test_zero_noise_and_bad_inputs():
    values = np.array([1.0, 2.0])
    same, std = SAMPLER.add_noise(values, 0.0, 1.0)
    assert std == 0.0 and np.array_equal(same, values)
    with pytest.raises(ValueError, match="non-finite"):
        SAMPLER.add_noise(np.array([np.nan]), 1.0, 1.0)
    with pytest.raises(ValueError, match="sensitivity"):
        SAMPLER.add_noise(values, 1.0, math.inf)


def test_a_policy_noises_with_the_exact_sampler():
    policy = build_policy("bounded", {"lower_bound": 0.1, "initial_bound": 0.5})
    state = policy.initial_state(5000)
    result = policy.server_side(
        state,
        np.zeros(5000),
        np.array([3.0]),
        expected_clients=10.0,
        num_reports=3,
        noise=NoiseMultipliers(update=1.1, report=11.0),
        rng=SAMPLER,
    )
    assert 1.1 * 0.5 <= result.noise_std <= 1.1 * 0.5 * (1 + 1e-9)
    noise = result.estimate * 10.0
    assert abs(noise.std() / result.noise_std - 1) < 6 * math.sqrt(2 / 5000)
    assert result.noisy_reports.shape == (1,) and result.noisy_reports[0] != 3.0


def test_fairclip_run_with_secure_noise(cli, tmp_path):
    out = tmp_path / "run"
    args = ["--set", "training.rounds=2", "--set", "privacy.noise_multiplier=1.0", "--out", str(out)]
    status, _, err = cli("run", "--scenario", "bimodal-mean", "--set", "privacy.secure_noise=true", *args)
    assert status == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert "OpenDP" in summary["noise_source"] and summary["config"]["privacy"]["secure_noise"] is True
    status, _, err = cli("run", "--scenario", "bimodal-mean", *args)
    assert status == 0, err
    assert "seed 0" in json.loads((out / "summary.json").read_text())["noise_source"], "simulations: numpy"
    status, _, err = cli("run", "--scenario", "bimodal-mean", "--set", "privacy.secure_noise=yes", *args)
    assert status == 2 and "privacy.secure_noise" in err
