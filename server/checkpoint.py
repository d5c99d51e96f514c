"""A run's progress on disk, so that a long run killed half-way continues where it stopped.

A simulation's randomness is keyed by (seed, stream, round[, client])
(:mod:`fairclip.strategies.randomness`): no generator carries state from one round to the next.
What a later process needs to continue after round k is therefore the round server's state after
k -- θ_k, the server optimizer's moments, the policy state, the accountant's history, the last
DP event -- and what the run has produced so far (its rows and summary), which
:meth:`fairclip.server.run.Run.snapshot` gathers. The continued run computes rounds k+1, ...
exactly as the uninterrupted run would have: the same numbers, bit for bit on the same machine
(``test_checkpoint.py``).

:class:`Checkpointing` writes that snapshot atomically (a temporary file, then a rename) every
``every_seconds`` of run time, when the run is interrupted, and when it finishes; a kill between
two writes loses the rounds since the last one. ``fairclip compare`` and ``fairclip reproduce``
keep it as ``checkpoint.pkl`` in the run's folder and delete it once the run's own files are
written; their ``--resume`` continues every unfinished run from its checkpoint.

A round's release can reach the outside before the checkpoint that covers it is written: the
run's observers (its file writer, a tracker, a callback) see every round as it finishes. Where
the noise is a function of (seed, round), a resumed run recomputes those rounds with the same
noise. Where it is not (OpenDP's sampler, ``privacy.secure_noise = true``, or operating-system
entropy), a recomputed round is a second release with fresh noise. So, for such a run, the
number of rounds released is written durably (``<checkpoint>.released``, :meth:`Checkpointing.
note_released`) before any observer sees a round, and a resume charges the accountant once more
for every released round that the checkpoint does not hold (:meth:`Run.charge_released_again
<fairclip.server.run.Run.charge_released_again>`): ε always covers every release ever
written, and a budget stops the run that much earlier.

The file is a pickle: load only checkpoints you wrote. It holds what the server alone may see in a
simulation (the rows' exact counts and diagnostics, like the run's folder): do not publish it.
A checkpoint made with another configuration is refused with a :class:`ConfigError`, as a
finished run is (:func:`fairclip.sims.sweeps.runs.finished_summary`).
"""

from __future__ import annotations

import json
import pickle
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fairclip.atomic import atomic_write_bytes, json_normalised, write_json
from fairclip.scenarios.errors import ConfigError
from fairclip.scenarios.stored import same_configuration

if TYPE_CHECKING:
    from fairclip.scenarios.config import RunConfig
    from fairclip.server.run import Run

CHECKPOINT_FILE = "checkpoint.pkl"
"""The checkpoint's name in a run's folder (``fairclip compare``, ``fairclip reproduce``)."""

FORMAT = 1
"""The layout of the pickled snapshot; a checkpoint of another layout is refused."""

DEFAULT_EVERY_SECONDS = 300.0
"""Run time between two checkpoints: a kill loses at most about this much work. Writing one
takes well under a second (θ and the rows so far), so this costs under 0.5 % of a run."""


def released_path(path: Path) -> Path:
    """Where the rounds released by a run that keeps its checkpoint in ``path`` are counted."""
    return path.with_name(path.name + ".released")


def read_released(path: Path, config: RunConfig) -> int:
    """Rounds released by the run of ``config`` whose checkpoint is ``path`` (0 when none were
    counted); refused like :func:`read` when unreadable or of another configuration."""
    ledger = released_path(path)
    if not ledger.is_file():
        return 0
    try:
        stored = json.loads(ledger.read_text())
        layout, stored_config, rounds = stored["format"], stored["config"], int(stored["rounds_released"])
    except Exception as error:  # a truncated or foreign file
        raise ConfigError(f"release count {ledger} is unreadable ({error!r})") from None

    if layout != FORMAT or not same_configuration(stored_config, config):
        raise ConfigError(
            f"release count {ledger} belongs to a run with another configuration; use a new checkpoint file"
        )
    return rounds


def read(path: Path, config: RunConfig) -> dict[str, Any] | None:
    """The snapshot stored in ``path`` (None when there is none), after checking that it continues
    a run of ``config``: an unreadable file, another layout or another configuration raise a
    :class:`ConfigError` naming the file."""
    if not path.is_file():
        return None
    try:
        stored = pickle.loads(path.read_bytes())
        layout, stored_config = stored["format"], stored["config"]
    except Exception as error:  # a truncated or foreign file: anything unpickling can raise
        raise ConfigError(f"checkpoint {path} is unreadable ({error!r}); delete it to start again") from None
    if layout != FORMAT:
        raise ConfigError(f"checkpoint {path} has layout {layout!r}, not {FORMAT}; delete it to start again")

    if not same_configuration(stored_config, config):
        raise ConfigError(
            f"checkpoint {path} continues a run with another configuration; "
            "delete it, or use a new --out folder"
        )
    return stored


def rounds_done(path: Path, config: RunConfig) -> int:
    """Rounds a run of ``config`` has finished in the checkpoint ``path`` (0 without one);
    refused as in :func:`read`. Lets a driver check every checkpoint before any work."""
    stored = read(path, config)
    return 0 if stored is None else int(stored["snapshot"]["rounds_completed"])


def share_computed_earlier(summary: dict[str, Any]) -> float:
    """The share of a finished run's rounds that earlier processes computed before it was
    continued from its checkpoint: 0 for a run computed in one go. Read from the summary's
    ``provenance.pieces`` (:meth:`fairclip.server.run.Run.snapshot`), whose last piece is
    the process that finished the run; progress displays count that share as done earlier, not
    towards their pace (:mod:`fairclip.progress`)."""
    pieces = (summary.get("provenance") or {}).get("pieces") or []
    if not pieces:
        return 0.0
    last = pieces[-1]
    total = int(last["last_round"])
    return (int(last["first_round"]) - 1) / total if total > 0 else 0.0


@dataclass
class Checkpointing:
    """Keeps run ``config``'s progress in ``path``: :meth:`resume` a server from it, then
    :meth:`after_round` writes it every ``every_seconds`` and :meth:`save` at the end."""

    path: Path
    every_seconds: float = DEFAULT_EVERY_SECONDS
    _last: float = field(default_factory=time.perf_counter, repr=False)
    _config: dict[str, Any] | None = field(default=None, repr=False)
    """The run's configuration as the release count stores it (normalised once)."""

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        if not self.every_seconds > 0:
            raise ConfigError(f"checkpoint interval must be > 0 seconds (got {self.every_seconds})")

    def resume(self, server: Run) -> int:
        """Restore ``server`` from the checkpoint, if there is one, and charge it for the rounds
        released beyond it where the noise is not reproducible (module docstring); the rounds it
        had finished."""
        stored = read(self.path, server.config)
        released = read_released(self.path, server.config)
        if stored is not None:
            server.restore(stored["snapshot"])
            self._last = time.perf_counter()
        if released > server.rounds_completed and not server.noise_reproducible:
            server.charge_released_again(released - server.rounds_completed)
        return server.rounds_completed

    def note_released(self, server: Run) -> None:
        """Write, atomically and before anyone sees them, that ``server``'s rounds up to its last
        finished one are released. An error (a full disk) propagates: the round must then not
        be shown."""
        config = self._config or json_normalised(server.config.as_dict())
        self._config = config
        write_json(
            released_path(self.path),
            {"format": FORMAT, "config": config, "rounds_released": server.rounds_completed},
        )

    def after_round(self, server: Run) -> None:
        """Write the checkpoint when ``every_seconds`` have passed since the last one."""
        if time.perf_counter() - self._last >= self.every_seconds:
            self.save(server)

    def save(self, server: Run) -> bool:
        """Write ``server``'s snapshot now, atomically: the file holds the old checkpoint or the
        new one; whether it was written. A write that fails (a full disk, a policy state pickle
        cannot hold) keeps the old checkpoint and warns: the run itself goes on, its result is
        still written at the end."""
        self._last = time.perf_counter()
        try:
            config = json_normalised(server.config.as_dict())
            data = pickle.dumps(
                {"format": FORMAT, "config": config, "snapshot": server.snapshot()},
                protocol=pickle.HIGHEST_PROTOCOL,
            )
            atomic_write_bytes(self.path, data)
        except Exception as error:  # OSError, PicklingError, or what a user's state raises when pickled
            warnings.warn(
                f"checkpoint {self.path} not written after round {server.rounds_completed}: {error!r}",
                RuntimeWarning,
                stacklevel=2,
            )
            return False
        return True

    def discard(self) -> None:
        """Delete the checkpoint and its release count (the run's own files are written: they
        supersede both)."""
        self.path.unlink(missing_ok=True)
        released_path(self.path).unlink(missing_ok=True)
