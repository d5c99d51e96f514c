"""The command line: outputs, privacy claims, budgets, reproducibility and bad input."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import typer
from opacus.accountants import PRVAccountant, RDPAccountant

QUICK = ["--set", "federation.num_clients=500", "--set", "training.rounds=8"]


def _run(cli, out, *extra):
    return cli("run", "--scenario", "bimodal-mean", *QUICK, "--out", str(out), *extra)


@pytest.mark.parametrize("accountant", ["prv", "rdp"])
def test_privacy_json_equals_opacus_called_directly(cli, accountant):
    status, out, err = cli(
        "privacy",
        "--noise-multiplier",
        "1.1",
        "--count-noise-multiplier",
        "11",
        "--sample-rate",
        "0.02",
        "--rounds",
        "300",
        "--delta",
        "1e-5",
        "--accountant",
        accountant,
        "--json",
    )
    assert status == 0, err
    claim = json.loads(out)
    sigma_eff = (1.1**-2 + 11**-2) ** -0.5
    opacus = {"prv": PRVAccountant, "rdp": RDPAccountant}[accountant]()
    opacus.history = [(sigma_eff, 0.02, 300)]
    assert claim["epsilon"] == pytest.approx(opacus.get_epsilon(delta=1e-5), rel=1e-9)
    assert claim["effective_noise_multiplier"] == pytest.approx(sigma_eff)
    assert set(claim) == {
        "epsilon",
        "delta",
        "noise_multiplier",
        "count_noise_multiplier",
        "effective_noise_multiplier",
        "sample_rate",
        "rounds",
        "accountant",
    }
    assert (claim["sample_rate"], claim["rounds"], claim["delta"], claim["accountant"]) == (
        0.02,
        300,
        1e-5,
        accountant,
    )


def test_privacy_target_epsilon_round_trips(cli):
    status, out, _ = cli(
        "privacy",
        "--target-epsilon",
        "3",
        "--sample-rate",
        "0.05",
        "--rounds",
        "200",
        "--delta",
        "1e-5",
        "--json",
    )
    assert status == 0
    claim = json.loads(out)
    assert claim["count_noise_multiplier"] == pytest.approx(10 * claim["noise_multiplier"])
    status, out, _ = cli(
        "privacy",
        "--noise-multiplier",
        str(claim["noise_multiplier"]),
        "--count-noise-multiplier",
        str(claim["count_noise_multiplier"]),
        "--sample-rate",
        "0.05",
        "--rounds",
        "200",
        "--delta",
        "1e-5",
        "--json",
    )
    assert json.loads(out)["epsilon"] == pytest.approx(3.0, rel=0.01)
    assert json.loads(out)["epsilon"] <= 3.0


def test_privacy_count_noise_ratio_splits_the_calibrated_noise(cli):
    """Seed 002's σ_q = 7.124 σ_eff: --count-noise-ratio 7.054 gives σ_b = k σ_Δ with the same σ_eff
    (so the same ε) as the default split; without --target-epsilon it is refused (exit 2)."""
    common = ["--sample-rate", "0.00853", "--rounds", "1172", "--delta", "1e-5", "--accountant", "rdp"]
    claims = {}
    for ratio in (None, "7.054"):
        extra = [] if ratio is None else ["--count-noise-ratio", ratio]
        status, out, err = cli("privacy", "--target-epsilon", "3", *common, *extra, "--json")
        assert status == 0, err
        claims[ratio] = json.loads(out)
    oso = claims["7.054"]
    assert oso["count_noise_multiplier"] == pytest.approx(7.054 * oso["noise_multiplier"])
    assert oso["count_noise_multiplier"] / oso["effective_noise_multiplier"] == pytest.approx(7.124, rel=1e-3)
    assert oso["effective_noise_multiplier"] == pytest.approx(claims[None]["effective_noise_multiplier"])
    assert oso["epsilon"] == pytest.approx(claims[None]["epsilon"]) and oso["epsilon"] <= 3.0
    status, _out, err = cli("privacy", "--noise-multiplier", "1", "--count-noise-ratio", "7", *common)
    assert status == 2 and "--count-noise-ratio goes with --target-epsilon" in err


def test_zero_noise_reports_infinite_epsilon(cli):
    status, out, _ = cli(
        "privacy",
        "--noise-multiplier",
        "0",
        "--sample-rate",
        "0.1",
        "--rounds",
        "5",
        "--delta",
        "1e-5",
        "--json",
    )
    assert status == 0
    assert json.loads(out)["epsilon"] == "inf"


def test_run_with_noise_records_epsilon_and_the_noise_of_the_clipping_bound(cli, tmp_path):
    status, _, err = _run(
        cli,
        tmp_path,
        "--set",
        "policy.name=bounded",
        "--set",
        "privacy.noise_multiplier=0.8",
        "--set",
        "privacy.accountant=rdp",
    )
    assert status == 0, err
    rounds = pd.read_csv(tmp_path / "rounds.csv")
    assert np.allclose(rounds["noise_std"], 0.8 * rounds["clip_bound"], rtol=1e-12)
    assert rounds["clip_bound"].nunique() > 1
    assert rounds["epsilon"].is_monotonic_increasing
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["epsilon"] == pytest.approx(rounds["epsilon"].iloc[-1])
    assert summary["privacy"]["count_noise_multiplier"] == pytest.approx(8.0)
    assert summary["privacy"]["sample_rate"] == 0.1
    assert summary["privacy"]["rounds"] == 8


def test_budget_stops_the_run_before_it_is_exceeded(cli, tmp_path):
    status, _out, err = _run(
        cli,
        tmp_path,
        "--set",
        "policy.name=bounded",
        "--set",
        "privacy.noise_multiplier=1.0",
        "--set",
        "privacy.epsilon_budget=3.0",
        "--set",
        "privacy.accountant=rdp",
    )
    assert status == 0, err
    assert "privacy budget reached" in err
    rounds = pd.read_csv(tmp_path / "rounds.csv")
    assert 0 < len(rounds) < 8
    assert rounds["epsilon"].iloc[-1] <= 3.0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["rounds_completed"] == len(rounds)
    assert "privacy budget reached" in summary["stopped_early"]


def test_target_epsilon_calibrates_both_multipliers(cli, tmp_path):
    status, _, err = _run(
        cli, tmp_path, "--set", "policy.name=bounded", "--set", "privacy.target_epsilon=4.0"
    )
    assert status == 0, err
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["rounds_completed"] == 8
    assert 4.0 * 0.99 <= summary["epsilon"] <= 4.0
    privacy = summary["privacy"]
    assert privacy["count_noise_multiplier"] == pytest.approx(10 * privacy["noise_multiplier"])


def test_count_noise_ratio_sets_sigma_b_with_and_without_calibration(cli, tmp_path):
    """Seed 002's σ_q ≈ 7.124 σ_eff is k = 7.054: the calibrated pair keeps σ_eff (the same ε as
    with k = 10) and σ_b = k σ_Δ; without a target, σ_b = k σ_Δ from the given σ_Δ."""
    runs = {
        "k7": ("privacy.target_epsilon=4.0", "privacy.count_noise_ratio=7.054"),
        "k10": ("privacy.target_epsilon=4.0",),
        "fixed": ("privacy.noise_multiplier=0.9", "privacy.count_noise_ratio=3.0"),
    }
    privacy = {}
    for name, keys in runs.items():
        sets = [arg for key in ("policy.name=online", *keys) for arg in ("--set", key)]
        status, _, err = _run(cli, tmp_path / name, *sets)
        assert status == 0, err
        privacy[name] = json.loads((tmp_path / name / "summary.json").read_text())["privacy"]
    k7, k10, fixed = privacy["k7"], privacy["k10"], privacy["fixed"]
    assert k7["count_noise_multiplier"] == pytest.approx(7.054 * k7["noise_multiplier"])
    assert k7["effective_noise_multiplier"] == pytest.approx(k10["effective_noise_multiplier"])
    assert k7["count_noise_multiplier"] == pytest.approx(7.124 * k7["effective_noise_multiplier"], rel=1e-3)
    assert k7["noise_multiplier"] > k10["noise_multiplier"]  # a noisier q buys less update noise
    assert fixed["noise_multiplier"] == 0.9
    assert fixed["count_noise_multiplier"] == pytest.approx(2.7)


@pytest.mark.parametrize(
    "keys, named",
    [
        (("privacy.count_noise_multiplier=5.0", "privacy.count_noise_ratio=3.0"), "not both"),
        (("privacy.count_noise_multiplier=5.0", "privacy.target_epsilon=4.0"), "count_noise_ratio instead"),
        (("privacy.count_noise_ratio=0",), "count_noise_ratio"),
    ],
)
def test_conflicting_count_noise_keys_are_refused_in_one_line(cli, tmp_path, keys, named):
    sets = [arg for key in keys for arg in ("--set", key)]
    status, _out, err = _run(cli, tmp_path, *sets)
    assert status == 2
    assert named in err and "Traceback" not in err
    assert not (tmp_path / "summary.json").exists()


def test_same_seed_same_result_and_other_seed_differs(cli, tmp_path):
    noisy = ["--set", "policy.name=adaptive", "--set", "privacy.noise_multiplier=0.5"]
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        assert _run(cli, tmp_path / name, *noisy, "--set", f"seed={seed}")[0] == 0
    a, b, c = (pd.read_csv(tmp_path / name / "rounds.csv") for name in "abc")
    pd.testing.assert_frame_equal(a, b)
    assert not a["estimate"].equals(c["estimate"])


def test_interrupted_run_keeps_finished_rounds(cli, tmp_path, monkeypatch):
    import fairclip.sims.executors.loop as loop

    original = loop.simulate

    def interrupted(config, task, *args, on_round=None, **kwargs):
        def stop_after_three(row):
            if on_round is not None:
                on_round(row)
            if row["round"] == 3:
                raise KeyboardInterrupt

        return original(config, task, *args, on_round=stop_after_three, **kwargs)

    monkeypatch.setattr(loop, "simulate", interrupted)
    status, _, _ = _run(cli, tmp_path)
    assert status == 130
    assert list(pd.read_csv(tmp_path / "rounds.csv")["round"]) == [1, 2, 3]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["rounds_completed"] == 3 and summary["status"] == "interrupted"
    assert summary["privacy"]["rounds"] == 3
    np.testing.assert_array_equal(np.load(tmp_path / "model.npy"), summary["estimate"])


BAD_INPUTS = [
    ("run", "--scenario", "no-such-scenario"),
    ("run", "--scenario", "bimodal-mean", "--set", "policy.target_quantile=1.5"),
    ("run", "--scenario", "bimodal-mean", "--set", "policy.initial_bound=-1"),
    (
        "run",
        "--scenario",
        "bimodal-mean",
        "--set",
        "policy.name=bounded",
        "--set",
        "policy.lower_bound=5",
    ),
    (
        "run",
        "--scenario",
        "bimodal-mean",
        "--set",
        "policy.name=bounded",
        "--set",
        "policy.bounded.lower_bound=0",
    ),
    ("run", "--scenario", "bimodal-mean", "--set", "policy.name=nonsense"),
    ("run", "--scenario", "bimodal-mean", "--set", "policy.unknown_key=1"),
    ("run", "--scenario", "bimodal-mean", "--set", "federation.sample_rate=0"),
    ("run", "--scenario", "bimodal-mean", "--set", "training.rounds=many"),
    ("run", "--scenario", "bimodal-mean", "--set", "privacy.delta=2"),
    ("run", "--scenario", "bimodal-mean", "--set", "privacy.accountant=gdp"),
    ("run", "--scenario", "bimodal-mean", "--set", "privacy.noise_multiplier=-0.5"),
    ("run", "--scenario", "bimodal-mean", "--set", "nosuchtable.key=1"),
    ("run", "--scenario", "demo", "--set", "privacy.target_epsilon=2", "--set", "privacy.noise_multiplier=1"),
    (
        "run",
        "--scenario",
        "demo",
        "--set",
        "policy.lower_bound=0.2",
        "--set",
        "policy.bounded.lower_bound=0.3",
    ),
    ("run", "--scenario", "bimodal-mean", "--set", "novalue"),
    ("run", "--config", "/nonexistent/scenario.toml"),
    ("compare", "--scenario", "bimodal-mean", "--set", "policy.name=bounded"),
    ("compare", "--scenario", "bimodal-mean", "--epsilons", "1,2", "--set", "privacy.target_epsilon=3"),
    ("compare", "--scenario", "bimodal-mean", "--epsilons", "1", "--set", "privacy.noise_multiplier=2"),
    ("run", "--scenario", "bimodal-mean", "--backend", "mpi"),
    (
        "privacy",
        "--noise-multiplier",
        "1",
        "--sample-rate",
        "1.5",
        "--rounds",
        "10",
        "--delta",
        "1e-5",
    ),
    (
        "privacy",
        "--noise-multiplier",
        "-1",
        "--sample-rate",
        "0.1",
        "--rounds",
        "10",
        "--delta",
        "1e-5",
    ),
    (
        "privacy",
        "--noise-multiplier",
        "1",
        "--sample-rate",
        "0.1",
        "--rounds",
        "ten",
        "--delta",
        "1e-5",
    ),
    (
        "privacy",
        "--target-epsilon",
        "1",
        "--noise-multiplier",
        "1",
        "--sample-rate",
        "0.1",
        "--rounds",
        "1",
        "--delta",
        "1e-5",
    ),
]


@pytest.mark.parametrize("args", BAD_INPUTS, ids=lambda args: " ".join(args[-2:]))
def test_bad_input_gives_one_line_and_status_2(cli, tmp_path, args):
    status, _, err = cli(*args, *(["--out", str(tmp_path / "x")] if args[0] in ("run", "compare") else []))
    assert status == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("fairclip: error: ")
    assert "Traceback" not in err
    assert not (tmp_path / "x").exists()


def test_a_misspelled_section_is_named(cli, tmp_path):
    """``[federaton]`` leaves ``federation`` missing too; the line names the misspelling."""
    good = (Path(__file__).resolve().parents[1] / "scenarios" / "builtin" / "demo.toml").read_text()
    assert good.count("[federation]") == 1
    typo = tmp_path / "typo.toml"
    typo.write_text(good.replace("[federation]", "[federaton]"))
    status, _, err = cli("run", "--config", str(typo), "--out", str(tmp_path / "x"))
    assert status == 2 and err == "fairclip: error: federaton: unknown key (did you mean 'federation'?)\n", (
        err
    )


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["run", "--scenario", "demo", "--set", "training.round=5"],
            "training.round: unknown key (did you mean 'rounds'?)",
        ),
        (
            ["run", "--scenario", "demo", "--set", "scenario.cohortz=1"],
            "unknown key (did you mean 'cohorts'?)",
        ),
        (["run", "--scenario", "dem"], "unknown scenario 'dem' (did you mean 'demo'?)"),
        (
            ["run", "--scenario", "demo", "--set", "policy.name=bounde"],
            "unknown policy 'bounde' (did you mean 'bounded'?)",
        ),
        (
            [
                "run",
                "--scenario",
                "demo",
                "--set",
                "policy.name=bounded",
                "--set",
                "policy.lower_bond=0.1",
            ],
            "no such parameter (did you mean 'lower_bound'?)",
        ),
        (["reproduce", "xu-adlt"], "unknown reproduction 'xu-adlt' (did you mean 'xu-adult'?)"),
        (["run", "--scenario", "demo", "--set", "training.zzzz=5"], "training.zzzz: unknown key\n"),
    ],
)
def test_a_misspelled_key_scenario_policy_or_setup_gets_a_did_you_mean(cli, tmp_path, args, line):
    """Issue 67: "did you mean" for keys, scenarios, policies, their parameters and setups; a
    name close to nothing gets no guess."""
    status, _, err = cli(*args, "--out", str(tmp_path / "x"))
    assert status == 2 and line in err and err.count("\n") == 1, err
    assert not (tmp_path / "x").exists()


def test_malformed_config_file_is_one_line(cli, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[scenario\nname = 1\n")
    status, _, err = cli("run", "--config", str(bad))
    assert status == 2
    assert len(err.strip().splitlines()) == 1 and "invalid TOML" in err


def test_python_dash_m_entry_point_exits_2_without_traceback(tmp_path):
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "fairclip",
            "run",
            "--scenario",
            "bimodal-mean",
            "--set",
            "policy.bound_lr=-1",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert completed.returncode == 2
    assert completed.stderr.strip().splitlines() == [
        "fairclip: error: policy (adaptive): bound_lr must be >= 0 (got -1)"
    ]


def test_scenarios_lists_bimodal_mean(cli):
    status, out, _ = cli("scenarios")
    assert status == 0 and "bimodal-mean" in out


@pytest.mark.parametrize("value", ["False", "maybe", "'true'", "1", "0"])
def test_boolean_keys_take_true_or_false_only(cli, tmp_path, value):
    """Issue 18, point 1: `policy.normalize=False` (then named `strategy.normalize`) ran *with*
    normalisation (bool("False"))."""
    for key in ("policy.normalize", "policy.adaptive", "privacy.secure_noise", "scenario.balance"):
        strategy = ["--set", "policy.name=soft"] if key == "policy.adaptive" else []
        scenario = "adult" if key == "scenario.balance" else "bimodal-mean"
        args = ["run", "--scenario", scenario, *strategy, "--set", f"{key}={value}"]
        status, _, err = cli(*args, "--out", str(tmp_path / "x"))
        assert status == 2, (key, value, err)
        assert len(err.strip().splitlines()) == 1 and key.split(".")[-1] in err, err
        assert not (tmp_path / "x").exists()


def test_normalize_true_and_false_run(cli, tmp_path):
    for value in ("true", "false"):
        out = tmp_path / value
        status, _, err = cli(
            "run", "--scenario", "bimodal-mean", "--set", "training.rounds=1",
            "--set", f"policy.normalize={value}", "--out", str(out),
        )  # fmt: skip
        assert status == 0, err
        summary = json.loads((out / "summary.json").read_text())
        assert summary["config"]["policy"]["normalize"] is (value == "true")


def test_result_files_honour_the_umask(cli, tmp_path):
    """Issue 18, point 5: results were created 0600 (mkstemp), unreadable by colleagues."""
    import os

    previous = os.umask(0o022)
    try:
        status, _, err = cli(
            "run", "--scenario", "bimodal-mean", "--set", "training.rounds=1", "--out", str(tmp_path)
        )
    finally:
        os.umask(previous)
    assert status == 0, err
    for name in ("rounds.csv", "summary.json", "model.npy"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o644, name


def test_summary_records_its_provenance(cli, tmp_path):
    """Issue 18, point 6: version, commit, libraries, machine (CPU model and torch's CPU kernels
    included), start and wall time."""
    status, _, err = _run(cli, tmp_path)
    assert status == 0, err
    provenance = json.loads((tmp_path / "summary.json").read_text())["provenance"]
    assert provenance["fairclip_version"] == "0.1.0"
    assert set(provenance["libraries"]) >= {"torch", "flwr", "opacus", "ray"}
    assert provenance["libraries"]["torch"].startswith("2.13.0")
    assert provenance["machine"]["cores"] >= 1 and "gpu" in provenance["machine"]
    # two hosts of one platform can round alike code differently: the CPU and its torch kernels
    import torch

    assert provenance["machine"]["cpu"].strip()
    assert provenance["machine"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert provenance["started"].endswith("+00:00") and provenance["wall_seconds"] > 0
    assert provenance["execution"]["device"] == "cpu"  # a mean-estimation task trains on the CPU
    commit = provenance["git_commit"]
    assert commit is None or len(commit.removesuffix("+dirty")) == 40


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["scenarios"], ["run", "--help"]])
def test_help_version_and_scenarios_import_no_heavy_library(args):
    """Issue 18, point 14: `fairclip --help` took 10-14 s importing torch and Opacus."""
    probe = (
        "import sys\n"
        "from fairclip.cli import main\n"
        "try:\n"
        f"    main({args!r})\n"
        "except SystemExit as done:\n"
        "    assert not done.code, done.code\n"
        "heavy = sorted(m for m in ('torch', 'opacus', 'ray', 'flwr', 'opendp') if m in sys.modules)\n"
        "print('HEAVY', heavy, file=sys.stderr)\n"
    )
    completed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert "HEAVY []" in completed.stderr, completed.stderr
    if args == ["--version"]:
        assert completed.stdout.strip() == "fairclip 0.1.0"


def _commands_and_bracketed_help():
    from fairclip.cli import app

    command = typer.main.get_command(app)
    for name, sub in command.commands.items():
        for param in sub.params:
            help_text = getattr(param, "help", None) or ""
            for bracketed in re.findall(r"\\\[([^\]]*)\]", help_text):
                yield name, f"[{bracketed}]"


def test_help_shows_every_bracketed_default():
    """Issue 18, point 15: Rich took `[runs/<scenario>-<strategy>]` for markup and dropped it."""
    found = list(_commands_and_bracketed_help())
    assert len(found) >= 10
    env = {**os.environ, "COLUMNS": "400"}
    for name in sorted({name for name, _ in found}):
        shown = subprocess.run(
            [sys.executable, "-m", "fairclip", name, "--help"],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        ).stdout
        for command, bracketed in found:
            if command == name:
                assert bracketed in shown, (name, bracketed)


def test_piped_output_is_not_wrapped_and_numbers_are_rounded(tmp_path):
    completed = subprocess.run(
        [sys.executable, "-m", "fairclip", "run", "--scenario", "bimodal-mean", "--set", "training.rounds=2",
         "--set", "privacy.noise_multiplier=1", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "80"},
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    claim = [line for line in completed.stdout.splitlines() if line.startswith("epsilon = ")]
    assert len(claim) == 1 and claim[0].endswith(tuple("0123456789")), completed.stdout
    assert len(claim[0]) > 80, "one unwrapped line"
    epsilon = json.loads((tmp_path / "summary.json").read_text())["epsilon"]
    assert claim[0].startswith(f"epsilon = {epsilon:.4g} at delta"), claim[0]


def test_progress_writes_plain_lines_where_stderr_is_no_terminal():
    """Issue 20, point 3 ("long runs you can watch"): under nohup or in a pipe rich's bar draws
    nothing, so the progress display writes plain lines: one per finished run for run-counting
    bars; for a run's rounds none in the first ``every`` seconds, then at most one every
    ``every`` seconds, and the last one where an earlier one was written."""
    from io import StringIO

    from rich.console import Console

    from fairclip import progress as progress_module

    clock = [100.0]
    written = StringIO()
    console = Console(file=written, force_terminal=False)
    bar = progress_module.progress_bar(
        "[bold]adaptive[/bold] on demo",
        console=console,
        transient=True,
        unit="rounds",
        every=30,
        clock=lambda: clock[0],
    )
    with bar:
        rounds = bar.add_task("rounds", total=10)
        for round_number in range(10):
            clock[0] += 4.0  # a round every 4 s: a line at round 8 (32 s in) and 10 (the last)
            bar.advance(rounds, note=f"round {round_number + 1}")
    lines = [line for line in written.getvalue().splitlines() if line.strip()]
    assert [line.split(":")[0] for line in lines] == ["adaptive on demo"] * 2, lines
    assert [line.split(" rounds done")[0].split(": ")[1] for line in lines] == ["8/10", "10/10"]
    assert lines[0].endswith("(round 8), 0:00:32 elapsed, eta 0:00:08"), lines  # 4 s a round, 2 left
    assert lines[-1].endswith("eta 0:00:00") and "(round 10)" in lines[-1]

    quiet = StringIO()  # a run shorter than ``every``: no line at all (an error stays one line)
    short = progress_module.progress_bar(
        "x", console=Console(file=quiet, force_terminal=False), transient=True, every=30
    )
    with short:
        task = short.add_task("x", total=3)
        for _ in range(3):
            clock[0] += 1.0
            short.advance(task)
    assert "done" not in quiet.getvalue()

    shown = StringIO()
    terminal = progress_module.progress_bar(
        "x", console=Console(file=shown, force_terminal=True), transient=True, every=0
    )
    with terminal:
        task = terminal.add_task("x", total=2)
        terminal.advance(task, note="first")
    assert "runs done" not in shown.getvalue()  # a terminal gets rich's bar, not the lines


def test_the_eta_of_a_resumed_reproduction_counts_only_the_runs_it_ran():
    """A resumed reproduction finds some runs already done: they count as done, but took no
    time, so the ETA's pace comes from the runs this process ran (an ETA from all of them was
    far too short after a resume), on the plain lines and on the terminal's bar alike."""
    from io import StringIO

    from rich.console import Console

    from fairclip import progress as progress_module

    clock = [0.0]
    written = StringIO()
    bar = progress_module.progress_bar(
        "reproduce x",
        console=Console(file=written, force_terminal=False),
        transient=True,
        clock=lambda: clock[0],
    )
    with bar:
        runs = bar.add_task("x", total=10)
        for key in range(6):
            bar.advance(runs, note=f"reused-{key}", reused=True)
        assert "runs done" not in written.getvalue()  # a reused run writes no line
        clock[0] += 100.0
        bar.advance(runs, note="ran-0")  # 100 s a run this time, 3 runs left
        eta = progress_module.PaceRemainingColumn().render(bar.tasks[0]).plain
    lines = [line for line in written.getvalue().splitlines() if line.strip()]
    assert lines == ["reproduce x: 7/10 runs done (ran-0), 0:01:40 elapsed, eta 0:05:00"], lines
    assert eta == "0:05:00"
    assert progress_module.pace_eta(100.0, 6, 10, reused=6) is None  # no timed run yet: no pace


def test_the_eta_counts_only_the_rounds_a_continued_run_computed_here(cli, monkeypatch, tmp_path):
    """A run continued from its checkpoint was mostly computed by an earlier invocation: only the
    share of its rounds computed here counts towards the pace. Before, a run resumed one round
    before its end set a pace of seconds a run (a reproduction of 14 hours showed eta 0:12:00)."""
    from io import StringIO

    from rich.console import Console

    import fairclip.api
    from fairclip import cli as cli_module
    from fairclip import progress as progress_module

    clock = [0.0]
    written = StringIO()
    console = Console(file=written, force_terminal=False)
    bar = progress_module.progress_bar("reproduce x", console=console, transient=True, clock=lambda: clock[0])
    with bar:
        runs = bar.add_task("x", total=4)
        bar.advance(runs, note="reused", reused=1)
        clock[0] += 10.0
        bar.advance(runs, note="continued", reused=0.75)  # a quarter of a run in 10 s: 40 s a run
        clock[0] += 40.0
        bar.advance(runs, note="ran")  # 1.25 runs in 50 s
        for wrong in (1.5, -0.1):
            with pytest.raises(ValueError, match="reused must lie in"):
                bar.advance(runs, reused=wrong)
    lines = [line for line in written.getvalue().splitlines() if line.strip()]
    assert lines == [
        "reproduce x: 2/4 runs done (continued), 0:00:10 elapsed, eta 0:01:20",
        "reproduce x: 3/4 runs done (ran), 0:00:50 elapsed, eta 0:00:40",
    ], lines

    # `fairclip reproduce` passes the share that fairclip.reproduce reports (on_continued) to its bar
    def reproduce(name, *, on_plan, on_run, on_reused, on_continued, **_options):
        folder = tmp_path / "reproduction"
        folder.mkdir()
        (folder / "reproduction.md").write_text("report\n")
        on_plan(3)
        on_reused("a")
        clock[0] += 30.0
        on_continued("b", 0.75)  # a quarter of a run in 30 s: 120 s a run, 1 left
        on_run("b")
        return fairclip.api.Reproduction(name=name, table=None, wall_seconds=30.0, folder=folder)

    clock[0] = 0.0
    real_bar = progress_module.progress_bar
    monkeypatch.setattr(cli_module, "progress_bar", lambda *a, **k: real_bar(*a, clock=lambda: clock[0], **k))
    monkeypatch.setattr(fairclip.api, "reproduce", reproduce)
    status, _stdout, err = cli("reproduce", "x", "--out", str(tmp_path / "reproduction"))
    assert status == 0, err
    assert "reproduce x: 2/3 runs done (b), 0:00:30 elapsed, eta 0:02:00" in err, err
