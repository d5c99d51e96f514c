"""Memory a run will need, estimated before any work, and the check that refuses what cannot fit.

A simulation holds every client's data in memory, so its size grows with
``federation.num_clients``. The estimate is per client plus the interpreter (torch, numpy and
fairclip imported), from what the tasks allocate while they build their data (the peak):

- ``mean-estimation`` (d dimensions): points, the Gaussian draws and the centres gathered per
  client (3 d float64) and the cohort and spread of each (2 × 8 bytes), plus the sampling draw
  of a round (8 bytes): ``(24 d + 24)`` bytes a client. Measured: 10⁶ clients 425 MB, 10⁷
  777 MB peak (39 bytes a client for d = 1; estimate 48).
- ``classification`` on the synthetic dataset (n examples of f features a client): the float64
  draws and their float32 copy (12 f bytes an example), the labels (2 × 8) and an index array a
  client (~120 bytes of numpy object and n × 8 of indices): ``n (12 f + 24) + 120`` bytes.
- ``classification`` on a real dataset: the dataset is fixed in size and a client is at least
  one example, so the population never dominates; 200 bytes a client is counted.

A run with R copies of its task (Ray actors of ``run --backend ray``, runs at once of
``compare``) needs R times that.
"""

from __future__ import annotations

from pathlib import Path

from fairclip.sims.config import RunConfig
from fairclip.sims.errors import ConfigError

INTERPRETER_BYTES = 450 * 2**20
"""A process with torch, numpy and fairclip imported (measured 350-390 MB peak with a small task
built; counted with a margin)."""

CGROUP_LIMIT = Path("/sys/fs/cgroup/memory.max")
CGROUP_USAGE = Path("/sys/fs/cgroup/memory.current")


def bytes_per_client(config: RunConfig) -> int:
    """Peak bytes one simulated client costs in a run's task (see the module docstring)."""
    scenario = config.scenario
    if scenario.task == "mean-estimation":
        return 24 * scenario.dimension + 16
    if scenario.dataset == "synthetic":
        return scenario.examples_per_client * (12 * scenario.features + 24) + 120
    return 200


def estimate_run_memory(config: RunConfig) -> int:
    """Peak bytes of one process that builds and runs the task of ``config``."""
    return INTERPRETER_BYTES + config.federation.num_clients * bytes_per_client(config)


def available_memory() -> int:
    """Bytes this process may still allocate: the machine's available memory (psutil), or less
    where a cgroup (a container, a Slurm job) limits it."""
    import psutil

    available = psutil.virtual_memory().available
    try:
        limit = CGROUP_LIMIT.read_text().strip()
        if limit != "max":
            available = min(available, int(limit) - int(CGROUP_USAGE.read_text()))
    except (OSError, ValueError):
        pass
    return available


def _gigabytes(value: float) -> str:
    return f"{value / 1e9:.3g} GB"


def check_memory(config: RunConfig, copies: int = 1, available: int | None = None) -> None:
    """Refuse, before any work, a run whose ``copies`` task copies cannot fit in ``available``
    bytes (default: :func:`available_memory`): one :class:`ConfigError` line with the estimate,
    what is available and the largest population that fits."""
    needed = copies * estimate_run_memory(config)
    available = available_memory() if available is None else available
    if needed <= available:
        return
    per_client = bytes_per_client(config)
    fits = max(0, (available // copies - INTERPRETER_BYTES) // per_client)
    where = f" in {copies} processes at once" if copies > 1 else ""
    raise ConfigError(
        f"federation.num_clients={config.federation.num_clients:,} needs about "
        f"{_gigabytes(needed)} of memory{where} and {_gigabytes(available)} is available; "
        f"at most about {fits:,} clients fit"
    )
