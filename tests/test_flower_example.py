"""Issue 19, point 3: fairclip in the user's own Flower app (the DifferentialPrivacy wrapper around
any strategy, the ClientApp mod), and the example app under examples/ run with `flwr run`."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp.strategy import FedAvg

import fairclip
from fairclip.benchmarks.flower_local import (
    LOCAL_CONNECTION,
    kill_sessions_mentioning,
    local_simulation_env,
    simulation_options,
    write_local_simulation,
)
from fairclip.client.protocol import CONTRIBUTION, REPORTS, UPDATE
from fairclip.flower import DifferentialPrivacy, fairclip_mod
from fairclip.strategies import NoiseMultipliers, build_policy
from fairclip.strategies.accounting import Accountant, epsilon
from fairclip.strategies.base import DPEvent

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "flower-app"
BIN = Path(sys.executable).parent
NODES = 4


@pytest.fixture
def example_task(monkeypatch):
    """The example app's task module, importable for this test only."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    from fairclip_example import task

    return task


def executor_run(task, settings: dict, seed: int) -> fairclip.Simulation:
    """fairclip's own executor on the example's data, model and training."""
    xs, ys = zip(*(task.load_data(i) for i in range(NODES)), strict=True)
    test_x, test_y, test_cohorts = task.test_data()
    data = fairclip.FederatedDataset.from_arrays(
        np.concatenate(xs),
        np.concatenate(ys),
        clients=np.repeat(np.arange(NODES), task.EXAMPLES),
        cohorts=[task.cohort_of(i) for i in range(NODES)],
        test_x=test_x,
        test_y=test_y,
        test_cohorts=test_cohorts,
    )
    scenario = fairclip.Scenario(
        "flower-example",
        dataset=data,
        model=task.make_model,
        sample_rate=float(settings["sample-rate"]),
        rounds=int(settings["num-server-rounds"]),
        settings={
            "seed": seed,
            "policy.name": "bounded",
            "policy.initial_bound": float(settings["initial-bound"]),
            "policy.lower_bound": float(settings["lower-bound"]),
            "policy.bound_lr": float(settings["bound-lr"]),
            "privacy.noise_multiplier": float(settings["noise-multiplier"]),
            "training.client_lr": float(settings["lr"]),
            "training.batch_size": task.EXAMPLES,  # one step on the whole local set, as the app trains
        },
    )
    return fairclip.simulate(scenario)


def run_example(tmp_path: Path, program: str, verb: str, *options: str) -> subprocess.CompletedProcess:
    """``BIN/program verb EXAMPLE local <4 nodes> options`` on Flower's local simulation runtime
    of a fresh ``FLWR_HOME`` under ``tmp_path`` (also its working folder); its SuperLink and
    nodes are stopped after it."""
    home = tmp_path / "flwr-home"
    home.mkdir()
    env = local_simulation_env(home, BIN)
    write_local_simulation(home)
    command = [str(BIN / program), verb, str(EXAMPLE), LOCAL_CONNECTION, *simulation_options(NODES), *options]
    try:
        return subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=400)
    finally:
        kill_sessions_mentioning(str(home))


def example_settings() -> dict:
    import tomllib

    return tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]


def readme_commands() -> str:
    """The shell block of the example's README that runs it, as written there."""
    readme = (EXAMPLE / "README.md").read_text()
    (block,) = re.findall(r"```sh\n(.*?)```", readme, flags=re.S)
    return block


@pytest.mark.slow
def test_the_example_app_runs_as_its_readme_says_with_fairclips_mechanism(example_task, tmp_path):
    """The README's commands, run literally with bash from a copy of the example's folder (the
    README says "from this folder"; the only thing the test adds is a fresh FLWR_HOME whose
    ``local`` connection is Flower's local simulation runtime, as the README's last paragraph
    asks): FedAvg wrapped in DifferentialPrivacy with `bounded`, the mod on the nodes, as the
    example ships (secure noise, no seed): every round noised with σ times the bound that
    clipped, ε as the accountant gives it for the rounds run, the bound moving, nothing private
    logged."""
    app = tmp_path / "flower-app"
    shutil.copytree(EXAMPLE, app, ignore=shutil.ignore_patterns("__pycache__", "runs"))
    home = tmp_path / "flwr-home"
    home.mkdir()
    write_local_simulation(home)
    env = {**local_simulation_env(home, BIN), "PWD": str(app)}
    try:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", readme_commands()],
            env=env, cwd=app, capture_output=True, text=True, timeout=400,
        )  # fmt: skip
    finally:
        kill_sessions_mentioning(str(home))
    log = done.stdout + done.stderr
    out = app / "runs"
    assert done.returncode == 0 and (out / "rounds.csv").exists(), log[-3000:]
    flower = pd.read_csv(out / "rounds.csv")
    settings = example_settings()
    rounds = settings["num-server-rounds"]
    assert list(flower["round"]) == list(range(1, rounds + 1))
    sigma = float(settings["noise-multiplier"])
    # OpenDP's sampler widens the noise by the most its rounding can add (a relative 1e-11)
    assert (flower["noise_std"] >= sigma * flower["sensitivity"]).all()
    np.testing.assert_allclose(flower["noise_std"], sigma * flower["sensitivity"], rtol=1e-9)
    np.testing.assert_allclose(flower["sensitivity"], flower["clip_bound"], rtol=1e-12)
    assert flower["clip_bound"].iloc[0] == settings["initial-bound"]
    assert (flower["clip_bound"] >= settings["lower-bound"]).all() and flower["clip_bound"].nunique() > 1
    sigma_eff = DPEvent(sigma, 10 * sigma).effective_noise_multiplier
    q = float(settings["sample-rate"])
    expected = [epsilon(sigma_eff, q, t, 1e-5, "prv") for t in range(1, rounds + 1)]
    np.testing.assert_allclose(flower["epsilon"], expected, rtol=1e-9)
    assert flower["accuracy"].between(0, 1).all() and "not_private" not in flower.columns
    # nothing but public values leaves the strategy: no client's loss or number of examples
    assert "train_loss" not in log and "num-examples" not in flower.columns
    assert "Sampled" not in log, "the inner FedAvg's node count is not logged"


def test_the_example_app_matches_fairclips_executor_with_a_not_private_seed(
    example_task, server_task_identity
):
    """The example's ServerApp strategy and ClientApp (with the mod), driven message by message in
    this process with a not-private seed: the same bound, noise and ε, round by round, and the
    same model, as fairclip's executor on the same data, model and seed."""
    from fairclip_example.client_app import local_training

    settings = example_settings()
    seed = 7
    strategy = DifferentialPrivacy(
        FedAvg(fraction_train=1.0, fraction_evaluate=0.0),
        "bounded",
        {
            "initial_bound": settings["initial-bound"],
            "lower_bound": settings["lower-bound"],
            "bound_lr": settings["bound-lr"],
        },
        num_clients=NODES,
        sample_rate=float(settings["sample-rate"]),
        noise_multiplier=float(settings["noise-multiplier"]),
        not_private_seed=seed,
    )
    arrays = ArrayRecord(example_task.make_model().state_dict())
    grid = _Grid(list(range(1, NODES + 1)))  # node k holds partition k - 1, client k - 1
    rows = []
    for t in range(1, settings["num-server-rounds"] + 1):
        replies = []
        for message in strategy.configure_train(t, arrays, ConfigRecord({}), grid):
            node = message.metadata.dst_node_id
            context = Context(
                run_id=1, node_id=node, node_config={"partition-id": node - 1}, state=RecordDict(),
                run_config=settings,
            )  # fmt: skip
            replies.append(fairclip_mod(message, context, local_training))
        arrays, metrics = strategy.aggregate_train(t, replies)
        rows.append(dict(metrics))
    wrapped = pd.DataFrame(rows)
    simulated = executor_run(example_task, settings, seed)
    for column in ("clip_bound", "noise_std", "sensitivity"):
        np.testing.assert_allclose(wrapped[column], simulated.rounds[column], rtol=1e-6, err_msg=column)
    np.testing.assert_allclose(wrapped["mechanism_epsilon"], simulated.rounds["epsilon"], rtol=1e-9)
    assert wrapped["clip_bound"].nunique() > 1, "the bound should move under `bounded`"
    final = np.concatenate([arrays[key].numpy().ravel() for key in arrays])  # float32 in the app
    np.testing.assert_allclose(final, simulated.model, atol=1e-4)


# ----- the mod, message by message -------------------------------------------------------------
def _train_message(model: dict, strategy: DifferentialPrivacy | None, bound: float = 0.1) -> Message:
    config = ConfigRecord({"lr": 0.1})
    if strategy is not None:
        from fairclip.client.protocol import write_policy_config

        write_policy_config(
            config, strategy.policy, strategy.policy.broadcast(strategy.policy.initial_state(1))
        )
    content = RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in model.items()}), "config": config})
    return Message(content, dst_node_id=3, message_type=MessageType.TRAIN)


def _app_training(step: np.ndarray):
    """A user's train function: moves every weight by ``step`` and reports its own metrics."""

    def train(message: Message, context: Context) -> Message:
        arrays = message.content["arrays"]
        moved = {key: Array(arrays[key].numpy() + step.reshape(arrays[key].numpy().shape)) for key in arrays}
        metrics = MetricRecord({"train_loss": 0.5, "num-examples": 10})
        return Message(RecordDict({"arrays": ArrayRecord(moved), "metrics": metrics}), reply_to=message)

    return train


def _context() -> Context:
    return Context(run_id=1, node_id=3, node_config={}, state=RecordDict(), run_config={})


def test_the_mod_clips_the_apps_update_and_sends_nothing_else(server_task_identity):
    strategy = DifferentialPrivacy(FedAvg(), "bounded", {"lower_bound": 0.01, "initial_bound": 0.1},
                                   num_clients=4, sample_rate=1.0, noise_multiplier=1.0)  # fmt: skip
    model = {"w": np.zeros((2, 2), dtype=np.float32)}
    message = _train_message(model, strategy)
    reply = fairclip_mod(message, _context(), _app_training(np.full(4, 3.0, dtype=np.float32)))
    assert not reply.has_error()
    assert set(reply.content.keys()) == {UPDATE}  # the app's metrics stay on the node
    contribution = reply.content[UPDATE][CONTRIBUTION].numpy()
    assert contribution.dtype == np.float64 and contribution.shape == (4,)
    assert np.linalg.norm(contribution) <= 0.1 and np.allclose(contribution, 0.05)
    np.testing.assert_array_equal(reply.content[UPDATE][REPORTS].numpy(), [1.0])  # 6 > τ·C = 0.25

    small = fairclip_mod(_train_message(model, strategy), _context(), _app_training(np.full(4, 0.01)))
    np.testing.assert_allclose(small.content[UPDATE][CONTRIBUTION].numpy(), 0.01, rtol=1e-6)
    np.testing.assert_array_equal(small.content[UPDATE][REPORTS].numpy(), [0.0])


def test_the_mod_never_sends_an_unclipped_update(server_task_identity):
    model = {"w": np.zeros(3, dtype=np.float32)}
    reply = fairclip_mod(_train_message(model, None), _context(), _app_training(np.ones(3)))
    assert reply.has_error() and "no fairclip policy" in reply.error.reason

    strategy = DifferentialPrivacy(FedAvg(), "constant", num_clients=4, sample_rate=1.0, noise_multiplier=1.0)

    def renamed(message: Message, context: Context) -> Message:
        arrays = ArrayRecord({"other": Array(np.ones(3, dtype=np.float32))})
        return Message(RecordDict({"arrays": arrays}), reply_to=message)

    reply = fairclip_mod(_train_message(model, strategy), _context(), renamed)
    assert reply.has_error() and "other arrays" in reply.error.reason

    evaluate = Message(
        RecordDict({"config": ConfigRecord({})}), dst_node_id=3, message_type=MessageType.EVALUATE
    )
    passed = fairclip_mod(evaluate, _context(), lambda message, context: "untouched")
    assert passed == "untouched"


def test_a_policy_defined_in_main_is_named_as_unreachable_on_the_nodes(server_task_identity, caplog):
    """Issue 67: a policy class written in the server's own script (``__main__``) cannot reach a
    node in another process. The wrapper warns when it is built; a node, whose ``__main__`` is
    not that script (here pytest's), answers with an error that says why and what to do, and
    never sends an update."""
    from fairclip.strategies.constant import ConstantClipping

    script_policy = type(
        "ScriptPolicy", (ConstantClipping,), {"name": "script-policy", "__module__": "__main__"}
    )
    with caplog.at_level("WARNING"):
        strategy = DifferentialPrivacy(
            FedAvg(), script_policy, num_clients=4, sample_rate=1.0, noise_multiplier=1.0
        )
    assert "policy 'script-policy' is defined in __main__" in caplog.text
    model = {"w": np.zeros(3, dtype=np.float32)}
    reply = fairclip_mod(_train_message(model, strategy), _context(), _app_training(np.ones(3)))
    assert reply.has_error()
    assert "'__main__:ScriptPolicy': it was defined in the script another process runs as __main__" in (
        reply.error.reason
    )
    assert "refer to it as 'my_research:Name'" in reply.error.reason


# ----- the strategy ---------------------------------------------------------------------------
class _Grid:
    """What FedAvg's configure_train asks of a grid: the connected nodes."""

    def __init__(self, nodes: list[int]):
        self.nodes = nodes

    def get_node_ids(self) -> list[int]:
        return list(self.nodes)


def _reply(instruction: Message, contribution: np.ndarray, report: float) -> Message:
    """A reply from the node ``instruction`` went to."""
    content = RecordDict(
        {UPDATE: ArrayRecord({CONTRIBUTION: Array(contribution), REPORTS: Array(np.array([report]))})}
    )
    return Message(content, reply_to=instruction)


def test_the_strategy_noises_drops_and_accounts_like_fairclip(server_task_identity):
    inner = FedAvg(fraction_train=1.0, min_available_nodes=3)
    strategy = DifferentialPrivacy(
        inner, "bounded", {"lower_bound": 0.1, "initial_bound": 1.0},
        num_clients=3, sample_rate=1.0, noise_multiplier=0.0, count_noise_multiplier=0.0,
    )  # fmt: skip
    arrays = ArrayRecord({"w": Array(np.zeros(2, dtype=np.float32))})
    instructions = list(strategy.configure_train(1, arrays, ConfigRecord({}), _Grid([11, 12, 13])))
    assert sorted(m.metadata.dst_node_id for m in instructions) == [11, 12, 13]
    assert instructions[0].content["config"]["fairclip.broadcast.bound"] == 1.0
    stranger = Message(RecordDict({}), dst_node_id=99, message_type=MessageType.TRAIN)
    replies = [
        _reply(instructions[0], np.array([0.6, 0.0]), 0.0),
        _reply(instructions[1], np.array([0.0, 3.0]), 1.0),  # beyond the bound it was sent: dropped
        _reply(stranger, np.array([0.0, 0.3]), 0.0),  # from a node that was not sampled
    ]
    aggregated, metrics = strategy.aggregate_train(1, replies)
    # no noise here: Δ̂ = (0.6, 0) / m̂ with m̂ = q·3, and FedAvg returns θ_t + Δ̂
    np.testing.assert_allclose(aggregated["w"].numpy(), [0.2, 0.0], rtol=1e-6)
    assert [event["node"] for event in strategy.dropped] == [12, 99]
    assert metrics["clip_bound"] == 1.0 and "accepted" not in " ".join(metrics.keys())
    # the count (0 of m̂ = 3 above τ·C) moved the bound down: C_2 = C_1 · exp(η (0 − γ))
    assert strategy.policy.sensitivity(strategy.state) == pytest.approx(np.exp(-0.2 * 0.5))


def test_the_strategy_accounts_what_ran():
    strategy = DifferentialPrivacy(
        FedAvg(), "adaptive", num_clients=10, sample_rate=0.5, noise_multiplier=1.2
    )
    assert strategy.noise == NoiseMultipliers(1.2, 12.0) and strategy.expected_clients == 5.0
    with pytest.raises(ValueError, match="needs each client's cohort"):
        DifferentialPrivacy(FedAvg(), "per-cohort", num_clients=10, sample_rate=0.5, noise_multiplier=1.0)
    with pytest.raises(ValueError, match="lower_bound"):
        DifferentialPrivacy(FedAvg(), "bounded", num_clients=10, sample_rate=0.5, noise_multiplier=1.0)


def test_the_accountant_composes_the_events_it_is_fed():
    from opacus.accountants import RDPAccountant

    accountant = Accountant("rdp")
    assert accountant.get_epsilon(1e-5) == 0.0
    for _ in range(30):
        accountant.step(DPEvent(1.1, 11.0), 0.1)
    sigma = DPEvent(1.1, 11.0).effective_noise_multiplier
    assert accountant.history == [(sigma, 0.1, 30)]
    assert accountant.get_epsilon(1e-5) == epsilon(sigma, 0.1, 30, 1e-5, "rdp")
    for _ in range(10):
        accountant.step(DPEvent(2.0), 0.2)
    opacus = RDPAccountant()
    opacus.history = [(sigma, 0.1, 30), (2.0, 0.2, 10)]
    assert accountant.get_epsilon(1e-5) == pytest.approx(opacus.get_epsilon(delta=1e-5), rel=1e-12)
    accountant.step(DPEvent(0.0), 0.1)  # a round without noise: no privacy left to claim
    assert accountant.get_epsilon(1e-5) == float("inf")


def test_every_round_releases_its_event():
    policy = build_policy("bounded", {"lower_bound": 0.1})
    state = policy.initial_state(3)
    released = policy.server_side(
        state, np.zeros(3), np.zeros(1), expected_clients=2.0, num_reports=2,
        noise=NoiseMultipliers(1.5, 15.0), rng=np.random.default_rng(0),
    )  # fmt: skip
    assert released.event == DPEvent(1.5, 15.0)
    constant = build_policy("constant")
    released = constant.server_side(
        constant.initial_state(3), np.zeros(3), None, expected_clients=2.0, num_reports=2,
        noise=NoiseMultipliers(1.5, 15.0), rng=np.random.default_rng(0),
    )  # fmt: skip
    assert released.event == DPEvent(1.5, None)  # no report released: its noise does not count


def test_the_readme_snippet_runs_as_written():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("## Use fairclip in your Flower app", 1)[1].split("\n## ", 1)[0]
    snippet = section.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(compile(snippet, "README.md (Flower)", "exec"), namespace)
    assert namespace["strategy"].policy.name == "bounded" and namespace["strategy"].policy.lower_bound == 0.05
    assert namespace["app"]._mods == [fairclip_mod]


@pytest.mark.slow
def test_the_example_refuses_a_relative_out_and_fairclip_flower_fails_with_it(tmp_path):
    """Issue 67: the example's README once wrote `out='runs'`, which resolved against the
    SuperLink's working folder and overwrote another app's rounds.csv. A relative `out` is refused
    before any round, in one line, and `fairclip flower` (flwr run, streamed) exits non-zero."""
    done = run_example(tmp_path, "fairclip", "flower", "--run-config", "out='runs'")
    log = done.stdout + done.stderr
    assert done.returncode != 0, log[-3000:]
    refusal = "fairclip example: error: out='runs' is relative to the SuperLink's working folder"
    assert sum(refusal in line for line in log.splitlines()) >= 1, log[-3000:]
    assert "finished:failed" in log, log[-3000:]
    assert not list(tmp_path.rglob("rounds.csv"))  # nothing written anywhere
