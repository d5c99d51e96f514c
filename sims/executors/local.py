"""The in-process executor: the client side of a round in this process, on one or more threads.

Clients are trained in the fixed groups of :func:`fairclip.strategies.aggregation.group_blocks`
and summed per block, in block order, exactly as the Ray executor does, so both give the same run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np
import torch

from fairclip.client.contributions import contribute_blocks, contribute_scaled_blocks
from fairclip.scenarios.tasks import Task
from fairclip.scenarios.tasks.ghost import OneStepGradients
from fairclip.strategies import Policy
from fairclip.strategies.aggregation import (
    Exchange,
    RoundSums,
    add_in_order,
    balance,
    group_blocks,
    round_total,
    sent_in,
    shard_ids,
)
from fairclip.strategies.base import Broadcast
from fairclip.strategies.evaluation import add_blocks, block_sum


class ClientExecutor(Protocol):
    """Runs the client side of a round for the sampled clients and returns their sums.

    ``exchange`` is passed only for a counts-first policy (:attr:`Policy.counts_first`), whose
    round asks the same clients twice: :attr:`Exchange.COUNTS` (reports only), then
    :attr:`Exchange.UPDATES` (contributions only, clipped with the second call's ``params``).
    An executor may keep the clients' work from the first call for the second."""

    def __call__(
        self,
        model: np.ndarray,
        client_ids: np.ndarray,
        round_number: int,
        params: Broadcast,
        exchange: Exchange = Exchange.ROUND,
    ) -> RoundSums: ...


ClientWork = OneStepGradients | np.ndarray
"""What a group of clients computed before clipping: their per-example gradients' norms and
sums (:func:`fairclip.scenarios.tasks.ghost.one_step_gradients`), or their raw updates (one row each)."""


def client_work(
    task: Task, policy: Policy, model: np.ndarray, ids: np.ndarray, round_number: int
) -> ClientWork:
    """Train ``ids`` from θ_t: the task's per-example gradients where it can clip without
    forming the updates (``per_example_gradients``), else the raw updates."""
    per_example = getattr(task, "per_example_gradients", None)
    gradients = per_example(model, ids, round_number, policy) if per_example is not None else None
    return gradients if gradients is not None else task.local_updates(model, ids, round_number)


def clip_and_sum(
    work: ClientWork,
    policy: Policy,
    params: Broadcast,
    cohorts: np.ndarray,
    num_cohorts: int,
    sizes: list[int],
    exchange: Exchange = Exchange.ROUND,
    directions: bool = False,
    unclipped_total: bool = False,
    on_device: bool = False,
) -> list[RoundSums]:
    """The clients' sums per block (``sizes[j]`` clients each) under ``params``; from
    per-example gradients, only what ``exchange`` releases is formed. ``directions``: with each
    cohort's unclipped and clipped sums (``training.cohort_directions``); ``unclipped_total``:
    with the sum of the raw updates (``training.clipping_error``); ``on_device``: per-example
    gradients leave each block's contribution sum where they are, as a float64 tensor
    (:func:`add_in_order_on_device`)."""
    if isinstance(work, OneStepGradients):
        return contribute_scaled_blocks(
            policy,
            params,
            work,
            cohorts,
            num_cohorts,
            sizes,
            exchange,
            directions,
            unclipped_total,
            on_device,
        )
    return contribute_blocks(policy, params, work, cohorts, num_cohorts, sizes, directions, unclipped_total)


def groups_sums(
    task: Task,
    policy: Policy,
    model,
    groups: list[dict[int, np.ndarray]],
    round_number: int,
    params,
    exchange: Exchange = Exchange.ROUND,
    held: dict[tuple[int, int], ClientWork] | None = None,
    on_device: bool = False,
) -> dict[int, RoundSums]:
    """Train each group of blocks in one call, then clip and sum per block; sums by block index,
    holding only what ``exchange`` releases (:func:`sent_in`).

    In a counts-first round, ``held`` keeps each group's work (by round and first block) from the
    :attr:`Exchange.COUNTS` call for the :attr:`Exchange.UPDATES` call, which clips the same
    updates with the round's new bounds; a group not held there is trained again (training is
    a function of θ_t, the client and the round, so the updates are the same).

    A task with ``cohort_directions`` set (``training.cohort_directions``, :func:`build_task`)
    also sums each cohort's unclipped and clipped updates, and one with ``unclipped_total`` set
    all the unclipped updates, in the exchange that carries them. ``on_device``: see
    :func:`clip_and_sum` (only for a caller in the same process, which adds the sums with
    :func:`add_in_order_on_device`)."""
    directions = bool(getattr(task, "cohort_directions", False)) and exchange is not Exchange.COUNTS
    unclipped_total = bool(getattr(task, "unclipped_total", False)) and exchange is not Exchange.COUNTS
    sums: dict[int, RoundSums] = {}
    for group in groups:
        ids = np.concatenate(list(group.values()))
        sizes = [len(block_ids) for block_ids in group.values()]
        key = (round_number, min(group))  # never another round's work
        work = held.pop(key, None) if held is not None and exchange is Exchange.UPDATES else None
        if work is None:
            work = client_work(task, policy, model, ids, round_number)
        if held is not None and exchange is Exchange.COUNTS:
            held[key] = work
        cohorts = task.client_cohorts[ids]
        parts = clip_and_sum(
            work,
            policy,
            params,
            cohorts,
            len(task.cohort_names),
            sizes,
            exchange,
            directions,
            unclipped_total,
            on_device,
        )
        sums.update(zip(group, (sent_in(part, exchange) for part in parts), strict=True))
    return sums


def update_length(task: Task, policy: Policy, dimension: int) -> int:
    """The length of the update rows a call of ``task`` forms for ``policy``, which bounds its
    groups (:func:`fairclip.strategies.aggregation.group_blocks`): ``dimension``, or 0 where the
    task clips one-step clients from their norms without forming them (``forms_updates``; a task
    without that method forms them). On a GPU (256 rows a call) this lets ``xu-cnn``'s groups
    hold 256 rows instead of 77 of 431,080 float64 entries that are never formed."""
    forms_updates = getattr(task, "forms_updates", None)
    return dimension if forms_updates is None or forms_updates(policy) else 0


def task_device(task: Task) -> torch.device:
    """The torch device ``task`` trains on (the CPU for a task that names none)."""
    return torch.device(getattr(task, "device", None) or "cpu")


ON_DEVICE_SHARE = 4
"""The in-process executor keeps a round's block sums on the GPU (:func:`add_in_order_on_device`)
while all of them (one float64 vector per block, two where the reports are as large as the
model) take at most 1/ON_DEVICE_SHARE of its memory: ``zhao-cnn``'s 64 take 412 MB. A model so
large that they would not fit adds them on the host, as before, where a round holds them all too
(:data:`fairclip.strategies.aggregation.SUM_SHARDS`)."""


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
        self._held: dict[tuple[int, int], ClientWork] = {}
        """The current counts-first round's work, between its two exchanges."""
        device = task_device(self.task)
        self._device_bytes = (
            torch.cuda.get_device_properties(device).total_memory // ON_DEVICE_SHARE
            if device.type == "cuda"
            else 0
        )
        """How many bytes of block sums may stay on the task's GPU until the round's total (0: on
        the CPU, where numpy's copies and additions measured a few per cent faster than torch's)."""

    @property
    def execution(self) -> dict[str, Any]:
        """How the clients run, for the summary's provenance: with the device they train on
        (``training.device`` ``auto`` is a GPU where torch sees one, so the setting alone does
        not say). ``backend`` is ``executor``'s old name, kept for readers of earlier summaries."""
        return {
            "executor": "local",
            "backend": "local",
            "workers": self.workers,
            "device": task_device(self.task).type,
        }

    def __call__(self, model, client_ids, round_number, params, exchange=Exchange.ROUND) -> RoundSums:
        blocks = shard_ids(client_ids, len(self.task.client_cohorts))
        length = update_length(self.task, self.policy, model.shape[0])
        groups = group_blocks(blocks, self.task.rows_per_call, length)
        if exchange is not Exchange.UPDATES:
            self._held.clear()  # a new round: nothing of an earlier one is used again

        kept_length = model.shape[0] + self.policy.report_size(model.shape[0])  # per block, at most
        on_device = len(blocks) * kept_length * 8 <= self._device_bytes

        def run(task: Task, share: list[dict[int, np.ndarray]]) -> dict[int, RoundSums]:
            return groups_sums(
                task, self.policy, model, share, round_number, params, exchange, self._held, on_device
            )

        if self.workers == 1 or len(groups) < 2:
            by_block = run(self.task, groups)
        else:
            shares = [share for share in balance(groups, self.workers) if share]
            with ThreadPoolExecutor(len(shares)) as pool:
                parts = pool.map(run, self._tasks, shares)
                by_block = {block: sums for part in parts for block, sums in part.items()}
        if exchange is Exchange.UPDATES:
            self._held.clear()
        total = add_in_order_on_device([by_block[b] for b in range(len(blocks))])
        return round_total(total, exchange, model.shape[0])

    def evaluate_clients(
        self, model: np.ndarray, client_ids: np.ndarray, max_examples: int, loss_bound: float
    ) -> np.ndarray:
        """Σ of the evaluation vectors of ``client_ids`` (:mod:`fairclip.strategies.evaluation`),
        block by block in block order."""
        blocks = shard_ids(client_ids, len(self.task.client_cohorts))
        found = evaluation_block_sums(self.task, model, dict(enumerate(blocks)), max_examples, loss_bound)
        return add_blocks([found[b] for b in range(len(blocks))], len(self.task.cohort_names))


def evaluation_block_sums(
    task: Task, model: np.ndarray, blocks: dict[int, np.ndarray], max_examples: int, loss_bound: float
) -> dict[int, np.ndarray]:
    """The clients' evaluation sums (``[evaluation] clients``) of each block of ids, one task call
    per block (the same calls on every executor, so the same bits)."""
    num_cohorts = len(task.cohort_names)
    return {
        index: block_sum(
            task.evaluation_contributions(model, ids, max_examples, loss_bound),  # type: ignore[attr-defined]
            num_cohorts,
            max_examples,
            loss_bound,
        )
        for index, ids in blocks.items()
    }


def add_in_order_on_device(sums: list[RoundSums]) -> RoundSums:
    """:func:`add_in_order` where some blocks' ``contribution_sum`` (or ``report_sum``: a direction
    report) is a float64 tensor (``on_device`` in :func:`groups_sums`): each of the two vectors
    is added where those tensors are, in the same block order, and on a GPU the total comes to
    the host once a round instead of once a block (zhao-cnn on an H200, 2026-11-26: the
    per-block copies and host additions took 2.3 s of 4.0 s per 10 rounds). Each addition is
    one IEEE float64 addition per entry on either device, in the same order, so the total has
    the same bits as :func:`add_in_order`'s (``tests/test_ghost_clipping.py`` checks it with CPU
    tensors, ``tests/test_devices.py`` on a GPU). :class:`LocalExecutor` asks for it where its
    task runs on a GPU with room for them (:data:`ON_DEVICE_SHARE`)."""
    on_device = [
        field
        for field in ("contribution_sum", "report_sum")
        if any(isinstance(getattr(part, field), torch.Tensor) for part in sums)
    ]
    if not on_device:
        return add_in_order(sums)
    rest = add_in_order([replace(part, **dict.fromkeys(on_device, np.zeros(0))) for part in sums])
    totals = {field: _added_in_order([getattr(part, field) for part in sums]) for field in on_device}
    return replace(rest, **totals)


def _added_in_order(vectors: list[np.ndarray | torch.Tensor]) -> np.ndarray:
    """``vectors[0] + vectors[1] + ...`` where the first tensor among them is, copied to the host."""
    device = next(vector for vector in vectors if isinstance(vector, torch.Tensor)).device
    total = torch.as_tensor(vectors[0], device=device)
    for vector in vectors[1:]:
        total = total + torch.as_tensor(vector, device=device)
    return total.cpu().numpy()


@contextlib.contextmanager
def session(
    config: Any,
    task: Task,
    data_dir: Any,
    *,
    workers: int = 1,
    actors: int | None = None,
    address: Any = None,
) -> Iterator[Callable[[Task, Policy], LocalExecutor]]:
    """The ``local`` executor (:mod:`fairclip.sims.executors.registry`): ``workers`` threads of
    this process; ``actors`` and ``address`` are Ray's."""
    yield lambda task, policy: LocalExecutor(task, policy, workers)
