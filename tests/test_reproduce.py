"""`fairclip reproduce`: the setup list, a few rounds of every setup, the flagging rule, bad names.

The setups read the benchmark files from ``$FAIRCLIP_DATA`` (default ``../shared/data`` beside the
repository); a setup whose files are absent is skipped with the reason. Each smoke run caps
every run at one round and the grid at one value per axis: it checks the plumbing, not numbers.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from fairclip.scenarios.config import validate
from fairclip.scenarios.data import DATASET_FILES
from fairclip.scenarios.errors import ConfigError
from fairclip.sims.reproduce import claims as claims_module
from fairclip.sims.reproduce import planning, tables
from fairclip.sims.reproduce import reproduction as repro
from fairclip.sims.reproduce import setups as setup_files
from tools import results

DATA_DIR = Path(os.environ.get("FAIRCLIP_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data")
SMOKE_TEST_ROWS = 500
"""Evaluation rows of a smoke run: the 10,000 MNIST test images through galli-mnist's CNN took
2.5 s a run, 59 of the 87 s its 24 one-round runs took."""
DATASET_OF = {"adult": "adult", "dutch": "dutch", "skewed-mnist": "mnist", "fashion-mnist": "fashion-mnist"}


def skip_without_data(setup: setup_files.Setup) -> None:
    """Skip, with the reason, when a dataset file of ``setup`` is absent."""
    for relative in DATASET_FILES[DATASET_OF[setup.scenario]]:
        if not (DATA_DIR / relative).is_file():
            pytest.skip(f"{DATA_DIR / relative} is absent: set FAIRCLIP_DATA to the benchmark data folder")


def expected_rows(setup, policies: list[str] | None = None) -> int:
    """The rows of a reproduction's table of ``policies`` (all of the setup's): each metric per
    target ε (a non-private policy's once), and each paired metric for every policy but the
    reference, where the reference ran."""
    policies = [s.name for s in setup.policies] if policies is None else policies
    non_private = {s.name for s in setup.policies if s.policy_name == "none"}
    reference = tables.reference_policy(setup)
    total = 0
    for name in policies:
        times = 1 if name in non_private else len(setup.epsilons)
        paired = len(setup.paired_metrics) if name != reference and reference in policies else 0
        total += times * (len(setup.metrics) + paired)
    return total


def test_list_names_every_setup(cli):
    status, out, _ = cli("reproduce", "--list")
    assert status == 0
    for name in ("esipova-adult", "esipova-dutch", "esipova-skewed-mnist", "zhao-adult", "zhao-dutch"):
        assert name in out


def test_unknown_setup_is_one_line_and_exit_2(cli):
    status, _out, err = cli("reproduce", "no-such-setup")
    assert status == 2
    assert err.count("\n") == 1 and err.startswith("fairclip: error: ")  # no blank line before it
    assert "unknown reproduction 'no-such-setup'" in err and "esipova-adult" in err


@pytest.mark.parametrize("mode", [[], ["--resume"], ["--extend", "--seeds", "3"]])
def test_a_missing_name_is_one_line_and_exit_2_where_no_folder_names_it(cli, tmp_path, mode):
    """Only a reproduction folder stored in --out can name the setup (to resume or extend)."""
    status, _out, err = cli("reproduce", *mode, "--out", str(tmp_path / "empty"))
    assert status == 2
    assert err.strip().count("\n") == 0 and "give a reproduction NAME" in err
    assert not (tmp_path / "empty").exists()


@pytest.mark.parametrize("name", sorted(setup_files.builtin_setups()))
def test_every_setup_runs_a_few_steps(ray_session, cli, tmp_path, name, request):
    setup = setup_files.load_setup(name)
    skip_without_data(setup)
    out = tmp_path / name
    resnet = setup.settings.get("scenario.model") == "zhao-resnet18"
    if resnet:
        request.getfixturevalue("one_memory_heavy_test_at_a_time")  # a run takes 7.5-9.5 GB
    # A few steps of small batches. An image's per-example gradients cost 10-30 ms of CPU on the
    # CNNs (zhao-fashion-mnist's 18 runs took 14 s each at 64, nine tenths of it training) and
    # 0.23 s on ResNet-18 (its notes), so image batches are 16 examples (ResNet-18: two of its
    # calls of 8 rows, training.one_step_rows); tabular batches 64.
    image = setup.scenario in {"skewed-mnist", "fashion-mnist"}
    max_batch = 16 if image else 64
    args = ["reproduce", name, "--seeds", "1", "--max-rounds", "1", "--grid-limit", "1", "--out", str(out)]
    args += ["--max-batch", str(max_batch), "--data-dir", str(DATA_DIR)]
    overrides = [f"scenario.test_limit={SMOKE_TEST_ROWS}"]  # evaluation took most of an image run
    if setup.settings.get("training.train_loss") is True:  # and each training image's loss 85 % of the rest
        overrides.append(f"training.train_loss_limit={SMOKE_TEST_ROWS}")
    for override in overrides:
        args += ["--set", override]
    if setup.scenario == "skewed-mnist" or resnet:
        # as their notes advise: one run at a time, two threads each (ResNet-18's 64 block sums
        # of 11.2 M float64 take 5.7 GB a run)
        args += ["--workers", "2"]
    policies = [s.name for s in setup.policies]
    if resnet:
        # ResNet-18's runs cost 20 s each even at one round of 16 examples: its plumbing (the
        # model, its memory, its grid and its three epsilons) is checked with the main method
        # alone; every policy runs these steps on the other setups, whose code path is the same
        policies = ["bounded"]
        args += ["--policies", "bounded"]
    status, stdout, err = cli(*args)
    assert status == 0, err
    assert "wall time" in stdout
    table = pd.read_csv(out / "reproduction.csv", keep_default_na=False)
    assert list(table.columns) == tables.COLUMNS
    assert sorted(set(table["policy"])) == sorted(policies)
    assert len(table) == expected_rows(setup, policies)
    absolute = table["policy"] == setup.relative_to  # a reference's own rows: absolute values
    sources = {
        f"{cohort}/{metric}" for name, (cohort, metric) in setup.metrics.items() if setup.changes(name)
    }
    assert set(table.loc[~absolute, "metric"]) == set(setup.metric_names)
    assert set(table.loc[absolute, "metric"]) == (sources | setup.absolute if setup.relative_to else set())
    assert (table["seeds"] == 1).all()
    means = pd.to_numeric(table["fairclip_mean"])  # "" (no value): NaN
    paired = table["metric"].isin([metric.name for metric in setup.paired_metrics])
    own = table["metric"].isin(setup.absolute)  # Table 2's losses and norms: positive, not rates
    # one round's batch of 16 may hold no example of a small class (xu-mnist's 500 eights): its
    # last-epoch loss and norm are then unknown, never 0; every other number is there
    assert (means[own].dropna() > 0).all() and (means[own].notna().any() or not own.any())
    assert means[~own].notna().all()
    # accuracies lie in [0, 1]; a loss need not
    rates = ~table["metric"].str.contains("loss") & ~paired & ~own
    levels = means[absolute & rates] if setup.relative_to else means[rates]
    assert ((levels >= 0) & (levels <= 1)).all()
    assert (means[rates].abs() <= 1).all()  # a change against the reference lies in [-1, 1]
    assert setup.relative_to or (means[~rates & ~paired] >= 0).all()
    costs = paired & table["metric"].str.startswith("privacy_cost")  # accuracy lost: in [-1, 1]
    assert (means[costs].abs() <= 1).all() and means[paired].map(math.isfinite).all()
    report = (out / "reproduction.md").read_text()
    assert setup.title in report and "Wall time" in report
    smoke = "Smoke run (not a reproduction): at most 1 rounds per run; "
    smoke += f"expected batches of at most {max_batch} examples"
    grid_limit = "; only the first 1 values of each grid axis" if setup.has_grid else ""
    assert f"{smoke}{grid_limit}." in report  # the grid's limit only where the setup has a grid
    said = "Overrides (`--set`), applied to every run on top of the setup: "
    assert said + ", ".join(f"`{o}`" for o in overrides) + "." in report
    summaries = [json.loads(path.read_text()) for path in out.glob("runs/*/summary.json")]
    assert summaries and all(s["config"]["training"]["rounds"] == 1 for s in summaries)
    if setup.settings.get("training.train_loss") in (
        "last-epoch",
        "last-epoch-examples",
    ):  # 1 round: the last epoch
        assert all(s["train_loss_rounds"] == 1 for s in summaries)
    assert all(s["config"]["scenario"]["test_limit"] == SMOKE_TEST_ROWS for s in summaries)
    rates = {
        s["config"]["federation"]["sample_rate"] * s["config"]["federation"]["num_clients"] for s in summaries
    }
    assert all(rate <= max_batch + 1e-9 for rate in rates)
    if setup.has_grid:
        assert any(key.startswith("grid__") for key in os.listdir(out / "runs"))


def test_sample_level_mapping():
    setup = setup_files.load_setup("esipova-adult")
    assert planning.sample_level_settings(setup, 22400, None) == {
        "federation.num_clients": 22400,
        "federation.sample_rate": 256 / 22400,
        "training.rounds": 1750,
    }
    full = setup_files.load_setup("zhao-adult")
    settings = planning.sample_level_settings(full, 22400, None)
    assert settings["federation.sample_rate"] == 1.0 and settings["training.rounds"] == 40
    assert len(planning.grid_points(full, full.policies[1], full=True, limit=None)) == 200
    assert len(planning.grid_points(full, full.policies[1], full=False, limit=None)) == 20


def test_flagging_on_constructed_numbers():
    # ± 2 points without a paper error
    assert not tables.outside(0.80, None, 0.815)
    assert tables.outside(0.80, None, 0.825)
    assert tables.outside(0.80, None, 0.775)
    # ± 2 combined standard errors when both sides give one (± 2 points when either does not)
    assert not tables.outside(0.80, 0.01, 0.819)
    assert not tables.outside(0.80, 0.01, 0.826, 0.01)
    assert tables.outside(0.80, 0.001, 0.803, 0.001)
    # no paper number: never flagged; a diverged run (NaN) is flagged
    assert not tables.outside(None, None, 0.1)
    assert tables.outside(0.80, None, math.nan)


def test_a_paper_error_of_zero_is_refused_in_one_line(tmp_path, monkeypatch):
    """A stored standard error of 0 would count as none (± 2 points: 0.02 in a loss); a paper
    that prints ± 0.000 gives one below 0.0005, which the setup file stores instead."""
    assert tables.tolerance(0.0005, 0.0003) < tables.tolerance(0.0, 0.0003) == tables.POINTS
    text = setup_files.builtin_setups()["esipova-dutch"].read_text()
    line = "paper_stderr = { accuracy_male = 0.002, accuracy_female = 0.0005,"
    assert text.count(line) == 1
    (tmp_path / "esipova-dutch.toml").write_text(text.replace(line, line.replace("0.0005", "0.0")))
    monkeypatch.setattr(setup_files, "SETUP_DIR", tmp_path)
    refused = r"policies.none.paper_stderr.accuracy_female must be > 0 \(got 0.0\)"
    with pytest.raises(ConfigError, match=refused):
        setup_files.load_setup("esipova-dutch")


def test_absolute_metrics_are_each_runs_own_value_beside_paired_changes():
    """``[setup.absolute_metrics]`` (xu-adult's Table 2) in a ``relative_to`` setup: the
    accuracy changes are differences against SGD of the same seed, the losses and norms each
    run's own values, under their own names for SGD too, in the table and in per_seed.csv."""
    setup = setup_files.load_setup("xu-adult")
    assert setup.relative_to == "none" and "loss_male" in setup.absolute
    assert setup.changes("accuracy_change_male") and not setup.changes("gradient_norm_male")
    runs, summaries = [], {}
    for policy, accuracy, loss, norm in (("none", 0.80, 0.50, 0.11), ("constant", 0.70, 0.66, 0.40)):
        for seed in (0, 1):
            key = f"{policy}-{seed}"
            runs.append(setup_files.Run(key, policy, None, seed, {}))
            group = {"accuracy": accuracy, "train_loss": loss + 0.01 * seed, "train_mean_update_norm": norm}
            sigma = 0.0 if policy == "none" else 1.0
            summaries[key] = {
                "epsilon": "inf" if policy == "none" else 2.66,
                "overall": {"accuracy": accuracy},
                "cohorts": {"male": group, "female": dict(group)},
                "privacy": {
                    "effective_noise_multiplier": sigma,
                    "sample_rate": 0.007,
                    "rounds": 2827,
                    "delta": 1e-6,
                },
            }
    rows = {(r["policy"], r["metric"]): r for r in tables.table_rows(setup, runs, summaries)}
    assert rows[("constant", "accuracy_change_male")]["fairclip_mean"] == pytest.approx(-0.10)
    assert rows[("none", "male/accuracy")]["fairclip_mean"] == pytest.approx(0.80)
    assert rows[("constant", "loss_male")]["fairclip_mean"] == pytest.approx(0.665)  # not 0.16
    assert rows[("none", "loss_male")]["fairclip_mean"] == pytest.approx(0.505)  # not 0, and by name
    assert rows[("constant", "gradient_norm_male")]["fairclip_mean"] == pytest.approx(0.40)
    assert not rows[("constant", "loss_male")]["outside"]  # the paper's 0.68, within 2 points
    assert rows[("constant", "gradient_norm_male")]["outside"] is False  # 0.41
    assert rows[("none", "gradient_norm_male")]["outside"]  # 0.11 against 0.08
    per_seed = {(r["policy"], r["seed"]): r for r in tables.per_seed_rows(setup, runs, summaries)}
    assert per_seed[("none", 1)]["loss_male"] == pytest.approx(0.51)
    assert per_seed[("none", 1)]["accuracy_change_male"] == 0
    assert per_seed[("constant", 1)]["loss_male"] == pytest.approx(0.67)


def test_a_metric_named_twice_is_refused(tmp_path, monkeypatch):
    text = setup_files.builtin_setups()["xu-adult"].read_text()
    line = 'loss_male = "male/train_loss"\n'
    assert text.count(line) == 1
    twice = text.replace(line, line + 'accuracy_change_male = "male/accuracy"\n')
    (tmp_path / "xu-adult.toml").write_text(twice)
    monkeypatch.setattr(setup_files, "SETUP_DIR", tmp_path)
    with pytest.raises(ConfigError, match="metric accuracy_change_male is named twice"):
        setup_files.load_setup("xu-adult")


def test_table_rows_flag_constructed_summaries():
    setup = setup_files.load_setup("esipova-dutch")
    runs, summaries = [], {}
    for policy, male in (("none", 0.799), ("constant", 0.70)):
        for seed in (0, 1):
            key = f"{policy}-{seed}"
            runs.append(setup_files.Run(key, policy, None, seed, {}))
            cohorts = {
                "male": {"accuracy": male + 0.001 * seed, "train_loss": 0.52},
                "female": {"accuracy": 0.865, "train_loss": 0.45},
            }
            sigma = 0.0 if policy == "none" else 1.0
            claim = {"effective_noise_multiplier": sigma, "sample_rate": 0.005, "rounds": 400, "delta": 1e-6}
            summaries[key] = {
                "epsilon": "inf" if policy == "none" else 2.0,
                "cohorts": cohorts,
                "privacy": claim,
            }
    rows = {(r["policy"], r["metric"]): r for r in tables.table_rows(setup, runs, summaries)}
    assert not rows[("none", "accuracy_male")]["outside"]
    assert rows[("constant", "accuracy_male")]["outside"]  # 0.70 vs the paper's 0.760
    assert not rows[("constant", "accuracy_female")]["outside"]
    assert not rows[("constant", "loss_male")]["outside"]  # 0.52: the paper's training loss
    assert rows[("none", "loss_male")]["outside"]  # 0.52 vs the paper's 0.499 ± 0.000: ± 2 points
    assert rows[("none", "accuracy_male")]["epsilon"] == "inf"
    assert rows[("constant", "accuracy_male")]["epsilon"] == 2.0
    assert rows[("constant", "accuracy_male")]["fairclip_stderr"] == pytest.approx(0.0005)
    assert rows[("constant", "accuracy_male")]["seeds"] == 2
    # both seed papers report Opacus' RDP ε; the table gives it and PRV's for every run
    from fairclip.strategies.accounting import calibrate, epsilon
    from fairclip.strategies.errors import PolicyConfigError

    constant = rows[("constant", "accuracy_male")]
    assert constant["epsilon_rdp"] == float(f"{epsilon(1.0, 0.005, 400, 1e-6, 'rdp'):.4g}")
    assert constant["epsilon_prv"] == float(f"{epsilon(1.0, 0.005, 400, 1e-6, 'prv'):.4g}")
    assert constant["epsilon_rdp"] > constant["epsilon_prv"] > 0
    assert (
        rows[("none", "accuracy_male")]["epsilon_rdp"]
        == "inf"
        == rows[("none", "accuracy_male")]["epsilon_prv"]
    )
    # Esipova et al.'s ε are RDP's; Zhao et al.'s ε 0.1 lies below what Opacus' RDP can certify
    # at δ 1e-5 (its orders end at 63), so those targets are calibrated with PRV (setup notes)
    accountants = {
        name: setup_files.load_setup(name).settings["privacy.accountant"]
        for name in setup_files.builtin_setups()
    }
    tabular_zhao = {"zhao-adult", "zhao-dutch"}  # their image setups (epsilon >= 1) use RDP, as the paper
    assert accountants == {name: "prv" if name in tabular_zhao else "rdp" for name in accountants}
    with pytest.raises(PolicyConfigError):
        calibrate(0.1, 1.0, 40, 1e-5, "rdp", releases_reports=False)


def test_a_non_private_policy_is_shown_at_infinite_epsilon_beside_a_target():
    """In a setup with a target ε (softadaclip-adult: 8), the non-private ``none`` runs are not
    at that ε: their rows, and the list of flags, say ε inf (they used to say 8.0)."""
    setup = setup_files.select_policies(setup_files.load_setup("softadaclip-adult"), ["none", "dpsgd-c0.1"])
    runs, summaries = [], {}
    for policy in ("none", "dpsgd-c0.1"):
        for seed in (0, 1):
            key = f"{policy}-{seed}"
            runs.append(setup_files.Run(key, policy, 8.0, seed, {}))
            sigma = 0.0 if policy == "none" else 1.0
            summaries[key] = {
                "epsilon": "inf" if policy == "none" else 7.99,
                "overall": {"accuracy": 0.5, "f1": 0.5, "loss": 0.6, "cohort_loss_gap": 0.1},
                "cohorts": {
                    "male": {"accuracy": 0.5, "loss": 0.65},
                    "female": {"accuracy": 0.5, "loss": 0.55},
                },
                "privacy": {
                    "effective_noise_multiplier": sigma,
                    "sample_rate": 0.005,
                    "rounds": 400,
                    "delta": 1e-5,
                },
            }
    rows = tables.table_rows(setup, runs, summaries)
    assert {(r["policy"], r["epsilon"]) for r in rows} == {("none", "inf"), ("dpsgd-c0.1", 8.0)}
    report = tables.markdown(setup, rows, 1.0, [])
    assert "| `none` | inf | inf / inf | accuracy |" in report
    assert "`none` accuracy (ε inf)" in report and "`dpsgd-c0.1` accuracy (ε 8.0)" in report


def test_a_non_private_reference_runs_at_each_target_but_is_tabulated_once():
    """zhao-dutch has three targets and a non-private reference (``none``): its runs at each target
    are the same runs, so the table shows them once, and the fairest policy is ranked at each ε
    against the reference's runs of that ε."""
    setup = setup_files.select_policies(setup_files.load_setup("zhao-dutch"), ["none", "constant"])
    runs, summaries = [], {}
    for policy, accuracy in (("none", 0.83), ("constant", 0.80)):
        for epsilon in (0.1, 0.2, 0.5):
            for seed in (0, 1):
                key = f"{policy}-{epsilon}-{seed}"
                runs.append(setup_files.Run(key, policy, epsilon, seed, {}))
                value = accuracy + (epsilon / 100 if policy == "constant" else 0) + seed / 1000
                summaries[key] = {
                    "epsilon": "inf" if policy == "none" else epsilon,
                    "cohorts": {
                        "marital-other": {"accuracy": value},
                        "marital-4": {"accuracy": value - 0.01},
                    },
                    "privacy": {
                        "effective_noise_multiplier": 0.0 if policy == "none" else 5.0,
                        "sample_rate": 0.5,
                        "rounds": 80,
                        "delta": 1e-5,
                    },
                }
    rows = tables.table_rows(setup, runs, summaries)
    assert [(r["policy"], r["epsilon"]) for r in rows if r["policy"] == "none"] == [("none", "inf")] * 2
    assert {r["epsilon"] for r in rows if r["policy"] == "constant"} == {0.1, 0.2, 0.5}
    per_seed = pd.DataFrame(tables.per_seed_rows(setup, runs, summaries))
    fairest = claims_module.fairest_rows(setup.name, per_seed, "none", ["marital-other", "marital-4"])
    costs = {row["target_epsilon"]: row["worst_group_cost"] for row in fairest}
    assert costs == pytest.approx({"0.1": 0.029, "0.2": 0.028, "0.5": 0.025})


def test_resume_reuses_finished_runs_and_refuses_other_settings(ray_session, cli, tmp_path):
    setup = setup_files.load_setup("esipova-dutch")
    skip_without_data(setup)
    out = tmp_path / "dutch"
    args = ["reproduce", "esipova-dutch", "--seeds", "1", "--max-rounds", "1", "--out", str(out)]
    args += ["--data-dir", str(DATA_DIR)]
    status, _stdout, err = cli(*args)
    assert status == 0, err
    stamps = {path.parent.name: path.stat().st_mtime_ns for path in out.glob("runs/*/summary.json")}
    assert len(stamps) == len(setup.policies)
    listed = json.loads((out / "runs.json").read_text())  # the runs `results record` counts
    assert listed["grid"] == [] and sorted(listed["final"]) == sorted(stamps)
    table = (out / "reproduction.csv").read_text()
    interrupted = sorted(stamps)[0]
    shutil.rmtree(out / "runs" / interrupted)  # as if the invocation had stopped during that run

    status, stdout, err = cli(*args, "--resume")
    assert status == 0, err
    assert f"Resumed: {len(stamps) - 1} finished runs in this folder were reused" in stdout
    done = [line for line in err.splitlines() if "runs done" in line]  # the reused runs write no line
    assert len(done) == 1 and f"{len(stamps)}/{len(stamps)} runs done ({interrupted})" in done[0], err
    assert str(tmp_path) not in (out / "reproduction.md").read_text()  # committed reports name no local path
    after = {path.parent.name: path.stat().st_mtime_ns for path in out.glob("runs/*/summary.json")}
    assert set(after) == set(stamps)
    assert all(after[key] == stamps[key] for key in stamps if key != interrupted)
    assert (out / "reproduction.csv").read_text() == table  # the recomputed run is the same run

    rounds_at = args.index("--max-rounds") + 1
    other_rounds = [*args[:rounds_at], "2", *args[rounds_at + 1 :]]
    status, _stdout, err = cli(*other_rounds, "--resume")
    assert status == 2
    assert err.strip().count("\n") == 0 and "max_rounds differ" in err


def test_the_api_runs_here_or_on_ray_with_the_same_numbers(ray_session, cli, tmp_path, monkeypatch):
    """``fairclip.reproduce`` (what the command runs) without Ray runs the runs one after the
    other in this process; the table is the Ray backend's (the CLI's default), number for
    number. It resumes a folder from its stored specification, and ``--backend local``
    refuses a cluster address in one line."""
    import fairclip
    from fairclip.sims.executors import jobs

    setup = setup_files.load_setup("esipova-dutch")
    skip_without_data(setup)
    smoke = {"seeds": 1, "max_rounds": 2, "max_batch": 64, "data_dir": DATA_DIR}
    with monkeypatch.context() as patched:
        patched.setattr(jobs, "simulate_on_ray", lambda *a, **k: pytest.fail("a Ray task ran"))
        here = fairclip.reproduce("esipova-dutch", out=tmp_path / "here", **smoke)
    assert isinstance(here, fairclip.Reproduction) and here.name == "esipova-dutch"
    assert list(here.table.columns) == tables.COLUMNS
    assert len(here.table) == expected_rows(setup) and here.wall_seconds > 0
    on_file = pd.read_csv(here.folder / "reproduction.csv", keep_default_na=False)
    assert list(on_file["fairclip_mean"].astype(float)) == list(here.table["fairclip_mean"].astype(float))

    args = ["reproduce", "esipova-dutch", "--seeds", "1", "--max-rounds", "2", "--max-batch", "64"]
    status, _stdout, err = cli(*args, "--out", str(tmp_path / "ray"), "--data-dir", str(DATA_DIR))
    assert status == 0, err
    on_ray = pd.read_csv(tmp_path / "ray" / "reproduction.csv", keep_default_na=False)
    pd.testing.assert_frame_equal(on_ray, on_file)

    seen: list[str] = []
    again = fairclip.reproduce(out=here.folder, mode="resume", data_dir=DATA_DIR, on_run=seen.append)
    stored = sorted(p.parent.name for p in (here.folder / "runs").glob("*/summary.json"))
    assert sorted(seen) == stored
    pd.testing.assert_frame_equal(again.table, here.table)
    ran: list[str] = []
    reused: list[str] = []
    fairclip.reproduce(
        out=here.folder, mode="resume", data_dir=DATA_DIR, on_run=ran.append, on_reused=reused.append
    )
    assert ran == [] and sorted(reused) == stored  # on_reused takes the reused runs from on_run

    status, _stdout, err = cli(*args, "--backend", "local", "--address", "127.0.0.1:1")
    assert status == 2 and err.strip().count("\n") == 0 and "--scheduler ray" in err


def test_kept_progress_continues_from_a_fresh_folder(ray_session, cli, tmp_path):
    """``results.keep`` stores what --resume needs of an unfinished reproduction (its sweep.json
    and the finished runs' summaries, nothing of the run in flight); a copy of that alone, as a
    fresh clone has it, continues the reproduction: the kept runs are reused, the missing one is
    computed, and the table is the uninterrupted one."""
    setup = setup_files.load_setup("esipova-dutch")
    skip_without_data(setup)
    out = tmp_path / "dutch"
    args = ["reproduce", "esipova-dutch", "--seeds", "1", "--max-rounds", "1", "--out", str(out)]
    status, _stdout, err = cli(*args, "--data-dir", str(DATA_DIR))
    assert status == 0, err
    table = (out / "reproduction.csv").read_text()
    runs = sorted(path.name for path in (out / "runs").iterdir())
    (out / "runs" / runs[0] / "summary.json").unlink()  # as if that run were still running

    entry = results.keep(out, tmp_path / "kept")
    assert entry["finished_runs"] == len(runs) - 1 == len(setup.policies) - 1
    assert entry["setup"] == "esipova-dutch" and entry["compute_seconds"] > 0
    kept = sorted(
        str(p.relative_to(tmp_path / "kept")) for p in (tmp_path / "kept").rglob("*") if p.is_file()
    )
    assert kept == sorted(["sweep.json", "progress.json", *(f"runs/{key}/summary.json" for key in runs[1:])])

    fresh = tmp_path / "fresh"
    shutil.copytree(tmp_path / "kept", fresh)
    status, stdout, err = cli("reproduce", "--resume", "--out", str(fresh), "--data-dir", str(DATA_DIR))
    assert status == 0, err
    assert f"Resumed: {len(runs) - 1} finished runs in this folder were reused" in stdout
    assert (fresh / "reproduction.csv").read_text() == table
    # keeping again never drops a kept run: a folder that lacks one is refused, the kept one stays
    shutil.rmtree(out / "runs" / runs[1])
    with pytest.raises(ValueError, match=f"lacks 1 finished run.*{runs[1]}"):
        results.keep(out, tmp_path / "kept")
    assert (tmp_path / "kept" / "runs" / runs[1] / "summary.json").is_file()
    assert results.keep(fresh, tmp_path / "kept")["finished_runs"] == len(runs)  # more runs: kept
    # a reproduction extended since it was kept (--extend --seeds 2; the folder names its setup)
    # is kept again, with its new specification; the kept folder never goes back to fewer seeds
    extend = ["--extend", "--seeds", "2", "--max-rounds", "1", "--out", str(fresh)]
    status, _stdout, err = cli("reproduce", *extend, "--backend", "local", "--data-dir", str(DATA_DIR))
    assert status == 0, err
    assert results.keep(fresh, tmp_path / "kept")["finished_runs"] == 2 * len(runs)
    assert json.loads((tmp_path / "kept" / "sweep.json").read_text())["seeds"] == 2
    with pytest.raises(ValueError, match="keeps another reproduction"):
        results.keep(out, tmp_path / "kept")
    assert len(list((tmp_path / "kept").glob("runs/*/summary.json"))) == 2 * len(runs)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "sweep.json").write_text('{"command": "reproduce", "name": "xu-dutch"}')
    with pytest.raises(ValueError, match="keeps another reproduction"):
        results.keep(tmp_path / "other", tmp_path / "kept")
    with pytest.raises(ValueError, match="not a reproduction"):
        (tmp_path / "compare").mkdir()
        (tmp_path / "compare" / "sweep.json").write_text('{"command": "compare"}')
        results.keep(tmp_path / "compare", tmp_path / "elsewhere")


def test_markdown_says_what_was_compared():
    def row(paper, outside):
        return {
            "policy": "constant",
            "epsilon": 2.0,
            "epsilon_rdp": 2.1,
            "epsilon_prv": 1.9,
            "metric": "accuracy_male",
            "paper": paper,
            "fairclip_mean": 0.7,
            "fairclip_stderr": "",
            "seeds": 1,
            "grid_point": {},
            "outside": outside,
        }

    setup = setup_files.load_setup("esipova-dutch")
    assert "nothing is flagged" in tables.markdown(setup, [row("", False)], 1.0, [])
    assert "Every number with a paper value (1) lies within" in tables.markdown(
        setup, [row(0.76, False)], 1.0, []
    )
    text = tables.markdown(setup, [row(0.76, True), row("", False)], 1.0, [])
    assert "1 of 1 numbers with a paper value lie outside" in text
    assert "**outside**" in text and "| 2.1 / 1.9 |" in text


def test_extend_keeps_the_stored_options_it_is_not_given(cli, tmp_path):
    """`--extend --policies X` adds X to the stored reproduction: its seeds and smoke options,
    not their defaults (it used to add a second seed of every policy to a one-seed folder), and
    `--extend --seeds N` adds seeds to the stored policies, not to all of the setup's. So runs
    made in two folders, one policy each (on two machines, say), put together and extended
    give the table of one folder that ran both."""
    skip_without_data(setup_files.load_setup("zhao-dutch"))
    local = ["--backend", "local", "--data-dir", str(DATA_DIR)]
    smoke = ["zhao-dutch", "--seeds", "1", "--grid-limit", "1", "--max-rounds", "1", *local]
    folders = {"constant": "constant", "adaptive": "adaptive", "both": "constant,adaptive"}
    for folder, policies in folders.items():
        status, _, err = cli("reproduce", *smoke, "--policies", policies, "--out", str(tmp_path / folder))
        assert status == 0, err
    merged = tmp_path / "constant"
    for run in (tmp_path / "adaptive" / "runs").iterdir():
        shutil.copytree(run, merged / "runs" / run.name)
    runs = {path.parent.name for path in merged.glob("runs/*/summary.json")}

    extend = ["reproduce", "--extend", "--out", str(merged), *local]
    status, stdout, err = cli(*extend, "--policies", "adaptive")
    assert status == 0, err
    assert f"Resumed: {len(runs)} finished runs in this folder were reused" in stdout
    spec = json.loads((merged / "sweep.json").read_text())
    assert spec == json.loads((tmp_path / "both" / "sweep.json").read_text())
    assert (spec["seeds"], spec["max_rounds"], spec["policies"]) == (1, 1, ["constant", "adaptive"])
    assert (merged / "reproduction.csv").read_text() == (tmp_path / "both" / "reproduction.csv").read_text()

    status, _, err = cli(*extend, "--seeds", "2")
    assert status == 0, err
    spec = json.loads((merged / "sweep.json").read_text())
    assert (spec["seeds"], spec["max_rounds"], spec["policies"]) == (2, 1, ["constant", "adaptive"])
    table = pd.read_csv(merged / "reproduction.csv")
    assert set(table["policy"]) == {"constant", "adaptive"} and set(table["seeds"]) == {2}
    added = {path.parent.name for path in merged.glob("runs/*/summary.json")} - runs
    assert {name.split("__")[0] for name in added} == {"constant", "adaptive"}  # the grid stays seed 0's
    assert all(name.endswith("__seed-1") for name in added)


def test_a_reproduction_is_stored_and_resumed_extended_or_replaced(tmp_path):
    """Issue 18, point 2, for `reproduce`: the stored specification decides what --resume runs."""
    from fairclip.scenarios.errors import ConfigError
    from fairclip.sims.sweeps import folder as sweep_folder
    from fairclip.sims.sweeps.folder import Mode, settle

    def spec(explicit_only=False, **options):
        values = {"seeds": None, "full_grid": None, "grid_limit": None, "max_rounds": None, "overrides": None}
        values.update(options)
        return repro.reproduce_spec("zhao-dutch", **values, explicit_only=explicit_only)

    results = ("runs", "reproduction.csv")
    first = settle(tmp_path, spec(max_rounds=3), Mode.NEW, merge=repro.merge_specs, results=results)
    assert first["seeds"] == 2 and first["max_rounds"] == 3
    assert settle(tmp_path, spec(explicit_only=True), Mode.RESUME) == first
    with pytest.raises(ConfigError, match="max_rounds differ"):
        settle(tmp_path, spec(explicit_only=True, max_rounds=4), Mode.RESUME)
    with pytest.raises(ConfigError, match="holds another sweep"):
        settle(tmp_path, spec(seeds=3, max_rounds=3), Mode.NEW)
    for mode in (Mode.NEW, Mode.RESUME, Mode.EXTEND):  # another command's folder: named, not "differ"
        other = {**spec(explicit_only=mode is Mode.RESUME), "command": "tune"}
        with pytest.raises(ConfigError, match=r"holds a `fairclip reproduce` sweep .* `fairclip tune` can"):
            settle(tmp_path, other, mode, merge=repro.merge_specs)
    extended = settle(tmp_path, spec(seeds=3, max_rounds=3), Mode.EXTEND, merge=repro.merge_specs)
    assert extended["seeds"] == 3
    with pytest.raises(ConfigError, match="max_rounds differ"):
        settle(tmp_path, spec(seeds=4), Mode.EXTEND, merge=repro.merge_specs)
    (tmp_path / "runs" / "a").mkdir(parents=True)
    (tmp_path / "reproduction.csv").write_text("x")
    replaced = settle(tmp_path, spec(seeds=1), Mode.REPLACE, results=results)
    assert replaced["seeds"] == 1 and not (tmp_path / "runs").exists()
    assert not (tmp_path / "reproduction.csv").exists()
    assert sweep_folder.stored_spec(tmp_path) == replaced


def test_policies_run_a_subset_and_extend_adds_the_rest(ray_session, cli, tmp_path):
    """Issue 20, point 3: `--policies` runs a subset of a setup (named in the report), a
    policy the setup lacks is one line and exit 2 before any work, and `--extend` adds
    policies while reusing the finished runs."""
    setup = setup_files.load_setup("esipova-dutch")
    skip_without_data(setup)
    out = tmp_path / "dutch"
    args = ["reproduce", "esipova-dutch", "--seeds", "1", "--max-rounds", "1", "--out", str(out)]
    args += ["--data-dir", str(DATA_DIR)]

    status, _stdout, err = cli(*args, "--policies", "constant,bounded")
    assert status == 2 and err.strip().count("\n") == 0
    assert "has no policy 'bounded'" in err and "global-adapt" in err
    assert not out.exists()  # refused before any work

    status, stdout, err = cli(*args, "--policies", "none, global")
    assert status == 0, err
    table = pd.read_csv(out / "reproduction.csv", keep_default_na=False)
    assert sorted(set(table["policy"])) == ["global", "none"]
    assert len(table) == expected_rows(setup, ["none", "global"])  # global's paired metrics too
    assert "Policies: none, global of the setup's" in stdout
    # stderr is no terminal here: one plain progress line per finished run, the last with eta 0
    lines = re.findall(r"^reproduce esipova-dutch: (\d)/2 runs done \((\w+)__.*\), .* eta (.*)$", err, re.M)
    assert [done for done, _key, _eta in lines] == ["1", "2"], err
    assert sorted(key for _done, key, _eta in lines) == ["global", "none"] and lines[-1][2] == "0:00:00"
    stamps = {path.parent.name: path.stat().st_mtime_ns for path in out.glob("runs/*/summary.json")}
    assert len(stamps) == 2

    status, stdout, err = cli(*args, "--policies", "constant", "--extend")
    assert status == 0, err
    table = pd.read_csv(out / "reproduction.csv", keep_default_na=False)
    assert sorted(set(table["policy"])) == ["constant", "global", "none"]
    assert "Resumed: 2 finished runs in this folder were reused" in stdout
    after = {path.parent.name: path.stat().st_mtime_ns for path in out.glob("runs/*/summary.json")}
    assert len(after) == 3 and all(after[key] == stamps[key] for key in stamps)


def test_a_policy_subset_is_part_of_the_stored_reproduction(tmp_path):
    from fairclip.scenarios.errors import ConfigError
    from fairclip.sims.sweeps.folder import Mode, settle

    def spec(explicit_only=False, **options):
        values = {"seeds": None, "full_grid": None, "grid_limit": None, "max_rounds": None, "overrides": None}
        values.update(options)
        return repro.reproduce_spec("zhao-dutch", **values, explicit_only=explicit_only)

    assert "policies" not in spec()  # all of them, as folders stored before the option
    first = settle(tmp_path, spec(policies=["bounded"]), Mode.NEW)
    assert first["policies"] == ["bounded"]
    with pytest.raises(ConfigError, match="policies differ"):
        settle(tmp_path, spec(explicit_only=True, policies=["constant"]), Mode.RESUME)
    more = settle(tmp_path, spec(policies=["constant"]), Mode.EXTEND, merge=repro.merge_specs)
    assert more["policies"] == ["bounded", "constant"]
    everything = settle(tmp_path, spec(), Mode.EXTEND, merge=repro.merge_specs)
    assert "policies" not in everything
    with pytest.raises(ConfigError, match="has no policy 'soft'"):
        spec(policies=["soft"])


def test_esipova_setups_run_the_authors_models_and_count_noise():
    """Seed 003's setups train the networks its authors' code trains (no pooling in the MNIST
    CNN, tanh in the Adult MLP, a sigmoid on the Dutch model's outputs), and Global-Adapt's
    count noise is the paper's absolute σ₂ = 10, not 10σ."""
    models = {
        "esipova-skewed-mnist": "esipova-cnn",
        "esipova-adult": "mlp-tanh",
        "esipova-dutch": "sigmoid-logistic",
    }
    for name, model in models.items():
        setup = setup_files.load_setup(name)
        assert setup.settings["scenario.model"] == model, name
        (adapt,) = [s for s in setup.policies if s.name == "global-adapt"]
        assert adapt.settings["privacy.count_noise_multiplier"] == 10.0, name
        assert "privacy.count_noise_multiplier" not in setup.settings, name


def test_the_authors_model_variants():
    import torch

    from fairclip.scenarios.models import build_model

    torch.manual_seed(0)
    tanh_mlp, relu_mlp = build_model("mlp-tanh", (5,), 2), build_model("mlp", (5,), 2)
    assert [type(m).__name__ for m in tanh_mlp] == [
        type(m).__name__.replace("ReLU", "Tanh") for m in relu_mlp
    ]
    sigmoid = build_model("sigmoid-logistic", (5,), 2)
    outputs = sigmoid(torch.randn(64, 5) * 100)
    assert outputs.shape == (64, 2) and float(outputs.min()) >= 0 and float(outputs.max()) <= 1
    assert sum(p.numel() for p in sigmoid.parameters()) == 12
    assert sum(p.numel() for p in build_model("esipova-cnn", (1, 28, 28), 10).parameters()) == 97_114
    # seed 000's logistic regression: one output and a sigmoid; its cross-entropy is the BCE of σ(z)
    binary = build_model("binary-logistic", (5,), 2)
    features, labels = torch.randn(32, 5), torch.arange(32) % 2
    scores = binary[1](features)[:, 0]
    torch.testing.assert_close(
        torch.nn.functional.cross_entropy(binary(features), labels),
        torch.nn.functional.binary_cross_entropy_with_logits(scores, labels.float()),
    )
    assert sum(p.numel() for p in binary.parameters()) == 6
    with pytest.raises(ValueError, match="2 classes"):
        build_model("binary-logistic", (5,), 3)


def test_zhao_setups_choose_their_grid_point_by_macro_accuracy():
    """Seed 000 selects by macro accuracy: a point with the better overall accuracy but the worse
    mean of per-class accuracies loses."""
    for name in ("zhao-adult", "zhao-dutch"):
        setup = setup_files.load_setup(name)
        assert setup.select_by == "macro_accuracy" and setup.settings["scenario.model"] == "binary-logistic"
    assert setup_files.load_setup("esipova-adult").select_by == "accuracy"
    grid = [
        setup_files.Run(f"p{i}", "bounded", 0.5, 0, {}, {"training.server_lr": lr})
        for i, lr in enumerate((1.0, 2.0))
    ]
    summaries = {
        "p0": {"overall": {"accuracy": 0.85, "macro_accuracy": 0.70}},
        "p1": {"overall": {"accuracy": 0.83, "macro_accuracy": 0.78}},
    }
    assert planning.choose(grid, summaries)[("bounded", 0.5)] == {"training.server_lr": 1.0}
    assert planning.choose(grid, summaries, "macro_accuracy")[("bounded", 0.5)] == {"training.server_lr": 2.0}


def _summary(overall: float, male: float, female: float, sigma: float) -> dict:
    claim = {"effective_noise_multiplier": sigma, "sample_rate": 0.01, "rounds": 100, "delta": 1e-5}
    return {
        "epsilon": "inf" if sigma == 0 else 1.0,
        "overall": {"accuracy": overall},
        "cohorts": {"male": {"accuracy": male}, "female": {"accuracy": female}},
        "privacy": claim,
    }


def test_changes_against_the_reference_are_paired_by_seed():
    """Seed 004 reports accuracy change against non-private SGD: per seed, run − reference run of
    the same seed; the mean and s.e. are those of the paired differences."""
    setup = setup_files.load_setup("xu-adult-balanced")
    assert setup.relative_to == "none"
    runs, summaries = [], {}
    values = {
        ("none", 0): (0.84, 0.80, 0.88),
        ("none", 1): (0.80, 0.76, 0.84),  # a worse seed for everyone
        ("constant", 0): (0.80, 0.75, 0.86),
        ("constant", 1): (0.77, 0.72, 0.83),
        ("per-cohort", 0): (0.83, 0.79, 0.875),
        ("per-cohort", 1): (0.79, 0.75, 0.835),
    }
    for (policy, seed), (overall, male, female) in values.items():
        key = f"{policy}-{seed}"
        runs.append(setup_files.Run(key, policy, None, seed, {}))
        summaries[key] = _summary(overall, male, female, 0.0 if policy == "none" else 1.0)
    rows = {(r["policy"], r["metric"]): r for r in tables.table_rows(setup, runs, summaries)}
    total = rows[("constant", "accuracy_change_total")]
    assert total["fairclip_mean"] == pytest.approx(-0.035)  # (-0.04 - 0.03) / 2, paired
    assert total["fairclip_stderr"] == pytest.approx(0.005)  # s.e. of the differences, not of levels
    assert rows[("constant", "accuracy_change_male")]["fairclip_mean"] == pytest.approx(-0.045)
    assert rows[("per-cohort", "accuracy_change_female")]["fairclip_mean"] == pytest.approx(-0.005)
    assert not total["outside"]  # the paper's -0.036
    assert rows[("constant", "accuracy_change_male")]["outside"] is False  # -0.045 vs -0.054
    # the reference's own rows hold its absolute values, named by their source
    assert rows[("none", "overall/accuracy")]["fairclip_mean"] == pytest.approx(0.82)
    assert ("none", "accuracy_change_total") not in rows
    # a change needs the reference's run of the same seed
    with pytest.raises(ConfigError, match="seeds \\[1\\]"):
        tables.table_rows(setup, [r for r in runs if r.key != "none-1"], summaries)
    # a subset of policies keeps the reference
    kept = setup_files.select_policies(setup, ["constant"])
    assert [s.name for s in kept.policies] == ["none", "constant"]


def test_reproduce_reports_paired_tests_between_policies_of_the_same_seeds(tmp_path):
    """Issue 22: the reproduction's report says which differences are significant at 5 %."""
    setup = setup_files.load_setup("xu-adult-balanced")
    runs, summaries = [], {}
    # constant is 0.04 ± 0.002 below per-cohort on every seed (male), and level with it (female,
    # ± noise); differences equal on every seed would have an undefined t-test (statistics.py)
    for seed, (base, gap) in enumerate(((0.80, 0.040), (0.76, 0.042), (0.78, 0.038))):
        for policy, shift, female in (
            ("per-cohort", 0.0, 0.86),
            ("constant", -gap, 0.86 + (-1) ** seed * 0.01),
        ):
            key = f"{policy}-{seed}"
            runs.append(setup_files.Run(key, policy, None, seed, {}))
            summaries[key] = _summary(base + shift, base + shift, female, 1.0)
    tests = tables.paired_rows(setup, runs, summaries)
    by_metric = {t["quantity"]: t for t in tests}
    male = by_metric["accuracy_change_male"]
    assert (male["first"], male["second"], male["seeds"]) == ("per-cohort", "constant", 3)
    assert male["mean_difference"] == pytest.approx(0.04)
    assert male["significant"] and male["p_value"] < 0.05
    female = by_metric["accuracy_change_female"]
    assert not female["significant"]
    text = tables.markdown(setup, [], 1.0, [], tests)
    assert "## Paired tests between policies" in text
    assert "`per-cohort` − `constant` | 3 | +0.0400" in text and "**significant**" in text
    tables.write_outputs(tmp_path, setup, [], 1.0, [], tests)
    stored = pd.read_csv(tmp_path / "paired_tests.csv")
    assert list(stored.columns) == tables.PAIRED_COLUMNS and len(stored) == len(tests)
    # one seed: no test, no section
    assert "Paired tests" not in tables.markdown(
        setup, [], 1.0, [], tables.paired_rows(setup, runs[:2], summaries)
    )


def test_seed_004_setups_are_its_table_5():
    census = {  # name: (rows kept, scenario.balance, scenario.group_rows)
        "xu-adult-balanced": (28_000, True, None),
        "xu-adult": (45_222, False, None),
        "xu-dutch": (60_420, True, None),
        "xu-dutch-unbalanced": (40_000, True, {"female": 30_000, "male": 10_000}),
    }
    for name, (rows, balance, group_rows) in census.items():
        setup = setup_files.load_setup(name)
        assert setup.settings["scenario.model"] == "binary-logistic"
        assert setup.settings["training.weight_decay"] == 0.01
        assert setup.settings.get("scenario.balance", True) is balance
        assert setup.settings.get("scenario.group_rows") == group_rows
        assert setup.settings["scenario.include_protected"] is False  # unprotected attributes only
        assert setup.settings["privacy.delta"] == 1e-6  # section 6.1
        assert setup.relative_to == "none" and setup.batch_size == 256 and setup.epochs == 20
        by_name = {s.name: s for s in setup.policies}
        assert by_name["constant"].settings["policy.initial_bound"] == 0.5
        # lr = 1/sqrt(T), T = ceil(20 N / 256) over the 80 % training rows
        train = rows - round(0.2 * rows)
        steps = math.ceil(20 * train / 256)
        assert setup.settings["training.server_lr"] == pytest.approx(1 / math.sqrt(steps), abs=1e-6)
        _check_seed_004_policies(setup, sigma=1.0, sample_rate=256 / train, steps=steps)
    dutch = {s.name: s for s in setup_files.load_setup("xu-dutch").policies}
    # seed 004's "male" Dutch rows are fairclip's female rows: its columns are swapped here
    assert dutch["constant"].paper[""]["accuracy_change_female"] == -0.1534
    unbalanced = {s.name: s for s in setup_files.load_setup("xu-dutch-unbalanced").policies}
    assert unbalanced["reweight"].paper[""]["accuracy_change_male"] == 0.025  # the paper's women


def test_seed_004_mnist_setups_are_its_tables_3_and_4():
    """Bagdasaryan et al.'s setting, which seed 004 replicates: standardised pixels, SGD with
    momentum 0.5; Algorithm 2 and 3 as written, stopped at DP-SGD's epsilon."""
    for name, train in (("xu-mnist", 54_649), ("xu-mnist-balanced", 60_000), ("xu-mnist-bounds", 54_649)):
        setup = setup_files.load_setup(name)
        assert setup.settings["scenario.model"] == "xu-cnn-normalized"
        assert setup.settings["training.server_momentum"] == 0.5
        assert setup.settings["training.server_lr"] == 0.01
        assert setup.settings["privacy.delta"] == 1e-6
        assert setup.batch_size == 256 and setup.epochs == 60
        _check_seed_004_policies(setup, sigma=0.8, sample_rate=256 / train, steps=math.ceil(60 * train / 256))
    bounds = {s.name: s for s in setup_files.load_setup("xu-mnist-bounds").policies}
    mnist = {s.name: s for s in setup_files.load_setup("xu-mnist").policies}
    # the runs shared with xu-mnist have its configurations exactly
    assert bounds["per-cohort-c1"].settings == mnist["per-cohort"].settings
    assert bounds["constant-c1"].settings == mnist["constant"].settings
    assert [s for s in bounds if s.startswith("per-cohort")] == ["per-cohort-c1"]  # Table 4's only DPSGD-F


def _check_seed_004_policies(setup, sigma: float, sample_rate: float, steps: int) -> None:
    """DPSGD-F is Algorithm 2 as written, the naive baseline Algorithm 3 with the batch's own
    counts, and both stop at the epsilon DP-SGD spends (section 6.1): a budget at most DP-SGD's
    epsilon and within 1e-4 of it; every paper value of a setup is a claim's or a row's."""
    from fairclip.strategies.accounting import epsilon

    dpsgd = epsilon(sigma, sample_rate, steps, 1e-6, "rdp")
    for policy in setup.policies:
        settings = policy.settings
        assert policy.paper[""], f"{setup.name}: {policy.name} has no paper values"
        if policy.policy_name == "per-cohort":
            assert settings["policy.same_round"] is True and settings["policy.rule"] == "xu"
            assert settings["policy.noise_bound"] == "max"
        if policy.policy_name == "reweight":
            assert settings["policy.same_round"] is True
        if policy.policy_name in ("per-cohort", "reweight"):
            assert dpsgd - 1e-4 <= settings["privacy.epsilon_budget"] <= dpsgd, (setup.name, dpsgd)
        else:
            assert "privacy.epsilon_budget" not in settings


def test_a_setup_runs_a_policy_variant_under_its_own_label(tmp_path):
    """Seed 003's Table 1 runs ``constant`` three ways: a policy table may name the policy it
    runs (``policy``) under a label of its own, which keys its runs and rows."""
    setup = setup_files.load_setup("esipova-clipping-errors")
    assert [(s.name, s.policy_name) for s in setup.policies] == [
        ("none", "none"),
        ("constant", "constant"),
        ("magnitude-error-only", "constant"),
        ("direction-error-only", "constant"),
    ]
    planner = planning.Planner(setup, None, [], max_rounds=3, examples=lambda *_: 1000)
    runs = {run.policy: run for run in planner.final_runs(1, {})}
    assert set(runs) == {s.name for s in setup.policies}
    assert runs["magnitude-error-only"].key == "magnitude-error-only__eps-none__seed-0"
    errors = {name: validate(run.raw).training.clipping_error for name, run in runs.items()}
    assert errors == {
        "none": "both",
        "constant": "both",
        "magnitude-error-only": "magnitude",
        "direction-error-only": "direction",
    }
    assert {validate(run.raw).policy.name for run in runs.values()} == {"none", "constant"}
    assert all(validate(run.raw).privacy.noise_multiplier == 0 for run in runs.values())
    # a label that would break the run keys, and a policy that is no string, are refused
    with pytest.raises(ConfigError, match="may not contain '__'"):
        setup_files._policy("a__b", {}, "reproduction x")
    with pytest.raises(ConfigError, match="policy must name a policy"):
        setup_files._policy("variant", {"policy": 3}, "reproduction x")


def test_a_lower_bound_above_the_initial_bound_raises_the_initial_bound():
    """Zhao et al.'s grid puts C_LB above the shared C_0 = 1 (3.18 here, up to 50 in the full
    grid), which ``bounded`` refuses (C_0 < C_LB): a reproduction's run starts at C_0 = C_LB
    there and keeps C_0 = 1 where C_LB is below it; constant's and adaptive's C_0 are untouched."""
    setup = setup_files.load_setup("zhao-skewed-mnist")
    planner = planning.Planner(setup, None, [], max_rounds=3, examples=lambda *_: 48_000)
    bounds = set()
    for run in planner.grid_runs(full=False, limit=None):
        params = validate(run.raw).policy.params
        bounds.add((run.policy, params.get("lower_bound"), params["initial_bound"]))
    assert bounds == {
        ("constant", None, 0.216),
        ("constant", None, 3.18),
        ("adaptive", None, 1.0),
        ("bounded", 0.216, 1.0),
        ("bounded", 3.18, 3.18),
    }


def _galli_planner(*policies: str) -> planning.Planner:
    """galli-mnist (budget per grid) planned on MNIST's 60,000 training rows: q = 512/60,000,
    T = 1,172 rounds for grid and final runs alike."""
    setup = setup_files.select_policies(setup_files.load_setup("galli-mnist"), list(policies) or None)
    return planning.Planner(setup, None, [], None, examples=lambda *_: 60_000)


def test_a_per_grid_budget_gives_each_run_of_a_search_its_share_of_the_target():
    """Seed 002 spends each target ε on a policy's whole grid search (Mohapatra et al.'s
    per-grid budget): every run of a policy with k grid points, its final runs included, is
    calibrated so that k such runs compose to ε. online searches 5 learning rates, fixed and
    fixed-quantile 25 points, so their runs get less than online's, and far less than ε; adamwosm
    searches C alone at its fixed ρ_0 (its one-value learning-rate axis replaces the setup's),
    5 points, as online."""
    from fairclip.strategies.accounting import calibrate_effective, epsilon

    planner = _galli_planner()
    assert planner.setup.budget == "per-grid"
    grid = planner.grid_runs(full=False, limit=None)
    finals = planner.final_runs(2, {})
    q, rounds, delta = 512 / 60_000, 1172, 1e-5
    sizes = {"online": 5, "fixed": 25, "fixed-quantile": 25, "adamwosm": 5}
    shares: dict[tuple[str, float], float] = {}
    for run in grid + finals:
        config = validate(run.raw)
        if run.policy == "adamwosm" and run in grid:  # (these final runs are given no chosen point)
            assert (config.training.server_optimizer, config.training.server_lr) == ("adam-wosm", 0.001)
        assert (config.federation.sample_rate, config.training.rounds) == (q, rounds)
        assert run.search_runs == sizes[run.policy]
        share = config.privacy.target_epsilon
        assert shares.setdefault((run.policy, run.target_epsilon), share) == share  # grid and finals alike
        sigma = calibrate_effective(share, q, rounds, delta, "rdp")  # what the run calibrates
        whole = epsilon(sigma, q, run.search_runs * rounds, delta, "rdp")
        assert 0.99 * run.target_epsilon <= whole <= run.target_epsilon
        assert share < 0.55 * run.target_epsilon
    assert len(grid) == 4 * sum(sizes.values())
    for target in (3.0, 5.0, 7.0, 9.0):
        assert shares["fixed", target] == shares["fixed-quantile", target] < shares["online", target]
        assert shares["adamwosm", target] == shares["online", target]
    # the noise the notes give at epsilon 3: 2.302 for 25 runs, 1.208 for 5 (0.837 for one run)
    assert calibrate_effective(shares["fixed", 3.0], q, rounds, delta, "rdp") == pytest.approx(
        2.302, abs=0.01
    )
    assert calibrate_effective(shares["online", 3.0], q, rounds, delta, "rdp") == pytest.approx(
        1.208, abs=0.01
    )
    # a smaller grid is a smaller search: k follows the grid last planned, final runs included
    assert planning.per_run_epsilon(3.0, 1, q, rounds, delta, "rdp") == 3.0
    small = planner.grid_runs(full=False, limit=2)
    assert {run.policy: run.search_runs for run in small} == {
        "online": 2,
        "fixed": 4,
        "fixed-quantile": 4,
        "adamwosm": 2,
    }
    assert {run.policy: run.search_runs for run in planner.final_runs(1, {})} == {
        "online": 2,
        "fixed": 4,
        "fixed-quantile": 4,
        "adamwosm": 2,
    }
    line = tables.budget_line(planner.setup, planner)
    assert "`online` 2, `fixed` 4, `fixed-quantile` 4, `adamwosm` 2" in line and "per-grid" in line


def test_a_per_grid_rows_report_the_epsilon_of_the_whole_search():
    """The ε of a selected baseline's row is its whole search's: its k runs composed (k·T rounds
    at the run's σ_eff), not the share one run spent; a per-run setup keeps one run's ε."""
    from fairclip.strategies.accounting import calibrate_effective, epsilon

    planner = _galli_planner("online", "fixed")
    planner.grid_runs(full=False, limit=None)
    runs = planner.final_runs(2, {("fixed", 3.0): {"policy.initial_bound": 0.01}})
    summaries = {}
    for run in runs:
        config = validate(run.raw)
        q, rounds = config.federation.sample_rate, config.training.rounds
        share = config.privacy.target_epsilon
        sigma = calibrate_effective(share, q, rounds, 1e-5, "rdp")
        claim = {"effective_noise_multiplier": sigma, "sample_rate": q, "rounds": rounds, "delta": 1e-5}
        summaries[run.key] = {"epsilon": share, "overall": {"accuracy": 0.9}, "privacy": claim}
    rows = {(row["policy"], row["epsilon"]): row for row in tables.table_rows(planner.setup, runs, summaries)}
    for policy, k in (("online", 5), ("fixed", 25)):
        for target in (3.0, 9.0):
            row = rows[policy, target]
            run = next(r for r in runs if r.policy == policy and r.target_epsilon == target)
            claim = summaries[run.key]["privacy"]
            sigma, q, rounds = claim["effective_noise_multiplier"], claim["sample_rate"], claim["rounds"]
            assert row["epsilon_rdp"] == float(f"{epsilon(sigma, q, k * rounds, 1e-5, 'rdp'):.4g}")
            assert row["epsilon_prv"] == float(f"{epsilon(sigma, q, k * rounds, 1e-5, 'prv'):.4g}")
            assert 0.99 * target <= row["epsilon_rdp"] <= target
            assert row["epsilon_rdp"] > 1.5 * summaries[run.key]["epsilon"]  # not the one run's share
    assert rows["fixed", 3.0]["grid_point"] == {"policy.initial_bound": 0.01}


def test_setup_budget_is_checked(tmp_path, monkeypatch):
    """``setup.budget`` is per-run (the default) or per-grid, and per-grid needs target epsilons."""
    text = setup_files.builtin_setups()["galli-mnist"].read_text()
    assert setup_files.load_setup("esipova-adult").budget == "per-run"
    monkeypatch.setattr(setup_files, "SETUP_DIR", tmp_path)
    (tmp_path / "galli-mnist.toml").write_text(text.replace('budget = "per-grid"', 'budget = "per-seed"'))
    with pytest.raises(ConfigError, match=re.escape("setup.budget must be one of per-run, per-grid")):
        setup_files.load_setup("galli-mnist")
    (tmp_path / "galli-mnist.toml").write_text(text.replace("epsilons = [3.0, 5.0, 7.0, 9.0]\n", ""))
    with pytest.raises(ConfigError, match=re.escape("per-grid needs setup.epsilons")):
        setup_files.load_setup("galli-mnist")


def test_grid_runs_evaluate_after_their_last_round_only():
    """A grid run's one product is its final validation metric, so it is evaluated once, after
    its last round, unless the user sets ``training.eval_every``; the final runs keep their curve."""
    setup = setup_files.load_setup("galli-mnist")

    def planner(*overrides: str) -> planning.Planner:
        return planning.Planner(setup, None, list(overrides), None, examples=lambda *_: 48_000)

    grid = planner().grid_runs(full=False, limit=1)
    assert grid
    for run in grid:
        training = validate(run.raw).training
        assert training.rounds == 938 and training.eval_every == training.rounds
    for run in planner().final_runs(1, {}):
        assert validate(run.raw).training.eval_every == 1
    assert {
        validate(run.raw).training.eval_every for run in planner("training.eval_every=5").grid_runs(False, 1)
    } == {5}


def test_set_wins_over_the_policy_settings_and_refuses_what_each_run_sets():
    """``--set`` is applied on top of every run's policy settings (``global``'s server lr and Z
    are policy settings of esipova-adult, and were silently kept before); keys the reproduction
    sets per run, or that a grid varies, are refused rather than half applied."""
    from fairclip.scenarios.errors import ConfigError

    def planner(name: str, *overrides: str, policies: list[str] | None = None) -> planning.Planner:
        setup = setup_files.select_policies(setup_files.load_setup(name), policies)
        return planning.Planner(setup, None, list(overrides), None, examples=lambda *_: 28_000)

    sets = ("training.server_lr=0.5", "policy.scale_threshold=100", "seed=7")
    runs = planner("esipova-adult", *sets, policies=["global", "global-adapt"]).final_runs(2, {})
    by_policy = {run.policy: validate(run.raw) for run in runs if run.seed == 7}
    assert sorted(run.seed for run in runs if run.policy == "global") == [7, 8]
    assert {config.training.server_lr for config in by_policy.values()} == {0.5}
    assert {config.policy.params["scale_threshold"] for config in by_policy.values()} == {100}
    default = {run.policy: validate(run.raw) for run in planner("esipova-adult").final_runs(1, {})}
    assert default["global"].training.server_lr == 0.2 and default["none"].training.server_lr == 0.01
    assert default["global"].policy.params["scale_threshold"] == 50

    refused = {
        ("esipova-adult", "training.rounds=3"): "sets it for each run",
        ("esipova-adult", "policy.name=constant"): "--policies",
        ("zhao-skewed-mnist", "training.server_lr=1"): "the setup's grid varies it",
        ("zhao-skewed-mnist", "policy.lower_bound=1"): "policy bounded's grid varies it",
        ("zhao-skewed-mnist", "privacy.target_epsilon=3"): "target epsilons",
        ("galli-mnist", "privacy.noise_multiplier=2"): "target epsilons",
    }
    for (name, assignment), reason in refused.items():
        with pytest.raises(ConfigError, match=re.escape(reason)):
            planner(name, assignment)
    # global's settings set policy.scale_threshold directly, which wins over global's own table
    with pytest.raises(ConfigError, match=re.escape("set policy.scale_threshold")):
        planner("esipova-adult", "policy.global.scale_threshold=100", policies=["global"]).final_runs(1, {})


def test_a_setup_with_a_grid_splits_every_seeds_rows_as_its_first_seed_does(tmp_path, monkeypatch):
    """Selection runs on a validation split of the first seed's training rows. Were the rows of
    Adult and Dutch split anew for each seed, a later seed's test rows would hold some of those
    validation rows (and grid-training rows); so in a setup with a grid every run splits them as
    the first seed does (``scenario.split_seed``), while the seed still varies the rest. A setup
    without a grid, and a dataset with a fixed test set, keep the split of each run's own seed."""
    from fairclip.scenarios.errors import ConfigError

    def runs(name: str, *overrides: str) -> list[setup_files.Run]:
        planner = planning.Planner(
            setup_files.load_setup(name), None, list(overrides), None, examples=lambda *_: 28_000
        )
        return planner.grid_runs(False, 1) + planner.final_runs(3, {})

    for name, first in (("zhao-adult", 0), ("zhao-dutch", 0), ("zhao-adult", 4)):
        planned = runs(name, f"seed={first}")
        assert {run.seed for run in planned} == {first, first + 1, first + 2}
        assert {validate(run.raw).scenario.split_seed for run in planned} == {first}
    for name in ("esipova-adult", "zhao-skewed-mnist"):
        assert {validate(run.raw).scenario.split_seed for run in runs(name)} == {None}
    with pytest.raises(ConfigError, match=re.escape("--set scenario.split_seed: a reproduction sets it")):
        runs("zhao-adult", "scenario.split_seed=1")
    assert {
        validate(run.raw).scenario.split_seed for run in runs("esipova-adult", "scenario.split_seed=1")
    } == {1}
    # a setup whose only grids are policies' splits every run alike, whichever policies run
    text = setup_files.builtin_setups()["zhao-adult"].read_text()
    for table in ("[grid]", "[full_grid]"):
        start = text.index(table + "\n")
        text = text[:start] + text[text.index("\n\n", start) + 2 :]
    (tmp_path / "zhao-adult.toml").write_text(text)
    monkeypatch.setattr(setup_files, "SETUP_DIR", tmp_path)
    only_adaptive = setup_files.select_policies(setup_files.load_setup("zhao-adult"), ["adaptive"])
    assert not only_adaptive.has_grid and only_adaptive.selects
    planner = planning.Planner(only_adaptive, None, [], None, examples=lambda *_: 28_000)
    assert {validate(run.raw).scenario.split_seed for run in planner.final_runs(2, {})} == {0}


def test_a_refused_set_fails_before_the_output_folder_is_written(cli, tmp_path):
    out = tmp_path / "zhao"
    args = ["reproduce", "zhao-skewed-mnist", "--set", "training.server_lr=1", "--out", str(out)]
    status, _stdout, err = cli(*args, "--data-dir", str(tmp_path))
    assert status == 2
    assert err.strip().splitlines() == [
        "fairclip: error: --set training.server_lr: the setup's grid varies it, so each grid point sets it"
    ]
    assert not out.exists()
    # a key the runs take with a value they refuse: refused before the folder is written too, so
    # the corrected command can use the same --out (it once met a sweep.json of the refused one)
    for name, assignment, problem in (
        ("xu-adult", "training.train_loss=last-epoch-example", "true, false, 'last-epoch' or"),
        ("zhao-skewed-mnist", "training.one_step_rows=many", "training.one_step_rows"),
        ("esipova-adult", "policy.scale_threshold=-1", "scale_threshold must be > 0"),
    ):
        chosen = ["--policies", "global"] if name == "esipova-adult" else []
        status, _stdout, err = cli(
            "reproduce", name, *chosen, "--set", assignment, "--out", str(out), "--data-dir", str(tmp_path)
        )
        assert status == 2, (assignment, err)
        assert len(err.strip().splitlines()) == 1 and problem in err, err
        assert not out.exists(), assignment


def test_a_policys_final_runs_start_once_its_own_grid_has_finished(ray_session, tmp_path, monkeypatch):
    """A policy's final runs at an ε are queued as soon as its grid runs there have finished,
    while other grid runs still run: the tail of the grid leaves no core idle. Continued with
    one policy's grid finished, the grid runs still to compute are queued before that
    policy's final runs; the table and the chosen points are the uninterrupted run's."""
    from fairclip.sims.reproduce import planning  # where the runs are handed to the executors

    setup = setup_files.load_setup("zhao-dutch")
    skip_without_data(setup)
    queued_at_each_result: list[tuple[str, list[str]]] = []
    real = planning.simulate_jobs

    def recording(jobs, **options):
        for run, result in real(jobs, **options):
            queued_at_each_result.append((run.key, [queued.key for queued, _raw in jobs]))
            yield run, result

    monkeypatch.setattr(planning, "simulate_jobs", recording)
    smoke = {"seeds": 1, "grid_limit": 1, "max_rounds": 1, "max_batch": 64, "data_dir": DATA_DIR}
    out = tmp_path / "dutch"
    rows, _wall = repro.reproduce("zhao-dutch", out=out, **smoke)
    grid = [key for key, _queued in queued_at_each_result if key.startswith("grid__")]
    assert len(grid) == len(queued_at_each_result) // 2 == len(setup.policies) * len(setup.epsilons)
    first_final_queued = next(
        index
        for index, (_key, queued) in enumerate(queued_at_each_result)
        if not queued[-1].startswith("grid__")
    )
    assert first_final_queued < len(grid) - 1  # queued with grid runs still to finish

    grid_order = queued_at_each_result[0][1]  # all the grid, queued before its first result
    assert sorted(grid_order) == sorted(grid)
    chosen = (out / "chosen.json").read_text()
    kept = [key for key, _queued in queued_at_each_result if key.startswith("grid__constant__")]
    computed_again = [key for key, _queued in queued_at_each_result if key not in kept]
    for key in computed_again:
        shutil.rmtree(out / "runs" / key)
    queued_at_each_result.clear()
    reused: list[str] = []
    again, _wall = repro.reproduce(
        "zhao-dutch", out=out, resume=True, on_reused=lambda run, _summary: reused.append(run.key), **smoke
    )
    assert sorted(reused) == sorted(kept) and len(kept) == len(setup.epsilons)
    assert sorted(key for key, _queued in queued_at_each_result) == sorted(computed_again)
    others_grid = [key for key in grid_order if key in computed_again]
    constant_finals = {key for key in computed_again if key.startswith("constant__")}
    queued_first = queued_at_each_result[0][1]  # constant's final runs were ready from the start,
    assert queued_first[: len(others_grid)] == others_grid  # but the grid runs to compute go first
    assert set(queued_first[len(others_grid) :]) == constant_finals
    assert again == rows and (out / "chosen.json").read_text() == chosen


@pytest.mark.parametrize(
    ("table", "line"),
    [
        ("[settings]", '"scenario.evaluate_on" = "validation"'),
        ("[settings]", '"training.rounds" = 3'),
        ("[policies.constant]", 'settings = { "scenario.evaluate_on" = "validation" }'),
        ("[settings]", '"scenario.split_seed" = 1'),
    ],
)
def test_a_setup_may_not_set_what_the_reproduction_sets_for_each_run(tmp_path, monkeypatch, table, line):
    """A setup (or one of its policies) that set ``scenario.evaluate_on`` would have had its
    final runs scored on the validation split; one that set ``training.rounds`` saw it replaced
    by the setup's epochs. Both are refused in one line, naming where."""
    from fairclip.scenarios.errors import ConfigError

    text = setup_files.builtin_setups()["zhao-adult"].read_text()
    assert text.count(table + "\n") == 1
    text = text.replace(table + "\n", f"{table}\n{line}\n")
    (tmp_path / "zhao-adult.toml").write_text(text)
    monkeypatch.setattr(setup_files, "SETUP_DIR", tmp_path)
    key = line.split('"')[1]
    with pytest.raises(
        ConfigError, match=rf"reproduction zhao-adult: .*sets {key}, which a reproduction sets"
    ):
        setup_files.load_setup("zhao-adult")


def test_a_policy_may_train_with_its_own_epochs_and_batch_size(tmp_path, monkeypatch):
    """Seed 001 trains its non-private model 15 epochs in batches of 32 and its private ones 30
    epochs in batches of 128: the ``none`` runs get q = 32/N and 15·N/32 rounds, the others the
    setup's."""
    setup = setup_files.load_setup("softadaclip-adult")
    none = next(s for s in setup.policies if s.name == "none")
    dpsgd = next(s for s in setup.policies if s.name == "dpsgd-c0.1")
    assert (none.epochs, none.batch_size) == (15, 32) and (dpsgd.epochs, dpsgd.batch_size) == (None, None)
    assert planning.sample_level_settings(setup, 22_400, None, policy=none) == {
        "federation.num_clients": 22_400,
        "federation.sample_rate": 32 / 22_400,
        "training.rounds": 10_500,
    }
    assert planning.sample_level_settings(setup, 22_400, None, policy=dpsgd)["training.rounds"] == 5_250
    planner = planning.Planner(setup, None, [], None, examples=lambda *_: 22_400)
    by_name = {run.policy: validate(run.raw) for run in planner.final_runs(1, {})}
    assert by_name["none"].training.rounds == 10_500 and by_name["none"].training.server_lr == 3e-4
    assert by_name["dpsgd-c0.1"].training.rounds == 5_250 and by_name["dpsgd-c0.1"].training.server_lr == 3e-3
    text = setup_files.builtin_setups()["softadaclip-adult"].read_text()
    for bad in ("0", "2.5", "true"):
        (tmp_path / "softadaclip-adult.toml").write_text(
            text.replace("batch_size = 32\n", f"batch_size = {bad}\n")
        )
        monkeypatch.setattr(setup_files, "SETUP_DIR", tmp_path)
        with pytest.raises(ConfigError, match=r"policies.none.batch_size must be a positive integer"):
            setup_files.load_setup("softadaclip-adult")


def test_seed_001_selects_its_bound_learning_rate_by_validation_f1_and_runs_no_idle_grid():
    """The paper gives no η_C: adaptive and soft choose it on the validation split by F1 (the
    paper's validation criterion); the policies without grid axes get no validation run."""
    setup = setup_files.load_setup("softadaclip-adult")
    assert setup.select_by == "f1" and setup.selects
    planner = planning.Planner(setup, None, [], None, examples=lambda *_: 22_400)
    grid = planner.grid_runs(False, None)
    assert {run.policy for run in grid} == {
        f"{p}-c{c}" for p in ("adaptive", "soft") for c in (0.01, 0.05, 0.1)
    }
    assert len(grid) == 18 and {run.grid_point["policy.bound_lr"] for run in grid} == {0.02, 0.2, 2.0}
    assert all(validate(run.raw).scenario.evaluate_on == "validation" for run in grid)
    ungridded = planner.ungridded_runs(2, False)
    assert {run.policy for run in ungridded} == {"none"} | {
        f"{p}-c{c}" for p in ("dpsgd", "fixedsoft") for c in (0.01, 0.05, 0.1)
    }
    assert len(ungridded) == 14 and all(validate(run.raw).scenario.split_seed == 0 for run in ungridded)
    runs = [
        setup_files.Run(f"p{i}", "soft-c0.1", 8.0, 0, {}, {"policy.bound_lr": lr})
        for i, lr in enumerate((0.2, 2.0))
    ]
    summaries = {
        "p0": {"overall": {"accuracy": 0.85, "f1": 0.55}},
        "p1": {"overall": {"accuracy": 0.83, "f1": 0.61}},
    }
    assert planning.choose(runs, summaries, "f1")[("soft-c0.1", 8.0)] == {"policy.bound_lr": 2.0}
    for policy in setup.policies:  # the paper's count (Algorithm 2, line 10): norms above C itself
        params = validate(planner.final_runs_of(policy, 8.0, 1, {})[0].raw).policy.params
        if policy.policy_name in ("adaptive", "soft"):
            assert params["threshold_multiplier"] == 1.0 and params["target_quantile"] == 0.5
        if policy.name.startswith("fixedsoft"):
            assert params["adaptive"] is False
