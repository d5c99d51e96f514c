"""``flwr run`` with an exit status that tells whether the run succeeded.

Flower 1.41's ``flwr run`` exits 0 for every run it *submitted*, however the run ends: a
ServerApp that fails (fairclip's refuses a configuration, a node count or its data with exit
code 700) only marks the run ``finished:failed`` on the SuperLink, where ``flwr ls`` shows it.
:func:`run_flower_app` runs ``flwr run ... --stream``, passes its output
through, and asks ``flwr ls --run-id ID --format json`` how the run ended.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

RUN_STARTED = re.compile(r"Successfully started run (\d+)")
"""The line by which ``flwr run`` names the run it submitted."""

COMPLETED = "finished:completed"


@dataclass(frozen=True)
class FlowerRunStatus:
    """How a Flower run ended, as its SuperLink reports it."""

    run_id: int | None
    status: str
    details: str

    @property
    def succeeded(self) -> bool:
        return self.status == COMPLETED

    def message(self) -> str:
        """One line for the user."""
        if self.run_id is None:
            return f"flwr run did not start a run ({self.details})"
        details = "" if self.details in ("", "N/A") else f": {self.details}"
        return f"Flower run {self.run_id} {self.status}{details}"


def run_status(run_id: int, superlink: str | None = None, flwr: str = "flwr") -> FlowerRunStatus:
    """Status of run ``run_id`` from ``flwr ls [SUPERLINK] --run-id ID --format json``."""
    command = [flwr, "ls", *([superlink] if superlink else []), "--run-id", str(run_id), "--format", "json"]
    done = subprocess.run(command, capture_output=True, text=True)
    try:
        runs = json.loads(done.stdout)["runs"]
        (run,) = [entry for entry in runs if int(entry["run-id"]) == run_id]
        return FlowerRunStatus(run_id, str(run["status"]), str(run.get("status-details", "")))
    except (ValueError, KeyError, TypeError):
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return FlowerRunStatus(run_id, "unknown", f"flwr ls failed: {last[0]}")


def run_arguments(arguments: list[str]) -> dict[str, Any]:
    """``flwr run ARGUMENTS`` as Flower's own command-line parser reads them (``app``, the app's
    folder, default "."; ``superlink``, ``None`` for Flower's default connection, ...)."""
    import typer
    from flwr.cli.app import app as flwr_app

    command = typer.main.get_command(flwr_app).commands["run"]
    with command.make_context("run", list(arguments), resilient_parsing=True) as context:
        return dict(context.params)


def superlink_of(arguments: list[str]) -> str | None:
    """The SUPERLINK that ``flwr run ARGUMENTS`` uses (``None``: Flower's default connection)."""
    return run_arguments(arguments).get("superlink")


def check_app(arguments: list[str]) -> None:
    """Refuse, before ``flwr run`` starts, an app folder that holds no Flower app (no
    ``pyproject.toml`` with ``[tool.flwr.app]``): one :class:`ValueError` line naming it."""
    import tomllib

    folder = Path(str(run_arguments(arguments).get("app") or "."))
    project = folder / "pyproject.toml"
    where = f"no Flower app in {folder.resolve()}"
    if not project.is_file():
        raise ValueError(f"{where}: it has no pyproject.toml (fairclip flower APP-FOLDER ...)")
    try:
        app = tomllib.loads(project.read_text()).get("tool", {}).get("flwr", {}).get("app")
    except (OSError, ValueError) as error:
        raise ValueError(f"{where}: its pyproject.toml cannot be read ({error})") from None
    if not app:
        raise ValueError(f"{where}: its pyproject.toml has no [tool.flwr.app] table")


def flwr_command() -> str:
    """The ``flwr`` command: on the PATH, else beside this Python (an environment not activated)."""
    found = shutil.which("flwr") or shutil.which("flwr", path=str(Path(sys.executable).parent))
    if found is None:
        raise ValueError("the flwr command is not installed: pip install 'flwr[simulation]'")
    return found


BOX_CHARACTERS = "╭╮╰╯│─┌┐└┘├┤═║"


def last_message(lines: list[str]) -> str:
    """The last thing ``flwr`` printed, as one line: the text of its last rich box (an error
    panel) without the border, or its last non-empty line."""
    boxed: list[str] = []
    for line in reversed(lines):
        text = line.strip(BOX_CHARACTERS + " ")
        if line.lstrip().startswith("╭"):
            break
        if line.lstrip().startswith(("│", "╰")) and text:
            boxed.insert(0, text)
    if boxed:
        return " ".join(boxed)
    return next((line.strip() for line in reversed(lines) if line.strip(BOX_CHARACTERS + " ")), "")


def run_flower_app(
    arguments: list[str], *, flwr: str = "flwr", output: TextIO | None = None
) -> FlowerRunStatus:
    """Run ``flwr run ARGUMENTS --stream``, copying its output to ``output`` (standard output by
    default) as it comes, and return how the run ended."""
    output = output or sys.stdout
    command = [flwr, "run", *arguments]
    if "--stream" not in command:
        command.append("--stream")
    run_id = None
    tail: list[str] = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as process:
        assert process.stdout is not None
        for line in process.stdout:
            output.write(line)
            output.flush()
            tail = [*tail[-11:], line.rstrip("\n")]
            if run_id is None and (found := RUN_STARTED.search(line)):
                run_id = int(found.group(1))
    if run_id is None:
        reason = last_message(tail) or f"exit status {process.returncode}"
        return FlowerRunStatus(None, "not started", reason)
    return run_status(run_id, superlink_of(arguments), flwr)
