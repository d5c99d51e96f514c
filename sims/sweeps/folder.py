"""The output folder of a sweep (``compare``, ``reproduce``): its stored specification and its lock.

A sweep writes its full specification -- everything that decides which runs it holds -- into
``DIR/sweep.json`` before its first run. Then:

- ``--resume`` alone continues *that* sweep (the stored specification is used; options given
  with it must agree);
- a different specification on a folder that holds one is refused, unless the user asks to
  ``extend`` the sweep (more policies, ε or seeds over the same scenario; finished runs are
  kept) or to ``replace`` it (its results are deleted first);
- the same specification without ``--resume`` computes every run again.

One process at a time: :func:`locked` holds an exclusive ``flock`` on ``DIR/.fairclip.lock``
for as long as the sweep runs, and a second process on the folder is refused with one line. The
kernel drops the lock when its process ends, however it ends, so no stale lock survives a kill.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from collections.abc import Callable, Iterator
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fairclip.atomic import json_normalised, write_json
from fairclip.scenarios.config import canonical_assignments, canonical_raw
from fairclip.scenarios.errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd

SPEC_FILE = "sweep.json"
LOCK_FILE = ".fairclip.lock"
TUNE_SPEC_FILE = "tuning.json"
"""Where ``fairclip tune`` stores a search."""
TUNE_CURVE_FILE = "curve.csv"
"""Where ``fairclip tune --policies ... --epsilons ...`` stores its curve (one search per
subfolder)."""
_HELD_BY = {
    SPEC_FILE: "a sweep (`fairclip compare` or `reproduce`)",
    TUNE_SPEC_FILE: "a `fairclip tune` search",
    TUNE_CURVE_FILE: "a `fairclip tune` curve",
}


def refuse_another_commands_folder(out: Path, mine: str) -> None:
    """A :class:`ConfigError` where ``out`` holds what another kind of command wrote (a sweep,
    a search, a curve: their reports share names), for the command whose own file is ``mine``."""
    for name, what in _HELD_BY.items():
        if name != mine and (out / name).is_file():
            raise ConfigError(f"{out} holds {what} ({name}), not this command's: use another --out")


class Mode(StrEnum):
    """What to do with a folder that already holds a sweep."""

    NEW = "new"
    """Refuse a different sweep; compute the same one again."""
    RESUME = "resume"
    """Continue the stored sweep, keeping its finished runs."""
    EXTEND = "extend"
    """Add runs to the stored sweep (merged specification), keeping its finished runs."""
    REPLACE = "replace"
    """Delete the stored sweep's results and start the given one."""


@contextlib.contextmanager
def locked(out: Path) -> Iterator[None]:
    """Hold the folder ``out`` for this process, or raise :class:`ConfigError` naming who holds it.
    A folder this call created and in which nothing was written is removed again at the end (a
    command refused after taking it leaves nothing behind)."""
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    handle = (out / LOCK_FILE).open("a+")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise ConfigError(
                f"{out} is in use by another fairclip process ({holder}); wait for it"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}")
        handle.flush()
        yield
    finally:
        if created and [path.name for path in out.iterdir()] == [LOCK_FILE]:
            with contextlib.suppress(OSError):  # still held: nobody else can be using it
                (out / LOCK_FILE).unlink()
                out.rmdir()
        handle.close()  # closing the file releases the lock


def stored_spec(out: Path) -> dict[str, Any] | None:
    """The specification stored in ``out``, or ``None`` when it holds no sweep."""
    path = out / SPEC_FILE
    if not path.is_file():
        return None
    try:
        spec = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ConfigError(f"{path} is unreadable ({error}); delete it or use --replace") from None
    return canonical_spec(spec, quiet=True)


OLD_COLUMNS = {"strategy": "policy"}
"""Columns of fairclip's tables (``summary.csv``, ``statistics.csv``, ``curve.csv``,
``reproduction.csv``, ``per_seed.csv``, ``fairest.csv``) by their names before issue 66 (one
name per concept): a file written before is read under the new names (:func:`canonical_columns`)."""
OLD_SPEC_KEYS = {"strategies": "policies"}
"""Entries of a stored specification (``sweep.json``, ``tuning-curve.json``) by their names
before issue 66, read under the new names (:func:`canonical_keys`)."""


def canonical_columns(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with each old column of :data:`OLD_COLUMNS` under its new name (where the new
    one is not there too): every reader of fairclip's tables reads them through this, so that a
    folder or a recorded result written before the rename reads as one written now."""
    renames = {
        old: new for old, new in OLD_COLUMNS.items() if old in table.columns and new not in table.columns
    }
    return table.rename(columns=renames) if renames else table


def read_table(path: Path, **options: Any) -> pd.DataFrame:
    """A table fairclip wrote (``pandas.read_csv`` with ``options``), under the current column
    names (:func:`canonical_columns`)."""
    import pandas as pd  # only where a table is read: the command line starts without it

    return canonical_columns(pd.read_csv(path, **options))


def canonical_keys(spec: dict[str, Any]) -> dict[str, Any]:
    """A stored specification with each old entry of :data:`OLD_SPEC_KEYS` under its new name
    (where the new one is not there too)."""
    renamed = dict(spec)
    for old, new in OLD_SPEC_KEYS.items():
        if old in renamed and new not in renamed:
            renamed = {(new if key == old else key): value for key, value in renamed.items()}
    return renamed


def canonical_spec(spec: dict[str, Any], *, quiet: bool = False) -> dict[str, Any]:
    """A sweep's specification under the current names: ``strategies`` (the old name of
    ``policies``, :func:`canonical_keys`) and ``strategy.*`` keys (the old name of ``policy.*``)
    read as ``policy.*`` in its configuration (``config``) and its ``--set`` assignments
    (``overrides``), so that a folder written before the rename resumes as the same sweep."""
    if not isinstance(spec, dict):
        return spec
    spec = canonical_keys(spec)
    if isinstance(spec.get("config"), dict):
        spec["config"] = canonical_raw(spec["config"], quiet=quiet)
    if isinstance(spec.get("overrides"), list):
        spec["overrides"] = canonical_assignments(spec["overrides"], quiet=quiet)
    return spec


def settle(
    out: Path,
    given: dict[str, Any],
    mode: Mode,
    *,
    merge: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]] | None = None,
    results: tuple[str, ...] = (),
    explicit: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The specification this invocation runs, stored in ``out`` (call it inside :func:`locked`).

    ``given`` is the specification the options describe: complete, except with ``resume``,
    where it holds only the options the user gave, each of which must agree with the stored
    sweep. ``merge(stored, given)`` extends a stored specification (:class:`ConfigError` where
    they cannot be merged); ``results`` are the files and folders in ``out`` that ``replace``
    deletes.

    ``explicit``, with ``extend``: only the options the user gave (as ``given`` holds them for
    ``resume``). An option left out then keeps the stored sweep's value instead of taking its
    default, so ``--extend --policies X`` adds X to the stored seeds (not to the default
    number of seeds) and ``--extend --seeds N`` adds seeds to the stored policies (not to all
    of them). Where nothing is stored, ``given`` (complete) starts the sweep.
    """
    refuse_another_commands_folder(out, SPEC_FILE)
    stored = stored_spec(out)
    given = json_normalised(given)
    if stored is not None and mode is not Mode.REPLACE and stored.get("command") != given.get("command"):
        raise ConfigError(
            f"{out} holds a `fairclip {stored.get('command')}` sweep ({describe(stored)}), which "
            f"`fairclip {given.get('command')}` can neither continue nor extend: use another --out"
        )
    if mode is Mode.EXTEND and stored is not None and explicit is not None:
        given = {**stored, **json_normalised(explicit)}
    if mode is Mode.RESUME:
        if stored is None:
            raise ConfigError(
                f"--resume: {out} holds no stored sweep ({SPEC_FILE}); give the sweep's options with "
                "--extend instead, which keeps every finished run made with the same configuration"
            )
        differ = sorted(key for key, value in given.items() if stored.get(key) != value)
        if differ:
            raise ConfigError(
                f"--resume continues the sweep stored in {out / SPEC_FILE} ({describe(stored)}); "
                f"{', '.join(differ)} differ: use --extend to add runs or --replace to start over"
            )
        spec = stored
    elif mode is Mode.REPLACE:
        for name in results:
            target = out / name
            if target.is_dir():
                shutil.rmtree(target)
            else:
                target.unlink(missing_ok=True)
        spec = given
    elif stored is None or stored == given:
        spec = given
    elif mode is Mode.EXTEND:
        if merge is None:
            raise ConfigError("this sweep cannot be extended; use --replace")
        spec = json_normalised(merge(stored, given))
    else:
        raise ConfigError(
            f"{out} holds another sweep ({describe(stored)}); this one is {describe(given)}: "
            "use --resume to continue that one, --extend to add these runs, --replace to start over, "
            "or another --out"
        )
    write_json(out / SPEC_FILE, spec)
    return spec


def mode_of(resume: bool, extend: bool, replace: bool) -> Mode:
    """The :class:`Mode` of the flags ``--resume``, ``--extend`` and ``--replace`` (at most one)."""
    chosen = [
        mode for mode, flag in ((Mode.RESUME, resume), (Mode.EXTEND, extend), (Mode.REPLACE, replace)) if flag
    ]
    if len(chosen) > 1:
        raise ConfigError("give at most one of --resume, --extend and --replace")
    return chosen[0] if chosen else Mode.NEW


def specification(
    command: str,
    fixed: dict[str, Any],
    options: dict[str, tuple[Any, Any]],
    explicit_only: bool,
) -> dict[str, Any]:
    """A sweep's specification: ``command``, the ``fixed`` entries, and each option
    (name -> (value given or ``None``, default)) with its default filled in -- or, with
    ``explicit_only`` (``--resume``), only the options that were given, for :func:`settle` to
    check against the stored sweep."""
    spec = {"command": command, **fixed}
    for key, (value, default) in options.items():
        if value is not None or not explicit_only:
            spec[key] = default if value is None else value
    return spec


def union(first: list[Any], second: list[Any]) -> list[Any]:
    """``first`` followed by the items of ``second`` it lacks."""
    return [*first, *(item for item in second if item not in first)]


def describe(spec: dict[str, Any]) -> str:
    """A one-line summary of a specification (its options, not its scenario table)."""
    return ", ".join(f"{key} {value}" for key, value in spec.items() if key not in ("command", "config"))
