"""Atomic files: a temporary file in the same folder, then a rename (docs/design.md, section 7).

Readers see the old file or the new one, never half of it. Every room writes its files this way
(a run's outputs, a checkpoint, a sweep's tables, a downloaded dataset), so this module imports
nothing of fairclip.
"""

from __future__ import annotations

import io
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd


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


def write_note(folder: Path, text: str) -> None:
    """Write ``folder/README.txt`` (the note saying what a folder of unpublishable files holds)
    unless it is there already."""
    note = folder / "README.txt"
    if not note.exists():
        atomic_write_text(note, text)
