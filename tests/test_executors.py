"""The in-process and Ray backends give the same run for one seed, noise included."""

from __future__ import annotations

import functools
import operator

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairclip.scenarios.config import load_config
from fairclip.scenarios.tasks import build_task
from fairclip.server.run import Run
from fairclip.sims.executors.local import LocalExecutor, groups_sums
from fairclip.sims.executors.loop import simulate
from fairclip.strategies.aggregation import (
    SUM_SHARDS,
    CohortDiagnostics,
    RoundSums,
    add_in_order,
    balance,
    group_blocks,
    shard_ids,
)


def test_blocks_partition_the_sampled_clients():
    ids = np.array([0, 3, 124, 125, 499, 500, 998, 999])
    blocks = shard_ids(ids, 1000)
    assert len(blocks) == SUM_SHARDS
    assert np.array_equal(np.concatenate(blocks), ids)
    assert all(((block * SUM_SHARDS) // 1000 == b).all() for b, block in enumerate(blocks))


@pytest.mark.parametrize("policy", ["bounded", "per-cohort", "per-cohort same_round"])
def test_local_and_ray_give_identical_runs(ray_session, policy):
    """Also for a counts-first policy, whose actors keep their clients' work between a round's
    two exchanges."""
    from fairclip.sims.executors.ray import RayExecutor

    name, *flags = policy.split()
    config = load_config(
        "demo",
        None,
        [
            f"policy.name={name}",
            *(f"policy.{flag}=true" for flag in flags),
            "training.rounds=4",
            "privacy.noise_multiplier=0.8",
            "seed=7",
        ],
    )
    assert config.training.cohort_directions  # the demo records them: on both backends
    local = simulate(config, build_task(config), LocalExecutor)
    executor = RayExecutor.start(config, None, num_actors=3)
    try:
        remote = simulate(config, build_task(config), lambda _task, _policy: executor)
    finally:
        executor.stop()
    local_rounds, remote_rounds = pd.DataFrame(local.rows), pd.DataFrame(remote.rows)
    assert (local_rounds["noise_std"] > 0).all()
    assert local_rounds["minority/magnitude_ratio"].notna().all()
    pd.testing.assert_frame_equal(local_rounds, remote_rounds, check_exact=True)
    assert local.summary["cohorts"] == remote.summary["cohorts"]


def test_ray_backend_and_local_workers_through_the_cli(ray_session, cli, tmp_path):
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
    local_rounds = (tmp_path / "local" / "rounds.csv").read_text()
    assert local_rounds == (tmp_path / "ray" / "rounds.csv").read_text()
    status, _, err = cli("run", *common, "--workers", "3", "--out", str(tmp_path / "threads"))
    assert status == 0, err
    assert local_rounds == (tmp_path / "threads" / "rounds.csv").read_text()
    status, _, err = cli("run", *common, "--backend", "ray", "--workers", "2", "--out", str(tmp_path / "bad"))
    assert status == 2 and err.strip().count("\n") == 0 and "--workers" in err


@pytest.mark.parametrize(
    "model_sets",
    [
        ["policy.name=bounded", "privacy.noise_multiplier=0.6", "seed=11"],
        ["scenario.model=eicu-mlp", "policy.name=adaptive", "privacy.noise_multiplier=0.5"],
    ],
    ids=["mlp", "eicu-mlp-dropout"],
)
def test_one_step_clients_give_identical_runs_on_local_threads_and_ray(ray_session, model_sets):
    """Per-sample gradients are computed for several blocks at once, by one thread, by several
    threads or by Ray actors; the run must not depend on it. eicu-mlp also draws dropout masks:
    each call seeds them from the run's seed, the round and its first client, so the fixed groups
    give the same masks everywhere (worker threads take turns: torch's generator is one per
    process, and without the turns a thread could draw from the seed another had just set)."""
    from fairclip.sims.executors.ray import RayExecutor

    one_step = ["scenario.examples_per_client=1", "federation.num_clients=600", "federation.sample_rate=0.3"]
    config = load_config("demo", None, [*one_step, "training.rounds=3", *model_sets])
    task = build_task(config)
    assert task.one_step
    local = simulate(config, task, LocalExecutor)
    executor = RayExecutor.start(config, None, num_actors=3)
    try:
        remote = simulate(config, build_task(config), lambda _task, _policy: executor)
    finally:
        executor.stop()
    threads = simulate(config, build_task(config), lambda task, pol: LocalExecutor(task, pol, workers=3))
    for other in (remote, threads):
        pd.testing.assert_frame_equal(pd.DataFrame(local.rows), pd.DataFrame(other.rows), check_exact=True)
        np.testing.assert_array_equal(local.model, other.model)


def test_worker_threads_give_the_same_run_as_one_thread():
    """Clients with several examples train with their own generators in any thread; the model
    of each worker thread is its own (ClassificationTask.worker)."""
    config = load_config("demo", None, ["federation.num_clients=300", "training.rounds=3", "seed=5"])
    task = build_task(config)
    assert not task.one_step
    one = simulate(config, task, LocalExecutor)
    two = simulate(config, build_task(config), lambda task, policy: LocalExecutor(task, policy, workers=2))
    pd.testing.assert_frame_equal(pd.DataFrame(one.rows), pd.DataFrame(two.rows), check_exact=True)
    np.testing.assert_array_equal(one.model, two.model)
    assert task.worker().model is not task.model and task.worker().train_x is task.train_x


def test_groups_of_blocks_depend_only_on_the_sampled_clients():
    blocks = [np.arange(n) for n in (30, 40, 50, 200, 10, 0, 5, 70)]
    groups = group_blocks(blocks, rows_per_call=128, dimension=10)
    assert [list(g) for g in groups] == [[0, 1, 2], [3], [4, 5, 6, 7]]
    assert [list(g) for g in group_blocks(blocks, rows_per_call=1, dimension=10)] == [[b] for b in range(8)]
    # The memory bound wins over the task's batch: GROUP_BYTES holds 32 rows of 2**20 float64.
    by_memory = group_blocks(blocks, rows_per_call=128, dimension=2**20)
    assert [list(g) for g in by_memory] == [[0], [1], [2], [3], [4, 5, 6], [7]]
    # A call that forms no update rows (dimension 0: clipped from per-example norms) has no
    # memory bound: the task's batch alone decides.
    assert group_blocks(blocks, rows_per_call=128, dimension=0) == groups


def test_blocks_trained_together_or_apart_give_the_same_sums():
    """The one-step task trains all blocks in one call or one by one; the per-block sums of
    ``groups_sums`` are the same (the executors rely on the grouping being fixed, not on this)."""
    config = load_config(
        "demo", None, ["scenario.examples_per_client=1", "federation.num_clients=400", "seed=2"]
    )
    task = build_task(config)
    assert task.rows_per_call > 1
    server = Run(config, task)
    blocks = shard_ids(np.arange(0, 400, 3), 400)
    model, params = server.model, server.broadcast()
    together = groups_sums(task, server.policy, model, [dict(enumerate(blocks))], 1, params)
    apart = groups_sums(task, server.policy, model, [{b: ids} for b, ids in enumerate(blocks)], 1, params)
    assert sorted(together) == sorted(apart) == list(range(SUM_SHARDS))
    for block in together:
        expected = apart[block].contribution_sum
        scale = float(np.max(np.abs(expected)))
        np.testing.assert_allclose(together[block].contribution_sum, expected, rtol=1e-6, atol=1e-6 * scale)
        np.testing.assert_array_equal(together[block].report_sum, apart[block].report_sum)


def test_balance_gives_every_group_once_and_evens_the_load():

    blocks = [np.arange(n) for n in (13, 9, 15, 12, 11, 14, 10, 16)]
    groups = [{b: ids} for b, ids in enumerate(blocks)]
    shares = balance(groups, 2)
    given = sorted(block for share in shares for group in share for block in group)
    assert given == list(range(8))
    loads = [sum(len(ids) for group in share for ids in group.values()) for share in shares]
    assert sum(loads) == 100 and max(loads) - min(loads) <= 2
    # More workers than groups: the extra workers get nothing.
    assert [len(share) for share in balance(groups[:3], 5)].count(0) == 2


@pytest.mark.parametrize("budget_rounds", [None, 3])
def test_final_claim_from_the_background_equals_the_accountant_now(budget_rounds):
    """The server computes ε after its last round in a background thread while the rounds run;
    the summary's claim is the one the accountant gives when asked directly, also when a privacy
    budget ends the run early (then after the last round the budget allows)."""
    from fairclip.strategies.accounting import PrivacyClaim, epsilon

    overrides = ["federation.num_clients=120", "training.rounds=6", "policy.name=bounded"]
    if budget_rounds is not None:
        plan = Run(
            load_config("demo", None, overrides), build_task(load_config("demo", None, overrides))
        ).plan
        overrides.append(f"privacy.epsilon_budget={plan.epsilon_after(budget_rounds) * 1.0001!r}")
    config = load_config("demo", None, overrides)
    result = simulate(config, build_task(config))
    epsilon.cache_clear()
    server = Run(config, build_task(config))
    completed = result.summary["rounds_completed"]
    assert completed == server.rounds_to_run == (budget_rounds or 6)
    plan = server.plan
    expected = PrivacyClaim.of(
        plan.noise,
        releases_reports=plan.releases_reports,
        sample_rate=plan.sample_rate,
        rounds=completed,
        delta=plan.delta,
        accountant=plan.accountant,
    ).as_dict()
    assert result.summary["privacy"] == expected
    assert result.summary["epsilon"] == expected["epsilon"] > 0


def test_background_work_hands_over_its_result_or_its_error():
    from fairclip.server.run import in_background

    assert in_background(pow, 2, 10).result(timeout=10) == 1024
    with pytest.raises(ZeroDivisionError):
        in_background(divmod, 1, 0).result(timeout=10)


def test_observers_see_the_start_every_round_and_the_end_in_order():
    """``on_start`` (where an observer defines it) comes once before the first round, then
    ``on_round`` per round, then ``on_finish``; an observer without ``on_start`` is fine."""
    from fairclip.scenarios.config import load_config
    from fairclip.scenarios.tasks import build_task
    from fairclip.sims.executors.loop import simulate

    class Recorder:
        def __init__(self):
            self.seen = []

        def on_start(self, run):
            self.seen.append(("start", run.rounds_completed))

        def on_round(self, row, run):
            self.seen.append(("round", row["round"]))

        def on_finish(self, run):
            self.seen.append(("finish", run.rounds_completed))

    class WithoutStart:
        def __init__(self):
            self.rounds = 0

        def on_round(self, row, run):
            self.rounds += 1

        def on_finish(self, run):
            pass

    config = load_config("demo", None, ["federation.num_clients=40", "training.rounds=3"])
    recorder, plain = Recorder(), WithoutStart()
    simulate(config, build_task(config), observers=[recorder, plain])
    assert recorder.seen == [("start", 0), ("round", 1), ("round", 2), ("round", 3), ("finish", 3)]
    assert plain.rounds == 3


@settings(max_examples=80, deadline=None)
@given(
    dtypes=st.lists(st.sampled_from(["float64", "float32"]), min_size=1, max_size=9),
    dimension=st.integers(0, 6),
    seed=st.integers(0, 2**32 - 1),
)
def test_block_sums_added_in_place_have_the_bits_of_adding_them_one_by_one(dtypes, dimension, seed):
    """add_in_order keeps one running total of the contribution vectors: the same additions in
    the same order as ``sums[0] + sums[1] + ...`` (float32 blocks promoted where a float64 one
    comes), and no block's own vector changes."""
    generator = np.random.default_rng(seed)
    sums = [
        RoundSums(
            (generator.standard_normal(dimension) * 10.0 ** generator.integers(-8, 8, dimension)).astype(
                dtype
            ),
            generator.standard_normal(3),
            int(generator.integers(0, 5)),
            CohortDiagnostics.zeros(2),
        )
        for dtype in dtypes
    ]
    before = [part.contribution_sum.copy() for part in sums]
    expected = functools.reduce(operator.add, sums)
    total = add_in_order(sums)
    assert total.contribution_sum.dtype == expected.contribution_sum.dtype
    assert total.contribution_sum.tobytes() == expected.contribution_sum.tobytes()
    assert total.report_sum.tobytes() == expected.report_sum.tobytes()
    assert total.num_reports == expected.num_reports
    for part, vector in zip(sums, before, strict=True):
        assert part.contribution_sum.tobytes() == vector.tobytes()
