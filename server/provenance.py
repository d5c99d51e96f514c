"""Where a result came from: code, libraries, machine and time (``summary.json``'s ``provenance``)."""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

LIBRARIES = ("fairclip", "torch", "flwr", "opacus", "ray", "numpy", "opendp")


@cache
def _static() -> dict[str, Any]:
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "fairclip_version": versions.pop("fairclip"),
        "git_commit": git_commit(),
        "libraries": versions,
        "python": platform.python_version(),
        "machine": machine(),
    }


def git_commit() -> str | None:
    """The commit of the fairclip checkout this code runs from (with ``+dirty`` when it has
    uncommitted changes), or ``None`` for an installed copy or a machine without git."""
    root = Path(__file__).resolve().parents[1]
    if not (root / ".git").exists():
        return None
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if commit.returncode != 0:
            return None
        status = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return commit.stdout.strip() + ("+dirty" if status.stdout.strip() else "")


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (Linux), else what :mod:`platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity, where the platform has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def machine() -> dict[str, Any]:
    """CPU cores this process may use, the platform, the CPU model, the vector instructions
    torch's CPU kernels use (``torch.backends.cpu.get_cpu_capability()``: two hosts that differ
    here can round the same computation differently), and the GPU torch sees (if any)."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "processor": platform.machine(),
        "cpu": cpu_model(),
        "cpu_capability": None,
        "cores": usable_cores(),
        "gpu": None,
    }
    try:
        import torch

        info["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except Exception:  # torch without a working CUDA runtime: no GPU to report
        pass
    return info


def provenance(started: dt.datetime, wall_seconds: float) -> dict[str, Any]:
    """The provenance of a result begun at ``started`` (UTC) after ``wall_seconds`` of work."""
    return {
        **_static(),
        "started": started.isoformat(timespec="seconds"),
        "wall_seconds": round(wall_seconds, 3),
    }
