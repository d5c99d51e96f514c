"""Issue 19: a user's own model, data and policy, defined outside the package, from Python and
from the command line (import paths in a TOML, entry points), with the same errors as built-ins."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import fairclip
from fairclip import plugins
from fairclip.policies import PolicyConfigError, check_policy, policy_parameters, register
from fairclip.scenarios.errors import ConfigError

RESEARCH = textwrap.dedent(
    '''
    """A researcher's own code: a small MLP, a dataset of three cohorts from numpy arrays, and
    hard clipping with a public per-round bound schedule."""
    from dataclasses import dataclass
    from typing import Annotated

    import numpy as np
    from pydantic import Field
    from torch import nn

    import fairclip
    from fairclip.policies import Policy, PolicyParams, PositiveFinite, hard_clip

    COHORTS = ("north", "south", "east")


    def make_mlp(input_shape, num_classes):
        return nn.Sequential(
            nn.Flatten(), nn.Linear(int(np.prod(input_shape)), 8), nn.ReLU(), nn.Linear(8, num_classes)
        )


    def make_batchnorm_mlp(input_shape, num_classes):
        """Batch normalisation mixes the examples of a batch: fairclip refuses it."""
        return nn.Sequential(
            nn.Flatten(),
            nn.Linear(int(np.prod(input_shape)), 8),
            nn.BatchNorm1d(8),
            nn.ReLU(),
            nn.Linear(8, num_classes),
        )


    def load(num_clients, seed, examples_per_client=12, features=4):
        """Cohort k's label depends on feature k; east (every third client) is the hard one."""
        rng = np.random.default_rng(seed)
        cohort_of_client = np.array([COHORTS[c % 3] for c in range(num_clients)])

        def sample(cohorts):
            x = rng.normal(size=(len(cohorts), features)).astype(np.float32)
            signal = np.array([COHORTS.index(c) for c in cohorts])
            y = (x[np.arange(len(cohorts)), signal] > 0).astype(np.int64)
            return x, y

        owner = np.repeat(np.arange(num_clients), examples_per_client)
        x, y = sample(cohort_of_client[owner])
        test_cohorts = np.repeat(np.array(COHORTS), 200)
        test_x, test_y = sample(test_cohorts)
        return fairclip.FederatedDataset.from_arrays(
            x, y, clients=owner, cohorts=cohort_of_client, test_x=test_x, test_y=test_y,
            test_cohorts=test_cohorts,
        )


    @dataclass(frozen=True)
    class ScheduleState:
        round: int


    class HardSchedule(Policy):
        """Hard clipping at C_t = max(C_min, C_0 · decay^t): a public schedule, no reports."""

        name = "hard-schedule"

        class Params(PolicyParams):
            initial_bound: PositiveFinite = 1.0
            decay: Annotated[float, Field(gt=0, le=1)] = 0.5
            floor: PositiveFinite = 1e-3

        def initial_state(self, dim):
            return ScheduleState(0)

        def bound(self, state):
            return max(self.floor, self.initial_bound * self.decay**state.round)

        def broadcast(self, state):
            return {"bound": self.bound(state)}

        def sensitivity(self, state):
            return self.bound(state)

        def contribution_bounds(self, params, cohorts):
            return np.full(cohorts.shape[0], params["bound"])

        def transform(self, updates, norms, cohorts, params):
            bound = params["bound"]
            return hard_clip(updates, norms, bound), np.zeros((updates.shape[0], 0)), norms > bound

        def next_state(self, state, estimate, noisy_reports, expected_clients):
            return ScheduleState(state.round + 1)
    '''
)

TOML = textwrap.dedent(
    """
    seed = 4

    [scenario]
    name = "my-research"
    task = "federated-dataset"
    dataset = "my_research:load"
    model = "my_research:make_mlp"
    options = {examples_per_client = 12}

    [federation]
    num_clients = 30
    sample_rate = 0.5

    [training]
    rounds = 3
    client_lr = 0.5

    [policy]
    name = "constant"

    [policy."my_research:HardSchedule"]
    initial_bound = 2.0
    decay = 0.5

    [privacy]
    noise_multiplier = 0.5
    """
)


@pytest.fixture
def research(tmp_path, monkeypatch):
    """``my_research`` written to a folder of its own and importable, as a user's module is."""
    (tmp_path / "my_research.py").write_text(RESEARCH)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("my_research", None)
    yield importlib.import_module("my_research")
    sys.modules.pop("my_research", None)


def scenario(module) -> fairclip.Scenario:
    return fairclip.Scenario(
        "my-research",
        dataset=module.load,
        model=module.make_mlp,
        num_clients=30,
        sample_rate=0.5,
        rounds=3,
        options={"examples_per_client": 12},
        settings={"seed": 4, "training.client_lr": 0.5, "privacy.noise_multiplier": 0.5},
    )


def test_compare_own_model_data_and_policy_from_python(research, tmp_path):
    finished = []
    comparison = fairclip.compare(
        scenario(research),
        policies=["constant", research.HardSchedule],
        overrides={"policy.constant.initial_bound": 2.0, "policy.hard-schedule.initial_bound": 2.0},
        out=tmp_path / "sweep",
        on_run=lambda key, _result: finished.append(key),
    )
    table = comparison.table
    assert sorted(finished) == sorted(comparison.summaries) and len(finished) == 3
    assert set(table["policy"]) == {"none", "constant", "hard-schedule"}
    assert set(table["cohort"]) == {"north", "south", "east"}
    assert table.groupby("policy").size().to_dict() == {"constant": 3, "hard-schedule": 3, "none": 3}
    reference = table[table["policy"] == "none"]
    assert np.all(reference["privacy_cost"] == 0) and np.isinf(reference["epsilon"]).all()
    private = table[table["policy"] != "none"]
    assert np.all(np.isfinite(private["epsilon"])) and np.all(private["epsilon"] > 0)
    # the plug-in ran with its own schedule: C_t = 2 · 0.5^(t-1), noise σ · C_t
    rounds = comparison.rounds["hard-schedule__eps-none__seed-4"]
    np.testing.assert_allclose(rounds["clip_bound"], [2.0, 1.0, 0.5])
    np.testing.assert_allclose(rounds["noise_std"], [1.0, 0.5, 0.25])
    assert (rounds["clip_bound"] != comparison.rounds["constant__eps-none__seed-4"]["clip_bound"]).any()
    # and it was written like `fairclip compare` writes a sweep
    written = pd.read_csv(tmp_path / "sweep" / "summary.csv")
    np.testing.assert_allclose(written["accuracy"], table["accuracy"])
    assert (tmp_path / "sweep" / "report.md").read_text().count("hard-schedule") >= 1


def test_ray_workers_receive_objects_registered_in_this_process(research, ray_session):
    """A dataset object, a model function and a policy class that exist only in this process
    (no import path names them): Ray tasks get them with the registrations, and give the same
    numbers as the runs in this process."""
    mine = fairclip.Scenario(
        "in-memory",
        dataset=research.load(30, 4),
        model=lambda shape, classes: research.make_mlp(shape, classes),
        sample_rate=0.5,
        rounds=2,
        settings={"seed": 4, "privacy.noise_multiplier": 0.5},
    )
    local = fairclip.compare(mine, policies=[research.HardSchedule])
    remote = fairclip.compare(mine, policies=[research.HardSchedule], ray=True)
    pd.testing.assert_frame_equal(local.table, remote.table)


def test_simulate_trains_the_users_own_model(research):
    result = fairclip.simulate(scenario(research), overrides={"policy.name": "none"})
    # the MLP of my_research: 4·8 + 8 + 8·2 + 2 parameters, trained
    assert result.model.shape == (58,)
    assert list(result.cohorts.index) == ["north", "south", "east"]
    assert result.cohorts["accuracy"].between(0, 1).all()
    assert result.summary["config"]["scenario"]["model"] == "my-research"


def test_the_cli_runs_the_same_comparison_from_import_paths(research, tmp_path):
    config = tmp_path / "mine.toml"
    config.write_text(TOML)
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))  # this fairclip too
    environment = {**os.environ, "PYTHONPATH": path, "FLWR_TELEMETRY_ENABLED": "0"}
    out = tmp_path / "cli-sweep"
    done = subprocess.run(
        [sys.executable, "-m", "fairclip", "compare", "--config", str(config), "--out", str(out),
         "--strategies", "constant,my_research:HardSchedule"],
        capture_output=True, text=True, env=environment, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    from_cli = pd.read_csv(out / "summary.csv")
    # the import path's policy shows its one name, as from Python (issue 67): not the path
    assert set(from_cli["policy"]) == {"none", "constant", "hard-schedule"}
    rounds = pd.read_csv(out / "runs" / "hard-schedule__eps-none__seed-4" / "rounds.csv")
    np.testing.assert_allclose(rounds["clip_bound"], [2.0, 1.0, 0.5])
    summary = json.loads((out / "runs" / "hard-schedule__eps-none__seed-4" / "summary.json").read_text())
    assert summary["policy"] == "hard-schedule"
    assert summary["config"]["policy"]["name"] == "my_research:HardSchedule"  # how to find it again
    assert "hard-schedule" in done.stdout and "my_research:HardSchedule" not in done.stdout

    # the Python API on the same settings (the policy named by the same import path) gives the
    # same numbers, run by run and cohort by cohort
    comparison = fairclip.compare(config_file=config, policies=["constant", "my_research:HardSchedule"])
    key = ["policy", "cohort"]
    merged = from_cli.merge(comparison.table, on=key, suffixes=("_cli", "_api"))
    assert len(merged) == 9
    for column in ("accuracy", "loss", "privacy_cost", "epsilon"):
        np.testing.assert_allclose(
            merged[f"{column}_cli"], merged[f"{column}_api"], rtol=1e-9, err_msg=column
        )


PLUGIN_ERRORS = [
    (["policy.name=my_research:HardSchedule", "policy.decay=2.0"], "decay must be <= 1 (got 2.0)"),
    (
        ["policy.name=my_research:HardSchedule", "policy.lower_bound=0.1"],
        "policy.lower_bound: policy 'my_research:HardSchedule' has no such parameter",
    ),
    (["policy.name=no_such_module:Policy"], "cannot import 'no_such_module'"),
    (["policy.name=my_research:Missing"], "has no attribute 'Missing'"),
    (["policy.name=my_research:make_mlp"], "not a subclass of fairclip's Policy"),
    (["scenario.model=my_research:nope"], "has no attribute 'nope'"),
    (["scenario.model=my_research:make_batchnorm_mlp"], "layer '2' is a BatchNorm1d"),
    (["scenario.dataset=my_research:make_mlp"], "dataset loader 'my_research:make_mlp' failed"),
    (["scenario.options.colour=1"], "unexpected keyword argument 'colour'"),
]


@pytest.mark.parametrize(("sets", "message"), PLUGIN_ERRORS)
def test_plugin_errors_are_one_line_like_builtin_ones(research, cli, tmp_path, sets, message):
    config = tmp_path / "mine.toml"
    config.write_text(TOML)
    overrides = [arg for assignment in sets for arg in ("--set", assignment)]
    status, _, err = cli("run", "--config", str(config), *overrides, "--out", str(tmp_path / "run"))
    assert status == 2, err
    assert len(err.strip().splitlines()) == 1 and message in err, err
    assert not (tmp_path / "run").exists()  # refused before any work


def test_a_fixed_dataset_must_match_the_federation(research):
    fixed = fairclip.Scenario("fixed", dataset=research.load(30, 0), settings={"federation.num_clients": 31})
    with pytest.raises(ConfigError, match=r"has 30 clients, federation\.num_clients 31"):
        fairclip.simulate(fixed)


def test_a_model_factory_must_return_a_module(research):
    bad = fairclip.Scenario("bad-model", dataset=research.load(30, 0), model=lambda shape, classes: "mlp")
    with pytest.raises(ConfigError, match=r"returned str, not a torch\.nn\.Module"):
        fairclip.simulate(bad)


@pytest.mark.parametrize(
    ("layer", "refused"),
    [
        (lambda: torch.nn.BatchNorm1d(8, affine=False), "BatchNorm1d"),
        (lambda: torch.nn.LazyBatchNorm1d(), "LazyBatchNorm1d"),
        (
            lambda: torch.nn.Sequential(
                torch.nn.Unflatten(1, (2, 4)),
                torch.nn.InstanceNorm1d(2, track_running_stats=True),
                torch.nn.Flatten(),
            ),
            "InstanceNorm1d",
        ),
        (lambda: torch.nn.GroupNorm(2, 8), None),
        (lambda: torch.nn.LayerNorm(8), None),
    ],
    ids=["batch-norm", "lazy-batch-norm", "instance-norm-running-stats", "group-norm", "layer-norm"],
)
@pytest.mark.parametrize("examples_per_client", [1, 12])
def test_a_model_whose_layers_see_batch_statistics_is_refused(research, layer, refused, examples_per_client):
    """Batch normalisation makes one example's output depend on the rest of its batch, which
    holds other clients' examples on the one-step path; running statistics keep the clients'
    data outside the clipped and noised parameters. Layers that normalise each example alone
    train."""

    def factory(shape, classes):
        return torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Linear(int(np.prod(shape)), 8), layer(), torch.nn.Linear(8, classes)
        )

    run = fairclip.Scenario(
        "normalised",
        dataset=research.load,
        model=factory,
        num_clients=30,
        sample_rate=0.5,
        rounds=2,
        options={"examples_per_client": examples_per_client},
        settings={"seed": 4, "privacy.noise_multiplier": 0.5},
    )
    if refused is None:
        result = fairclip.simulate(run)
        assert len(result.rounds) == 2 and np.isfinite(result.rounds["accuracy"]).all()
        assert result.model.shape == (4 * 8 + 8 + 16 + 8 * 2 + 2,)
    else:
        name = "2.1" if refused == "InstanceNorm1d" else "2"
        with pytest.raises(
            ConfigError, match=rf"'normalised': the model's layer '{name}' is a {refused}: .*GroupNorm"
        ):
            fairclip.simulate(run)


def test_the_property_helper_checks_plugins_and_catches_broken_ones(research):
    from hypothesis import strategies as st

    check_policy(
        research.HardSchedule,
        st.fixed_dictionaries({"initial_bound": st.floats(1e-3, 1e3), "decay": st.floats(1e-3, 1.0)}),
        max_examples=60,
    )

    class Leaky(research.HardSchedule):
        """Clips at twice the bound it tells the server to noise with."""

        name = "leaky"

        def contribution_bounds(self, params, cohorts):
            return np.full(cohorts.shape[0], 2 * params["bound"])

        def transform(self, updates, norms, cohorts, params):
            return super().transform(updates, norms, cohorts, {"bound": 2 * params["bound"]})

    with pytest.raises(AssertionError, match="exceeds the sensitivity"):
        check_policy(Leaky, max_examples=60)

    class Vanishing(research.HardSchedule):
        """A bound schedule that reaches 0: nothing left to calibrate noise to."""

        name = "vanishing"

        def bound(self, state):
            return self.initial_bound * 1e-200**state.round

    with pytest.raises(AssertionError, match="not > 0"):
        check_policy(Vanishing, {"initial_bound": 1e-200}, max_examples=60)


@pytest.mark.parametrize("name", sorted(fairclip.policies.BUILTIN))
def test_every_builtin_policy_passes_the_plugin_helper(name):
    check_policy(name, {"lower_bound": 0.1} if name == "bounded" else {}, max_examples=25)


def test_register_and_entry_points(research, tmp_path):
    register(research.HardSchedule)
    assert policy_parameters("hard-schedule") == {
        "normalize": False,
        "initial_bound": 1.0,
        "decay": 0.5,
        "floor": 1e-3,
    }
    with pytest.raises(PolicyConfigError, match="built-in"):
        register(research.HardSchedule, "bounded")
    with pytest.raises(PolicyConfigError, match="already registered"):
        register(type("Other", (research.HardSchedule,), {"name": "hard-schedule"}))

    # an installed package declares its policy in the entry-point group fairclip.policies
    info = tmp_path / "my_research-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-research\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[fairclip.policies]\nscheduled = my_research:HardSchedule\n")
    importlib.invalidate_caches()
    result = fairclip.simulate(
        scenario(research), overrides={"policy.name": "scheduled", "policy.initial_bound": 4.0}
    )
    np.testing.assert_allclose(result.rounds["clip_bound"], [4.0, 2.0, 1.0])
    assert "scheduled" in fairclip.policies.plugin_names()


def test_federated_dataset_from_arrays_checks_its_input():
    from fairclip.scenarios.data import iid

    x = np.zeros((6, 2))
    y = np.array([0, 1, 0, 1, 0, 1])
    test = {"test_x": np.zeros((2, 2)), "test_y": np.array([0, 1]), "test_cohorts": ["a", "b"]}
    data = fairclip.FederatedDataset.from_arrays(
        x, y, clients=[0, 0, 1, 1, 2, 2], cohorts=["a", "b", "a"], **test
    )
    assert data.num_clients == 3 and data.cohort_names == ["a", "b"] and data.num_classes == 2
    np.testing.assert_array_equal(data.client_cohorts, [0, 1, 0])
    np.testing.assert_array_equal(data.client_indices[1], [2, 3])
    with pytest.raises(ValueError, match="client 1 holds no examples"):
        fairclip.FederatedDataset.from_arrays(
            x, y, clients=[0, 0, 2, 2, 2, 2], cohorts=["a", "b", "a"], **test
        )
    with pytest.raises(ValueError, match="test cohort 'c'"):
        fairclip.FederatedDataset.from_arrays(
            x, y, clients=[0, 0, 1, 1, 2, 2], cohorts=["a", "b", "a"], **{**test, "test_cohorts": ["a", "c"]}
        )
    with pytest.raises(ValueError, match="integer class labels"):
        fairclip.FederatedDataset.from_arrays(
            x, y * 0.5, clients=[0, 0, 1, 1, 2, 2], cohorts=["a"] * 3, **test
        )
    with pytest.raises(ValueError, match="non-finite"):
        fairclip.FederatedDataset.from_arrays(
            x * np.nan, y, clients=[0] * 6, cohorts=["a"], **test | {"test_cohorts": ["a", "a"]}
        )
    split = iid(6, 3, np.random.default_rng(0))
    dealt = fairclip.FederatedDataset.from_arrays(x, y, clients=split, cohorts=["a", "b", "b"], **test)
    assert [len(rows) for rows in dealt.client_indices] == [2, 2, 2]
    assert json.dumps(dealt.cohort_names) == '["a", "b"]'


def test_plugins_are_documented_in_one_place():
    guide = (Path(__file__).resolve().parents[1] / "docs" / "plugins.md").read_text()
    methods = ["initial_state", "broadcast", "sensitivity", "contribution_bounds", "transform"]
    for name in [*methods, "report_size", "report_is_valid", "next_state", "Params", "check_policy"]:
        assert f"`{name}" in guide, name
    assert "fairclip.policies" in guide


def test_a_registration_another_process_cannot_load_fails_only_where_it_is_used():
    plugins.register("model", "generator", (n for n in range(3)))  # cloudpickle cannot pickle it
    state = plugins.snapshot()
    state["registered"]["dataset"]["garbled"] = b"not a pickle"
    plugins.restore(state)
    with pytest.raises(plugins.PluginError, match=r"'generator' was registered .* cannot be pickled"):
        plugins.resolve("model", "generator")
    with pytest.raises(plugins.PluginError, match=r"'garbled' was registered .* cannot be loaded here"):
        plugins.resolve("dataset", "garbled")


def test_federated_dataset_from_torch_datasets():
    import torch
    from torch.utils.data import TensorDataset

    generator = torch.Generator().manual_seed(0)
    train = TensorDataset(torch.randn(8, 3, generator=generator), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1]))
    test = TensorDataset(torch.randn(4, 3, generator=generator), torch.tensor([0, 1, 2, 1]))
    data = fairclip.FederatedDataset.from_torch(
        train,
        test,
        clients=np.arange(8) // 2,
        cohorts=["a", "b", "a", "b"],
        test_cohorts=["a", "a", "b", "b"],
    )
    assert data.num_clients == 4 and data.num_classes == 3 and data.input_shape == (3,)
    np.testing.assert_array_equal(data.train_x, train.tensors[0].numpy())
    np.testing.assert_array_equal(data.cohort_weights["b"], [0, 0, 1, 1])
    with pytest.raises(ValueError, match="the train dataset must give"):
        fairclip.FederatedDataset.from_torch(
            [1, 2], test, clients=[0, 0], cohorts=["a"], test_cohorts=["a"] * 4
        )


def test_a_policy_without_a_client_transform_is_refused_in_one_line():
    """A policy defines ``scales`` (row factors) or ``transform``; one with neither is refused
    where it is registered, naming what is missing."""
    from fairclip.policies import Policy, PolicyConfigError, PolicyParams, register

    class Silent(Policy):
        name = "silent"
        Params = PolicyParams

        def initial_state(self, dim):
            return None

        def broadcast(self, state):
            return {"bound": 1.0}

        def sensitivity(self, state):
            return 1.0

        def contribution_bounds(self, params, cohorts):
            return np.ones(cohorts.shape[0])

    with pytest.raises(PolicyConfigError, match=r"does not implement scales \(or transform\)"):
        register(Silent)
