"""More Ray actors than the 8 blocks there once were: a run on 10 actors (a local Ray with 12
logical CPUs, started in its own process) gives the numbers of the in-process engine, and the
fixed summation blocks partition the sampled ids exactly as their definition says."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairclip.strategies.aggregation import SUM_SHARDS, shard_ids

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from fairclip.api import simulate_config
    from fairclip.sims.config import load_config
    from fairclip.sims.ray_engine import ensure_ray

    config = load_config("demo", None, ["federation.num_clients=400", "federation.sample_rate=0.3",
                                        "training.rounds=3", "strategy.name=bounded", "seed=3"])
    local = simulate_config(config, backend="local")
    ensure_ray(num_cpus=12)
    remote = simulate_config(config, backend="ray", actors=10)
    json.dump({"local": local.rows, "remote": remote.rows,
               "same_model": bool(np.array_equal(local.model, remote.model)),
               "execution": remote.summary["provenance"]["execution"]}, sys.stdout)
    """
)


@pytest.mark.slow
def test_ten_actors_give_the_in_process_numbers():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["execution"] == {"backend": "ray", "actors": 10, "nodes": 1}
    assert result["same_model"]
    assert result["remote"] == result["local"]  # every value of every round, bit for bit
    assert all(row["sampled_clients"] > 0 for row in result["local"])


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    num_clients=st.integers(1, 10**9),
    shards=st.sampled_from([1, 3, 8, SUM_SHARDS, 1000]),
    draws=st.lists(st.integers(0, 2**62), max_size=300),
)
def test_blocks_are_the_ids_with_the_same_floor_of_i_s_over_n(num_clients, shards, draws):
    ids = np.unique(np.asarray([d % num_clients for d in draws], dtype=np.int64))
    blocks = shard_ids(ids, num_clients, shards)
    assert len(blocks) == shards
    assert np.array_equal(np.concatenate(blocks), ids)
    for block, members in enumerate(blocks):
        assert np.all(members * shards // num_clients == block)


def test_unsorted_ids_are_refused():
    with pytest.raises(ValueError, match="sorted"):
        shard_ids(np.array([5, 3]), 10)
