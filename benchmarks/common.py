"""Shared helpers: timing, peak memory of a process tree, machine information, child results."""

from __future__ import annotations

import json
import math
import os
import platform
import resource
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from fairclip.server.provenance import machine, usable_cores

REPO_ROOT = Path(__file__).resolve().parents[1]
"""The folder that holds ``benchmarks/`` (the repository root)."""

RESULT_MARKER = "BENCH-RESULT "
"""Prefix of the one stdout line in which a contender subprocess reports its result."""


def env_importing_fairclip(folder: Path) -> dict[str, str]:
    """The environment in which another interpreter (pfl-research's venv, which does not have
    fairclip installed) imports this fairclip: ``folder/fairclip`` links to the package root and
    ``folder`` leads ``PYTHONPATH``."""
    link = folder / "fairclip"
    if not link.exists():
        link.symlink_to(REPO_ROOT, target_is_directory=True)
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), *parts])}


# ----- memory ---------------------------------------------------------------------------------


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _children(pid: int) -> list[int]:
    found = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                found.extend(int(c) for c in handle.read().split())
        except OSError:
            continue
    return found


def tree_rss_bytes(root: int) -> int:
    """Resident memory of ``root`` and all its descendants (Linux /proc; 0 elsewhere)."""
    total, stack, seen = 0, [root], set()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += _rss_bytes(pid)
        stack.extend(_children(pid))
    return total


class TreeMemorySampler:
    """Samples the resident memory of this process and its descendants every ``interval`` s."""

    def __init__(self, interval: float = 0.2, root: int | None = None):
        self.interval = interval
        self.root = root or os.getpid()
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_rss_bytes(self.root))
            self._stop.wait(self.interval)

    def __enter__(self) -> TreeMemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, tree_rss_bytes(self.root))


def self_peak_rss_bytes() -> int:
    """Peak resident memory of this process (ru_maxrss is in KiB on Linux)."""
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


# ----- results --------------------------------------------------------------------------------


@dataclass
class Measurement:
    """One contender's figures, as a subprocess reports them."""

    throughput: float
    unit: str
    wall_s: float
    """Wall time of the measured phase (the rounds / training steps)."""
    total_s: float
    """Wall time including start-up (data, model, actors, framework)."""
    work: float
    """Amount of work done in the measured phase (client updates, examples, rounds)."""
    peak_rss_bytes: int
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "throughput": self.throughput,
            "unit": self.unit,
            "wall_s": self.wall_s,
            "total_s": self.total_s,
            "work": self.work,
            "peak_rss_bytes": self.peak_rss_bytes,
            "peak_rss_mib": self.peak_rss_bytes / 2**20,
            **self.details,
        }


def emit(measurement: Measurement) -> None:
    """Print the result line the runner parses (the last line of the child's stdout)."""
    sys.stdout.flush()
    print(RESULT_MARKER + json.dumps(measurement.as_dict()), flush=True)


BARRIER_ENV = "FAIRCLIP_BENCH_BARRIER"
"""``FOLDER:COUNT``: :func:`wait_for_peers` holds a child until COUNT children are ready."""
BARRIER_TIMEOUT_S = 300.0


def wait_for_peers() -> None:
    """Where :data:`BARRIER_ENV` is set, mark this process ready in its folder and wait until
    the given number of processes are, so that processes started together begin their measured
    phases together (their set-up takes different times); otherwise return at once."""
    spec = os.environ.get(BARRIER_ENV)
    if not spec:
        return
    folder, _, count = spec.rpartition(":")
    (Path(folder) / f"ready-{os.getpid()}").touch()
    deadline = time.monotonic() + BARRIER_TIMEOUT_S
    while len(list(Path(folder).glob("ready-*"))) < int(count):
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{BARRIER_ENV}: the other processes were not ready within {BARRIER_TIMEOUT_S:.0f} s"
            )
        time.sleep(0.005)


def alternate(names: tuple[str, ...], repeat: int) -> tuple[str, ...]:
    """The order of one paired repeat's runs: as given in even repeats, reversed in odd ones, so
    that neither contender always runs first (W4's policies, W5's 1 and 2 workers)."""
    return names if repeat % 2 == 0 else names[::-1]


def fastest(runs: list[tuple[float, float, dict[str, Any]]]) -> tuple[float, float, dict[str, Any]]:
    """The fastest of a contender's repeats (seconds, work, details), the one least disturbed by
    other load on a shared machine (as ``timeit`` reports); every repeat's wall time is kept."""
    seconds, work, details = min(runs, key=lambda run: run[0] / run[1])
    details.update(repeats=len(runs), all_wall_s=[run[0] for run in runs])
    return seconds, work, details


def measured(
    unit: str, body: Callable[[], tuple[float, float, dict[str, Any]]], sample_tree: bool = True
) -> Measurement:
    """Run ``body`` (returns measured-phase seconds, work, details) and wrap it with wall time and
    peak memory (of the whole process tree while it runs)."""
    started = time.perf_counter()
    with TreeMemorySampler() as sampler:
        seconds, work, details = body()
    total = time.perf_counter() - started
    peak = max(sampler.peak if sample_tree else 0, self_peak_rss_bytes())
    throughput = work / seconds if seconds > 0 else math.nan
    return Measurement(throughput, unit, seconds, total, work, peak, details)


# ----- machine --------------------------------------------------------------------------------


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


BUSY_FRACTION = 0.05
"""Share of the machine's CPU time that processes other than the benchmark's may take before the
report says its timings are not those of an idle machine."""


class OtherLoad:
    """CPU time taken, while the benchmark runs, by the processes that were already running when
    it started (other than this one): a background job that competes with the contenders. Its
    threads also slow multi-threaded contenders out of proportion (a thread that waits for its
    busy core holds up the others at every barrier), so such a run's ratios mislead. Processes
    started later by others are not seen; every contender's processes start later and are not
    counted. A process that ends counts what it had used at the last :meth:`per_process` call
    (the runner calls it after every contender)."""

    def __init__(self) -> None:
        import psutil

        self._started = time.perf_counter()
        self._before: dict[int, tuple[float, float]] = {}
        self._last: dict[int, tuple[float, str]] = {}
        own = os.getpid()
        for process in psutil.process_iter():
            try:
                if process.pid != own:
                    self._before[process.pid] = (process.create_time(), _cpu_seconds(process))
            except psutil.Error:
                continue

    def per_process(self) -> list[tuple[float, int, str]]:
        """(core-seconds since the start, pid, name) of each earlier process: now, or at the
        last call for one that has ended since."""
        import psutil

        for pid, (created, before) in self._before.items():
            try:
                process = psutil.Process(pid)
                if process.create_time() != created:  # the pid was reused
                    continue
                self._last[pid] = (_cpu_seconds(process) - before, process.name())
            except psutil.Error:
                continue
        return [(seconds, pid, name) for pid, (seconds, name) in self._last.items()]

    def measure(self) -> dict[str, Any]:
        """``core_seconds`` the earlier processes used since the start, their ``fraction`` of the
        machine's CPU time over that wall time, and the ``busiest`` three (pid, name, seconds)."""
        wall = time.perf_counter() - self._started
        used = self.per_process()
        total = sum(seconds for seconds, _, _ in used)
        return {
            "core_seconds": round(total, 2),
            "fraction": round(total / (wall * usable_cores()), 4) if wall > 0 else 0.0,
            "busiest": [
                {"pid": pid, "name": name, "core_seconds": round(seconds, 2)}
                for seconds, pid, name in sorted(used, reverse=True)[:3]
            ],
        }


def _cpu_seconds(process: Any) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def machine_info() -> dict[str, Any]:
    """The machine as a run's provenance names it (:func:`fairclip.server.provenance.machine`:
    platform, CPU, its vector instructions, usable ``cores``, GPU), with what a benchmark also
    needs: all the cores, memory, load and the versions of the libraries that matter here."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        memory = None
    try:
        load = list(os.getloadavg())
    except OSError:
        load = None
    return {
        **machine(),
        "all_cores": os.cpu_count(),
        "memory_bytes": memory,
        "load_average": load,
        "python": platform.python_version(),
        "libraries": {
            name: _version(name) for name in ("fairclip", "torch", "flwr", "ray", "opacus", "numpy", "pfl")
        },
    }
