"""Issue 64, item 6: Adult's preprocessing uses no statistic of the private rows by default.

The built-in scenarios scale Adult's numeric columns by their documented domains (``public``);
the reproductions keep their paper's scaling by the training rows' statistics, say so in their
notes, and their runs' summaries name the step as outside ε. Nothing here reads the data.
"""

from __future__ import annotations

import pytest

from fairclip.scenarios.config import builtin_scenarios, load_config, validate
from fairclip.scenarios.data.real_data import outside_epsilon
from fairclip.scenarios.errors import ConfigError
from fairclip.sims.reproduce import planning, setups

ADULT_SETUPS = {
    "esipova-adult": "standardize",
    "softadaclip-adult": "standardize",
    "softadaclip-adult-age": "standardize",
    "softadaclip-adult-complex": "standardize",
    "softadaclip-adult-complex-age": "standardize",
    "xu-adult": "minmax",
    "xu-adult-balanced": "minmax",
    "zhao-adult": "standardize",
}
"""Each reproduction on Adult and its paper's scaling, as recorded in results/reproductions."""


def adult_scenarios() -> list[str]:
    return [
        name
        for name in builtin_scenarios()
        if getattr(load_config(name, None, []).scenario, "dataset", None) == "adult"
    ]


def test_the_builtin_adult_scenarios_scale_by_public_domains():
    names = adult_scenarios()
    assert {"adult", "adult-per-example"} <= set(names)
    for name in names:
        spec = load_config(name, None, []).scenario
        assert spec.feature_scaling == "public", name
        assert outside_epsilon(spec) == [], name
    # a user may still ask for a paper's preprocessing, and is told it lies outside epsilon
    spec = load_config("adult", None, ["scenario.feature_scaling=standardize"]).scenario
    assert outside_epsilon(spec) == ["feature scaling by statistics of the training rows (standardize)"]
    by_age = ["scenario.protected=age", "scenario.cohorts.female.attribute=older"]
    by_age += ["scenario.cohorts.male.attribute=younger"]
    assert load_config("adult", None, by_age).scenario.age_split == "public"
    median = load_config("adult", None, [*by_age, "scenario.age_split=median"]).scenario
    assert outside_epsilon(median) == [
        "age groups split at the median age of the complete rows, test rows included"
    ]


def test_age_split_and_feature_scaling_are_refused_where_they_do_not_apply():
    with pytest.raises(ConfigError, match="age_split applies to protected = age only"):
        load_config("adult", None, ["scenario.age_split=median"])
    with pytest.raises(ConfigError, match="feature_scaling applies to the adult dataset only"):
        load_config("dutch", None, ["scenario.feature_scaling=standardize"])
    assert load_config("dutch", None, []).scenario.feature_scaling == "public"  # the default, unused
    with pytest.raises(ConfigError, match="balance_by applies to the adult dataset with balance = true only"):
        load_config("adult", None, ["scenario.balance=false", "scenario.balance_by=sex"])
    with pytest.raises(ConfigError, match="balance_by applies to the adult dataset with balance = true only"):
        load_config("dutch", None, ["scenario.balance_by=sex"])
    # seed 001: balanced by sex, grouped by age at the median (outside epsilon, and said so)
    by_age = ["scenario.protected=age", "scenario.cohorts.female.attribute=older"]
    by_age += ["scenario.cohorts.male.attribute=younger", "scenario.balance_by=sex"]
    by_age += ["scenario.age_split=median"]
    spec = load_config("adult", None, by_age).scenario
    assert spec.balance_by == "sex" and outside_epsilon(spec) == [
        "age groups split at the median age of the complete rows, test rows included"
    ]


@pytest.mark.parametrize("name", sorted(ADULT_SETUPS))
def test_a_reproduction_keeps_its_papers_scaling_and_says_it_is_outside_epsilon(name):
    setup = setups.load_setup(name)
    assert setup.settings["scenario.feature_scaling"] == ADULT_SETUPS[name]  # explicit, not the default
    planner = planning.Planner(setup, None, [], max_rounds=1, examples=lambda *_: 1000)
    for run in planner.final_runs(1, {}):
        spec = validate(run.raw).scenario
        assert spec.feature_scaling == ADULT_SETUPS[name]
        assert outside_epsilon(spec)[0].endswith(f"({ADULT_SETUPS[name]})")
    notes = " ".join(setup.notes.split())
    assert "statistics of the private rows" in notes and "outside epsilon" in notes
    assert f'scenario.feature_scaling = "{ADULT_SETUPS[name]}"' in notes
    if name.startswith("softadaclip-adult") and name.endswith("-age"):
        spec = validate(planner.final_runs(1, {})[0].raw).scenario
        assert spec.age_split == "median" and spec.protected == "age"
        assert spec.balance and spec.balance_by == "sex"  # softadaclip-adult's rows, grouped by age
        assert 'scenario.age_split = "median"' in notes


def test_every_reproduction_on_adult_is_listed():
    on_adult = {name for name in setups.builtin_setups() if setups.load_setup(name).scenario == "adult"}
    assert on_adult == set(ADULT_SETUPS)
