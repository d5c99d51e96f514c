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
import subprocess
import sys
from dataclasses import dataclass
from typing import TextIO

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


def superlink_of(arguments: list[str]) -> str | None:
    """The SUPERLINK that ``flwr run ARGUMENTS`` uses (``None``: Flower's default connection),
    as Flower's own command-line parser reads them."""
    import typer
    from flwr.cli.app import app as flwr_app

    command = typer.main.get_command(flwr_app).commands["run"]
    with command.make_context("run", list(arguments), resilient_parsing=True) as context:
        return context.params.get("superlink")


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
            tail = [*tail[-4:], line.strip()]
            if run_id is None and (found := RUN_STARTED.search(line)):
                run_id = int(found.group(1))
    if run_id is None:
        reason = next((line for line in reversed(tail) if line), f"exit status {process.returncode}")
        return FlowerRunStatus(None, "not started", reason)
    return run_status(run_id, superlink_of(arguments), flwr)
