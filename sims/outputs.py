"""Atomic result files: write to a temporary file in the same folder, then rename (DESIGN 7)."""

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


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that readers see the old file or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
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


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    """Atomically write ``rows`` as CSV with pandas."""
    atomic_write_text(path, pd.DataFrame(rows).to_csv(index=False))


def write_run(
    out: Path, rows: list[dict[str, Any]], summary: dict[str, Any], model: np.ndarray | None
) -> None:
    """The files of one run: ``rounds.csv``, ``summary.json`` and the final model ``model.npy``."""
    write_csv(out / "rounds.csv", rows)
    write_json(out / "summary.json", summary)
    if model is not None:
        write_model(out / "model.npy", model)
