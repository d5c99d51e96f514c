"""The in-process and Ray backends give the same run for one seed, noise included."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fairclip.client.contributions import SUM_SHARDS, shard_ids
from fairclip.sims.config import load_config
from fairclip.sims.engine import LocalExecutor, build_task, simulate


@pytest.fixture(scope="module")
def ray_session():
    import ray

    from fairclip.sims.ray_engine import ensure_ray

    ensure_ray(num_cpus=2)
    yield ray
    ray.shutdown()


def test_blocks_partition_the_sampled_clients():
    ids = np.array([0, 3, 124, 125, 499, 500, 998, 999])
    blocks = shard_ids(ids, 1000)
    assert len(blocks) == SUM_SHARDS
    assert np.array_equal(np.concatenate(blocks), ids)
    assert all(((block * SUM_SHARDS) // 1000 == b).all() for b, block in enumerate(blocks))


@pytest.mark.parametrize("strategy", ["bounded", "per-cohort"])
def test_local_and_ray_give_identical_runs(ray_session, strategy):
    from fairclip.sims.ray_engine import RayExecutor

    config = load_config(
        "demo",
        None,
        [f"strategy.name={strategy}", "training.rounds=4", "privacy.noise_multiplier=0.8", "seed=7"],
    )
    local = simulate(config, build_task(config), LocalExecutor)
    executor = RayExecutor.start(config, None, num_actors=3)
    try:
        remote = simulate(config, build_task(config), lambda _task, _policy: executor)
    finally:
        executor.stop()
    local_rounds, remote_rounds = pd.DataFrame(local.rows), pd.DataFrame(remote.rows)
    assert (local_rounds["noise_std"] > 0).all()
    pd.testing.assert_frame_equal(local_rounds, remote_rounds, check_exact=True)
    assert local.summary["cohorts"] == remote.summary["cohorts"]


def test_ray_backend_through_the_cli(ray_session, cli, tmp_path):
    common = [
        "--scenario",
        "bimodal-mean",
        "--set",
        "training.rounds=5",
        "--set",
        "privacy.noise_multiplier=0.3",
    ]
    assert cli("run", *common, "--out", str(tmp_path / "local"))[0] == 0
    status, _, err = cli("run", *common, "--backend", "ray", "--actors", "2", "--out", str(tmp_path / "ray"))
    assert status == 0, err
    assert (tmp_path / "local" / "rounds.csv").read_text() == (tmp_path / "ray" / "rounds.csv").read_text()
