"""The Flower path: `flwr run .` against the local backend, reply checks, run-config mapping."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from hypothesis import given, settings
from hypothesis import strategies as st

from fairclip.client.contributions import contribute
from fairclip.client.protocol import (
    CONTRIBUTION,
    DIAGNOSTICS,
    REPORTS,
    UPDATE,
    reply_content,
    train_content,
)
from fairclip.server.replies import ReplyError, check_reply
from fairclip.server.strategy import PolicyStrategy
from fairclip.sims.config import ConfigError, load_config
from fairclip.sims.engine import RunServer, build_task
from fairclip.sims.flower_config import flower_run
from fairclip.sims.flower_local import kill_sessions_mentioning, local_simulation_env, write_local_simulation
from fairclip.strategies import build_policy

PROJECT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


@pytest.fixture
def flower_home(tmp_path):
    """A throw-away FLWR_HOME with a `local-simulation` connection, and the env to use it.

    `flwr run` starts a detached local SuperLink (its own session); on teardown every process of
    that session is killed, so nothing outlives the test.
    """
    home = tmp_path / "flwr-home"
    home.mkdir()
    env = local_simulation_env(home, BIN)
    yield home, env
    kill_sessions_mentioning(str(home))


def _flwr_run(
    home: Path, env: dict[str, str], num_nodes: int, run_config: str
) -> subprocess.CompletedProcess:
    write_local_simulation(home, num_nodes)
    command = [
        str(BIN / "flwr"),
        "run",
        str(PROJECT),
        "local-simulation",
        "--stream",
        "--run-config",
        run_config,
    ]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=400)


SETTINGS = {
    "scenario": "demo",
    "seed": 5,
    "federation.num_clients": 8,
    "federation.sample_rate": 0.5,
    "training.rounds": 3,
    "strategy.name": "bounded",
    "privacy.noise_multiplier": 0.8,
}


@pytest.mark.slow
def test_flwr_run_matches_local_backend(flower_home, tmp_path, cli):
    """Same seed: the same bound trajectory, the same noise and the same final model."""
    home, env = flower_home
    flower_out = tmp_path / "flower"
    run_config = " ".join(
        f"{key}={json.dumps(value)}" for key, value in {**SETTINGS, "out": str(flower_out)}.items()
    )
    started = time.perf_counter()
    completed = _flwr_run(home, env, SETTINGS["federation.num_clients"], run_config)
    wall = time.perf_counter() - started
    log = completed.stdout + completed.stderr
    assert completed.returncode == 0, log[-3000:]
    assert (flower_out / "summary.json").exists(), log[-3000:]
    rounds, nodes = SETTINGS["training.rounds"], SETTINGS["federation.num_clients"]
    sys.__stdout__.write(f"\nflwr run . ({rounds} rounds, {nodes} nodes): {wall:.1f} s\n")

    local_out = tmp_path / "local"
    sets = [
        arg for key, value in SETTINGS.items() if key != "scenario" for arg in ("--set", f"{key}={value}")
    ]
    status, _, err = cli("run", "--scenario", "demo", *sets, "--backend", "local", "--out", str(local_out))
    assert status == 0, err

    flower_rounds = pd.read_csv(flower_out / "rounds.csv")
    local_rounds = pd.read_csv(local_out / "rounds.csv")
    assert len(flower_rounds) == len(local_rounds) == SETTINGS["training.rounds"]
    assert (flower_rounds["sampled_clients"] == local_rounds["sampled_clients"]).all()
    assert (flower_rounds["dropped_replies"] == 0).all()
    for column in ("clip_bound", "noise_std", "sensitivity", "epsilon", "accuracy", "loss"):
        np.testing.assert_allclose(flower_rounds[column], local_rounds[column], rtol=1e-9, err_msg=column)
    assert (flower_rounds["noise_std"] > 0).all()
    assert flower_rounds["clip_bound"].nunique() > 1, "the bound should move under `bounded`"
    np.testing.assert_allclose(
        np.load(flower_out / "model.npy"), np.load(local_out / "model.npy"), atol=1e-12
    )
    summary = json.loads((flower_out / "summary.json").read_text())
    assert summary["rounds_completed"] == SETTINGS["training.rounds"]
    assert np.isfinite(summary["epsilon"]) and summary["epsilon"] > 0
    assert "follow seed=5" in log


@pytest.mark.slow
def test_flwr_run_bad_configuration_fails_with_one_line(flower_home, tmp_path):
    home, env = flower_home
    completed = _flwr_run(
        home, env, 2, f"federation.num_clients=3 training.rounds=1 node-wait=3.0 out='{tmp_path}'"
    )
    log = completed.stdout + completed.stderr
    assert "fairclip: error: 2 nodes connected, but federation.num_clients=3" in log, log[-3000:]


# ----- run configuration ----------------------------------------------------------------------


def test_run_config_resolves_like_set():
    run = flower_run(
        {
            "scenario": "demo",
            "set": "training.client_lr=0.2; seed=9",
            "strategy.name": "adaptive",
            "training.rounds": 4,
            "privacy.delta": "",
            "out": "x",
        }
    )
    expected = load_config(
        "demo", None, ["training.client_lr=0.2", "seed=9", "strategy.name=adaptive", "training.rounds=4"]
    )
    assert run.config == expected
    assert not run.seeded and run.out == Path("x")
    assert flower_run({"scenario": "demo", "seed": 3}).seeded


def test_run_config_errors_are_config_errors():
    with pytest.raises(ConfigError, match="unknown strategy"):
        flower_run({"scenario": "demo", "strategy.name": "nonsense"})
    with pytest.raises(ConfigError, match="neither"):
        flower_run({"scenario": ""})


# ----- replies ----------------------------------------------------------------------------


def _reply(contribution, reports, diagnostics=None) -> RecordDict:
    content = RecordDict({UPDATE: ArrayRecord({CONTRIBUTION: Array(contribution), REPORTS: Array(reports)})})
    if diagnostics is not None:
        content[DIAGNOSTICS] = diagnostics
    return content


def test_check_reply_rejects_every_malformed_reply():
    good = np.array([0.6, 0.8])
    check = {"dim": 2, "report_size": 1, "bound": 1.0, "cohort": 0, "num_cohorts": 2}
    assert check_reply(_reply(good, np.array([1.0])), **check).num_reports == 1
    bad = {
        "over the bound": _reply(good * 1.01, np.array([0.0])),
        "wrong shape": _reply(np.zeros(3), np.array([0.0])),
        "wrong dtype": _reply(good.astype(np.float32), np.array([0.0])),
        "nan": _reply(np.array([np.nan, 0.0]), np.array([0.0])),
        "inf report": _reply(good, np.array([np.inf])),
        "report norm": _reply(good, np.array([1.5])),
        "missing reports": RecordDict({UPDATE: ArrayRecord({CONTRIBUTION: Array(good)})}),
        "missing update": RecordDict(),
        "bad diagnostics": _reply(good, np.array([0.0]), MetricRecord({"sampled": [1.0]})),
    }
    for label, content in bad.items():
        with pytest.raises(ReplyError):
            check_reply(content, **check)
            pytest.fail(label)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=3, max_size=3),
    st.floats(1e-3, 1e3),
)
def test_accepted_replies_never_exceed_their_bound(values, bound):
    contribution = np.array(values, dtype=np.float64)
    try:
        sums = check_reply(
            _reply(contribution, np.zeros(0)), dim=3, report_size=0, bound=bound, cohort=0, num_cohorts=1
        )
    except ReplyError:
        return
    assert np.linalg.norm(sums.contribution_sum) <= bound * (1 + 1e-9)


@pytest.fixture
def server_task_identity(monkeypatch):
    """Outside a Flower runtime, messages need the identity a ServerApp process would have."""
    from flwr.supercore.task_identity import TaskIdentity

    for attribute, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, attribute, value)


def test_strategy_drops_and_counts_bad_replies_and_sums_the_rest(server_task_identity):
    config = load_config(
        "demo",
        None,
        [
            "federation.num_clients=6",
            "federation.sample_rate=1.0",
            "strategy.name=constant",
            "privacy.noise_multiplier=0",
        ],
    )
    task = build_task(config)
    server = RunServer(config, task)
    nodes = {client: 100 + client for client in range(6)}
    strategy = PolicyStrategy(server, nodes, task.client_cohorts)
    instructions = list(strategy.configure_train(1, ArrayRecord(), None, None))
    assert sorted(m.metadata.dst_node_id for m in instructions) == sorted(nodes.values())
    model = server.model.copy()
    params = server.broadcast()
    policy = build_policy("constant", config.strategy.params)
    replies, honest = [], []
    for message in instructions:
        client = message.metadata.dst_node_id - 100
        update = task.local_updates(model, np.array([client]), 1)
        sums = contribute(policy, params, update, task.client_cohorts[[client]], 2)
        if client == 0:  # inflated update: over the bound it was sent
            sums.contribution_sum = sums.contribution_sum / np.linalg.norm(sums.contribution_sum) * 10
        elif client == 1:  # wrong length
            sums.contribution_sum = sums.contribution_sum[:-1]
        else:
            honest.append(sums.contribution_sum)
        replies.append(Message(reply_content(sums, with_diagnostics=False), reply_to=message))
    _, metrics = strategy.aggregate_train(1, replies)
    assert metrics["dropped_replies"] == 2 and metrics["accepted_replies"] == 4
    expected = model + config.training.server_lr * np.sum(honest, axis=0) / config.expected_clients
    np.testing.assert_allclose(server.model, expected, rtol=1e-12, atol=1e-15)
    row = server.result.rows[-1]
    assert np.isnan(row["clipped_fraction"]), "no simulation diagnostics were sent"


def test_train_instruction_round_trip():
    content = train_content(np.arange(4.0), {"bound": 0.5, "cohort_bounds": [0.1, 0.2]}, 7)
    from fairclip.client.protocol import read_train

    model, params, round_number = read_train(content)
    np.testing.assert_array_equal(model, np.arange(4.0))
    assert params == {"bound": 0.5, "cohort_bounds": [0.1, 0.2]} and round_number == 7


def test_client_with_its_own_data_file_trains_on_it_and_sends_no_diagnostics(server_task_identity, tmp_path):
    from flwr.app import Context

    from fairclip.client import app as client_app
    from fairclip.client.protocol import DIAGNOSTICS as DIAGNOSTICS_RECORD

    features = np.random.default_rng(0).normal(size=(5, 10)).astype(np.float32)
    labels = np.array([0, 1, 1, 0, 1])
    path = tmp_path / "local.npz"
    np.savez(path, x=features, y=labels)
    run_config = {"scenario": "demo", "federation.num_clients": 6, "strategy.name": "constant"}
    node_config = {"partition-id": 0, "num-partitions": 6, "data-path": str(path), "cohort": "minority"}
    context = Context(run_id=1, node_id=7, node_config=node_config, state=RecordDict(), run_config=run_config)
    client = client_app.local_client(context)
    assert client.cohort == client.task.cohort_names.index("minority") and not client.simulated
    np.testing.assert_array_equal(client.task.train_x[client.task.client_indices[0]].numpy(), features)

    model = client.task.initial_model()
    instruction = Message(train_content(model, {"bound": 0.05}, 1), dst_node_id=7, message_type="train")
    reply = client_app.train(instruction, context)
    contribution = reply.content.array_records[UPDATE][CONTRIBUTION].numpy()
    assert 0 < np.linalg.norm(contribution) <= 0.05 * (1 + 1e-12)
    assert DIAGNOSTICS_RECORD not in reply.content.metric_records

    bad = {**node_config, "num-partitions": 5}
    with pytest.raises(ValueError, match="num-partitions=5"):
        client_app.local_client(
            Context(run_id=2, node_id=7, node_config=bad, state=RecordDict(), run_config=run_config)
        )
