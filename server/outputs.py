"""A run's public outputs and the server-internal record, written atomically (:mod:`fairclip.atomic`).

A simulation writes ``rounds.csv``, ``summary.json`` and ``model.npy`` (:class:`RunWriter`); the
ServerApp writes its public release and, apart, what only the trusted server may keep
(:func:`write_server_run`). :func:`check_output_folder` refuses a folder that cannot take them
before any work.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from fairclip.atomic import write_csv, write_json, write_model, write_note
from fairclip.scenarios.errors import ConfigError

WRITE_CHECK_BYTES = 64 * 1024
"""What :func:`check_output_folder` writes (and deletes) to learn that a folder takes data: a
disk with less room than this cannot hold a run's first ``rounds.csv`` and ``summary.json``."""


def check_output_folder(out: Path) -> None:
    """Check, before any work starts, that the folder ``out`` can be created and written:
    :class:`ConfigError` names the folder and why not (a file of that name or on its path, no
    permission, a read-only file system, an impossible path). Nothing is left behind: a folder
    that does not exist yet is not created (the first result creates it), the check writes a
    nameless temporary file of :data:`WRITE_CHECK_BYTES` in ``out`` or in its nearest existing
    parent, so a full disk is refused here too."""
    try:
        existing = out
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        problem = None
        if existing == out and not out.is_dir():
            problem = "is a file"
        elif not existing.is_dir():
            problem = f"cannot be created: {existing} is a file"
        else:
            with tempfile.TemporaryFile(dir=existing, prefix=".fairclip-write-check-") as probe:
                probe.write(b"\0" * WRITE_CHECK_BYTES)
                probe.flush()
                os.fsync(probe.fileno())
    except (OSError, ValueError) as error:
        problem = f"cannot be written: {getattr(error, 'strerror', None) or error}"
    if problem:
        raise ConfigError(f"output folder {out} {problem}")


def write_run(
    out: Path, rows: list[dict[str, Any]], summary: dict[str, Any], model: np.ndarray | None
) -> None:
    """The files of one run: ``rounds.csv``, ``summary.json`` and the final model ``model.npy``."""
    write_csv(out / "rounds.csv", rows)
    write_json(out / "summary.json", summary)
    if model is not None:
        write_model(out / "model.npy", model)


WRITE_SHARE = 0.05
"""Most of a run's time that :class:`RunWriter` spends rewriting its result files between rounds
(each write replaces rounds.csv whole, so a write costs more as the rounds add up)."""


class RunWriter:
    """A run observer that writes ``rounds.csv``, ``summary.json`` and ``model.npy`` into ``out``:
    after every round, unless rounds come faster than that -- then as often as keeps writing
    within ``share`` of the run (a kill -9 loses at most that share of the time run so far) --
    and at the end, interrupted or not (Ctrl-C and SIGTERM lose nothing)."""

    def __init__(self, out: Path, share: float = WRITE_SHARE) -> None:
        self.out = out
        self.share = share
        self._ended = -math.inf
        self._cost = 0.0

    def on_round(self, row: dict[str, Any], run: Any) -> None:
        started = time.monotonic()
        if started - self._ended >= self._cost / self.share:
            self.write(run)
            self._ended = time.monotonic()
            self._cost = self._ended - started

    def on_finish(self, run: Any) -> None:
        """Write the run's files; where that fails (a full disk, a folder turned read-only), mark
        the summary last written as the run's end instead, so that the files on disk say how the
        run stopped and stay consistent with each other (the rounds of the last write)."""
        try:
            self.write(run)
        except OSError as error:
            mark_stopped(self.out, "failed", f"the run's files could not be written: {error}")
            if run.status == "finished":
                raise

    def write(self, run: Any) -> None:
        write_run(self.out, run.rows, run.summary, run.evaluated_model)


def mark_stopped(out: Path, status: str, why: str) -> bool:
    """Set ``status`` and ``error`` in the ``summary.json`` written last in ``out`` (a small
    rewrite, where the run's own files could not be written); whether it could."""
    path = out / "summary.json"
    try:
        summary = json.loads(path.read_text())
        summary.update(status=status, error=why)
        write_json(path, summary)
    except (OSError, ValueError):
        return False
    return True


SERVER_INTERNAL = "server-internal"
"""Folder, inside a ServerApp's ``out``, of what only the trusted server may keep."""

SERVER_INTERNAL_NOTE = """NOT DP-PROTECTED: keep these files on the server, never publish them.

They hold what the server of a fairclip deployment knows exactly and differential privacy does
not cover: how many clients were sampled, which replies were accepted, dropped or missing and
why, round timings, each node's partition (and cohort, where the policy needs it), and the
simulation diagnostics of runs that enable them. The public release is next to this folder:
rounds.csv, summary.json and model.npy.
"""


def split_rows(
    rows: list[dict[str, Any]], public_columns: set[str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(public rows, internal rows): each row's ``public_columns``, and ``round`` with the rest."""
    public = [{key: value for key, value in row.items() if key in public_columns} for row in rows]
    internal = [
        {"round": row["round"], **{key: value for key, value in row.items() if key not in public_columns}}
        for row in rows
    ]
    return public, internal


def write_server_run(
    out: Path,
    rows: list[dict[str, Any]],
    public_columns: set[str],
    summary: dict[str, Any],
    model: np.ndarray | None,
    internal_tables: dict[str, tuple[list[dict[str, Any]], list[str]]],
) -> None:
    """The files of a ServerApp run: the public release (``rounds.csv`` with the public columns
    only, ``summary.json``, ``model.npy``) and, in :data:`SERVER_INTERNAL`, the internal record:
    ``rounds.csv`` (the other columns), ``provenance.json`` (with the run's wall time, left out of
    the public summary) and each of ``internal_tables`` (name -> (rows, columns))."""
    public_rows, internal_rows = split_rows(rows, public_columns)
    public_summary = dict(summary)
    if "provenance" in summary:  # the run's wall time depends on who took part: internal
        public_summary["provenance"] = {k: v for k, v in summary["provenance"].items() if k != "wall_seconds"}
    write_run(out, public_rows, public_summary, model)
    folder = out / SERVER_INTERNAL
    write_csv(folder / "rounds.csv", internal_rows)
    if "provenance" in summary:
        write_json(folder / "provenance.json", summary["provenance"])
    for name, (table, columns) in internal_tables.items():
        write_csv(folder / f"{name}.csv", table, columns)
    write_note(folder, SERVER_INTERNAL_NOTE)
