"""``training.eval_every``: evaluation and the ε column after every k-th round and the last, with
training, noise and the final summary unchanged."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from fairclip.atomic import json_normalised
from fairclip.scenarios.config import load_config
from fairclip.scenarios.errors import ConfigError
from fairclip.scenarios.stored import same_configuration
from fairclip.scenarios.tasks import build_task
from fairclip.server.checkpoint import CHECKPOINT_FILE, Checkpointing, rounds_done
from fairclip.server.privacy_plan import EPSILON_ROWS, PrivacyPlan
from fairclip.server.run import Run
from fairclip.sims.executors.local import LocalExecutor
from fairclip.sims.executors.loop import simulate


def _demo(*overrides: str):
    return load_config(
        "demo",
        None,
        ["policy.name=bounded", "training.rounds=7", "privacy.noise_multiplier=0.8", "seed=3", *overrides],
    )


def _finish_rounds(server: Run, rounds: int) -> None:
    """Run rounds 1..``rounds`` of ``server`` on the local executor, one at a time."""
    execute = LocalExecutor(server.task, server.policy)
    for round_number in range(1, rounds + 1):
        server.finish_round(
            round_number, execute(server.model, server.sample(round_number), round_number, server.broadcast())
        )


def test_sparse_evaluation_changes_no_training_result():
    every_round = simulate(_demo(), build_task(_demo()), LocalExecutor)
    config = _demo("training.eval_every=3")
    sparse = simulate(config, build_task(config), LocalExecutor)
    dense, thin = pd.DataFrame(every_round.rows), pd.DataFrame(sparse.rows)
    for column in ("clip_bound", "noise_std", "sampled_clients", "minority/clipped_fraction"):
        np.testing.assert_array_equal(dense[column], thin[column], err_msg=column)
    evaluated = thin["accuracy"].notna()
    assert thin.loc[evaluated, "round"].tolist() == [3, 6, 7]
    assert thin.loc[thin["epsilon"].notna(), "round"].tolist() == [3, 6, 7]
    for column in ("accuracy", "epsilon", "minority/accuracy", "majority/loss"):
        np.testing.assert_allclose(thin.loc[evaluated, column], dense.loc[evaluated, column], err_msg=column)
    np.testing.assert_array_equal(sparse.model, every_round.model)
    drop = ("config", "provenance")
    assert {k: v for k, v in sparse.summary.items() if k not in drop} == {
        k: v for k, v in every_round.summary.items() if k not in drop
    }


def test_a_run_stopped_between_reports_is_evaluated_at_its_last_round():
    config = _demo("training.eval_every=5")
    task = build_task(config)
    server = Run(config, task)
    _finish_rounds(server, 2)
    assert all(math.isnan(row["epsilon"]) for row in server.result.rows)
    assert server.result.summary["rounds_completed"] == 0
    summary = server.finish().summary
    assert summary["rounds_completed"] == 2
    assert summary["epsilon"] == pytest.approx(server.plan.epsilon_after(2))
    assert summary["overall"]["accuracy"] == task.evaluate(server.model)[0]["accuracy"]


@pytest.mark.parametrize(
    ("rounds", "eval_every", "expected"),
    [
        (50, 1, 1),
        (50, 4, 4),
        (EPSILON_ROWS, 1, 1),
        (EPSILON_ROWS + 1, 1, 2),
        (250, 1, 3),
        (250, 2, 4),
        (1000, 3, 12),
    ],
)
def test_reporting_rounds_are_few_and_a_multiple_of_eval_every(rounds, eval_every, expected):
    every = PrivacyPlan.report_every(rounds, eval_every)
    assert every == expected
    assert every % eval_every == 0
    assert math.ceil(rounds / every) <= EPSILON_ROWS


def test_eval_every_must_be_positive(cli, tmp_path):
    status, _, err = cli(
        "run", "--scenario", "demo", "--set", "training.eval_every=0", "--out", str(tmp_path)
    )
    assert status == 2
    assert "eval_every" in err and "Traceback" not in err


def test_a_run_continues_under_another_evaluation_schedule(tmp_path):
    """A run stopped under one ``eval_every`` continues from its checkpoint under another, and
    its stored configuration is the same run's (``same_configuration``, by which ``--resume``
    also reuses a finished run): the schedule is no part of a run's identity, since the training
    and the summary do not depend on it (above). Another seed still is another run."""
    dense, sparse = _demo(), _demo("training.eval_every=3")
    path = tmp_path / CHECKPOINT_FILE
    server = Run(dense, build_task(dense))
    _finish_rounds(server, 4)
    Checkpointing(path).save(server)
    assert rounds_done(path, sparse) == 4
    with pytest.raises(ConfigError, match="another configuration"):
        rounds_done(path, _demo("seed=4"))
    resumed = simulate(sparse, build_task(sparse), LocalExecutor, checkpoint=Checkpointing(path))
    straight = simulate(dense, build_task(dense), LocalExecutor)
    np.testing.assert_array_equal(resumed.model, straight.model)
    assert pd.DataFrame(resumed.rows)["accuracy"].notna().tolist() == [True] * 4 + [False, True, True]
    drop = ("config", "provenance")
    assert {k: v for k, v in resumed.summary.items() if k not in drop} == {
        k: v for k, v in straight.summary.items() if k not in drop
    }
    stored = json_normalised(dense.as_dict())
    assert same_configuration(stored, sparse)
    assert not same_configuration(stored, _demo("seed=4"))
