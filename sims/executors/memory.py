"""Memory a run will need, estimated before any work, and the check that refuses what cannot fit.

A simulation holds every client's data in memory, unless the population is generated (below),
so its size grows with ``federation.num_clients``. The estimate is per client plus the
interpreter (torch, numpy and fairclip imported), from what the tasks allocate while they build
their data and run (the peak):

- ``mean-estimation`` (d dimensions): the points (d float64, drawn and scaled in place) and a
  round's sampling draw (a float64 and a bool a client), with the sampled clients' ids and
  updates: ``(8 d + 24)`` bytes a client. Measured: 10⁶ clients 413 MB, 10⁷ 592 MB peak (21
  bytes a client for d = 1; estimate 32).
- ``classification`` on the synthetic dataset (n examples of f features a client): the float64
  draws and their float32 copy (12 f bytes an example), the labels (2 × 8) and an index array a
  client (~120 bytes of numpy object and n × 8 of indices): ``n (12 f + 24) + 120`` bytes.
- ``classification`` on a real dataset: the dataset is fixed in size and a client is at least
  one example, so the population never dominates; 200 bytes a client is counted.

A synthetic population too large to hold
(:data:`fairclip.scenarios.data.generated_clients.GENERATE_ABOVE_BYTES`) holds no client: a round
draws its sampled clients' data, so only the expected qN sampled clients count, at what a held
client costs (their data) plus their ids.

A run with R copies of its task (Ray actors of ``run --executor ray``, runs at once of
``compare``) needs R times that.
"""

from __future__ import annotations

import math
from pathlib import Path

from fairclip.scenarios.config import RunConfig
from fairclip.scenarios.data.generated_clients import generates_clients
from fairclip.scenarios.errors import ConfigError
from fairclip.scenarios.tasks.mean_estimation import generates_points

INTERPRETER_BYTES = 450 * 2**20
"""A process with torch, numpy and fairclip imported (measured 350-390 MB peak with a small task
built; counted with a margin)."""

CGROUP_LIMIT = Path("/sys/fs/cgroup/memory.max")
CGROUP_USAGE = Path("/sys/fs/cgroup/memory.current")


def client_bytes(config: RunConfig) -> int:
    """Peak bytes one client's data costs in a run's task, held or drawn (module docstring)."""
    scenario = config.scenario
    if scenario.task == "mean-estimation":
        return 8 * scenario.dimension + 24
    if scenario.dataset == "synthetic":
        return scenario.examples_per_client * (12 * scenario.features + 24) + 120
    return 200


def generated(config: RunConfig) -> bool:
    """Whether the scenario's population is generated when sampled rather than held."""

    scenario, clients = config.scenario, config.federation.num_clients
    if scenario.task == "mean-estimation":
        return generates_points(scenario.dimension, clients)
    return scenario.task == "classification" and generates_clients(scenario, clients)


def bytes_per_client(config: RunConfig) -> int:
    """Peak bytes one client of the population costs: its data where it is held, nothing where
    the population is generated (the sampled clients are counted by :func:`estimate_run_memory`)."""
    return 0 if generated(config) else client_bytes(config)


def estimate_run_memory(config: RunConfig) -> int:
    """Peak bytes of one process that builds and runs the task of ``config``."""
    federation = config.federation
    if generated(config):
        sampled = math.ceil(federation.sample_rate * federation.num_clients)
        return INTERPRETER_BYTES + sampled * (client_bytes(config) + 8)
    return INTERPRETER_BYTES + federation.num_clients * bytes_per_client(config)


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
    where = f" in {copies} processes at once" if copies > 1 else ""
    federation = config.federation
    if generated(config):
        raise ConfigError(
            f"federation.sample_rate={federation.sample_rate:g} of {federation.num_clients:,} clients "
            f"draws about {math.ceil(federation.sample_rate * federation.num_clients):,} clients a round, "
            f"whose data need about {_gigabytes(needed)} of memory{where}, and "
            f"{_gigabytes(available)} is available; lower the sample rate"
        )
    fits = max(0, (available // copies - INTERPRETER_BYTES) // bytes_per_client(config))
    raise ConfigError(
        f"federation.num_clients={federation.num_clients:,} needs about "
        f"{_gigabytes(needed)} of memory{where} and {_gigabytes(available)} is available; "
        f"at most about {fits:,} clients fit"
    )
