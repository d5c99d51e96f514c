"""Old names keep working: ``[strategy]`` and ``strategy.*`` keys are read as ``[policy]`` and
``policy.*`` (issue 66, one name per concept), with a one-time note; both at once are refused."""

from __future__ import annotations

import json
import re
import warnings

import pytest

from fairclip.scenarios.config import (
    OLD_NAME_NOTE,
    ConfigError,
    OldNameNote,
    apply_overrides,
    builtin_scenarios,
    canonical_assignments,
    canonical_mapping,
    load_config,
    read_toml,
    scenario_source,
    validate,
)
from fairclip.scenarios.stored import same_configuration


def _old(raw: dict) -> dict:
    """``raw`` with its ``[policy]`` table under the old name."""
    return {("strategy" if key == "policy" else key): value for key, value in raw.items()}


def test_an_old_table_resolves_to_the_same_configuration_with_a_note():
    raw = read_toml(builtin_scenarios()["demo"])
    assert "policy" in raw and "strategy" not in raw
    with pytest.warns(OldNameNote, match=re.escape(OLD_NAME_NOTE)):
        old = validate(_old(raw))
    assert old == validate(raw)
    assert "policy" in old.as_dict() and "strategy" not in old.as_dict()


def test_old_set_keys_resolve_to_the_same_configuration_with_a_note():
    new = load_config("demo", None, ["policy.name=adaptive", "policy.adaptive.bound_lr=0.3"])
    with pytest.warns(OldNameNote):
        old = load_config("demo", None, ["strategy.name=adaptive", "strategy.adaptive.bound_lr=0.3"])
    assert old == new and old.policy.params["bound_lr"] == 0.3
    assert canonical_mapping({"strategy.name": "x", "seed": 1}, quiet=True) == {"policy.name": "x", "seed": 1}
    assert canonical_assignments(["strategy.lower_bound=0.1"], quiet=True) == ["policy.lower_bound=0.1"]


def test_new_keys_give_no_note():
    with warnings.catch_warnings():
        warnings.simplefilter("error", OldNameNote)
        load_config("demo", None, ["policy.name=constant"])


@pytest.mark.parametrize(
    "make",
    [
        lambda: apply_overrides(
            scenario_source("demo", None), ["strategy.name=constant", "policy.initial_bound=2"]
        ),
        lambda: validate({**read_toml(builtin_scenarios()["demo"]), "strategy": {"name": "constant"}}),
        lambda: canonical_mapping({"strategy.name": "constant", "policy.name": "bounded"}, "--grid"),
    ],
    ids=["--set", "table", "grid"],
)
def test_both_names_at_once_are_one_config_error(make):
    with pytest.raises(ConfigError, match="not both") as caught:
        make()
    assert "\n" not in str(caught.value)


def test_a_stored_old_configuration_is_the_same_run(recwarn):
    config = load_config("demo", None, [])
    stored = json.loads(json.dumps(config.as_dict()))
    assert same_configuration(stored, config)
    assert same_configuration(_old(stored), config)  # a summary or checkpoint written before
    assert not [w for w in recwarn if issubclass(w.category, OldNameNote)]  # no one's choice: no note
    assert not same_configuration({**_old(stored), "policy": stored["policy"]}, config)


def test_the_command_line_notes_old_keys_once_and_refuses_both(cli, tmp_path):
    out = tmp_path / "run"
    args = ["run", "--scenario", "bimodal-mean", "--set", "training.rounds=2", "--out", str(out)]
    status, _, err = cli(*args, "--set", "strategy.name=constant", "--set", "strategy.initial_bound=2")
    assert status == 0, err
    assert err.count(f"fairclip: note: {OLD_NAME_NOTE}") == 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["policy"]["initial_bound"] == 2 and "strategy" not in summary["config"]

    status, _, err = cli(*args, "--set", "strategy.name=constant", "--set", "policy.initial_bound=2")
    assert status == 2 and err.count("\n") == 1, err
    assert "not both" in err

    status, _, err = cli(*args, "--set", "policy.target_quantil=0.5")  # did you mean, under the new name
    assert status == 2 and "policy.target_quantil" in err and "did you mean 'target_quantile'" in err
    status, _, err = cli(*args, "--set", "strategy.target_quantil=0.5")  # and under the old one
    assert (
        status == 2
        and err.count("\n") == 1
        and "policy.target_quantil:" in err
        and "'target_quantile'" in err
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["compare", "--scenario", "demo", "--scheduler", "here", "--backend", "local"], "not both"),
        (
            ["tune", "--scenario", "demo", "--backend", "mars", "--grid", "training.client_lr=0.1"],
            "local or ray",
        ),
        (["reproduce", "xu-dutch", "--backend", "local", "--address", "127.0.0.1:1"], "--scheduler ray"),
        (["reproduce", "xu-dutch", "--scheduler", "here", "--address", "127.0.0.1:1"], "--scheduler ray"),
        (["compare", "--scenario", "demo", "--policies", "bounded,bounded"], "policies names bounded twice"),
        (
            ["compare", "--scenario", "demo", "--strategies", "bounded,bounded"],
            "policies names bounded twice",
        ),
    ],
)
def test_old_flags_are_aliases_and_both_are_refused(cli, args, message):
    status, _, err = cli(*args)
    assert status == 2 and err.count("\n") == 1 and message in err, err


def test_the_api_takes_old_keywords_with_a_deprecation_warning():
    import fairclip

    old = pytest.warns(DeprecationWarning, match="strategies= is the old name of policies=")
    with old, pytest.raises(ConfigError, match="names no policy"):
        fairclip.compare("demo", strategies=[])
    with pytest.raises(ConfigError, match="not both"):
        fairclip.compare("demo", policies=["bounded"], strategies=["bounded"])
    config = load_config("bimodal-mean", None, [])
    old = pytest.warns(DeprecationWarning, match="backend= is the old name of executor=")
    with old, pytest.raises(ConfigError, match="executor must be local or ray"):
        fairclip.api.simulate_config(config, backend="mars")
