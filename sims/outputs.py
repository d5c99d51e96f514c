"""Atomic result files: write to a temporary file in the same folder, then rename (DESIGN 7)."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd


def atomic_write_text(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` so that readers see the old file or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


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
