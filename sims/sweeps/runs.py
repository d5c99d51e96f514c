"""The run folders of a sweep (``compare``, ``reproduce``): ``DIR/runs/<key>/``.

A finished run is written at once and atomically (``rounds.csv``, then ``summary.json``, whose
presence marks it finished, :func:`save_run`), so an interrupted sweep keeps every finished run
and ``--resume`` recomputes none of them (:func:`finished_summary`); an unfinished one keeps its
checkpoint in its folder (:func:`run_checkpoint`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fairclip.atomic import write_csv, write_json
from fairclip.scenarios.config import RunConfig
from fairclip.scenarios.errors import ConfigError
from fairclip.scenarios.stored import same_configuration
from fairclip.server.checkpoint import CHECKPOINT_FILE, rounds_done


def finished_summary(folder: Path, config: RunConfig) -> dict[str, Any] | None:
    """The summary of the run finished in ``folder`` (its ``summary.json`` is written last,
    atomically), or None when it is not finished (where its checkpoint, if it has one, is
    checked as this one's: :func:`fairclip.server.checkpoint.read`).

    A finished run made with another configuration (other ``--set`` values, say) is an error:
    reusing it would mix two experiments in one table. The stored configuration is resolved as
    today's code would resolve it, so a key added to fairclip since (at its default) does not
    make an old run look different; nor does a default that now depends on the machine, where
    it resolves here to the value the old run stored (:func:`as_run_here`).
    """
    path = folder / "summary.json"
    if not path.is_file():
        rounds_done(folder / CHECKPOINT_FILE, config)  # refuses, before any work, another run's
        return None
    try:
        summary = json.loads(path.read_text())
        stored = summary["config"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigError(f"--resume: {path} is unreadable ({error!r}); delete that run folder") from None
    if not same_configuration(stored, config):
        raise ConfigError(
            f"--resume: {folder} was computed with another configuration; "
            "use a new --out folder or run without --resume"
        )
    return summary


def save_run(folder: Path, result: dict[str, Any]) -> None:
    """Write a finished run: ``rounds.csv``, then ``summary.json`` (which marks it finished); then
    delete the run's checkpoint, which they supersede (:mod:`fairclip.server.checkpoint`)."""

    write_csv(folder / "rounds.csv", result["rows"])
    write_json(folder / "summary.json", result["summary"])
    (folder / CHECKPOINT_FILE).unlink(missing_ok=True)


def run_checkpoint(out: Path, key: str) -> Path:
    """Where the run ``key`` of the sweep or reproduction in ``out`` keeps its progress."""

    return out / "runs" / key / CHECKPOINT_FILE


def discard_checkpoints(out: Path, keys: Iterable[str]) -> None:
    """Delete the checkpoints of the runs ``keys`` in ``out``: a sweep run again without
    ``--resume`` computes them again from their first round (with today's code), as asked."""
    for key in keys:
        run_checkpoint(out, key).unlink(missing_ok=True)
