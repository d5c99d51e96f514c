"""The Ray backend: long-lived actors, each owning some blocks of clients and their data.

Per round the driver puts θ_t into the object store once; every actor trains and clips the
sampled clients of its blocks with the same functions as the in-process engine
(:func:`fairclip.sims.engine.shard_sums`) and returns one :class:`RoundSums` per block. Traffic
per round therefore grows with the number of blocks (a fixed small number), not of clients, and
the driver adds the block sums in block order, so a seed gives the same result on ``local`` and
``ray``. Works on one machine (``ray.init(num_cpus=...)``) or on an existing cluster
(``address``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import ray

from fairclip.client.contributions import SUM_SHARDS, RoundSums, add_in_order, shard_ids
from fairclip.sims.config import RunConfig, validate
from fairclip.sims.engine import build_task, shard_sums
from fairclip.sims.tasks import Task
from fairclip.strategies import Policy, build_policy


def ensure_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Start Ray locally (dashboard off, ``num_cpus`` set) or connect to ``address``, once."""
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    if address:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    else:
        ray.init(
            num_cpus=num_cpus or os.cpu_count() or 1,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )


@ray.remote(num_cpus=1)
class ClientBlocksActor:
    """Holds the task (clients and data) and trains the sampled clients of its blocks."""

    def __init__(self, config: dict[str, Any], data_dir: str | None):
        self.config: RunConfig = validate(config)
        self.task: Task = build_task(self.config, Path(data_dir) if data_dir else None)
        cohorts = len(self.task.cohort_names)
        self.policy: Policy = build_policy(
            self.config.strategy.name, self.config.strategy.params, num_cohorts=cohorts
        )

    def run_blocks(
        self, model: np.ndarray, blocks: dict[int, np.ndarray], round_number: int, params: dict[str, Any]
    ) -> dict[int, RoundSums]:
        return {
            block: shard_sums(self.task, self.policy, model, ids, round_number, params)
            for block, ids in blocks.items()
        }


@dataclass
class RayExecutor:
    """Client side of a round on Ray actors; blocks are dealt round-robin to the actors."""

    actors: list[Any]
    num_clients: int

    @classmethod
    def start(cls, config: RunConfig, data_dir: Path | None, num_actors: int) -> RayExecutor:
        """Start ``num_actors`` actors (one CPU each; at most the cluster's CPUs and the blocks)."""
        available = int(ray.cluster_resources().get("CPU", 1))
        num_actors = max(1, min(num_actors, available, SUM_SHARDS))
        raw = config.as_dict()
        actors = [
            ClientBlocksActor.remote(raw, str(data_dir) if data_dir else None) for _ in range(num_actors)
        ]
        return cls(actors, config.federation.num_clients)

    def __call__(self, model, client_ids, round_number, params) -> RoundSums:
        blocks = shard_ids(client_ids, self.num_clients)
        model_ref = ray.put(model)
        futures = []
        for index, actor in enumerate(self.actors):
            mine = {b: blocks[b] for b in range(index, SUM_SHARDS, len(self.actors))}
            futures.append(actor.run_blocks.remote(model_ref, mine, round_number, params))
        by_block: dict[int, RoundSums] = {}
        for result in ray.get(futures):
            by_block.update(result)
        return add_in_order([by_block[b] for b in range(SUM_SHARDS)])

    def stop(self) -> None:
        for actor in self.actors:
            ray.kill(actor)
