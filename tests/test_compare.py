"""`fairclip compare` on the demo: every file with the required columns, and --resume."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest

from fairclip.scenarios.config import apply_overrides, scenario_source
from fairclip.scenarios.errors import ConfigError
from fairclip.sims.compare import sweep
from fairclip.sims.executors import jobs as job_runner
from fairclip.sims.sweeps import runs as run_folders
from fairclip.sims.sweeps.plots import PLOTS

SHORT = ["--set", "training.rounds=3", "--set", "federation.num_clients=200"]
REQUIRED = [
    "policy",
    "target_epsilon",
    "epsilon",
    "seed",
    "cohort",
    "accuracy",
    "loss",
    "privacy_cost",
    "final_clip_bound",
]


def test_short_compare_writes_every_file(ray_session, cli, tmp_path):
    status, out, err = cli(
        "compare",
        "--scenario",
        "demo",
        *SHORT,
        "--policies",
        "adaptive,bounded",
        "--epsilons",
        "2,8",
        "--seeds",
        "2",
        "--out",
        str(tmp_path),
    )
    assert status == 0, err
    table = pd.read_csv(tmp_path / "summary.csv")
    assert list(table.columns[: len(REQUIRED)]) == REQUIRED
    # none x 2 seeds + 2 policies x 2 eps x 2 seeds, each with 2 cohorts
    assert len(table) == (2 + 2 * 2 * 2) * 2
    assert set(table["cohort"]) == {"majority", "minority"}
    private = table[table["policy"] != "none"]
    assert set(private["target_epsilon"]) == {2.0, 8.0}
    assert (private["epsilon"] <= private["target_epsilon"]).all()
    assert (private["epsilon"] >= 0.98 * private["target_epsilon"]).all()
    reference = table[table["policy"] == "none"].set_index(["seed", "cohort"])["accuracy"]
    for _, row in private.iterrows():
        assert row["privacy_cost"] == pytest.approx(reference[(row["seed"], row["cohort"])] - row["accuracy"])
    report = (tmp_path / "report.md").read_text()
    assert "## target ε = 2" in report and "## target ε = 8" in report
    assert "At ε = 2: " in report and "At ε = 8: " in report  # each with its best policy or tie
    assert report.count("for the worst cohort") == 2
    for plot in PLOTS:
        assert (tmp_path / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert plot in out
    assert str(tmp_path / "report.md") in out


def test_resume_recomputes_nothing_finished(ray_session, tmp_path):
    raw = apply_overrides(scenario_source("demo", None), ["training.rounds=2", "federation.num_clients=200"])
    runs = sweep.plan_runs(raw, ["constant", "adaptive"], [4.0], seeds=2)
    finished = []

    def interrupt_after_two(run, _result):
        finished.append(run)
        if len(finished) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sweep.execute(raw, runs, tmp_path, data_dir=None, address=None, on_result=interrupt_after_two)

    def is_finished(run):
        return run_folders.finished_summary(tmp_path / "runs" / run.key, run.config(raw)) is not None

    assert [run for run in runs if is_finished(run)] == sorted(finished, key=runs.index)
    stamps = {run.key: os.stat(tmp_path / "runs" / run.key / "summary.json").st_mtime_ns for run in finished}
    computed = sweep.pending_runs(raw, runs, tmp_path, resume=True)
    assert set(computed) == set(runs) - set(finished)
    sweep.execute(raw, computed, tmp_path, data_dir=None, address=None)
    for run in finished:
        assert os.stat(tmp_path / "runs" / run.key / "summary.json").st_mtime_ns == stamps[run.key]
    assert all(is_finished(run) for run in runs)
    assert not list(tmp_path.glob("runs/*/.*.tmp"))
    summary = json.loads((tmp_path / "runs" / runs[-1].key / "summary.json").read_text())
    assert summary["rounds_completed"] == 2
    assert sweep.pending_runs(raw, runs, tmp_path, resume=True) == []
    changed = apply_overrides(raw, ["training.client_lr=0.2"])
    with pytest.raises(ConfigError, match="another configuration"):
        sweep.pending_runs(changed, runs, tmp_path, resume=True)


def test_worker_threads_per_run_give_the_same_runs(ray_session, cli, tmp_path):
    """``--workers 2``: one Ray task of 2 CPUs per run, a local executor of 2 threads in each; the
    runs are bit for bit those of one-CPU tasks. More workers than the cluster's CPUs is exit 2."""
    args = ("compare", "--scenario", "demo", *SHORT, "--policies", "bounded", "--epsilons", "4")
    for workers in (1, 2):
        status, _, err = cli(*args, "--workers", str(workers), "--out", str(tmp_path / f"w{workers}"))
        assert status == 0, err
    keys = sorted(path.name for path in (tmp_path / "w1" / "runs").iterdir())
    assert len(keys) == 2  # none and bounded
    for key in keys:
        one, two = (tmp_path / f"w{w}" / "runs" / key / "rounds.csv" for w in (1, 2))
        assert one.read_bytes() == two.read_bytes()
    status, _, err = cli(*args, "--workers", "3", "--out", str(tmp_path / "w3"))
    assert status == 2
    # refused before the plan and the bar: the only line
    assert err == "fairclip: error: --workers 3 is more than the Ray cluster's 2 CPUs\n"
    assert not (tmp_path / "w3").exists()


def test_bad_compare_arguments_are_one_line(cli, tmp_path):
    for args in (
        ["--policies", "constant,nonsense"],
        ["--epsilons", "1,abc"],
        ["--epsilons", "-1"],
        ["--seeds", "0"],
    ):
        status, _, err = cli("compare", "--scenario", "demo", *args, "--out", str(tmp_path))
        assert status == 2, args
        assert len(err.strip().splitlines()) == 1 and err.startswith("fairclip: error:")


def _keys_and_stamps(out):
    return {path.parent.name: path.stat().st_mtime_ns for path in out.glob("runs/*/summary.json")}


def test_a_sweep_is_stored_and_resume_alone_continues_it(ray_session, cli, tmp_path):
    """Issue 18, point 2: `--resume` without the original options ran a different sweep and
    overwrote the results; a different sweep on the same folder replaced the other's runs."""
    first = ("compare", "--scenario", "demo", *SHORT, "--policies", "bounded", "--epsilons", "4")
    status, _, err = cli(*first, "--seeds", "2", "--out", str(tmp_path))
    assert status == 0, err
    spec = json.loads((tmp_path / "sweep.json").read_text())
    assert (spec["policies"], spec["epsilons"], spec["seeds"]) == (["bounded"], [4.0], 2)
    stamps = _keys_and_stamps(tmp_path)
    assert len(stamps) == 4  # none and bounded, 2 seeds each
    lost = sorted(stamps)[0]
    for path in (tmp_path / "runs" / lost).iterdir():
        path.unlink()

    status, _, err = cli("compare", "--out", str(tmp_path), "--resume")
    assert status == 0, err
    after = _keys_and_stamps(tmp_path)
    assert set(after) == set(stamps) and all(after[k] == stamps[k] for k in stamps if k != lost)
    assert sorted(pd.read_csv(tmp_path / "summary.csv")["seed"].unique()) == [0, 1]

    for options in (["--seeds", "1"], ["--seeds", "2", "--resume", "--policies", "constant"]):
        status, _, err = cli(*first, *options, "--out", str(tmp_path))
        assert status == 2 and len(err.strip().splitlines()) == 1, err
        assert "--extend" in err and "--replace" in err
    assert _keys_and_stamps(tmp_path) == after, "a refused sweep must not touch the folder"

    status, _, err = cli(*first[:-4], "--policies", "constant", "--epsilons", "4", "--seeds", "1",
                         "--extend", "--out", str(tmp_path))  # fmt: skip
    assert status == 0, err
    spec = json.loads((tmp_path / "sweep.json").read_text())
    assert (spec["policies"], spec["seeds"]) == (["bounded", "constant"], 2)
    extended = _keys_and_stamps(tmp_path)
    assert len(extended) == 6 and all(extended[k] == after[k] for k in after)
    # options left out of --extend keep the stored values: --seeds 2 adds no policy or ε
    status, _, err = cli(*first[:-4], "--seeds", "2", "--extend", "--out", str(tmp_path))
    assert status == 0, err
    spec = json.loads((tmp_path / "sweep.json").read_text())
    assert (spec["policies"], spec["epsilons"], spec["seeds"]) == (["bounded", "constant"], [4.0], 2)
    assert _keys_and_stamps(tmp_path) == extended

    status, _, err = cli(*first, "--seeds", "1", "--replace", "--out", str(tmp_path))
    assert status == 0, err
    assert len(_keys_and_stamps(tmp_path)) == 2
    assert json.loads((tmp_path / "sweep.json").read_text())["seeds"] == 1


def test_a_folder_in_use_is_refused(cli, tmp_path):
    from fairclip.sims.sweeps.folder import locked

    with locked(tmp_path):
        status, _, err = cli("compare", "--scenario", "demo", *SHORT, "--out", str(tmp_path))
    assert status == 2 and err.strip() == (
        f"fairclip: error: {tmp_path} is in use by another fairclip process (pid {os.getpid()}); wait for it"
    )
    assert not (tmp_path / "runs").exists()
    with locked(tmp_path):  # released when its holder is done
        pass


def test_resume_needs_a_stored_sweep(cli, tmp_path):
    status, _, err = cli("compare", "--out", str(tmp_path), "--resume")
    assert status == 2 and "holds no stored sweep" in err and len(err.strip().splitlines()) == 1
    status, _, err = cli("compare", "--resume", "--extend", "--out", str(tmp_path))
    assert status == 2 and "at most one of" in err


README_DEMO = Path(__file__).resolve().parents[1] / "runs" / "demo"
"""Where the README's first command writes the demo sweep (CI runs it just before the suite)."""


def demo_of_this_code(into: Path) -> bool:
    """Copy the README's demo folder into ``into`` where every run in it was made by this very
    commit of a clean checkout (its summaries' ``provenance.git_commit``), as CI's first command
    makes it moments before the suite; else leave ``into`` alone. Whether it was copied."""
    from fairclip.server.provenance import git_commit

    commit = git_commit()
    summaries = list(README_DEMO.glob("runs/*/summary.json"))
    if commit is None or commit.endswith("+dirty") or not summaries:
        return False
    if any(json.loads(path.read_text())["provenance"].get("git_commit") != commit for path in summaries):
        return False
    shutil.copytree(README_DEMO, into)
    return True


@pytest.mark.slow
def test_the_demo_shows_who_pays_for_clipping_and_that_noise_matters(ray_session, cli, tmp_path):
    """Issue 18, point 11: the README's demo sweep. On every seed and at both ε the minority
    pays more under `adaptive` than under `bounded`, and accuracy moves with ε: the DP noise
    costs `constant` and `bounded` more at ε = 1 than at ε = 8.

    The sweep is the README's command. Where that command has just run on this commit (CI runs
    it before the suite: 4 minutes on 2 cores), its folder is continued with ``--resume``, which
    refuses another sweep's specification and each stored run whose configuration differs, and
    recomputes the tables from the stored runs; elsewhere the sweep runs here."""
    args = ("--policies", "constant,adaptive,bounded", "--epsilons", "1,8", "--seeds", "3")
    out = tmp_path / "demo"
    resume = ("--resume",) if demo_of_this_code(out) else ()
    status, _, err = cli("compare", "--scenario", "demo", *args, "--out", str(out), *resume)
    assert status == 0, err
    table = pd.read_csv(out / "summary.csv")
    minority = table[table["cohort"] == "minority"].pivot_table(
        index=["target_epsilon", "seed"], columns="policy", values="privacy_cost"
    )
    private = minority.drop(index=math.inf, level="target_epsilon")
    assert len(private) == 6
    assert (private["adaptive"] > private["bounded"] + 0.02).all(), private
    worst = table[table["policy"] != "none"].groupby(["policy", "target_epsilon", "seed"])["accuracy"].min()
    by_epsilon = worst.groupby(["policy", "target_epsilon"]).mean()
    for policy in ("constant", "bounded"):
        assert by_epsilon[(policy, 1.0)] < by_epsilon[(policy, 8.0)] - 0.01, by_epsilon


def test_resume_accepts_a_run_stored_before_a_key_was_added_at_its_default(tmp_path):
    """A run finished before fairclip gained a configuration key (stored without it) is the same
    configuration when that key is at its default; a different value is still refused."""
    import json

    from fairclip.atomic import json_normalised
    from fairclip.scenarios.config import ConfigError, load_config
    from fairclip.sims.sweeps.runs import finished_summary

    config = load_config("demo", None, ["training.rounds=2"])
    stored = json_normalised(config.as_dict())
    del stored["training"]["weight_decay"]  # a key added since that run
    (tmp_path / "summary.json").write_text(json.dumps({"config": stored, "epsilon": 1.0}))
    assert finished_summary(tmp_path, config)["epsilon"] == 1.0
    other = load_config("demo", None, ["training.rounds=2", "training.weight_decay=0.1"])
    with pytest.raises(ConfigError, match="another configuration"):
        finished_summary(tmp_path, other)


def test_resume_accepts_a_run_that_stored_the_value_a_machine_dependent_default_takes_here(tmp_path):
    """Runs made while ``training.one_step_rows`` defaulted to 32 stored 32; unset, it is 32 on
    the CPU, so such a run is the same configuration here, and a stored 64 is still refused."""
    import json

    from fairclip.atomic import json_normalised
    from fairclip.scenarios.config import ConfigError, load_config
    from fairclip.sims.sweeps.runs import finished_summary

    config = load_config("demo", None, ["training.rounds=2", "training.device=cpu"])
    assert config.training.one_step_rows is None
    stored = json_normalised(config.as_dict())
    for rows, reusable in ((32, True), (64, False), (None, True)):
        stored["training"]["one_step_rows"] = rows
        (tmp_path / "summary.json").write_text(json.dumps({"config": stored, "epsilon": 1.0}))
        if reusable:
            assert finished_summary(tmp_path, config)["epsilon"] == 1.0
        else:
            with pytest.raises(ConfigError, match="another configuration"):
                finished_summary(tmp_path, config)
    explicit = load_config(
        "demo", None, ["training.rounds=2", "training.device=cpu", "training.one_step_rows=64"]
    )
    with pytest.raises(ConfigError, match="another configuration"):  # stored unset, i.e. 32 here
        finished_summary(tmp_path, explicit)


@pytest.mark.parametrize("ray", [True, False], ids=["ray", "here"])
def test_jobs_appended_while_results_come_in_are_simulated_too(ray_session, tmp_path, ray):
    """What ``fairclip reproduce`` relies on to start a policy's final runs once its grid has
    finished: a job appended to the list between two results runs as well, on Ray as here."""
    raw = apply_overrides(scenario_source("demo", None), ["training.rounds=2", "federation.num_clients=200"])
    jobs = [("first", raw)]
    seen = []
    results = job_runner.simulate_jobs(jobs, data_dir=None, ray=ray)
    for item, result in results:
        seen.append((item, result["summary"]["seed"], result["summary"]["rounds_completed"]))
        if item == "first":
            jobs.append(("appended", apply_overrides(raw, ["seed=7"])))
    assert seen == [("first", raw.get("seed", 0), 2), ("appended", 7, 2)]
