"""More Ray actors than the 8 blocks there once were: a run on 10 actors (a local Ray with 12
logical CPUs, started in its own process) gives the numbers of the in-process executor, and the
fixed summation blocks partition the sampled ids exactly as their definition says."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fairclip.strategies.aggregation import SUM_SHARDS, shard_ids

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from fairclip.api import simulate_config
    from fairclip.scenarios.config import load_config
    from fairclip.sims.executors.ray import ensure_ray

    config = load_config("demo", None, ["federation.num_clients=400", "federation.sample_rate=0.3",
                                        "training.rounds=3", "policy.name=bounded", "seed=3"])
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
    assert result["execution"] == {
        "executor": "ray",
        "backend": "ray",  # the old name, kept for readers of earlier summaries
        "actors": 10,
        "nodes": 1,
        "device": "cuda" if torch.cuda.is_available() else "cpu",  # training.device auto
    }
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


@settings(max_examples=100, deadline=None, derandomize=True)
@given(
    num_clients=st.integers(1, 5000),
    rate=st.floats(0.001, 1.0),
    actors=st.integers(1, SUM_SHARDS),
    seed=st.integers(0, 2**32 - 1),
)
def test_each_group_of_one_by_one_clients_belongs_to_one_actor(num_clients, rate, actors, seed):
    """Where clients train one after the other, every group's sampled clients are owned by one
    actor (the one that holds their data), and every sampled client is trained exactly once."""
    from fairclip.sims.executors.ray import held_clients, owned_shares
    from fairclip.strategies.aggregation import group_blocks

    ids = np.flatnonzero(np.random.default_rng(seed).random(num_clients) < rate)
    groups = group_blocks(shard_ids(ids, num_clients), rows_per_call=1, dimension=10)
    shares = owned_shares(groups, actors)
    held = [held_clients(num_clients, actors, actor) for actor in range(actors)]
    assert np.all(np.sum(held, axis=0) == min(actors, 2))  # every client on two actors (one if A = 1)
    trained = []
    for actor, share in enumerate(shares):
        for group in share:
            for block_ids in group.values():
                assert np.all(held[actor][block_ids])
                trained.extend(block_ids.tolist())
    assert sorted(trained) == ids.tolist()
    loads = [sum(len(ids) for group in share for ids in group.values()) for share in shares]
    biggest = max((sum(len(ids) for ids in group.values()) for group in groups), default=0)
    if actors == 2:  # both actors hold every client: as even as any split of these groups
        assert max(loads) - min(loads) <= biggest
    assert sorted(b for share in shares for g in share for b in g) == list(range(SUM_SHARDS))


def test_a_task_keeps_only_its_clients_and_trains_them_as_before():
    from fairclip.scenarios.config import load_config
    from fairclip.scenarios.tasks import build_task
    from fairclip.sims.executors.ray import held_clients

    config = load_config("demo", None, ["federation.num_clients=90"])
    full, part = build_task(config), build_task(config)
    owned = held_clients(90, 4, 1)
    part.keep_clients(owned)
    model = full.initial_model()
    mine = np.flatnonzero(owned)
    np.testing.assert_array_equal(part.local_updates(model, mine, 2), full.local_updates(model, mine, 2))
    rows = sum(len(full.client_indices[c]) for c in mine)
    assert part.train_x.shape[0] == rows < full.train_x.shape[0]
    other = int(np.flatnonzero(~owned)[0])
    with pytest.raises(KeyError, match=f"client {other} is not held"):
        part.local_updates(model, np.array([other]), 2)


@pytest.mark.parametrize("name", sorted(__import__("fairclip.strategies", fromlist=["POLICIES"]).POLICIES))
@settings(max_examples=25, deadline=None, derandomize=True)
@given(sizes=st.lists(st.integers(0, 5), min_size=1, max_size=6), seed=st.integers(0, 2**32 - 1))
def test_blocks_contributed_together_equal_blocks_contributed_one_by_one(name, sizes, seed):
    """The executors clip a group's rows in one call and sum each block on its own rows: bit for
    bit what one call per block gives (a policy's client side acts on each row alone)."""
    from fairclip.client.contributions import contribute, contribute_blocks
    from fairclip.strategies import build_policy

    generator = np.random.default_rng(seed)
    policy = build_policy(name, {"lower_bound": 0.1} if name == "bounded" else {}, num_cohorts=3)
    state = policy.initial_state(4)
    params = policy.broadcast(state)
    updates = generator.normal(size=(sum(sizes), 4)) * generator.choice(
        [0.01, 1.0, 100.0], size=(sum(sizes), 1)
    )
    cohorts = generator.integers(0, 3, size=sum(sizes))
    together = contribute_blocks(policy, params, updates, cohorts, 3, sizes)
    start = 0
    for size, block in zip(sizes, together, strict=True):
        alone = contribute(policy, params, updates[start : start + size], cohorts[start : start + size], 3)
        start += size
        np.testing.assert_array_equal(block.contribution_sum, alone.contribution_sum)
        np.testing.assert_array_equal(block.report_sum, alone.report_sum)
        assert block.num_reports == alone.num_reports == size
        for field in ("sampled", "exceeded", "nonfinite", "norm_before", "norm_after"):
            np.testing.assert_array_equal(
                getattr(block.diagnostics, field), getattr(alone.diagnostics, field)
            )
        for mine, theirs in zip(block.diagnostics.norms, alone.diagnostics.norms, strict=True):
            np.testing.assert_array_equal(mine, theirs)


@settings(max_examples=60, deadline=None)
@given(
    size=st.integers(1, 300),
    zero_contribution=st.booleans(),
    specials=st.lists(st.sampled_from([0.0, -0.0, float("nan"), float("inf"), 1e-300]), max_size=4),
    zero_report=st.booleans(),
)
def test_block_sums_travel_with_their_zero_vectors_as_shapes(size, zero_contribution, specials, zero_report):
    """A worker's block sums pickle (as Ray sends them) with an all-(+0.0) vector as its shape
    alone and unpickle bit for bit: a -0.0, NaN or any other entry keeps the whole array."""
    import pickle

    from fairclip.strategies.aggregation import CohortDiagnostics, RoundSums

    rng = np.random.default_rng(size)
    contribution = np.zeros(size) if zero_contribution else rng.normal(size=size)
    contribution[: len(specials)] = specials[:size]
    report = np.zeros(3, dtype=np.float32) if zero_report else rng.normal(size=3).astype(np.float32)
    sums = RoundSums(contribution, report, 4, CohortDiagnostics.zeros(2))
    back = pickle.loads(pickle.dumps(sums))
    for sent, received in ((contribution, back.contribution_sum), (report, back.report_sum)):
        assert received.dtype == sent.dtype and received.shape == sent.shape
        assert received.tobytes() == sent.tobytes()  # bit for bit, the sign of a zero included
    assert back.num_reports == 4 and np.array_equal(back.diagnostics.sampled, sums.diagnostics.sampled)
    # an empty block's 0.84 MB vector (W1's model) travels as a few bytes
    empty = RoundSums(np.zeros(105_000), np.zeros(3), 0, CohortDiagnostics.zeros(2))
    assert len(pickle.dumps(empty)) < 2_000
    empty.contribution_sum[7] = -0.0
    assert len(pickle.dumps(empty)) > 105_000 * 8
