"""Committed reproduction results and the tables generated from them."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from fairclip.atomic import write_csv
from fairclip.scenarios.errors import ConfigError
from fairclip.sims.reproduce import setups
from fairclip.sims.reproduce.tables import COLUMNS
from fairclip.sims.sweeps.folder import read_table
from tools import results


def test_the_readme_points_at_the_results_instead_of_copying_them():
    """Issue 67: the README is a one-minute page; the reproduction tables are a page of the site,
    generated from the committed files when it builds (tests/test_docs.py builds it strictly)."""
    readme = (results.REPOSITORY / "README.md").read_text()
    assert len(readme.splitlines()) < 200
    assert "docs/claims.md" in readme and "results/reproductions" in readme
    assert results.results_markdown().splitlines()[0] not in readme


def test_every_recorded_report_carries_its_setups_current_notes(tmp_path, capsys):
    """A flag's likely cause goes into the setup file's notes after the runs; the recorded
    report must say the same (``python -m tools.results notes NAME``)."""
    folders = sorted(p for p in results.RESULTS_DIR.iterdir() if (p / "record.json").is_file())
    if not folders:
        pytest.skip("no results folder here (an installed copy): nothing recorded to check")
    for folder in folders:
        copy = tmp_path / folder.name
        shutil.copytree(folder, copy)
        assert not results.refresh_notes(copy), f"run: python -m tools.results notes {folder.name}"
    # A stale notes line is rewritten, and nothing else in the report changes.
    report = tmp_path / folders[0].name / "reproduction.md"
    recorded = report.read_text()
    notes = next(line for line in recorded.splitlines() if line.startswith("Notes: "))
    report.write_text(recorded.replace(notes, "Notes: an older text."))
    assert results.refresh_notes(report.parent)
    assert report.read_text() == recorded
    report.write_text(recorded.replace(notes, f"{notes}\n{notes}"))
    with pytest.raises(ValueError, match="2 notes lines where one is expected"):
        results.refresh_notes(report.parent)
    assert results.main(["notes", "no-such-setup"]) == 2
    assert "holds no reproduction.md" in capsys.readouterr().err


def test_every_recorded_paired_test_shows_the_interval_of_its_own_t_test():
    """A recorded paired test's 95 % interval leaves out 0 exactly where its p < 0.05 (one
    t-test gives both), and the report's paired section is what ``paired_tests.csv`` renders to.
    The percentile-bootstrap intervals recorded before were the seeds' range: in 225 of 723
    tests they disagreed with their own p."""
    import math

    import pandas as pd

    from fairclip.sims.reproduce.tables import paired_lines

    folders = sorted(p for p in results.RESULTS_DIR.iterdir() if (p / "paired_tests.csv").is_file())
    if not folders:
        pytest.skip("no results folder here (an installed copy): nothing recorded to check")
    for folder in folders:
        tests = pd.read_csv(folder / "paired_tests.csv", dtype={"target_epsilon": str}).to_dict("records")
        for test in tests:
            where = f"{folder.name}: {test['first']} − {test['second']}, {test['quantity']}"
            if math.isnan(test["p_value"]):
                assert math.isnan(test["interval_low"]) and math.isnan(test["interval_high"]), where
                continue
            assert test["interval_low"] <= test["mean_difference"] <= test["interval_high"], where
            outside = test["interval_low"] > 0 or test["interval_high"] < 0
            assert outside == (test["p_value"] < 0.05) == test["significant"], where
        report = (folder / "reproduction.md").read_text()
        section = "\n".join(paired_lines(tests))
        recorded_before = section.replace("between policies", "between strategies", 1)  # issue 66
        assert section in report or recorded_before in report, f"{folder.name}: the paired section is stale"


def test_no_recorded_non_private_row_stands_under_a_finite_epsilon():
    """A row whose runs spent ε = inf (no noise) shows ε inf in the table and in the report,
    not the target ε of the policies beside it (softadaclip's ``none`` rows said 8.0)."""
    folders = sorted(p for p in results.RESULTS_DIR.iterdir() if (p / "reproduction.csv").is_file())
    if not folders:
        pytest.skip("no results folder here (an installed copy): nothing recorded to check")
    for folder in folders:
        table = read_table(folder / "reproduction.csv", dtype=str, keep_default_na=False)  # old: strategy
        report = (folder / "reproduction.md").read_text()
        for row in table[table["epsilon_rdp"] == "inf"].itertuples():
            assert row.epsilon == "inf", f"{folder.name}: {row.policy} {row.metric}"
            assert f"| `{row.policy}` | inf | inf / inf | {row.metric} |" in report, folder.name


def test_kept_runs_are_committed_beside_their_progress():
    """Every ``results/in-progress/<setup>/progress.json`` counts finished runs whose summaries
    git tracks, so ``--resume`` from a fresh clone finds them (an ignore pattern ``runs/`` once
    hid every kept run from git while progress.json said they were kept)."""
    root = Path(__file__).resolve().parents[1]
    if not (root / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout (an installed copy): nothing committed to check")

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=60)

    kept_run = "results/in-progress/some-setup/runs/some-run/summary.json"
    assert git("check-ignore", "--no-index", "-q", kept_run).returncode == 1, f"git ignores {kept_run}"
    progress_files = sorted((root / "results" / "in-progress").glob("*/progress.json"))
    for progress in progress_files:
        folder = progress.parent.relative_to(root)
        tracked = git("ls-files", "--", f"{folder}/runs/*/summary.json").stdout.split()
        assert len(tracked) == json.loads(progress.read_text())["finished_runs"], folder


def _finished(out: Path) -> None:
    rows = [
        {
            "setup": "xu-dutch", "policy": "constant", "epsilon": 1.98, "epsilon_rdp": 1.98,
            "epsilon_prv": 1.2, "metric": "accuracy_change_total", "paper": -0.1, "paper_stderr": "",
            "fairclip_mean": -0.03, "fairclip_stderr": 0.004, "seeds": 3, "outside": True,
        },
        {
            "setup": "xu-dutch", "policy": "none", "epsilon": "inf", "epsilon_rdp": "inf",
            "epsilon_prv": "inf", "metric": "overall/accuracy", "paper": "", "paper_stderr": "",
            "fairclip_mean": 0.81, "fairclip_stderr": 0.002, "seeds": 3, "outside": False,
        },
    ]  # fmt: skip
    assert list(rows[0]) == COLUMNS
    write_csv(out / "reproduction.csv", rows)
    (out / "reproduction.md").write_text("# fairclip reproduce: xu-dutch\n")
    (out / "sweep.json").write_text(json.dumps({"name": "xu-dutch", "seeds": 3}))
    for index, wall in enumerate((100.0, 50.5)):
        run = out / "runs" / f"run-{index}"
        run.mkdir(parents=True)
        provenance = {"started": f"2026-11-25T12:0{index}:00+00:00", "wall_seconds": wall}
        (run / "summary.json").write_text(json.dumps({"provenance": provenance}))


def test_a_finished_reproduction_is_recorded_and_rendered(tmp_path):
    out, store = tmp_path / "run", tmp_path / "results"
    out.mkdir()
    with pytest.raises(FileNotFoundError, match="not finished"):
        results.record(out, store / "xu-dutch", "fairclip reproduce xu-dutch --seeds 3")
    _finished(out)
    entry = results.record(out, store / "xu-dutch", "fairclip reproduce xu-dutch --seeds 3")
    assert entry["runs"] == 2 and entry["compute_seconds"] == 150.5 and entry["seeds"] == 3
    assert entry["first_run_started"] == "2026-11-25T12:00:00+00:00"
    assert entry["specification"] == {"name": "xu-dutch", "seeds": 3}
    assert sorted(p.name for p in (store / "xu-dutch").iterdir()) == [
        "record.json",
        "reproduction.csv",
        "reproduction.md",
    ]
    text = results.results_markdown(store)
    assert "`fairclip reproduce xu-dutch --seeds 3`" in text and "3 seeds, 2 runs" in text
    assert (
        "| `constant` | 1.98 / 1.2 | accuracy_change_total | -0.1000 | -0.0300 ± 0.0040 | outside |" in text
    )
    assert "| `none` | inf / inf | overall/accuracy | — | 0.8100 ± 0.0020 |  |" in text
    shutil.rmtree(store / "xu-dutch")
    assert results.results_markdown(store) == "No reproduction has been recorded yet."


def test_only_the_reproductions_own_runs_are_recorded(tmp_path):
    """A run left in the folder that the reproduction did not plan (a grid point its setup had
    before, say) is not counted: ``runs.json`` names the reproduction's runs."""
    out = tmp_path / "run"
    _finished(out)
    stale = out / "runs" / "grid__constant__eps-1__199"
    stale.mkdir()
    (stale / "summary.json").write_text(
        json.dumps({"provenance": {"started": "2026-11-20T00:00:00+00:00", "wall_seconds": 9e3}})
    )
    assert results.record(out, tmp_path / "all", "c")["runs"] == 3  # a folder from before runs.json
    (out / "runs.json").write_text(json.dumps({"grid": [], "final": ["run-0", "run-1"]}))
    entry = results.record(out, tmp_path / "own", "c")
    assert entry["runs"] == 2 and entry["compute_seconds"] == 150.5
    assert entry["first_run_started"] == "2026-11-25T12:00:00+00:00"
    (out / "runs.json").write_text(json.dumps({"grid": ["run-9"], "final": ["run-0", "run-1"]}))
    with pytest.raises(FileNotFoundError, match=r"run run-9, named in runs\.json, has no summary\.json"):
        results.record(out, tmp_path / "missing", "c")


def test_runs_made_on_two_machines_are_recorded_as_two(tmp_path):
    """A reproduction continued on another machine (a GPU's) names each machine with its runs,
    run time and training device, so the run time is not read as one machine's."""
    out, store = tmp_path / "run", tmp_path / "results"
    out.mkdir()
    _finished(out)
    laptop = {"platform": "x", "processor": "x86_64", "cores": 2, "gpu": None}
    server = {"platform": "y", "processor": "x86_64", "cores": 16, "gpu": "NVIDIA H200"}
    wheres = [(laptop, "cpu", 100.0), (server, "cuda", 600.0), (server, None, 120.0), (laptop, "cpu", 20.0)]
    for index, (machine, device, wall) in enumerate(wheres):
        run = out / "runs" / f"run-{index}"
        run.mkdir(parents=True, exist_ok=True)
        provenance = {"started": "2026-11-25T12:00:00+00:00", "wall_seconds": wall, "machine": machine}
        if device is not None:
            provenance["execution"] = {"backend": "local", "workers": 1, "device": device}
        (run / "summary.json").write_text(json.dumps({"provenance": provenance}))
    entry = results.record(out, store / "xu-dutch", "fairclip reproduce xu-dutch --seeds 3")
    assert entry["compute_seconds"] == 840.0 and entry["machine"] == laptop
    assert entry["machines"] == [
        {"machine": laptop, "device": "cpu", "runs": 2, "seconds": 120.0},
        {"machine": server, "device": "cuda", "runs": 1, "seconds": 600.0},
        {"machine": server, "device": None, "runs": 1, "seconds": 120.0},
    ]
    text = results.results_markdown(store)
    assert (
        "14 min of run time: 2 runs (2 min) on 2 CPU core(s), trained on cpu; "
        "1 run (10 min) on 16 CPU core(s) with an NVIDIA H200, trained on cuda; "
        "1 run (2 min) on 16 CPU core(s) with an NVIDIA H200 (training device not recorded), "
    ) in text
    # A run continued from its checkpoint on the other machine counts on both, with each
    # piece's time (a piece written before pieces named their machine counts on the run's).
    pieces = [
        {"wall_seconds": 30.0},
        {"wall_seconds": 50.0, "machine": laptop, "device": "cpu"},
        {"wall_seconds": 400.0, "machine": server, "device": "cuda"},
    ]
    provenance = {"started": "2026-11-25T13:00:00+00:00", "wall_seconds": 480.0, "machine": server}
    provenance["pieces"] = pieces
    provenance["execution"] = {"backend": "local", "workers": 1, "device": "cuda"}
    (out / "runs" / "run-4").mkdir()
    (out / "runs" / "run-4" / "summary.json").write_text(json.dumps({"provenance": provenance}))
    entry = results.record(out, store / "xu-dutch", "fairclip reproduce xu-dutch --seeds 3")
    assert entry["compute_seconds"] == 1320.0 and entry["runs"] == 5
    assert entry["machines"] == [
        {"machine": laptop, "device": "cpu", "runs": 3, "seconds": 170.0},
        {"machine": server, "device": "cuda", "runs": 2, "seconds": 1030.0},
        {"machine": server, "device": None, "runs": 1, "seconds": 120.0},
    ]
    shutil.rmtree(out / "runs" / "run-4")
    # One machine reads as before.
    for run in list((out / "runs").iterdir())[1:]:
        shutil.rmtree(run)
    results.record(out, store / "xu-dutch", "fairclip reproduce xu-dutch --seeds 3")
    assert "CPU core(s) per run, recorded at" in results.results_markdown(store)


_ONE = {"platform": "Linux-a", "processor": "x86_64", "cores": 2, "gpu": None}
_GPU = {"platform": "Linux-c", "processor": "x86_64", "cores": 16, "gpu": "NVIDIA H200"}
_AMD = {**_ONE, "cpu": "AMD EPYC 7B13", "cpu_capability": "AVX2"}
_INTEL = {**_ONE, "cpu": "Intel(R) Xeon(R) Processor", "cpu_capability": "AVX512"}
_OTHER = {**_ONE, "platform": "Linux-b"}


@pytest.mark.parametrize(
    ("places", "heading"),
    [
        pytest.param(
            [(_ONE, "cpu"), (_OTHER, "cpu"), (_OTHER, "cpu"), (_GPU, "cuda")],
            "4 min of run time: 1 run (1 min) on 2 CPU core(s) (Linux-a), trained on cpu; "
            "2 runs (2 min) on 2 CPU core(s) (Linux-b), trained on cpu; "
            "1 run (1 min) on 16 CPU core(s) with an NVIDIA H200, trained on cuda, recorded at",
            id="one kind, two platforms",
        ),
        pytest.param(
            [(_ONE, "cpu"), (_AMD, "cpu"), (_INTEL, "cpu"), (_INTEL, "cpu")],
            "4 min of run time: 1 run (1 min) on 2 CPU core(s), trained on cpu; "
            "1 run (1 min) on 2 CPU core(s) (AMD EPYC 7B13, AVX2), trained on cpu; "
            "2 runs (2 min) on 2 CPU core(s) (Intel(R) Xeon(R) Processor, AVX512), trained on cpu, "
            "recorded at",
            id="one platform, two CPUs",
        ),
    ],
)  # fmt: skip
def test_two_hosts_that_look_alike_are_told_apart(tmp_path, places, heading):
    """Runs made on two hosts with the same cores and device (two sandboxes of one kind) are two
    entries, and the heading names what sets each apart, so they do not read as one machine named
    twice: the platform, or, where the platform string is the same too (one sandbox image on two
    CPUs, which rounded xu-mnist differently), the CPU model and torch's CPU kernels, which runs
    recorded before provenance named them lack. A host whose cores, GPU or device set it apart is
    named as before."""
    out, store = tmp_path / "run", tmp_path / "results"
    out.mkdir()
    _finished(out)
    for index, (machine, device) in enumerate(places):
        run = out / "runs" / f"run-{index}"
        run.mkdir(parents=True, exist_ok=True)
        provenance = {"started": "2026-11-25T12:00:00+00:00", "wall_seconds": 60.0, "machine": machine}
        provenance["execution"] = {"backend": "local", "workers": 1, "device": device}
        (run / "summary.json").write_text(json.dumps({"provenance": provenance}))
    results.record(out, store / "xu-dutch", "fairclip reproduce xu-dutch --seeds 3")
    assert heading in results.results_markdown(store)


@pytest.mark.parametrize(
    ("option", "named"),
    [
        ({"max_rounds": 1}, "--max-rounds 1"),
        ({"max_batch": 64}, "--max-batch 64"),
        ({"grid_limit": 1}, "--grid-limit 1"),
        ({"overrides": ["training.device=cpu", "scenario.test_limit=500"]}, "--set scenario.test_limit=500"),
    ],
)
def test_a_smoke_run_is_not_recorded(tmp_path, capsys, option, named):
    out = tmp_path / "run"
    out.mkdir()
    _finished(out)
    spec = {"command": "reproduce", "name": "x", "seeds": 3, "max_rounds": None, **option}
    (out / "sweep.json").write_text(json.dumps(spec))
    assert results.main(["record", str(out), "x", "--command", "c"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"is a smoke run ({named}), not a reproduction to record" in lines[0], lines
    assert not (results.RESULTS_DIR / "x").exists()
    (out / "sweep.json").write_text(json.dumps({**spec, **{key: None for key in option}, "overrides": []}))
    entry = results.record(out, tmp_path / "store" / "xu-dutch", "c")  # the same run without them
    assert entry["runs"] == 2


def test_the_command_line_refuses_a_folder_without_a_reproduction_in_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert results.main(["keep", str(tmp_path / "empty"), "x"]) == 2
    assert results.main(["record", str(tmp_path / "empty"), "x", "--command", "c"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and "not a reproduction folder" in lines[0] and "has not finished" in lines[1]
    assert not (results.IN_PROGRESS_DIR / "x").exists() and not (results.RESULTS_DIR / "x").exists()


def test_a_reproduction_is_recorded_only_under_its_own_setups_name(tmp_path, capsys):
    """The command line's NAME is the setup's name: a path there (``results/reproductions/galli-mnist``)
    would nest the results under ``results/reproductions/results/...``, and another setup's name
    would file these numbers as that setup's. Both are one line and status 2, and nothing is
    written. (The functions themselves write to the folder their caller gives.)"""
    out = tmp_path / "run"
    out.mkdir()
    _finished(out)  # a reproduction of xu-dutch
    (out / "sweep.json").write_text(json.dumps({"command": "reproduce", "name": "xu-dutch", "seeds": 3}))
    for name in ("results/reproductions/xu-dutch", "..", ""):
        assert results.main(["record", str(out), name, "--command", "c"]) == 2
        assert results.main(["notes", name]) == 2
    assert results.main(["keep", str(out), "results/in-progress/xu-dutch"]) == 2
    assert results.main(["record", str(out), "another-setup", "--command", "c"]) == 2
    assert results.main(["keep", str(out), "another-setup"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 9
    assert all("is not a setup's name" in line for line in lines[:7])
    assert all("holds a reproduction of xu-dutch, not of another-setup" in line for line in lines[7:])
    assert (
        not (results.RESULTS_DIR / "results").exists()
        and not (results.RESULTS_DIR / "another-setup").exists()
    )
    assert not (results.IN_PROGRESS_DIR / "another-setup").exists()


def test_keep_replaces_only_a_kept_reproduction(tmp_path):
    """``keep`` replaces its destination with the latest state: a folder there that is not a kept
    reproduction (no ``sweep.json``) is refused and left as it is, never deleted."""
    out = tmp_path / "run"
    out.mkdir()
    _finished(out)
    (out / "sweep.json").write_text(json.dumps({"command": "reproduce", "name": "xu-dutch", "seeds": 3}))
    other = tmp_path / "results"
    (other / "reproductions").mkdir(parents=True)
    (other / "README.md").write_text("mine")
    with pytest.raises(ValueError, match="something other than a kept reproduction"):
        results.keep(out, other)
    assert (other / "README.md").read_text() == "mine" and (other / "reproductions").is_dir()
    (tmp_path / "empty").mkdir()
    assert results.keep(out, tmp_path / "empty")["finished_runs"] == 2  # an empty folder is used
    assert results.keep(out, tmp_path / "empty")["finished_runs"] == 2  # and replaced once kept


def test_a_setup_that_repeats_anothers_published_numbers_is_counted_once(tmp_path, monkeypatch):
    """softadaclip-adult-age groups softadaclip-adult's runs by age: its 20 paper values are
    softadaclip-adult's (``setup.paper_values_from``), compared in its report but counted on the
    claims page only where they were published first."""
    age, adult = (results.RESULTS_DIR / name for name in ("softadaclip-adult-age", "softadaclip-adult"))
    if not (age / "record.json").is_file():
        pytest.skip("no results folder here (an installed copy): nothing recorded to check")
    table = read_table(age / "reproduction.csv", keep_default_na=False)
    assert (table["paper"].astype(str) != "").sum() == 20
    assert results.agreement(age)["published"] == 0
    assert results.agreement(adult)["published"] == 20
    text = setups.builtin_setups()["softadaclip-adult-age"].read_text()
    monkeypatch.setattr(setups, "SETUP_DIR", tmp_path)
    (tmp_path / "softadaclip-adult-age.toml").write_text(text.replace('"softadaclip-adult"', '"no-such"', 1))
    with pytest.raises(ConfigError, match=r"setup\.paper_values_from names no built-in setup"):
        setups.load_setup("softadaclip-adult-age")
