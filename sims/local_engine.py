"""The in-process engine: the client side of a round in this process, on one or more threads.

Clients are trained in the fixed groups of :func:`fairclip.strategies.aggregation.group_blocks`
and summed per block, in block order, exactly as the Ray engine does, so both give the same run.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from fairclip.client.contributions import contribute_blocks
from fairclip.sims.tasks import Task
from fairclip.strategies import Policy
from fairclip.strategies.aggregation import RoundSums, add_in_order, balance, group_blocks, shard_ids
from fairclip.strategies.base import Broadcast


class ClientExecutor(Protocol):
    """Runs the client side of a round for the sampled clients and returns their sums."""

    def __call__(
        self, model: np.ndarray, client_ids: np.ndarray, round_number: int, params: Broadcast
    ) -> RoundSums: ...


def groups_sums(
    task: Task, policy: Policy, model, groups: list[dict[int, np.ndarray]], round_number: int, params
) -> dict[int, RoundSums]:
    """Train each group of blocks in one call, then clip and sum per block; sums by block index.
    A task that can clip its clients without forming their updates does so (its
    ``clipped_block_sums``, :meth:`fairclip.sims.classification.ClassificationTask.clipped_block_sums`)."""
    sums: dict[int, RoundSums] = {}
    clipped_block_sums = getattr(task, "clipped_block_sums", None)
    for group in groups:
        ids = np.concatenate(list(group.values()))
        sizes = [len(block_ids) for block_ids in group.values()]
        parts = None
        if clipped_block_sums is not None:
            parts = clipped_block_sums(model, ids, round_number, policy, params, sizes)
        if parts is None:
            updates = task.local_updates(model, ids, round_number)
            parts = contribute_blocks(
                policy, params, updates, task.client_cohorts[ids], len(task.cohort_names), sizes
            )
        sums.update(zip(group, parts, strict=True))
    return sums


@dataclass
class LocalExecutor:
    """Every group of sampled clients in this process: one after the other, or shared out by
    :func:`balance` to ``workers`` threads, each training with its own copy of the model
    (:meth:`Task.worker`; torch and numpy release the GIL in their kernels, and torch runs one
    intra-op thread). The groups and the block order of the sum do not depend on the workers, so
    any number of them gives the same result."""

    task: Task
    policy: Policy
    workers: int = 1

    def __post_init__(self) -> None:
        self._tasks = [self.task, *(self.task.worker() for _ in range(self.workers - 1))]

    @property
    def execution(self) -> dict[str, Any]:
        """How the clients run, for the summary's provenance."""
        return {"backend": "local", "workers": self.workers}

    def __call__(self, model, client_ids, round_number, params) -> RoundSums:
        blocks = shard_ids(client_ids, len(self.task.client_cohorts))
        groups = group_blocks(blocks, self.task.rows_per_call, model.shape[0])
        if self.workers == 1 or len(groups) < 2:
            by_block = groups_sums(self.task, self.policy, model, groups, round_number, params)
        else:
            shares = [share for share in balance(groups, self.workers) if share]
            with ThreadPoolExecutor(len(shares)) as pool:
                parts = pool.map(
                    lambda task, share: groups_sums(task, self.policy, model, share, round_number, params),
                    self._tasks,
                    shares,
                )
                by_block = {block: sums for part in parts for block, sums in part.items()}
        return add_in_order([by_block[b] for b in range(len(blocks))])
