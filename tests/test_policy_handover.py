"""Issue 67: one way to hand fairclip a policy -- a name, a class or an instance, the same in
``compare``, ``simulate``, :class:`fairclip.flower.DifferentialPrivacy` and a configuration's
``policy.name`` (:func:`fairclip.policies.resolve_policy`) -- shown under one name in every
output (:func:`fairclip.policies.display_name`); and progress from the Python API, off with
``progress=False``."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord
from flwr.serverapp.strategy import FedAvg

import fairclip
from fairclip import plugins
from fairclip import progress as progress_module
from fairclip.client.protocol import policy_reference
from fairclip.flower import DifferentialPrivacy
from fairclip.policies import (
    PolicyConfigError,
    build_policy,
    display_name,
    policy_name,
    register,
    resolve_policy,
)
from fairclip.scenarios.errors import ConfigError
from fairclip.strategies.bounded import BoundedAdaptiveClipping
from fairclip.strategies.constant import ConstantClipping

SMALL = {"training.rounds": 2, "federation.num_clients": 60, "privacy.noise_multiplier": 0.5}
"""A scenario of seconds: ``bimodal-mean`` (one point per client) with 60 clients, 2 rounds."""


class SlowConstant(ConstantClipping):
    """A plug-in: hard clipping at a fixed bound, under a name of its own."""

    name = "slow-constant"


class Shadow(ConstantClipping):
    """A plug-in that forgot its own name: ``constant`` is a built-in's."""


@pytest.fixture(autouse=True)
def _registrations():
    """Each test starts from this process's registrations and leaves them as it found them."""
    before = dict(plugins._REGISTERED["policy"])
    yield
    plugins._REGISTERED["policy"].clear()
    plugins._REGISTERED["policy"].update(before)


# ----- the resolver -------------------------------------------------------------------------------


def test_a_name_a_class_and_an_instance_resolve_to_the_same_policy():
    by_name = resolve_policy("bounded")
    by_class = resolve_policy(BoundedAdaptiveClipping)
    instance = BoundedAdaptiveClipping(lower_bound=0.2)
    by_instance = resolve_policy(instance)
    assert by_name.cls is by_class.cls is by_instance.cls is BoundedAdaptiveClipping
    assert by_name.name == by_class.name == by_instance.name == "bounded"
    assert by_name.reference == by_class.reference == by_instance.reference == "bounded"
    assert by_name.params is None and by_class.params is None
    assert by_instance.instance is instance and by_instance.params["lower_bound"] == 0.2
    path = resolve_policy("fairclip.strategies.bounded:BoundedAdaptiveClipping")
    assert path.cls is BoundedAdaptiveClipping and path.name == "bounded"


def test_a_plugin_class_is_registered_under_its_name_and_shows_it():
    resolved = resolve_policy(SlowConstant)
    assert resolved.name == resolved.reference == "slow-constant"
    assert plugins.registered("policy")["slow-constant"] is SlowConstant
    # its import path names the same policy, and shows the same name
    path = f"{__name__}:SlowConstant"
    assert resolve_policy(path).name == "slow-constant" and policy_name(path) == "slow-constant"
    assert display_name(SlowConstant) == "slow-constant"


def test_the_name_a_class_is_registered_under_is_its_display_name():
    register(Shadow, "shadow")  # its own name is a built-in's: registered under another one
    assert display_name(Shadow) == "shadow"
    assert resolve_policy(Shadow).reference == "shadow"
    assert policy_name(f"{__name__}:Shadow") == "shadow"


def test_a_class_whose_name_another_policy_holds_is_refused_in_one_line():
    assert display_name(Shadow) == f"{__name__}:Shadow"  # unregistered: its import path
    with pytest.raises(PolicyConfigError, match=r"its name 'constant' is taken by another policy"):
        resolve_policy(Shadow)


def test_a_class_defined_again_takes_over_its_registration():
    """A notebook cell run twice defines the class twice: the second is not a name clash."""
    first = resolve_policy(SlowConstant).cls
    again = type("SlowConstant", (ConstantClipping,), {"name": "slow-constant", "__module__": __name__})
    again.__qualname__ = "SlowConstant"
    assert resolve_policy(again).name == "slow-constant"
    assert plugins.registered("policy")["slow-constant"] is again is not first


@pytest.mark.parametrize(
    ("given", "shown"),
    [
        ("", "''"),
        (3, "3"),
        (int, "the class int"),
        (None, "None"),
        (ConfigRecord, "the class ConfigRecord"),
    ],
)
def test_anything_else_is_one_error_naming_what_was_given_and_what_is_accepted(given, shown):
    with pytest.raises(PolicyConfigError) as caught:
        resolve_policy(given)
    message = str(caught.value)
    assert "\n" not in message and f"(got {shown})" in message
    assert "a policy name" in message and "subclass of fairclip.policies.Policy" in message
    assert "an instance of one" in message
    assert isinstance(caught.value, fairclip.FairclipError)


def test_an_unknown_name_is_one_line_with_a_suggestion():
    with pytest.raises(PolicyConfigError, match=r"unknown policy 'bouned' \(did you mean 'bounded'\?\)"):
        resolve_policy("bouned")


def test_build_policy_takes_a_name_or_a_class():
    assert isinstance(build_policy(SlowConstant, {"initial_bound": 0.3}), SlowConstant)
    assert build_policy("constant", {"initial_bound": 0.3}).initial_bound == 0.3
    assert "slow-constant" not in plugins.registered("policy")  # building registers nothing


# ----- simulate -------------------------------------------------------------------------------


def _simulate(**options):
    options.setdefault("progress", False)
    overrides = {**SMALL, **options.pop("overrides", {})}
    return fairclip.simulate("bimodal-mean", overrides=overrides, **options)


def test_simulate_takes_a_name_a_class_or_an_instance_with_the_same_result():
    by_settings = _simulate(overrides={"policy.name": "constant", "policy.constant.initial_bound": 0.3})
    by_name = _simulate(policy="constant", overrides={"policy.constant.initial_bound": 0.3})
    by_class = _simulate(policy=ConstantClipping, overrides={"policy.initial_bound": 0.3})
    by_instance = _simulate(policy=ConstantClipping(initial_bound=0.3))
    in_overrides = _simulate(overrides={"policy.name": ConstantClipping(initial_bound=0.3)})
    for result in (by_name, by_class, by_instance, in_overrides):
        np.testing.assert_array_equal(result.model, by_settings.model)
        np.testing.assert_array_equal(result.rounds["clip_bound"], [0.3, 0.3])
        assert result.summary["policy"] == "constant"
        assert result.summary["config"]["policy"]["initial_bound"] == 0.3


def test_simulate_runs_a_plugin_instance_under_its_name():
    result = _simulate(policy=SlowConstant(initial_bound=0.25))
    assert result.summary["policy"] == "slow-constant"
    assert result.summary["config"]["policy"]["name"] == "slow-constant"
    np.testing.assert_array_equal(result.rounds["clip_bound"], [0.25, 0.25])


def test_an_instance_replaces_the_scenarios_own_parameters_for_its_policy():
    """bimodal-mean sets [strategy.bounded] (lower_bound 1.0): the instance's values run."""
    result = _simulate(policy=BoundedAdaptiveClipping(lower_bound=0.3, threshold_multiplier=2.0))
    assert result.summary["config"]["policy"]["lower_bound"] == 0.3
    assert result.summary["config"]["policy"]["threshold_multiplier"] == 2.0


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        (
            {"policy": ConstantClipping(initial_bound=0.3), "overrides": {"policy.initial_bound": 0.5}},
            r"policy.initial_bound: policy 'constant' is given as an instance, which carries its own",
        ),
        (
            {"policy": ConstantClipping(), "overrides": {"policy.constant.initial_bound": 0.5}},
            r"policy.constant.initial_bound: .* give them one way",
        ),
        (
            {"policy": "constant", "overrides": {"policy.name": "bounded"}},
            r"the policy is given twice \(policy= and policy.name\)",
        ),
    ],
)
def test_a_policy_or_its_parameters_given_twice_is_refused(options, problem):
    with pytest.raises(ConfigError, match=problem):
        _simulate(**options)


def test_simulate_refuses_what_is_not_a_policy_before_any_work():
    with pytest.raises(PolicyConfigError, match=r"a policy must be .* \(got 42\)"):
        _simulate(policy=42)


# ----- compare --------------------------------------------------------------------------------


def test_compare_takes_names_classes_and_instances_and_shows_one_name(tmp_path):
    comparison = fairclip.compare(
        "bimodal-mean",
        policies=[ConstantClipping, SlowConstant(initial_bound=0.25)],
        overrides={**SMALL, "policy.constant.initial_bound": 0.3},
        out=tmp_path / "sweep",
        progress=False,
    )
    assert set(comparison.table["policy"]) == {"none", "constant", "slow-constant"}
    assert sorted(comparison.rounds) == [
        "constant__eps-none__seed-0",
        "none__eps-none__seed-0",
        "slow-constant__eps-none__seed-0",
    ]
    np.testing.assert_array_equal(
        comparison.rounds["slow-constant__eps-none__seed-0"]["clip_bound"], [0.25] * 2
    )
    np.testing.assert_array_equal(comparison.rounds["constant__eps-none__seed-0"]["clip_bound"], [0.3] * 2)
    assert comparison.summaries["slow-constant__eps-none__seed-0"]["policy"] == "slow-constant"
    assert "slow-constant" in (tmp_path / "sweep" / "report.md").read_text()
    assert (tmp_path / "sweep" / "runs" / "slow-constant__eps-none__seed-0" / "summary.json").is_file()


def test_compare_shows_an_import_path_under_its_policys_name():
    path = f"{__name__}:SlowConstant"
    comparison = fairclip.compare("bimodal-mean", policies=[path], overrides=SMALL, progress=False)
    assert set(comparison.table["policy"]) == {"none", "slow-constant"}
    summary = comparison.summaries["slow-constant__eps-none__seed-0"]
    assert summary["policy"] == "slow-constant" and summary["config"]["policy"]["name"] == path


@pytest.mark.parametrize(
    ("policies", "problem"),
    [
        (["constant", ConstantClipping], "policies names constant twice"),
        (["constant", "fairclip.strategies.constant:ConstantClipping"], "policies names constant twice"),
        (["constant", object()], "a policy must be"),
        ("constant", "policies must be a list of policies"),
    ],
)
def test_compare_refuses_one_policy_twice_and_what_is_not_one(policies, problem):
    with pytest.raises(fairclip.FairclipError, match=problem):
        fairclip.compare("bimodal-mean", policies=policies, overrides=SMALL, progress=False)


def test_compare_refuses_an_instance_with_parameters_set_for_it_too():
    with pytest.raises(ConfigError, match=r"policy.slow-constant.initial_bound: .* give them one way"):
        fairclip.compare(
            "bimodal-mean",
            policies=[SlowConstant(initial_bound=0.25)],
            overrides={**SMALL, "policy.slow-constant.initial_bound": 0.5},
            progress=False,
        )


# ----- the Flower wrapper ---------------------------------------------------------------------


class _Grid:
    def get_node_ids(self) -> list[int]:
        return [1, 2, 3, 4]


def _wrapper(policy, params=None) -> DifferentialPrivacy:
    return DifferentialPrivacy(
        FedAvg(fraction_train=1.0), policy, params, num_clients=4, sample_rate=1.0, noise_multiplier=1.0,
        not_private_seed=0,
    )  # fmt: skip


@pytest.mark.parametrize(
    "policy",
    [
        ("constant", {"initial_bound": 0.3}),
        (ConstantClipping, {"initial_bound": 0.3}),
        (ConstantClipping(initial_bound=0.3), None),
        ("fairclip.strategies.constant:ConstantClipping", {"initial_bound": 0.3}),
    ],
)
def test_the_wrapper_takes_a_name_a_class_or_an_instance(policy, server_task_identity):
    wrapper = _wrapper(*policy)
    assert type(wrapper.policy) is ConstantClipping and wrapper.policy.initial_bound == 0.3
    assert wrapper.policy_name == "constant"
    config = ConfigRecord({})
    wrapper.configure_train(1, ArrayRecord({"w": Array(np.zeros(3))}), config, _Grid())
    assert config["fairclip.policy"] == "constant" and config["fairclip.broadcast.bound"] == 0.3


def test_the_wrapper_names_a_plugin_by_its_one_name(caplog):
    wrapper = _wrapper(SlowConstant, {"initial_bound": 0.3})
    assert wrapper.policy_name == "slow-constant"
    assert "slow-constant" not in plugins.registered("policy")  # nothing registered: one process
    # the client finds the class by its import path, and shows the same name
    reference = policy_reference(wrapper.policy)
    assert reference == f"{__name__}:SlowConstant" and policy_name(reference) == "slow-constant"
    with caplog.at_level(logging.INFO, logger="flwr"):
        logging.getLogger("flwr").propagate, before = True, logging.getLogger("flwr").propagate
        try:
            wrapper.summary()
        finally:
            logging.getLogger("flwr").propagate = before
    assert "policy 'slow-constant'" in caplog.text


@pytest.mark.parametrize(
    ("policy", "params", "problem"),
    [
        (
            ConstantClipping(),
            {"initial_bound": 0.3},
            r"policy 'constant' is an instance, which carries its own",
        ),
        (42, None, r"a policy must be .* \(got 42\)"),
        (int, None, r"\(got the class int\)"),
        ("", None, r"\(got ''\)"),
    ],
)
def test_the_wrapper_refuses_parameters_twice_and_what_is_not_a_policy(policy, params, problem):
    with pytest.raises(PolicyConfigError, match=problem):
        _wrapper(policy, params)


# ----- progress from the Python API ------------------------------------------------------------


@pytest.fixture(autouse=True)
def _no_terminal(monkeypatch):
    """Standard error is not a terminal here (pytest captures it), whatever the environment says."""
    for variable in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(variable, raising=False)


@pytest.fixture
def every_round(monkeypatch):
    monkeypatch.setattr(progress_module, "API_ROUND_SECONDS", 0.0)


def test_simulate_logs_its_progress_off_a_terminal(every_round, caplog, capsys):
    with caplog.at_level(logging.INFO, logger="fairclip"):
        _simulate(policy="constant", progress=None)
    lines = [record.getMessage() for record in caplog.records if record.name == "fairclip"]
    assert lines[-1].startswith("constant on bimodal-mean: 2/2 rounds done")
    assert capsys.readouterr().err == ""  # records, not lines of its own: logging decides


def test_compare_logs_each_run_off_a_terminal(caplog):
    with caplog.at_level(logging.INFO, logger="fairclip"):
        fairclip.compare("bimodal-mean", policies=[SlowConstant], overrides=SMALL)
    lines = [record.getMessage() for record in caplog.records if record.name == "fairclip"]
    assert len(lines) == 2 and lines[-1].startswith("compare runs: 2/2 runs done (slow-constant__eps-none")


def test_progress_true_writes_lines_to_stderr_and_false_nothing(every_round, caplog, capsys):
    with caplog.at_level(logging.INFO, logger="fairclip"):
        _simulate(policy="constant", progress=True)
        assert "constant on bimodal-mean: 2/2 rounds done" in capsys.readouterr().err
        _simulate(policy="constant", progress=False)
        fairclip.compare("bimodal-mean", policies=["constant"], overrides=SMALL, progress=False)
    assert capsys.readouterr().err == ""
    assert not [record for record in caplog.records if record.name == "fairclip"]


def test_progress_must_be_a_flag():
    with pytest.raises(TypeError, match="progress must be True, False or None"):
        _simulate(policy="constant", progress="yes")


def test_tune_logs_each_run_off_a_terminal_and_is_silent_when_asked(caplog, capsys):
    grid = {"training.client_lr": [0.1, 0.5]}
    settings = {"policy.name": "constant", "training.rounds": 2, "privacy.target_epsilon": 2.0}
    with caplog.at_level(logging.INFO, logger="fairclip"):
        fairclip.tune("demo", grid=grid, overrides=settings, seed=3, grid_baseline=False)
        lines = [record.getMessage() for record in caplog.records if record.name == "fairclip"]
        assert lines and all(line.startswith("tune runs: ") for line in lines)
        assert lines[-1].split(": ")[1].split(" ")[0] == f"{len(lines)}/{len(lines)}"
        caplog.clear()
        fairclip.tune("demo", grid=grid, overrides=settings, seed=3, grid_baseline=False, progress=False)
    assert not [record for record in caplog.records if record.name == "fairclip"]
    assert capsys.readouterr().err == ""
