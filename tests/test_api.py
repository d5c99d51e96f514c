"""Issue 19, a first step: `fairclip.simulate` from Python gives what `fairclip run` writes."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

import fairclip
from fairclip.scenarios.errors import ConfigError

SETTINGS = {
    "policy.name": "adaptive",
    "training.rounds": 5,
    "federation.num_clients": 100,
    "privacy.target_epsilon": 4.0,
    "seed": 3,
}


def test_simulate_returns_what_fairclip_run_writes(cli, tmp_path):
    seen = []
    result = fairclip.simulate("demo", overrides=SETTINGS, on_round=lambda row: seen.append(row["round"]))
    sets = [arg for key, value in SETTINGS.items() for arg in ("--set", f"{key}={value}")]
    status, _, err = cli("run", "--scenario", "demo", *sets, "--out", str(tmp_path))
    assert status == 0, err

    assert seen == [1, 2, 3, 4, 5] and list(result.rounds.index) == seen
    written = pd.read_csv(tmp_path / "rounds.csv").set_index("round")
    for column in ("clip_bound", "noise_std", "epsilon", "minority/accuracy", "majority/median_norm"):
        np.testing.assert_allclose(result.rounds[column], written[column], rtol=1e-12, err_msg=column)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert list(result.cohorts.index) == ["majority", "minority"]
    for cohort, metrics in summary["cohorts"].items():
        assert result.cohorts.loc[cohort, "accuracy"] == pytest.approx(metrics["accuracy"], rel=1e-12)
    np.testing.assert_array_equal(result.model, np.load(tmp_path / "model.npy"))
    assert result.epsilon == pytest.approx(summary["epsilon"], rel=1e-12) and 3.9 < result.epsilon <= 4.0
    assert result.privacy["rounds"] == 5 and result.privacy["accountant"] == "prv"


def test_overrides_are_typed_and_validated_like_set():
    with pytest.raises(ConfigError, match=r"training\.rounds"):
        fairclip.simulate("demo", overrides={"training.rounds": "many"})
    with pytest.raises(ConfigError, match="no-such-policy"):
        fairclip.simulate("demo", overrides={"policy.name": "no-such-policy"})
    with pytest.raises(ConfigError, match="calibrates the noise multiplier"):  # it would go unused
        fairclip.simulate("demo", overrides={"privacy.target_epsilon": 2.0, "privacy.noise_multiplier": 1.0})
    none = fairclip.simulate("bimodal-mean", overrides={"policy.name": "none", "training.rounds": 2})
    assert none.epsilon == float("inf")


def test_import_fairclip_stays_light():
    program = "import sys, fairclip; print('torch' in sys.modules, callable(fairclip.simulate))"
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "True"]


def test_the_readme_example_runs_as_written():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("## Python API", 1)[1].split("\n## ", 1)[0]
    examples = [block.split("```", 1)[0] for block in section.split("```python\n")[1:]]
    assert len(examples) == 2
    namespace: dict = {}
    exec(compile(examples[0], "README.md (Python API)", "exec"), namespace)
    result = namespace["result"]
    assert result.privacy["rounds"] == 20 and result.epsilon <= 4.0

    mine: dict = {}
    exec(compile(examples[1], "README.md (Python API, your own data)", "exec"), mine)
    table = mine["comparison"].table
    assert set(table["policy"]) == {"none", "constant", "bounded"}
    assert set(table["cohort"]) == {"majority", "minority"}
    private = table[table["policy"] != "none"]
    assert private["epsilon"].between(3.5, 4.0).all()
    assert table.loc[table["policy"] == "none", "accuracy"].min() > 0.6  # the MLP learned


def test_the_python_api_example_runs(capsys):
    """examples/python_api.py: own data, model and policy, checked and compared from Python."""
    import runpy
    from pathlib import Path

    example = Path(__file__).resolve().parents[1] / "examples" / "python_api.py"
    comparison = runpy.run_path(str(example))["main"]()
    table = comparison.table
    assert set(table["policy"]) == {"none", "constant", "bounded", "decaying"}
    assert set(table["cohort"]) == {"north", "south", "east"}
    assert table.loc[table["policy"] != "none", "epsilon"].between(3.5, 4.0).all()
    assert "best for the worst-off cohort at ε = 4" in capsys.readouterr().out
