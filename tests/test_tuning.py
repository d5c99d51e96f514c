"""DP hyperparameter tuning: Papernot & Steinke's bounds, the trial count's law, and `fairclip tune`."""

from __future__ import annotations

import json
import math
import re
import shutil

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opacus.accountants.analysis.rdp import get_privacy_spent
from scipy import stats

import fairclip
from fairclip.cli import main
from fairclip.scenarios.errors import ConfigError
from fairclip.sims.tune.search import METRICS, draw_trials, grid_points
from fairclip.strategies import PolicyConfigError
from fairclip.strategies.accountants import ORDERS, rdp_epsilon
from fairclip.strategies.tuning import (
    TrialCount,
    poisson_delta_hat,
    selection_rdp,
    trial_rdp,
    tuning_epsilon,
)

LAWS = [
    TrialCount("tnb", 0.0, 0.1),
    TrialCount("tnb", 1.0, 0.2),
    TrialCount("tnb", 2.5, 0.3),
    TrialCount("poisson", mu=3.0),
]


def test_expected_trials_are_the_papers_closed_forms():
    assert TrialCount("tnb", 1.0, 0.25).expected == pytest.approx(4.0)  # geometric: 1/γ
    gamma = 0.1
    assert TrialCount("tnb", 0.0, gamma).expected == pytest.approx((1 / gamma - 1) / math.log(1 / gamma))
    for law in LAWS:  # the pmf sums to 1 and its mean is E[K]
        k = np.arange(0, 2000)
        pmf = law.pmf(k)
        assert pmf.sum() == pytest.approx(1.0, abs=1e-9)
        assert (k * pmf).sum() == pytest.approx(law.expected, rel=1e-9)
        if law.distribution == "tnb":
            assert pmf[0] == 0.0


@pytest.mark.parametrize("law", LAWS, ids=lambda law: law.describe())
def test_trial_counts_follow_their_law(law):
    """Chi-square goodness of fit of 20,000 draws (fixed seed) against the pmf."""
    rng = np.random.default_rng(7)
    draws = law.samples(rng, 20_000)
    top = int(np.quantile(draws, 0.99))
    low = 0 if law.distribution == "poisson" else 1
    observed = np.array([np.sum(draws == k) for k in range(low, top)] + [np.sum(draws >= top)])
    expected_p = np.append(law.pmf(np.arange(low, top)), 1 - law.pmf(np.arange(low, top)).sum())
    assert stats.chisquare(observed, expected_p * len(draws)).pvalue > 0.001


@given(
    rho=st.floats(0.001, 2.0),
    eta=st.one_of(st.just(0.0), st.floats(0.001, 3.0)),
    gamma=st.floats(0.01, 0.9),
)
@settings(max_examples=60, deadline=None)
def test_tnb_bound_is_theorem_2_for_zcdp(rho, eta, gamma):
    """For ρ-zCDP (ε(λ) = ρλ) the best λ̂ is sqrt(log(1/γ)/ρ), giving
    ε′(λ) = ρλ + (1+η)(2 sqrt(ρ log(1/γ)) − ρ) + log E[K]/(λ−1); with λ̂* among the orders the
    bound is exactly that, and never below it."""
    law = TrialCount("tnb", eta, gamma)
    log_inv_gamma = math.log(1 / gamma)
    best = math.sqrt(log_inv_gamma / rho)
    orders = np.array(sorted({1.5, 2.0, 4.0, 16.0, max(best, 1.0001)}))
    bound = selection_rdp(rho * orders, law, orders)
    closed = rho * orders + math.log(law.expected) / (orders - 1)
    if best > 1.0001:
        closed = closed + (1 + eta) * (2 * math.sqrt(rho * log_inv_gamma) - rho)
        np.testing.assert_allclose(bound, closed, rtol=1e-9, atol=1e-12)
    assert np.all(bound >= closed - 1e-12)


@given(rho=st.floats(0.001, 1.0), order=st.floats(1.1, 64.0))
@settings(max_examples=60, deadline=None)
def test_poisson_delta_hat_is_the_least_delta_of_opacus_conversion(rho, order):
    orders = np.array(ORDERS, dtype=float)
    rdp = rho * orders
    epsilon_hat = math.log1p(1 / (order - 1))
    delta_hat = poisson_delta_hat(rdp, orders, order)
    assert 0 < delta_hat <= 1
    if delta_hat < 1:
        eps, _ = get_privacy_spent(orders=list(orders), rdp=rdp, delta=delta_hat)
        assert eps <= epsilon_hat * (1 + 1e-9) + 1e-12
        smaller, _ = get_privacy_spent(orders=list(orders), rdp=rdp, delta=0.9 * delta_hat)
        assert smaller > epsilon_hat


@given(
    sigma=st.floats(0.6, 5.0),
    q=st.floats(0.01, 1.0),
    rounds=st.integers(1, 300),
    law=st.sampled_from(LAWS),
)
@settings(max_examples=30, deadline=None)
def test_a_search_costs_more_than_one_trial(sigma, q, rounds, law):
    rdp = trial_rdp([(sigma, q, rounds)])
    single = rdp_epsilon(rdp, 1e-5)
    assert tuning_epsilon(rdp, law, 1e-5) > single
    if law.distribution == "tnb":  # more trials on average cost more
        more = TrialCount("tnb", law.eta, law.gamma / 2)
        assert tuning_epsilon(rdp, more, 1e-5) >= tuning_epsilon(rdp, law, 1e-5)


def test_a_trial_is_the_worst_run_of_the_grid_order_by_order():
    low_noise, high_noise = trial_rdp([(0.8, 0.1, 100)]), trial_rdp([(2.0, 0.1, 100)])
    both = trial_rdp([(2.0, 0.1, 100), (0.8, 0.1, 100)])
    np.testing.assert_array_equal(both, np.maximum(low_noise, high_noise))
    assert np.all(np.isinf(trial_rdp([(0.0, 0.1, 10)])))
    assert tuning_epsilon(trial_rdp([(0.0, 0.1, 10)]), LAWS[0], 1e-5) == math.inf


@pytest.mark.parametrize(
    ("make", "mentions"),
    [
        (lambda: TrialCount("uniform"), "distribution"),
        (lambda: TrialCount("tnb", -0.5, 0.2), "eta"),
        (lambda: TrialCount("tnb", 1e-6, 0.2), "eta"),
        (lambda: TrialCount("tnb", 1.0, 1.0), "gamma"),
        (lambda: TrialCount("poisson", mu=0.0), "mu"),
    ],
)
def test_bad_trial_laws_are_one_clear_error(make, mentions):
    with pytest.raises(PolicyConfigError, match=mentions):
        make()


GRID = {"training.client_lr": [0.1, 0.5], "policy.bounded.lower_bound": [0.1, 0.5]}
SMALL = {"policy.name": "bounded", "training.rounds": 4, "privacy.target_epsilon": 2.0}
INTERNAL = "not-dp-protected"
"""The folder of what a DP search's ε does not cover (a literal: the test pins the layout)."""


def test_tune_end_to_end_releases_the_best_trial_with_the_search_epsilon(tmp_path):
    out = tmp_path / "tune"
    started = []
    tuning = fairclip.tune(
        "demo", grid=GRID, overrides=SMALL, seed=3, out=out, on_start=lambda n, m: started.append((n, m))
    )
    from fairclip.sims.tune.search import TuneSpec

    spec = TuneSpec(raw={}, grid=GRID, metric="macro_accuracy", trials=TrialCount(), seed=3)
    drawn = draw_trials(spec, len(grid_points(GRID)))
    assert len(tuning.trials) == len(drawn) >= 1
    assert started == [(len(drawn) + 4, len(drawn) + 4)]
    points = grid_points(GRID)
    for (_, row), index in zip(tuning.trials.iterrows(), drawn, strict=True):
        assert row["seed"] == 1 + row["trial"]  # the scenario's seed 0, + 1 + trial
        assert {key: row[key] for key in GRID} == points[index]
    assert tuning.best["macro_accuracy"] == tuning.trials["macro_accuracy"].max()
    assert tuning.grid_best["macro_accuracy"] == tuning.grid["macro_accuracy"].max()
    assert len(tuning.grid) == 4 and set(tuning.grid["seed"]) == {0}
    # ε of the search is the theorem's on the runs' own plan
    privacy = json.loads((out / "tuning.json").read_text())
    internal = out / INTERNAL
    assert len(pd.read_csv(internal / "trials.csv")) == len(drawn)
    assert len(pd.read_csv(internal / "grid.csv")) == 4
    sigma = fairclip.simulate("demo", overrides={**SMALL, "seed": 1}).privacy["effective_noise_multiplier"]
    expected = tuning_epsilon(trial_rdp([(sigma, 0.5, 4)]), TrialCount(), 1e-5)
    assert tuning.epsilon == pytest.approx(expected, rel=1e-12)
    assert privacy["result"]["epsilon"] == pytest.approx(expected, rel=1e-12)
    assert tuning.epsilon > tuning.epsilon_trial_rdp > tuning.best["epsilon_run"] * 0.99
    summary = tuning.summary().set_index("selection")["accountant"]
    assert list(summary) == ["prv", "rdp"]  # each ε with the accountant it comes from
    report = (out / "report.md").read_text()
    assert "DP random search" in report and "non-private selection (every" not in report
    assert f"{tuning.epsilon:.4g}" in report
    full = (internal / "report.md").read_text()
    assert "DP random search" in full and "non-private selection (every grid point)" in full

    # resume: nothing runs again, the same selection comes back
    again = []
    resumed = fairclip.tune("demo", grid=GRID, overrides=SMALL, seed=3, out=out, resume=True,
                            on_start=lambda n, m: again.append((n, m)))  # fmt: skip
    assert again == [(len(drawn) + 4, 0)]
    pd.testing.assert_frame_equal(resumed.trials, tuning.trials, check_dtype=False)
    # a run lost from the folder is run again, with the same numbers
    pd.read_csv(internal / "grid.csv").iloc[1:].to_csv(internal / "grid.csv", index=False)
    rerun = fairclip.tune("demo", grid=GRID, overrides=SMALL, seed=3, out=out, resume=True)
    pd.testing.assert_frame_equal(rerun.grid, tuning.grid, check_dtype=False)
    with pytest.raises(ConfigError, match="different search"):
        fairclip.tune(
            "demo", grid={"training.client_lr": [0.2]}, overrides=SMALL, seed=3, out=out, resume=True
        )
    with pytest.raises(ConfigError, match="already holds a search"):
        fairclip.tune("demo", grid=GRID, overrides=SMALL, seed=3, out=out)


def _unreleased_values(folder, best):
    """Every metric value of the search's runs other than its released trial, each as the regular
    expressions of its plain and 4-digit forms (skipping values that equal one released, or of
    under 3 significant digits, which another number of the folder could spell)."""
    metrics = list(METRICS)
    released = {f"{best[m]:.4g}" for m in metrics}
    runs = pd.concat([pd.read_csv(folder / INTERNAL / name) for name in ("trials.csv", "grid.csv")])
    runs = runs[~((runs.get("trial") == best["trial"]) & runs["trial"].notna())]
    patterns = set()
    for value in runs[metrics].to_numpy().ravel():
        short = f"{value:.4g}"
        if math.isfinite(value) and short not in released and len(short.lstrip("-0.").replace(".", "")) >= 3:
            for form in (repr(float(value)), short):
                patterns.add(rf"(?<![\d.]){re.escape(form)}(?!\d)")
    return patterns


def test_a_search_publishes_its_release_only(tmp_path, cli):
    """The DP search's ε covers its chosen trial only (Papernot & Steinke 2022): no file at the top
    of the folder and nothing the command prints holds another run's metric or how many trials
    ran; every run is in not-dp-protected/, under a note that says so."""
    out = tmp_path / "t"
    status, printed, err = cli(
        "tune", "--scenario", "demo", "--set", "policy.name=bounded", "--set", "training.rounds=3",
        "--set", "privacy.target_epsilon=2", "--grid", "training.client_lr=0.1,0.5", "--grid",
        "policy.bounded.lower_bound=0.1,0.5", "--tuning-seed", "3", "--backend", "local", "--out", str(out),
    )  # fmt: skip
    assert status == 0, err
    internal = out / INTERNAL
    trials = pd.read_csv(internal / "trials.csv")
    assert len(trials) >= 2 and len(pd.read_csv(internal / "grid.csv")) == 4  # others to leak
    best = trials.loc[trials["macro_accuracy"].idxmax()]
    leaks = _unreleased_values(out, best)
    assert len(leaks) >= 20
    public = {p.name: p.read_text() for p in out.iterdir() if p.is_file() and not p.name.startswith(".")}
    assert sorted(public) == ["report.md", "tuning.json"]
    for name, text in {**public, "stdout": printed}.items():
        found = [pattern for pattern in leaks if re.search(pattern, text)]
        assert not found, f"{name} holds unreleased values {found[:3]}"
        assert "drawn" not in text and "trials_run" not in text and "trial_points" not in text
    assert f"{best['macro_accuracy']:.4g}" in public["report.md"] and public["report.md"] in printed
    result = json.loads(public["tuning.json"])["result"]
    assert result["best"]["macro_accuracy"] == pytest.approx(best["macro_accuracy"])
    assert "trial" not in result["best"] and "seed" not in result["best"]  # its index tells K's least
    assert {"epsilon", "delta", "accountant", "epsilon_covers"} <= set(result)
    note = (internal / "README.txt").read_text()
    assert note.startswith("NOT DP-PROTECTED") and "trials.csv" in note and "grid.csv" in note
    assert "DP search trials" in (internal / "report.md").read_text()


def _to_old_layout(folder):
    """Turn a search folder into the layout before not-dp-protected/: the run tables and the full
    report at the top, the trials' grid points and the full result in tuning.json."""
    internal = folder / INTERNAL
    plan = json.loads((internal / "search.json").read_text())
    stored = json.loads((folder / "tuning.json").read_text())
    (folder / "tuning.json").write_text(json.dumps({**stored, "trial_points": plan["trial_points"],
                                                    "result": plan["result"]}))  # fmt: skip
    for name in ("trials.csv", "grid.csv", "report.md"):
        if (internal / name).exists():
            (internal / name).replace(folder / name)
    shutil.rmtree(internal)


def test_resume_moves_a_folder_of_the_old_layout_into_not_dp_protected(tmp_path):
    out = tmp_path / "t"
    tuning = fairclip.tune("demo", grid=GRID, overrides=SMALL, seed=3, out=out)
    public_report = (out / "report.md").read_text()
    _to_old_layout(out)
    pd.read_csv(out / "trials.csv").iloc[1:].to_csv(out / "trials.csv", index=False)  # one run lost
    with pytest.raises(ConfigError, match="different search"):  # refused before anything moves
        fairclip.tune(
            "demo", grid={"training.client_lr": [0.2]}, overrides=SMALL, seed=3, out=out, resume=True
        )
    assert (out / "trials.csv").exists() and not (out / INTERNAL).exists()
    started = []
    resumed = fairclip.tune("demo", grid=GRID, overrides=SMALL, seed=3, out=out, resume=True,
                            on_start=lambda n, m: started.append((n, m)))  # fmt: skip
    assert started == [(len(tuning.trials) + 4, 1)]  # only the lost run again
    pd.testing.assert_frame_equal(resumed.trials, tuning.trials, check_dtype=False)
    assert sorted(p.name for p in out.iterdir() if p.is_file() and not p.name.startswith(".")) == [
        "report.md",
        "tuning.json",
    ]
    assert (out / "report.md").read_text() == public_report
    stored = json.loads((out / "tuning.json").read_text())
    assert "trial_points" not in stored and "grid_best" not in stored["result"]
    assert len(pd.read_csv(out / INTERNAL / "trials.csv")) == len(tuning.trials)
    assert (out / INTERNAL / "README.txt").read_text().startswith("NOT DP-PROTECTED")
    plan = json.loads((out / INTERNAL / "search.json").read_text())
    assert plan["result"]["trials_run"] == len(plan["trial_points"]) == len(tuning.trials)


@pytest.mark.parametrize(
    ("args", "mentions"),
    [
        (["--grid", "training.client_lr"], "--grid expects KEY=V1,V2"),
        (["--grid", "training.client_lr=0.1", "--metric", "speed"], "metric must be one of"),
        (["--grid", "scenario.features=3,4"], "tune searches training, policy and privacy"),
        (["--grid", "privacy.delta=1e-5,1e-6"], "one privacy.delta"),
        (["--grid", "training.client_lr=0.1", "--set", "policy.name=none"], "needs a private policy"),
        (["--grid", "training.client_lr=-1"], "client_lr"),
        (["--grid", "training.client_lr=0.1,0.2", "--set", "training.client_lr=0.5"], "both set"),
        (
            [
                *("--grid", "policy.bounded.lower_bound=0.1,0.2", "--set", "policy.name=bounded"),
                *("--set", "policy.lower_bound=0.05"),
            ],
            "is set directly and wins over the table",
        ),
        (
            [
                *("--grid", "training.client_lr=0.1", "--policies", "constant", "--epsilons", "1"),
                *("--set", "privacy.target_epsilon=3"),
            ],
            "the curve sets it for each search",
        ),
        (["--grid", "training.client_lr=0.1", "--distribution", "tnb", "--gamma", "2"], "gamma"),
        (["--grid", "training.client_lr=0.1", "--policies", "constant"], "go together"),
        (
            ["--grid", "training.client_lr=0.1", "--policies", "constant", "--epsilons", "1,x"],
            "not a number",
        ),
    ],
)
def test_tune_refuses_bad_input_in_one_line_before_any_work(tmp_path, capsys, args, mentions):
    out = tmp_path / "t"
    with pytest.raises(SystemExit) as stop:
        main(["tune", "--scenario", "demo", "--backend", "local", "--out", str(out), *args])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and mentions in err[0]
    assert not (out / "tuning.json").exists()


def test_tune_command_prints_the_report(tmp_path, capsys):
    out = tmp_path / "t"
    main([
        "tune", "--scenario", "demo", "--set", "policy.name=bounded", "--set", "training.rounds=3",
        "--set", "privacy.target_epsilon=4", "--grid", "training.client_lr=0.2,0.4", "--distribution",
        "poisson", "--mu", "2", "--tuning-seed", "1", "--no-grid-baseline", "--backend", "local",
        "--out", str(out),
    ])  # fmt: skip
    printed = capsys.readouterr().out
    assert "ε of the whole DP search" in printed
    assert f"{out / INTERNAL}/" in printed.splitlines()[-1]
    assert not (out / INTERNAL / "grid.csv").exists()
    stored = json.loads((out / "tuning.json").read_text())
    assert stored["trials"]["distribution"] == "poisson" and stored["grid_baseline"] is False
    plan = json.loads((out / INTERNAL / "search.json").read_text())
    assert plan["result"]["trials_run"] == len(plan["trial_points"])


def test_a_policy_searches_only_its_own_and_the_shared_keys():
    from fairclip.sims.tune.curve import policy_grid

    grid = {
        "training.client_lr": [0.1],
        "policy.bounded.lower_bound": [0.1, 0.5],
        "policy.constant.initial_bound": [1.0],
        "policy.initial_bound": [2.0],
    }
    assert policy_grid(grid, "constant") == {
        "training.client_lr": [0.1],
        "policy.constant.initial_bound": [1.0],
        "policy.initial_bound": [2.0],
    }
    assert "policy.bounded.lower_bound" in policy_grid(grid, "bounded")
    assert grid_points({}) == [{}]  # no grid: the configuration as given, among seeds


def test_tuning_curve_runs_one_search_per_policy_and_epsilon(tmp_path):
    out = tmp_path / "curve"
    grid = {"training.client_lr": [0.2, 0.5], "policy.bounded.lower_bound": [0.1, 0.5]}
    options = dict(overrides={"training.rounds": 3}, grid_baseline=False, distribution="poisson", mu=2.0)
    with pytest.raises(ConfigError, match="lower_bound"):  # bounded's bad point refused before constant runs
        bad = {**grid, "policy.bounded.lower_bound": [-1.0]}
        fairclip.tune_curve(
            "demo", policies=["constant", "bounded"], epsilons=[2.0], grid=bad, out=out, **options
        )
    assert not out.exists()
    table = fairclip.tune_curve(
        "demo", policies=["constant", "bounded"], epsilons=[1.0, 4.0], grid=grid, out=out, **options
    )
    assert list(zip(table["policy"], table["target_epsilon"], strict=True)) == [
        ("constant", 1.0), ("constant", 4.0), ("bounded", 1.0), ("bounded", 4.0),
    ]  # fmt: skip
    stored = pd.read_csv(out / INTERNAL / "curve.csv")
    pd.testing.assert_frame_equal(stored, table, check_dtype=False)
    public = ["policy", "target_epsilon", "epsilon_search", "epsilon_trial_rdp", "dp_search_macro_accuracy"]
    pd.testing.assert_frame_equal(pd.read_csv(out / "curve.csv"), table[public], check_dtype=False)
    for folder in (out, out / INTERNAL):
        assert (folder / "tuning_curve.png").stat().st_size > 0
        assert "tuning_curve.png" in (folder / "report.md").read_text()
    assert "grid_epsilon_run" not in (out / "report.md").read_text()
    assert "grid_epsilon_run" in (out / INTERNAL / "report.md").read_text()
    assert (out / INTERNAL / "README.txt").read_text().startswith("NOT DP-PROTECTED")
    # a larger target ε costs more in the whole search; constant never searched bounded's key
    for policy in ("constant", "bounded"):
        mine = table[table["policy"] == policy]
        assert mine["epsilon_search"].is_monotonic_increasing
    constant = json.loads((out / "constant__eps-1" / "tuning.json").read_text())
    assert constant["grid"] == {"training.client_lr": [0.2, 0.5]}
    indices = [json.loads((out / k / "tuning.json").read_text())["search_index"] for k in
               ("constant__eps-1", "constant__eps-4", "bounded__eps-1", "bounded__eps-4")]  # fmt: skip
    assert indices == [0, 1, 2, 3]
    # resume: every search comes back from its folder
    again = fairclip.tune_curve(
        "demo",
        policies=["constant", "bounded"],
        epsilons=[1.0, 4.0],
        grid=grid,
        out=out,
        resume=True,
        **options,
    )
    pd.testing.assert_frame_equal(again, table)
    # a curve of the layout before not-dp-protected/ (the full table, plot and report at the top,
    # every search's runs too) is moved into it on resume
    for name in ("curve.csv", "report.md", "tuning_curve.png"):
        shutil.copy(out / INTERNAL / name, out / name)
    shutil.rmtree(out / INTERNAL)
    for key in table["policy"] + "__eps-" + table["target_epsilon"].map("{:g}".format):
        _to_old_layout(out / key)
    moved = fairclip.tune_curve(
        "demo", policies=["constant", "bounded"], epsilons=[1.0, 4.0], grid=grid, out=out, resume=True,
        **options,
    )  # fmt: skip
    pd.testing.assert_frame_equal(moved, table)
    assert list(pd.read_csv(out / "curve.csv").columns) == public
    assert "grid_epsilon_run" not in (out / "report.md").read_text()
    files = sorted(p.name for p in out.iterdir() if p.is_file() and not p.name.startswith("."))
    assert files == ["curve.csv", "report.md", "tuning-curve.json", "tuning_curve.png"]
    assert (out / INTERNAL / "README.txt").exists()


def test_a_search_stopped_early_closes_its_runs_so_those_still_going_stop(tmp_path, monkeypatch):
    """A search stopped between runs (Ctrl-C, an error) closes the generator of its runs, which
    on Ray cancels the tasks still going (:func:`fairclip.sims.executors.jobs.stop_tasks`)."""
    from fairclip.sims.executors import jobs

    real = jobs.simulate_jobs
    closed = []

    def recording(jobs, **kwargs):
        try:
            yield from real(jobs, **kwargs)
        except GeneratorExit:
            closed.append(len(jobs))
            raise

    monkeypatch.setattr(jobs, "simulate_jobs", recording)

    def stop(name, result):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt) as stopped:
        fairclip.tune("demo", grid=GRID, overrides=SMALL, seed=3, out=tmp_path / "t", on_run=stop)
    assert stopped.traceback  # the stopped search's frames are still held here
    assert len(closed) == 1 and closed[0] >= 5  # closed at once, with its trials and 4 grid runs
    assert len(pd.read_csv(tmp_path / "t" / INTERNAL / "trials.csv")) == 1


@pytest.mark.parametrize(
    ("command", "held"),
    [
        ("tune", "sweep.json"),
        ("tune", "curve.csv"),
        ("tune-curve", "sweep.json"),
        ("tune-curve", "tuning.json"),
        ("compare", "tuning.json"),
        ("compare --resume", "tuning.json"),
        ("compare --extend", "curve.csv"),
        ("reproduce --resume", "curve.csv"),
        ("reproduce-unnamed --resume", "tuning.json"),
    ],
)
def test_a_search_a_curve_and_a_sweep_never_share_a_folder(cli, tmp_path, command, held):
    """``compare`` into a folder holding a ``tune`` search or curve, or ``tune`` into one
    holding a sweep or another kind of search, would mix two commands' outputs (their reports
    are all ``report.md``; ``compare`` used to write its report beside the search's, and
    ``compare --resume`` suggested ``--extend``): one line naming what the folder holds, exit 2,
    and nothing written."""
    out = tmp_path / "folder"
    out.mkdir()
    (out / held).write_text(json.dumps({"command": "compare", "scenario": "demo"}))
    before = sorted(p.name for p in out.iterdir())
    name, *mode = command.split()
    tune = ["--grid", "training.client_lr=0.1", "--backend", "local"]
    args = {
        "tune": ["tune", "--scenario", "demo", *tune],
        "tune-curve": ["tune", "--scenario", "demo", *tune, "--policies", "constant", "--epsilons", "1"],
        "compare": ["compare", "--scenario", "demo", "--policies", "constant"],
        "reproduce": ["reproduce", "zhao-adult"],
        "reproduce-unnamed": ["reproduce"],  # --resume takes the setup from the folder
    }[name]
    status, _, err = cli(*args, *mode, "--out", str(out))
    assert status == 2
    assert "holds a" in err and f"({held}), not this command's" in err and err.count("\n") == 1, err
    assert sorted(p.name for p in out.iterdir() if p.name != ".fairclip.lock") == before


def test_a_tuning_curve_takes_a_policy_as_a_name_a_class_or_an_instance(tmp_path):
    """Issue 67: one way to hand fairclip a policy, in tune_curve as in compare: a class runs under
    its name, an instance's parameters are fixed in every run of its searches, and a grid that
    searches one of them too is refused before any work."""
    from fairclip.strategies import build_policy
    from fairclip.strategies.constant import ConstantClipping

    out = tmp_path / "curve"
    options = dict(overrides={"training.rounds": 2}, grid_baseline=False, distribution="poisson", mu=1.0)
    bounded = build_policy("bounded", {"lower_bound": 0.3, "initial_bound": 0.6})
    with pytest.raises(ConfigError, match="is given as an instance"):
        fairclip.tune_curve("demo", policies=[bounded], epsilons=[2.0], out=out,
                            grid={"policy.bounded.lower_bound": [0.1]}, **options)  # fmt: skip
    assert not out.exists()
    table = fairclip.tune_curve(
        "demo", policies=[ConstantClipping, bounded], epsilons=[2.0], grid={"training.client_lr": [0.3]},
        out=out, **options,
    )  # fmt: skip
    assert list(table["policy"]) == ["constant", "bounded"]
    # the search's configuration holds the instance's parameters, over the demo's own [policy.bounded]
    from fairclip.scenarios.config import validate

    searched = validate(json.loads((out / "bounded__eps-2" / "tuning.json").read_text())["raw"])
    assert searched.policy.name == "bounded"
    assert (searched.policy.params["lower_bound"], searched.policy.params["initial_bound"]) == (0.3, 0.6)
    stored = json.loads((out / "tuning-curve.json").read_text())["instances"]  # a resume must match it
    assert list(stored) == ["bounded"]
    assert (stored["bounded"]["policy.lower_bound"], stored["bounded"]["policy.initial_bound"]) == (0.3, 0.6)
