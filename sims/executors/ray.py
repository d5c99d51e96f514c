"""The Ray executor: long-lived actors, each owning some blocks of clients and their data.

Per round the driver puts θ_t into the object store once; every actor trains and clips the
sampled clients of its groups of blocks with the same functions as the in-process executor
(:func:`fairclip.server.run.groups_sums`) and returns one :class:`RoundSums` per block. Traffic
per round therefore grows with the number of blocks (a fixed small number), not of clients, and
the driver adds the block sums in block order, so a seed gives the same result on ``local`` and
``ray``. Works on one machine (``ray.init(num_cpus=...)``) or on an existing cluster
(``address``).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import ray

from fairclip.plugins import restore, snapshot
from fairclip.scenarios.config import RunConfig, validate
from fairclip.scenarios.errors import ConfigError
from fairclip.scenarios.tasks import Task, build_task
from fairclip.server.interrupts import sigterm_handler_kept
from fairclip.sims.executors.local import (
    ClientWork,
    evaluation_block_sums,
    groups_sums,
    task_device,
    update_length,
)
from fairclip.strategies import Policy, build_policy
from fairclip.strategies.aggregation import (
    SUM_SHARDS,
    Exchange,
    RoundSums,
    add_in_order,
    balance,
    group_blocks,
    round_total,
    shard_bounds,
    shard_ids,
)
from fairclip.strategies.evaluation import add_blocks

ADDRESS_TIMEOUT_SECONDS = 10.0
"""How long :func:`check_reachable` waits for a Ray cluster's address to accept a connection."""


def check_reachable(address: str, timeout: float = ADDRESS_TIMEOUT_SECONDS) -> None:
    """Raise :class:`ConfigError` naming ``address`` (``HOST:PORT`` of a cluster's GCS) when nothing
    accepts a TCP connection there within ``timeout`` seconds: ``ray.init`` would retry for
    minutes. ``auto`` and ``ray://`` addresses are left to Ray."""
    if address == "auto" or "://" in address:
        return
    host, separator, port = address.rpartition(":")
    if not separator or not port.isdigit():
        raise ConfigError(f"--address {address!r}: expected HOST:PORT of a Ray cluster")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as error:
        reason = getattr(error, "strerror", None) or str(error) or type(error).__name__
        raise ConfigError(f"--address {address}: no Ray cluster reachable there ({reason})") from None


def ensure_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Start Ray locally (dashboard off, ``num_cpus`` set) or connect to ``address``, once.

    Without ``address`` this always starts a new local Ray (``address="local"``): left to
    itself, ``ray.init`` would join the last cluster ``ray start`` began on this machine, or
    the one ``RAY_ADDRESS`` names, and refuse ``num_cpus`` there. Where this process is already
    connected to Ray, that connection is kept -- unless ``address`` names another cluster (a
    different port), which is a :class:`ConfigError` rather than a run on the wrong cluster."""
    if ray.is_initialized():
        if address and address != "auto" and "://" not in address:
            current = ray.get_runtime_context().gcs_address
            if address.rpartition(":")[2] != str(current).rpartition(":")[2]:
                raise ConfigError(
                    f"--address {address}: this process is already connected to the Ray cluster at "
                    f"{current} (run in a new process, or ray.shutdown() first)"
                )
        return
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    if address:
        check_reachable(address)
    with sigterm_handler_kept():
        if address:
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        else:
            ray.init(
                address="local",
                num_cpus=num_cpus or os.cpu_count() or 1,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
            )


def gpu_share(device: str, parallel: int) -> float:
    """The GPUs each of ``parallel`` Ray actors or tasks requests for ``training.device``: none on
    the CPU or on a cluster without GPUs; else an equal share of the cluster's GPUs, at most one
    each (Ray then makes them visible to torch in that worker)."""
    gpus = float(ray.cluster_resources().get("GPU", 0))
    if device == "cpu" or gpus == 0:
        return 0.0
    return min(1.0, gpus / max(parallel, 1))


def cluster_cpus() -> int:
    """CPUs of the cluster's alive nodes, from the node table. ``ray.cluster_resources()`` can
    lag a node that has just joined (seen under load: one CPU of a two-node cluster), which
    would start too few actors; an actor asked for meanwhile waits until its node is usable."""
    listed = sum(float(node["Resources"].get("CPU", 0)) for node in ray.nodes() if node.get("Alive"))
    return max(1, int(listed or ray.cluster_resources().get("CPU", 1)))


@ray.remote(num_cpus=1)
class ClientBlocksActor:
    """Holds the task (clients and data) and trains the sampled clients of its blocks."""

    def __init__(
        self,
        config: dict[str, Any],
        data_dir: str | None,
        plugins: dict[str, Any] | None = None,
        owner: tuple[int, int] | None = None,
    ):
        if plugins is not None:  # the driver's registered plug-ins and import path
            restore(plugins)
        self.task: Task = build_task(validate(config), Path(data_dir) if data_dir else None)
        generated = getattr(self.task, "generated", None) is not None  # no data to drop
        if owner is not None and owns_clients(self.task.rows_per_call) and not generated:
            actor, num_actors = owner
            held = held_clients(len(self.task.client_cohorts), num_actors, actor)
            if not held.all():
                self.task.keep_clients(held)
        self.set_policy(config)
        self.held: dict[tuple[int, int], ClientWork] = {}
        """A counts-first round's work on this actor, between its two exchanges."""

    def set_policy(self, config: dict[str, Any]) -> None:
        """Use the policy of ``config`` from now on (the same scenario, so the same task: the
        DP-overhead benchmark switches policies on one set of actors)."""
        self.config: RunConfig = validate(config)
        self.policy: Policy = build_policy(
            self.config.policy.name, self.config.policy.params, num_cohorts=len(self.task.cohort_names)
        )

    def rows_per_call(self) -> int:
        return self.task.rows_per_call

    def forms_updates(self) -> bool:
        """Whether this task forms its update rows for the current policy (:func:`update_length`)."""
        return update_length(self.task, self.policy, 1) > 0

    def device(self) -> str:
        """The type of the torch device this actor trains on: ``cpu`` or ``cuda``."""
        return task_device(self.task).type

    def node_id(self) -> str:
        """The Ray node this actor runs on."""
        return ray.get_runtime_context().get_node_id()

    def run_groups(
        self,
        model: np.ndarray,
        groups: list[dict[int, np.ndarray]],
        round_number: int,
        params: dict[str, Any],
        exchange: Exchange = Exchange.ROUND,
    ) -> dict[int, RoundSums]:
        if exchange is not Exchange.UPDATES:
            self.held.clear()
        sums = groups_sums(self.task, self.policy, model, groups, round_number, params, exchange, self.held)
        if exchange is Exchange.UPDATES:
            self.held.clear()
        return sums

    def evaluate_blocks(
        self, model: np.ndarray, blocks: dict[int, np.ndarray], max_examples: int, loss_bound: float
    ) -> dict[int, np.ndarray]:
        """The clients' evaluation sums of ``blocks`` (``[evaluation] clients``), by block."""
        return evaluation_block_sums(self.task, model, blocks, max_examples, loss_bound)


def owns_clients(rows_per_call: int) -> bool:
    """Whether the actors of a task split its clients between them: where clients train one
    after the other (``rows_per_call`` 1), a group of blocks holds the sampled clients of one
    block at most, so the actors that hold that block can train it. The one-step path's groups
    span many blocks, and every actor keeps every client (each example is small)."""
    return rows_per_call == 1


def block_owners(num_actors: int) -> np.ndarray:
    """Primary actor of each summation block: contiguous runs of :data:`SUM_SHARDS` / A blocks.
    The next actor (mod A) holds the block's clients too."""
    return np.arange(SUM_SHARDS) * num_actors // SUM_SHARDS


def held_clients(num_clients: int, num_actors: int, actor: int) -> np.ndarray:
    """Mask of the clients ``actor`` holds: those of the blocks it or the actor before it
    (mod A) owns -- 2/A of the population (all of it for 1 or 2 actors). Block s holds the ids
    ⌈s·N/S⌉ ≤ i < ⌈(s+1)·N/S⌉ (:func:`shard_bounds`), so the mask is set range by range."""
    owners = block_owners(num_actors)
    bounds = shard_bounds(num_clients)
    held = np.zeros(num_clients, dtype=bool)
    for shard in np.flatnonzero((owners == actor) | (owners == (actor - 1) % num_actors)):
        held[bounds[shard] : bounds[shard + 1]] = True
    return held


def owned_shares(groups: list[dict[int, np.ndarray]], num_actors: int) -> list[list[dict[int, np.ndarray]]]:
    """Each group to one of the two actors that hold its sampled clients (its block's owner and
    the next one): :func:`balance` restricted to those two, the "power of two choices" that
    keeps the actors as even as a free choice would. A group whose clients lie in two blocks of
    different owners is a bug, refused here."""
    owners = block_owners(num_actors)

    def holders(group: dict[int, np.ndarray]) -> tuple[int, int]:
        holding = {int(owners[block]) for block, ids in group.items() if len(ids)}
        if len(holding) > 1:
            raise RuntimeError(f"a group of blocks {sorted(group)} spans the clients of actors {holding}")
        first = holding.pop() if holding else int(owners[min(group)])
        return first, (first + 1) % num_actors

    return balance(groups, num_actors, holders)


@dataclass
class RayExecutor:
    """Client side of a round on Ray actors. Where clients train one after the other, each actor
    owns a contiguous run of the summation blocks and holds the clients of its blocks and of the
    previous actor's, with their data (:meth:`Task.keep_clients`; 2/A of the population), and a
    round's groups go to the less loaded of the two actors that hold them (:func:`owned_shares`);
    the one-step path's groups are shared out by :func:`balance`. Either way the actors finish
    together. Which actor trains a group changes nothing in the result: the
    groups are fixed and the block sums are added in block order."""

    actors: list[Any]
    num_clients: int
    rows_per_call: int
    nodes: int = 1
    """On how many Ray nodes the actors run."""
    forms_updates: bool = True
    """Whether the actors' task forms its clients' update rows for the current policy, which
    bounds the groups as in the in-process executor (:func:`update_length`)."""
    device: str = "cpu"
    """The device type the actors train on; the distinct ones joined by ``+`` where a cluster's
    nodes differ (``cpu+cuda``)."""

    @property
    def execution(self) -> dict[str, Any]:
        """How the clients run, for the summary's provenance."""
        return {
            "executor": "ray",
            "backend": "ray",
            "actors": len(self.actors),
            "nodes": self.nodes,
            "device": self.device,
        }

    @classmethod
    def start(
        cls,
        config: RunConfig,
        data_dir: Path | None,
        num_actors: int,
    ) -> RayExecutor:
        """Start ``num_actors`` actors (one CPU each; at most the cluster's CPUs and the
        :data:`SUM_SHARDS` blocks) and wait until every one holds its task."""
        if config.training.objective != "cross-entropy":
            raise ConfigError(
                f"training.objective = {config.training.objective} needs the whole batch in one "
                "process (its batch term, begin_round): run it with the in-process executor, not Ray actors"
            )
        available = cluster_cpus()
        num_actors = max(1, min(num_actors, available, SUM_SHARDS))
        raw = config.as_dict()
        folder = str(data_dir) if data_dir else None

        plugins = ray.put(snapshot())
        gpus = gpu_share(config.training.device, num_actors)
        actors = [
            ClientBlocksActor.options(num_gpus=gpus).remote(raw, folder, plugins, (index, num_actors))
            for index in range(num_actors)
        ]
        rows_per_call = ray.get([actor.rows_per_call.remote() for actor in actors])[0]
        nodes = len(set(ray.get([actor.node_id.remote() for actor in actors])))
        forms_updates = ray.get(actors[0].forms_updates.remote())
        device = "+".join(sorted(set(ray.get([actor.device.remote() for actor in actors]))))
        return cls(actors, config.federation.num_clients, rows_per_call, nodes, forms_updates, device)

    def set_policy(self, config: RunConfig) -> None:
        """Give every actor the policy of ``config`` (same scenario and task)."""
        raw = config.as_dict()
        ray.get([actor.set_policy.remote(raw) for actor in self.actors])
        self.forms_updates = ray.get(self.actors[0].forms_updates.remote())

    def __call__(self, model, client_ids, round_number, params, exchange=Exchange.ROUND) -> RoundSums:
        blocks = shard_ids(client_ids, self.num_clients)
        groups = group_blocks(blocks, self.rows_per_call, model.shape[0] if self.forms_updates else 0)
        model_ref = ray.put(model)
        if owns_clients(self.rows_per_call):
            shares = owned_shares(groups, len(self.actors))
        else:
            shares = balance(groups, len(self.actors))
        # (balance and owned_shares are deterministic: the second exchange of a counts-first
        # round sends every group to the actor that holds its work from the first)
        futures = [
            actor.run_groups.remote(model_ref, share, round_number, params, exchange)
            for actor, share in zip(self.actors, shares, strict=True)
            if share
        ]
        by_block: dict[int, RoundSums] = {}
        for result in ray.get(futures):
            by_block.update(result)
        return round_total(add_in_order([by_block[b] for b in range(SUM_SHARDS)]), exchange, model.shape[0])

    def evaluate_clients(
        self, model: np.ndarray, client_ids: np.ndarray, max_examples: int, loss_bound: float
    ) -> np.ndarray:
        """Σ of the evaluation vectors of ``client_ids``: each block evaluated by an actor that
        holds its clients, the block sums added in block order (as the local executor adds)."""
        blocks = shard_ids(client_ids, self.num_clients)
        groups = [{index: ids} for index, ids in enumerate(blocks)]
        if owns_clients(self.rows_per_call):
            shares = owned_shares(groups, len(self.actors))
        else:
            shares = balance(groups, len(self.actors))
        model_ref = ray.put(model)
        futures = [
            actor.evaluate_blocks.remote(
                model_ref, {b: ids for group in share for b, ids in group.items()}, max_examples, loss_bound
            )
            for actor, share in zip(self.actors, shares, strict=True)
            if share
        ]
        found: dict[int, np.ndarray] = {}
        for result in ray.get(futures):
            found.update(result)
        num_cohorts = len(next(iter(found.values()))) // 3
        return add_blocks([found[b] for b in range(len(blocks))], num_cohorts)

    def stop(self) -> None:
        for actor in self.actors:
            ray.kill(actor)


@contextlib.contextmanager
def session(
    config: RunConfig,
    task: Task,
    data_dir: Path | None,
    *,
    workers: int = 1,
    actors: int | None = None,
    address: str | None = None,
) -> Iterator[Callable[[Task, Policy], RayExecutor]]:
    """The ``ray`` executor (:mod:`fairclip.sims.executors.registry`): ``actors`` Ray actors (default
    one per core) on the cluster at ``address`` or a local Ray, stopped at the end (they hold the
    task's data: freed for what runs next); ``workers`` is the local executor's."""
    ensure_ray(address)
    executor = RayExecutor.start(config, data_dir, actors or os.cpu_count() or 1)
    try:
        yield lambda _task, _policy: executor
    finally:
        executor.stop()
