"""Atomic result files: a temporary file in the same folder, then a rename (docs/design.md, section 7)."""

from __future__ import annotations

import io
import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fairclip.sims.errors import ConfigError

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


def process_umask() -> int:
    """The process's umask, read without changing it where Linux tells it (``/proc``); elsewhere
    set and restored at once."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that readers see the old file or the new one, never half.

    The file gets the mode a plain ``open`` would give it (0666 less the umask), not the 0600 of
    the temporary file, so colleagues can read results on a shared machine.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), 0o666 & ~process_umask())
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """Atomically replace ``path`` with ``text`` (UTF-8)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def write_model(path: Path, model: np.ndarray) -> None:
    """Atomically write the flat model vector θ as ``.npy``."""
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(model, dtype=np.float64), allow_pickle=False)
    atomic_write_bytes(path, buffer.getvalue())


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(item) for item in value]
    return value


def json_normalised(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` as it reads back from :func:`write_json` (tuples as lists, ∞ as "inf")."""
    return json.loads(json.dumps(_json_safe(data)))


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Atomically write ``data`` as indented JSON (non-finite floats as strings)."""
    atomic_write_text(path, json.dumps(_json_safe(data), indent=2, sort_keys=False) + "\n")


def write_csv(path: Path, rows: list[dict[str, Any]], columns: list[str] | None = None) -> None:
    """Atomically write ``rows`` as CSV with pandas (``columns``: the header of an empty table)."""
    atomic_write_text(path, pd.DataFrame(rows, columns=columns).to_csv(index=False))


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


def write_note(folder: Path, text: str) -> None:
    """Write ``folder/README.txt`` (the note saying what a folder of unpublishable files holds)
    unless it is there already."""
    note = folder / "README.txt"
    if not note.exists():
        atomic_write_text(note, text)
