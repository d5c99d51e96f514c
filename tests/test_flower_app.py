"""The Flower path: `flwr run .` against the local backend, the ClientApp, run-config mapping."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from flwr.app import ConfigRecord, Message, RecordDict

from fairclip.benchmarks.flower_local import (
    LOCAL_CONNECTION,
    kill_sessions_mentioning,
    local_simulation_env,
    simulation_options,
    write_local_simulation,
)
from fairclip.client.protocol import CONTRIBUTION, DIAGNOSTICS, REPORTS, UPDATE, train_content
from fairclip.scenarios.config import ConfigError, load_config
from fairclip.scenarios.flower_config import flower_run

PROJECT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


@pytest.fixture
def flower_home(tmp_path):
    """A throw-away FLWR_HOME with a `local` simulation connection, and the env to use it.

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
    write_local_simulation(home)
    command = [
        str(BIN / "flwr"),
        "run",
        str(PROJECT),
        LOCAL_CONNECTION,
        *simulation_options(num_nodes),
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
    "policy.name": "bounded",
    "privacy.noise_multiplier": 0.8,
}
FLOWER_ONLY = {"simulation-diagnostics": True, "privacy.secure_noise": False, "not-private": True}
"""Flower's simulation runtime may enable the simulation diagnostics (never a deployment), and a
reproducible comparison needs sampling and numpy's noise to follow the seed instead of the
ServerApp's operating-system entropy and OpenDP: a not-private run."""


SAME_ROUND = {
    "policy.name": "per-cohort",
    "policy.initial_bound": 0.5,
    "set": "policy.same_round=true",
}
"""DPSGD-F as run: two exchanges per round, the counts first (:attr:`Policy.counts_first`)."""


@pytest.mark.slow
@pytest.mark.parametrize("strategy", [{}, SAME_ROUND], ids=["bounded", "per-cohort-same-round"])
def test_flwr_run_matches_local_backend(flower_home, tmp_path, cli, strategy):
    """Same seed: the same bound trajectory, the same noise and the same final model; for a
    counts-first policy too, whose rounds take two exchanges with the same nodes."""
    home, env = flower_home
    flower_out = tmp_path / "flower"
    settings = {**SETTINGS, **strategy}
    run_config = " ".join(
        f"{key}={json.dumps(value)}"
        for key, value in {**settings, **FLOWER_ONLY, "out": str(flower_out)}.items()
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
    assignments = [f"{key}={value}" for key, value in settings.items() if key not in ("scenario", "set")]
    assignments += settings.get("set", "").split(";") if "set" in settings else []
    sets = [arg for assignment in assignments for arg in ("--set", assignment)]
    status, _, err = cli("run", "--scenario", "demo", *sets, "--backend", "local", "--out", str(local_out))
    assert status == 0, err

    flower_rounds = pd.read_csv(flower_out / "rounds.csv")
    flower_internal = pd.read_csv(flower_out / "server-internal" / "rounds.csv")
    local_rounds = pd.read_csv(local_out / "rounds.csv")
    assert len(flower_rounds) == len(flower_internal) == len(local_rounds) == SETTINGS["training.rounds"]
    # the public release holds no exact count and no diagnostic; the internal record holds them
    for column in ("sampled_clients", "clipped_fraction", "majority/sampled", "minority/norm_before"):
        assert column not in flower_rounds.columns and column in flower_internal.columns
    assert (flower_internal["sampled_clients"] == local_rounds["sampled_clients"]).all()
    assert (flower_internal["dropped_replies"] == 0).all()
    if strategy:  # every sampled node answered both exchanges
        assert (flower_internal["count_accepted_replies"] == flower_internal["sampled_clients"]).all()
        assert (flower_internal["count_dropped_replies"] == 0).all()
    for column in (
        "clipped_fraction",
        "majority/sampled",
        "minority/clipped_fraction",
        "minority/norm_after",
    ):
        np.testing.assert_allclose(flower_internal[column], local_rounds[column], rtol=1e-9, err_msg=column)
    for column in ("clip_bound", "noise_std", "sensitivity", "accuracy", "loss", "noisy_report_0"):
        np.testing.assert_allclose(flower_rounds[column], local_rounds[column], rtol=1e-9, err_msg=column)
    # a not-private run claims no ε in its public outputs; the mechanism's is the executor's
    assert np.isinf(flower_rounds["epsilon"]).all()
    assert (flower_rounds["noise_std"] > 0).all()
    assert flower_rounds["clip_bound"].nunique() > 1, "the bound should move"
    np.testing.assert_allclose(
        np.load(flower_out / "model.npy"), np.load(local_out / "model.npy"), atol=1e-12
    )
    summary = json.loads((flower_out / "summary.json").read_text())
    local_summary = json.loads((local_out / "summary.json").read_text())
    assert summary["rounds_completed"] == SETTINGS["training.rounds"]
    assert summary["epsilon"] == "inf" and summary["privacy"]["epsilon"] == "inf"
    assert summary["privacy"]["guarantee"] is False
    assert "no privacy is claimed" in summary["privacy"]["not_private"]
    assert summary["privacy"]["mechanism_epsilon"] == pytest.approx(local_summary["epsilon"], rel=1e-12)
    assert log.count("NOT PRIVATE: client sampling and DP noise follow seed=5") == 1, "each line once"
    assert "deprecated" not in log, log
    assert "numpy's Gaussian sampler, seed 5" in log


@pytest.mark.slow
def test_flwr_run_bad_configuration_fails_with_one_line(flower_home, tmp_path):
    home, env = flower_home
    completed = _flwr_run(
        home, env, 2, f"federation.num_clients=3 training.rounds=1 node-wait=3.0 out='{tmp_path}'"
    )
    log = completed.stdout + completed.stderr
    assert (
        "fairclip: error: the federation has 2 nodes (num-partitions=2), but federation.num_clients=3" in log
    ), log[-3000:]


def _fairclip_flower(
    env: dict[str, str], cwd: Path, *arguments: str
) -> tuple[subprocess.CompletedProcess, float]:
    started = time.perf_counter()
    done = subprocess.run(
        [str(BIN / "fairclip"), "flower", str(PROJECT), *arguments],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=400,
    )
    return done, time.perf_counter() - started


@pytest.mark.slow
def test_a_bare_flwr_run_completes_on_flowers_default_local_simulation(flower_home, tmp_path):
    """Issue 18, point 13: the app's defaults run on the connection Flower creates by itself
    (2 simulated nodes), and `fairclip flower` says so with exit status 0."""
    _home, env = flower_home  # no connection written: Flower writes its default on first use
    done, _ = _fairclip_flower(env, tmp_path)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "finished:completed" in done.stdout
    summary = json.loads((tmp_path / "runs" / "flwr" / "summary.json").read_text())
    assert summary["config"]["scenario"]["name"] == "flower-local"
    assert summary["rounds_completed"] == summary["config"]["training"]["rounds"]


@pytest.mark.slow
def test_a_node_count_mismatch_fails_at_once_with_a_nonzero_status(flower_home, tmp_path):
    """The demo's 200 clients on Flower's 2 default nodes: refused as soon as the nodes answer
    (not after the 300 s node wait), in one line, and `fairclip flower` exits 1."""
    _home, env = flower_home
    done, wall = _fairclip_flower(env, tmp_path, "--run-config", "scenario='demo'")
    assert done.returncode == 1, (done.stdout + done.stderr)[-3000:]
    errors = done.stderr.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("fairclip: error: Flower run "), done.stderr
    assert "finished:failed" in errors[0] and "the federation has 2 nodes" in errors[0]
    assert "num-supernodes=200" in errors[0] and "federation.num_clients=2" in errors[0]
    assert wall < 150, f"took {wall:.0f} s: the mismatch waited for the node timeout"


# ----- run configuration ----------------------------------------------------------------------


def test_run_config_resolves_like_set():
    run = flower_run(
        {
            "scenario": "demo",
            "set": "training.client_lr=0.2; seed=9",
            "policy.name": "adaptive",
            "training.rounds": 4,
            "privacy.delta": "",
            "out": "x",
        }
    )
    expected = load_config(
        "demo", None, ["training.client_lr=0.2", "seed=9", "policy.name=adaptive", "training.rounds=4"]
    )
    assert run.config == expected and run.out == Path("x")
    assert not run.simulation_diagnostics and run.config.privacy.secure_noise is None  # on in a ServerApp


def test_a_seed_fixes_only_the_data_unless_the_run_says_not_private(tmp_path):
    """Issue 64, point 2: a seed in the run configuration (or in a config file copied from a
    built-in scenario, which carries `seed = 0`) used to make sampling, and without secure noise
    the noise, predictable while the summary still claimed ε. Now only `not-private = true` does."""
    source = (Path(__file__).resolve().parents[1] / "scenarios" / "builtin" / "demo.toml").read_text()
    copied = tmp_path / "copied.toml"
    copied.write_text(source)
    for run_config in (
        {"scenario": "demo", "seed": 3},
        {"scenario": "demo", "set": "training.rounds=2; seed = 9"},
        {"config-file": str(copied)},
    ):
        run = flower_run(run_config)
        assert not run.not_private, run_config
    assert flower_run({"scenario": "demo", "seed": 3}).config.seed == 3  # the data partition's seed
    assert flower_run({"scenario": "demo", "not-private": True}).not_private
    for bad in ("true", 1, "yes"):
        with pytest.raises(ConfigError, match="not-private must be true or false"):
            flower_run({"scenario": "demo", "not-private": bad})


def test_a_seeded_server_app_draws_sampling_and_noise_from_entropy():
    """The ServerApp's round server with a seed but without `not-private`: two runs of the same
    configuration sample different clients and draw different noise; with `not-private` they
    repeat, and the summary claims no ε."""
    from fairclip.scenarios.tasks import build_task
    from fairclip.server.run import Run

    run = flower_run({"scenario": "demo", "seed": 3, "privacy.secure_noise": False})
    task = build_task(run.config)

    def server(not_private: bool) -> Run:
        return Run(run.config, task, seeded=not_private, secure_noise_default=True, not_private=not_private)

    first, second = server(False), server(False)
    assert not np.array_equal(first.sample(1), second.sample(1))
    noise = [s.rounds.noise_source(1).normal(size=8) for s in (first, second)]
    assert not np.array_equal(*noise)
    assert np.isfinite(first.summary["epsilon"]) and "guarantee" not in first.summary["privacy"]
    repeat = [server(True), server(True)]
    assert np.array_equal(repeat[0].sample(1), repeat[1].sample(1))
    assert repeat[0].summary["epsilon"] == "inf" and repeat[0].summary["privacy"]["guarantee"] is False


def test_secure_noise_and_diagnostics_are_read_strictly():
    run = flower_run({"scenario": "demo", "privacy.secure_noise": False, "simulation-diagnostics": True})
    assert run.config.privacy.secure_noise is False and run.simulation_diagnostics
    for bad in ("false", "yes", 1):
        with pytest.raises(ConfigError, match="simulation-diagnostics"):
            flower_run({"scenario": "demo", "simulation-diagnostics": bad})
        with pytest.raises(ConfigError, match="secure_noise"):
            flower_run({"scenario": "demo", "privacy.secure_noise": bad})


def test_run_config_errors_are_config_errors():
    with pytest.raises(ConfigError, match="unknown policy"):
        flower_run({"scenario": "demo", "policy.name": "nonsense"})
    with pytest.raises(ConfigError, match="neither"):
        flower_run({"scenario": ""})
    # the target calibrates sigma, so a noise multiplier given beside it would be dropped silently
    calibrated = {"scenario": "demo", "privacy.target_epsilon": 2.0}
    with pytest.raises(ConfigError, match="calibrates the noise multiplier"):
        flower_run({**calibrated, "privacy.noise_multiplier": 1.0})
    with pytest.raises(ConfigError, match="calibrates the noise multiplier"):
        flower_run({**calibrated, "set": "privacy.noise_multiplier=1.0"})
    assert flower_run({**calibrated, "privacy.noise_multiplier": ""}).config.privacy.target_epsilon == 2.0


# ----- the ClientApp ---------------------------------------------------------------------


def test_train_instruction_round_trip():
    content = train_content(np.arange(4.0), {"bound": 0.5, "cohort_bounds": [0.1, 0.2]}, 7)
    from fairclip.client.protocol import read_train

    model, params, round_number = read_train(content)
    np.testing.assert_array_equal(model, np.arange(4.0))
    assert params == {"bound": 0.5, "cohort_bounds": [0.1, 0.2]} and round_number == 7


def test_client_with_its_own_data_file_trains_on_it_and_sends_no_diagnostics(server_task_identity, tmp_path):
    from flwr.app import Context

    from fairclip.client.app import clients as client_app
    from fairclip.client.protocol import DIAGNOSTICS as DIAGNOSTICS_RECORD

    features = np.random.default_rng(0).normal(size=(5, 10)).astype(np.float32)
    labels = np.array([0, 1, 1, 0, 1])
    path = tmp_path / "local.npz"
    np.savez(path, x=features, y=labels)
    run_config = {"scenario": "demo", "federation.num_clients": 6, "policy.name": "constant"}
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


def _context(run_config: dict, node_config: dict, run_id: int):
    from flwr.app import Context

    return Context(
        run_id=run_id, node_id=7, node_config=node_config, state=RecordDict(), run_config=run_config
    )


@pytest.mark.parametrize(("enabled", "sends"), [(None, False), (False, False), (True, True)])
def test_a_partition_node_sends_diagnostics_only_where_the_run_enables_them(
    server_task_identity, enabled, sends
):
    """Issue 17, point 1: a node on a scenario partition (the README's and compose's SuperNodes)
    used to send its raw norms and true clipping bit in every run."""
    from fairclip.client.app import clients as client_app

    run_config = {"scenario": "demo", "federation.num_clients": 6, "policy.name": "bounded"}
    if enabled is not None:
        run_config["simulation-diagnostics"] = enabled
    context = _context(run_config, {"partition-id": 2, "num-partitions": 6}, run_id=10 + int(bool(enabled)))
    client = client_app.local_client(context)
    instruction = Message(
        train_content(
            client.task.initial_model(), client.policy.broadcast(client.policy.initial_state(1)), 1
        ),
        dst_node_id=7,
        message_type="train",
    )
    reply = client_app.train(instruction, context)
    assert (DIAGNOSTICS in reply.content.metric_records) == sends
    assert set(reply.content.array_records[UPDATE].keys()) == {CONTRIBUTION, REPORTS}
    assert set(reply.content.keys()) == ({UPDATE, DIAGNOSTICS} if sends else {UPDATE})


IDENTIFY_POLICIES = ["none", "constant", "bounded", "online", "per-cohort", "reweight"]


@pytest.mark.parametrize("policy", IDENTIFY_POLICIES)
def test_a_node_tells_its_cohort_only_to_policies_that_need_it(server_task_identity, policy):
    """Issue 17, point 2: the identify answer carried the cohort (the protected attribute of
    adult/dutch) for every policy."""
    from fairclip.client.app import clients as client_app
    from fairclip.client.protocol import COHORT, IDENTIFY

    run_config = {"scenario": "demo", "federation.num_clients": 6, "policy.name": policy}
    if policy == "bounded":
        run_config["policy.lower_bound"] = 0.1
    context = _context(
        run_config, {"partition-id": 1, "num-partitions": 6}, run_id=20 + IDENTIFY_POLICIES.index(policy)
    )
    query = Message(RecordDict({IDENTIFY: ConfigRecord({})}), dst_node_id=7, message_type="query")
    identity = dict(client_app.identify(query, context).content.config_records[IDENTIFY])
    needs = policy in ("per-cohort", "reweight")
    assert (COHORT in identity) == needs
    assert identity["partition-id"] == 1 and identity["num-partitions"] == 6


def test_a_node_draws_its_dropout_masks_from_the_seed_the_round_and_its_partition(server_task_identity):
    """A model with dropout (``eicu-mlp``) trains on a Flower node as the simulation trains that
    client: the masks come from the run's seed, the round and the node's partition, not from
    torch's process-wide generator, so a node that trains a round again (a lost state, a
    counts-first exchange) sends the same update."""
    import torch

    from fairclip.client.app import clients as client_app
    from fairclip.scenarios.tasks import build_task

    sets = "scenario.model=eicu-mlp;policy.initial_bound=1e6"
    run_config = {"scenario": "demo", "seed": 3, "federation.num_clients": 6, "policy.name": "constant"}
    run_config["set"] = sets
    context = _context(run_config, {"partition-id": 4, "num-partitions": 6}, run_id=31)
    client = client_app.local_client(context)
    assert client.task._dropout and not client.task.one_step
    model = client.task.initial_model()

    calls = iter(range(1000, 2000))

    def contribution(round_number: int) -> np.ndarray:
        torch.manual_seed(next(calls))  # torch's generator holds something else at each call
        instruction = Message(
            train_content(model, {"bound": 1e6}, round_number), dst_node_id=7, message_type="train"
        )
        reply = client_app.train(
            instruction, _context(run_config, {"partition-id": 4, "num-partitions": 6}, 31)
        )
        return reply.content.array_records[UPDATE][CONTRIBUTION].numpy()

    first = contribution(2)
    np.testing.assert_array_equal(contribution(2), first)
    simulated = build_task(
        load_config("demo", None, ["seed=3", "federation.num_clients=6", *sets.split(";")])
    )
    np.testing.assert_allclose(
        simulated.local_updates(model, np.array([4]), 2)[0], first, rtol=1e-6, atol=1e-9
    )
    for layer in simulated.model.modules():  # the same call without dropout: the masks were in use
        if isinstance(layer, torch.nn.Dropout):
            layer.p = 0.0
    assert not np.allclose(simulated.local_updates(model, np.array([4]), 2)[0], first)


def test_the_client_app_keeps_its_task_across_copies_of_itself(monkeypatch, tmp_path):
    """Flower's simulation runtime sends the ClientApp object to its Ray workers pickled by value
    with every message: the scenario's task must be built once per process, not per message."""
    import cloudpickle
    from flwr.app import Context, RecordDict

    from fairclip.client import app as client_app_module

    built = []
    original = client_app_module._build_task
    monkeypatch.setattr(
        client_app_module, "_build_task", lambda *a, **k: built.append(1) or original(*a, **k)
    )
    run_config = {"scenario": "demo", "out": str(tmp_path), "seed": 0, "set": "federation.num_clients=6"}
    # The app's handlers are bound methods of this object: it travels by value with the app.
    shipped = cloudpickle.dumps(client_app_module.clients)
    for node in range(3):
        copy = cloudpickle.loads(shipped)  # a fresh copy per message, as the runtime delivers it
        assert copy is not client_app_module.clients
        context = Context(
            run_id=4242,
            node_id=10 + node,
            node_config={"partition-id": node, "num-partitions": 6},
            state=RecordDict(),
            run_config=run_config,
        )
        client = copy.local_client(context)
        assert client.client_id == node
    assert len(built) == 1


def test_a_clientapp_process_starts_light_and_a_serverapp_logs_each_line_once():
    """Flower starts a ClientApp process for every message of a deployment, and most stages of
    a secure sum train nothing: importing the ClientApp brings neither Opacus (never used by a
    client; with SciPy it cost 3 of a start's 7 s) nor torch and pandas (2.6 s more), which a
    message that trains or evaluates imports. A ServerApp imports Opacus (its accountants), and
    the root handler Opacus' import adds is removed, else Flower's lines print twice."""
    code = (
        "import logging, sys\n"
        "import fairclip.client.app\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('opacus', 'scipy', 'torch', 'pandas')))\n"
        "import fairclip.server.app\n"
        "from fairclip.client.flower_logging import OPACUS_FORMAT, OPACUS_LOGGING_MODULE\n"
        "print(OPACUS_LOGGING_MODULE in sys.modules)\n"
        "print([h.formatter._fmt for h in logging.getLogger().handlers if h.formatter])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    client_modules, server_imported, root_formats = done.stdout.strip().split("\n")
    assert client_modules == "[]"
    assert server_imported == "True" and "%(asctime)s:%(levelname)s" not in root_formats
