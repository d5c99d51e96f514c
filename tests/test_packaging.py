"""Issue 67, packaging: a wheel built from the repository holds everything fairclip needs (its
subpackages, the built-in scenarios and reproduction setups) and runs the demo from a folder
outside the checkout; the version has one source; the lowest-versions job (`.ci/lowest`) pins
exactly the lower bounds of pyproject.toml's ranges."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_version_has_one_source():
    import fairclip

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert fairclip.__version__ == project["project"]["version"]  # read from the installed metadata
    assert f'"{fairclip.__version__}"' not in (ROOT / "__init__.py").read_text()  # no second copy
    assert (ROOT / "CITATION.cff").read_text().count(f"version: {fairclip.__version__}") == 1
    assert project["project"]["requires-python"] == ">=3.11"  # no upper bound it does not need


@pytest.mark.slow
def test_a_wheel_built_from_the_repository_runs_the_demo_outside_the_checkout(tmp_path):
    import fairclip

    wheels = tmp_path / "wheels"
    build = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-q",
        "-w",
        str(wheels),
    ]
    subprocess.run([*build, str(ROOT)], check=True, capture_output=True, text=True, timeout=600)
    (wheel,) = wheels.glob("fairclip-*.whl")
    assert wheel.name.startswith(f"fairclip-{fairclip.__version__}-")
    names = zipfile.ZipFile(wheel).namelist()
    assert not any(
        name.startswith(("fairclip/tests/", "fairclip/results/", "fairclip/docs/")) for name in names
    )
    site = tmp_path / "site"
    install = [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)]
    subprocess.run(install, check=True, capture_output=True, text=True, timeout=600)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site), "FLWR_TELEMETRY_ENABLED": "0"}
    where = subprocess.run(
        [sys.executable, "-c", "import fairclip; print(fairclip.__file__)"],
        cwd=elsewhere, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert Path(where.stdout.strip()).is_relative_to(site)  # the wheel's copy, not the checkout
    demo = [
        "compare", "--scenario", "demo", "--strategies", "constant", "--epsilons", "8", "--seeds", "1",
        "--set", "training.rounds=3", "--set", "federation.num_clients=200", "--out", "runs/demo",
    ]  # fmt: skip
    run = subprocess.run(
        [sys.executable, "-m", "fairclip", *demo],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert (elsewhere / "runs" / "demo" / "summary.csv").is_file() and (
        elsewhere / "runs" / "demo" / "report.md"
    ).is_file()


def test_the_lowest_versions_job_pins_exactly_the_lower_bounds_of_the_ranges():
    """`.ci/lowest` installs every direct dependency at its range's lower bound, read from
    pyproject.toml (never a copied list): its pins are those bounds, one per dependency, and the
    install it runs uses them. Nothing is installed here (`--print-pins`)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    expected = []
    for line in project["dependencies"]:
        # "name[extras]>=low" or "name[extras]>=low,<high": every direct dependency has a lower bound
        form = r"([A-Za-z0-9_.\-]+(?:\[[a-z,]+\])?)>=([0-9.]+)(?:,<[0-9.]+)?"
        name, low = re.fullmatch(form, line).groups()
        expected.append(f"{name}=={low}")
    printed = subprocess.run(
        ["bash", str(ROOT / ".ci" / "lowest"), "--print-pins"],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    assert printed.stdout.split() == expected
    job = (ROOT / ".ci" / "lowest").read_text()
    assert """pip install -q -e '.[test]' "${pins[@]}\"""" in job  # the install uses the pins
    assert 'mapfile -t pins < <("$venv/bin/python" -c "$pins_py")' in job  # generated, not copied


def test_ci_runs_the_readmes_two_commands_as_they_read():
    """`.ci/run` refuses to run unless README.md holds its two commands, line for line: a README
    edited alone (a renamed flag, say) would fail CI only after its install."""
    import re

    ci = (ROOT / ".ci" / "run").read_text()
    commands = re.findall(r'^(?:install_and_run|test_command)="(.*)"$', ci, flags=re.M)
    assert len(commands) == 2, commands
    readme_lines = (ROOT / "README.md").read_text().splitlines()
    for command in commands:
        assert command in readme_lines, f"README.md lacks the line CI runs: {command}"
