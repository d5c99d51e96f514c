"""Old names keep working: ``[strategy]`` and ``strategy.*`` keys are read as ``[policy]`` and
``policy.*`` (issue 66, one name per concept), with a one-time note; both at once are refused."""

from __future__ import annotations

import json
import re
import shutil
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


# ---- outputs: `policy` columns and `policies` entries; files written before still read -------------


def _old_table(path) -> None:
    """Rewrite the table at ``path`` as fairclip wrote it before issue 66: ``strategy`` for ``policy``."""
    import pandas as pd

    table = pd.read_csv(path, keep_default_na=False)
    assert "policy" in table.columns and "strategy" not in table.columns
    table.rename(columns={"policy": "strategy"}).to_csv(path, index=False)


def _old_spec(path) -> None:
    """Rewrite the stored specification at ``path`` with ``strategies`` for ``policies``, in place."""
    spec = json.loads(path.read_text())
    assert "policies" in spec and "strategies" not in spec
    path.write_text(json.dumps({("strategies" if key == "policies" else key): v for key, v in spec.items()}))


def test_a_compare_folder_says_policy_and_one_written_before_resumes_unchanged(tmp_path):
    import pandas as pd

    import fairclip

    out = tmp_path / "sweep"
    options = {"overrides": {"training.rounds": 2}, "progress": False}
    fresh = fairclip.compare("demo", policies=["bounded"], epsilons=[4.0], out=out, **options)
    for name in ("summary.csv", "statistics.csv"):
        columns = list(pd.read_csv(out / name).columns)
        assert "policy" in columns and "strategy" not in columns, name
    assert "policy" in fresh.table.columns and "strategy" not in fresh.table.columns
    assert set(fresh.table["policy"]) == {"none", "bounded"}
    spec = json.loads((out / "sweep.json").read_text())
    assert spec["policies"] == ["bounded"] and "strategies" not in spec
    assert "strateg" not in (out / "report.md").read_text().lower()

    # the same folder as fairclip wrote it before the rename
    for name in ("summary.csv", "statistics.csv"):
        _old_table(out / name)
    _old_spec(out / "sweep.json")
    stamps = {path.parent.name: path.stat().st_mtime_ns for path in out.glob("runs/*/summary.json")}
    assert len(stamps) == 2
    ran = []
    resumed = fairclip.compare(out=out, mode="resume", on_run=lambda key, _: ran.append(key), progress=False)
    assert ran == []  # every finished run is reused: the old specification is the same sweep
    after = {path.parent.name: path.stat().st_mtime_ns for path in out.glob("runs/*/summary.json")}
    assert after == stamps
    pd.testing.assert_frame_equal(resumed.table, fresh.table)
    assert "strategy" not in pd.read_csv(out / "summary.csv").columns
    assert json.loads((out / "sweep.json").read_text())["policies"] == ["bounded"]
    # --extend over an old folder adds to its stored policies, and runs only what it adds
    _old_spec(out / "sweep.json")
    more = {"policies": ["constant"], "out": out, "mode": "extend", "on_run": lambda key, _: ran.append(key)}
    extended = fairclip.compare("demo", **more, **options)
    assert [key.split("__")[0] for key in ran] == ["constant"]
    assert json.loads((out / "sweep.json").read_text())["policies"] == ["bounded", "constant"]
    assert set(extended.table["policy"]) == {"none", "bounded", "constant"}


def test_every_reader_takes_the_old_column_and_entry_names(tmp_path):
    import pandas as pd

    from fairclip.sims.reproduce import reproduction as repro
    from fairclip.sims.sweeps.folder import Mode, canonical_spec, read_table, settle

    (tmp_path / "old.csv").write_text("strategy,seed\nbounded,0\n")
    assert list(read_table(tmp_path / "old.csv").columns) == ["policy", "seed"]
    (tmp_path / "both.csv").write_text("policy,strategy\nbounded,other\n")  # nothing is overwritten
    both = read_table(tmp_path / "both.csv").to_dict("records")
    assert both == [{"policy": "bounded", "strategy": "other"}]
    assert canonical_spec({"command": "compare", "strategies": ["a"], "seeds": 1}, quiet=True) == {
        "command": "compare",
        "policies": ["a"],
        "seeds": 1,
    }

    # a reproduction folder stored with `strategies` resumes as the same reproduction
    values = {"seeds": 1, "full_grid": None, "grid_limit": None, "max_rounds": 1, "overrides": None}
    folder = tmp_path / "reproduction"
    folder.mkdir()
    settle(folder, repro.reproduce_spec("zhao-dutch", **values, policies=["bounded"]), Mode.NEW)
    _old_spec(folder / "sweep.json")
    given = repro.reproduce_spec("zhao-dutch", **values, policies=["bounded"], explicit_only=True)
    assert settle(folder, given, Mode.RESUME)["policies"] == ["bounded"]
    _old_spec(folder / "sweep.json")
    more = repro.reproduce_spec("zhao-dutch", **values, policies=["constant"])
    assert settle(folder, more, Mode.EXTEND, merge=repro.merge_specs)["policies"] == ["bounded", "constant"]

    # a tuning curve stored with `strategies` is continued with its policies
    from fairclip.api import stored_tune_curve

    curve = tmp_path / "curve"
    curve.mkdir()
    (curve / "tuning-curve.json").write_text(
        json.dumps({"scenario": "demo", "strategies": ["constant"], "epsilons": [1.0], "grid": {}})
    )
    assert stored_tune_curve(curve)["policies"] == ["constant"]
    assert pd.read_csv(tmp_path / "old.csv").columns[0] == "strategy"  # the file itself is kept


def test_the_recorded_results_read_the_same_under_either_column_name(tmp_path):
    """The committed ``results/`` keep the column name they were written with (``strategy``
    before the rename, ``policy`` after); the results tool reads them through the one helper, so
    each folder shows the same under either name."""
    from tools import results

    folders = sorted(p for p in results.RESULTS_DIR.iterdir() if (p / "record.json").is_file())
    if not folders:
        pytest.skip("no results folder here (an installed copy): nothing recorded to check")
    old, new = tmp_path / "old", tmp_path / "new"
    written_with = set()
    for folder in folders:
        for copy in (old, new):
            shutil.copytree(folder, copy / folder.name)
        header = (folder / "reproduction.csv").read_text().split("\n")[0].split(",")
        assert ("strategy" in header) != ("policy" in header), header
        recorded = "strategy" if "strategy" in header else "policy"
        written_with.add(recorded)
        for copy, name_wanted in ((old, "strategy"), (new, "policy")):
            for name in ("reproduction.csv", "per_seed.csv", "fairest.csv"):
                path = copy / folder.name / name
                if path.is_file() and recorded != name_wanted:
                    path.write_text(path.read_text().replace(recorded, name_wanted, 1))
    assert "strategy" in written_with  # the old name is still among the committed results
    for folder in folders:
        shown = {
            copy: results.setup_markdown(copy / folder.name).replace(str(copy), "") for copy in (old, new)
        }
        assert shown[old] == shown[new]
        assert "| policy | ε (RDP / PRV) |" in shown[old] and "\n| `" in shown[old]
        assert results.agreement(old / folder.name) == results.agreement(new / folder.name)
    page = results.claims_page(old).replace(str(old), "")
    assert page == results.claims_page(new).replace(str(new), "")
    assert "| ε | rank | policy |" in page and "| `" in page


def test_a_setup_file_with_the_old_table_names_is_the_same_setup(tmp_path, monkeypatch):
    from fairclip.sims.reproduce import setups

    text = setups.builtin_setups()["xu-dutch"].read_text()
    assert "[policies.constant]" in text and "{ policy = " in text
    new = setups.load_setup("xu-dutch")
    old_text = text.replace("[policies.", "[strategies.").replace("{ policy = ", "{ strategy = ")
    (tmp_path / "xu-dutch.toml").write_text(old_text)
    monkeypatch.setattr(setups, "SETUP_DIR", tmp_path)
    assert setups.load_setup("xu-dutch") == new
    assert [s.name for s in new.policies] == ["none", "constant", "reweight", "per-cohort"]
    (tmp_path / "xu-dutch.toml").write_text(old_text + "\n[policies.extra]\npaper = {}\n")
    with pytest.raises(ConfigError, match="not both"):
        setups.load_setup("xu-dutch")
