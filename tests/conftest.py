"""Test-wide settings: no Flower telemetry, and a helper to run the CLI in-process."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")


@pytest.fixture
def cli(capsys):
    """Run ``fairclip`` in-process; returns (exit status, stdout, stderr)."""
    from fairclip.sims.cli import main

    def invoke(*args: str) -> tuple[int, str, str]:
        try:
            main(list(args))
            status = 0
        except SystemExit as done:
            status = int(done.code or 0)
        captured = capsys.readouterr()
        return status, captured.out, captured.err

    return invoke
