"""The round loop of a simulation (docs/design.md, section 2), shared by every backend.

One round t:

1. Poisson sampling of clients with rate q (:func:`fairclip.strategies.randomness.poisson_sample`).
2. The policy broadcasts its public parameters; the sampled clients train and their updates
   go through the policy's client side. *Where* that happens is the backend's only job
   (:class:`ClientExecutor`): in this process, or in Ray actors.
3. The policy's server side noises the sums with the sensitivity of this round, forms Δ̂ and
   moves its state; the server optimizer steps the model.
4. ε after t rounds is recorded; the run stops before a round that would exceed the budget.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from fairclip.client.contributions import RoundSums, add_in_order, contribute, shard_ids
from fairclip.server.optimizer import ServerSGD
from fairclip.sims.config import RunConfig
from fairclip.sims.errors import ConfigError
from fairclip.sims.interrupts import interrupts_deferred
from fairclip.sims.privacy_plan import json_number, plan_privacy
from fairclip.sims.provenance import provenance
from fairclip.sims.tasks import Task
from fairclip.strategies import Policy, build_policy
from fairclip.strategies.base import Broadcast
from fairclip.strategies.randomness import Stream, poisson_sample, rng


class ClientExecutor(Protocol):
    """Runs the client side of a round for the sampled clients and returns their sums."""

    def __call__(
        self, model: np.ndarray, client_ids: np.ndarray, round_number: int, params: Broadcast
    ) -> RoundSums: ...


GROUP_BYTES = 256 * 2**20
"""Bound on the float64 updates one ``Task.local_updates`` call of :func:`group_blocks` returns."""


def group_blocks(blocks: list[np.ndarray], rows_per_call: int, dimension: int) -> list[dict[int, np.ndarray]]:
    """Merge consecutive blocks of sampled clients into groups trained in one call.

    A group takes the next block while it stays within ``rows_per_call`` clients (the task's
    best batch, :attr:`Task.rows_per_call`) and :data:`GROUP_BYTES` of updates; a block is never
    split. The one-step path so computes per-sample gradients in vectorised batches of about
    ``rows_per_call`` examples even when the sampled batch falls into many small blocks.
    Kernels may round differently for other batch sizes, so the groups depend only on the
    sampled clients and the task -- never on the backend or its number of workers -- and every
    backend trains the same groups: the run stays identical on all of them.
    """
    limit = max(1, min(rows_per_call, GROUP_BYTES // (8 * dimension)))
    groups: list[dict[int, np.ndarray]] = []
    rows = 0
    for index, ids in enumerate(blocks):
        if not groups or rows + len(ids) > limit:
            groups.append({})
            rows = 0
        groups[-1][index] = ids
        rows += len(ids)
    return groups


def groups_sums(
    task: Task, policy: Policy, model, groups: list[dict[int, np.ndarray]], round_number: int, params
) -> dict[int, RoundSums]:
    """Train each group of blocks in one call, then clip and sum per block; sums by block index."""
    sums: dict[int, RoundSums] = {}
    for group in groups:
        ids = np.concatenate(list(group.values()))
        updates = task.local_updates(model, ids, round_number)
        cohorts = task.client_cohorts[ids]
        start = 0
        for block, block_ids in group.items():
            stop = start + len(block_ids)
            sums[block] = contribute(
                policy, params, updates[start:stop], cohorts[start:stop], len(task.cohort_names)
            )
            start = stop
    return sums


def balance(groups: list[dict[int, np.ndarray]], workers: int) -> list[list[dict[int, np.ndarray]]]:
    """Share groups out to ``workers`` by longest-processing-time first: the largest group (in
    clients) goes to the least-loaded worker. Dealing groups round-robin instead cost W1 (8 blocks
    of Poisson size on 2 Ray actors) 7.5 % of its round time, waiting for the busier actor; this
    leaves about 1.6 % (simulated over 2,000 rounds)."""
    shares: list[list[dict[int, np.ndarray]]] = [[] for _ in range(workers)]
    loads = [0] * workers
    for group in sorted(groups, key=lambda g: -sum(len(ids) for ids in g.values())):
        lightest = loads.index(min(loads))
        shares[lightest].append(group)
        loads[lightest] += sum(len(ids) for ids in group.values())
    return shares


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


@dataclass
class RunResult:
    """Rows of ``rounds.csv`` and the content of ``summary.json``."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    stop_reason: str | None = None
    model: np.ndarray | None = None
    """θ after the last finished round."""
    public_columns: set[str] = field(default_factory=set)
    """Columns of ``rows`` that DP covers (or that are public anyway) and may be published; every
    other column -- exact counts, simulation diagnostics, what an engine adds -- is internal
    to the server (:func:`fairclip.sims.outputs.split_rows`)."""


def build_task(config: RunConfig, data_dir: Path | None = None) -> Task:
    """The task of a scenario (real datasets are read from ``data_dir``).

    A scenario that its data cannot satisfy (a cohort left without clients, too few examples)
    raises :class:`ConfigError`; missing or corrupt files raise ``DataError``.
    """
    from fairclip.sims.data import DataError

    try:
        if config.scenario.task == "mean-estimation":
            from fairclip.sims.mean_estimation import MeanEstimationTask

            return MeanEstimationTask(config.scenario, config.federation.num_clients, config.seed)
        from fairclip.sims.classification import ClassificationTask, model_factory

        if config.scenario.task == "federated-dataset":
            from fairclip.sims.federated_dataset import load_federated_dataset

            scenario = config.scenario
            data = load_federated_dataset(
                scenario.dataset, scenario.options, config.federation.num_clients, config.seed
            )
            return ClassificationTask.from_dataset(
                data, config.training, config.seed, model_factory(scenario.model)
            )

        return ClassificationTask(
            config.scenario, config.training, config.federation.num_clients, config.seed, data_dir
        )
    except DataError:
        raise
    except ValueError as error:
        raise ConfigError(f"scenario {config.scenario.name!r}: {error}") from None


def in_background(function: Callable[..., Any], *args: Any) -> Future:
    """``function(*args)`` in a daemon thread of its own; its result (or error) in the future.
    A thread per call rather than a shared pool: a pool's thread does not survive a fork."""
    future: Future = Future()

    def resolve() -> None:
        try:
            future.set_result(function(*args))
        except BaseException as error:  # handed to whoever asks for the result
            future.set_exception(error)

    threading.Thread(target=resolve, name="fairclip-background", daemon=True).start()
    return future


class RunServer:
    """The server of one run: model θ_t, policy state, privacy plan and the finished rounds.

    Every backend drives it the same way -- ``sample``, send ``broadcast()`` and ``model`` to
    the sampled clients, collect their :class:`RoundSums`, ``finish_round`` -- so the local and
    Ray engines and the Flower ``ServerApp`` share one implementation of sampling, noise, bound
    updates, the server optimizer, accounting and evaluation.

    ``seeded=False`` (a deployment without a configured seed, docs/design.md, section 6) draws client
    sampling and DP noise from operating-system entropy instead of the run's seed.
    """

    def __init__(
        self,
        config: RunConfig,
        task: Task,
        result: RunResult | None = None,
        *,
        seeded: bool = True,
        secure_noise_default: bool = False,
    ):
        self.config = config
        self.task = task
        self.seeded = seeded
        secure = config.privacy.secure_noise
        self.secure_noise = secure_noise_default if secure is None else secure
        """Whether the DP noise comes from OpenDP's exact sampler (``privacy.secure_noise``, or
        the caller's default where unset: on for the Flower ServerApp, off for simulations)."""
        self.result = result if result is not None else RunResult()
        self.policy = build_policy(
            config.strategy.name, config.strategy.params, num_cohorts=len(task.cohort_names)
        )
        self.model = task.initial_model()
        self.plan = plan_privacy(config, self.policy, self.model.shape[0])
        self.state = self.policy.initial_state(self.model.shape[0])
        self.optimizer = ServerSGD(config.training.server_lr, config.training.server_momentum)
        self._secure_sampler = None
        if self.secure_noise and self.policy.private:
            from fairclip.server.secure_noise import ExactGaussian

            self._secure_sampler = ExactGaussian()
        self.rounds_completed = 0
        self._started = (dt.datetime.now(dt.UTC), time.perf_counter())
        self._final_claim = in_background(self.plan.claim, self.rounds_to_run)
        """ε after the last round, computed while the rounds run (PRV for W1's 5 rounds: 0.025 s
        of CPU since the accountants share their RDP work, 0.15 s before; when the summary
        waited for it, 15 % of the run)."""
        self.result.summary = self._summary({}, {})
        self.result.model = self.model

    @property
    def noise_source(self) -> str:
        """Where this run's DP noise comes from, in words (summary.json and the server log)."""
        if not self.policy.private:
            return "none (the non-private reference adds no noise)"
        if self._secure_sampler is not None:
            return "OpenDP's exact Gaussian sampler, operating-system entropy (not reproducible)"
        if self.seeded:
            return f"numpy's Gaussian sampler, seed {self.config.seed} (reproducible)"
        return "numpy's Gaussian sampler, operating-system entropy"

    @property
    def rounds_to_run(self) -> int:
        """Configured rounds, cut where the next round would exceed the privacy budget."""
        return min(self.config.training.rounds, self.plan.rounds_allowed)

    def sample(self, round_number: int) -> np.ndarray:
        """Ids of the clients of round ``round_number`` (Poisson sampling with rate q)."""
        clients, rate = self.config.federation.num_clients, self.config.federation.sample_rate
        if self.seeded:
            return poisson_sample(self.config.seed, round_number, clients, rate)
        return np.flatnonzero(np.random.default_rng().random(clients) < rate)

    def broadcast(self) -> Broadcast:
        """The policy's public parameters of the coming round (for example C_t)."""
        return self.policy.broadcast(self.state)

    def finish_round(
        self, round_number: int, sums: RoundSums, extra: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Noise the clients' sums, step the model, move the state, evaluate; return the row."""
        noise_rng = self._secure_sampler
        if noise_rng is None:
            seeded_rng = rng(self.config.seed, Stream.NOISE, round_number) if self.seeded else None
            noise_rng = seeded_rng or np.random.default_rng()
        server = self.policy.server_side(
            self.state,
            sums.contribution_sum,
            sums.report_sum,
            expected_clients=self.config.expected_clients,
            num_reports=sums.num_reports,
            noise=self.plan.noise,
            rng=noise_rng,
        )
        with interrupts_deferred():  # the model, state, summary and rows move together
            self.model = self.optimizer.step(self.model, server.estimate, server.server_lr_factor)
            self.state = server.state
            self.rounds_completed = round_number
            overall: dict[str, float] = {}
            per_cohort: dict[str, dict[str, float]] = {}
            epsilon = math.nan
            if self._reports(round_number):
                overall, per_cohort = self._evaluate()
                epsilon = self.result.summary["epsilon"]
            public, internal = _round_row(
                round_number, server, sums, epsilon, overall, per_cohort, self.task.cohort_names
            )
            self.result.public_columns.update(public)
            row = {**public, **internal, **(extra or {})}
            self.result.rows.append(row)
        return row

    def finish(self, interrupted: bool = False) -> RunResult:
        """The result, with the budget message when the budget cut the run short.

        The summary describes the model after the last completed round, evaluated here if that
        round was not a reporting round (a run stopped early or ``interrupted``), and its
        ``status`` says ``finished`` or ``interrupted``.
        """
        if self.result.summary.get("rounds_completed") != self.rounds_completed:
            self._evaluate()
        budget_cut = self.plan.rounds_allowed < self.config.training.rounds
        if budget_cut and self.rounds_completed >= self.plan.rounds_allowed:
            self.result.stop_reason = self.plan.budget_message(self.rounds_completed)
        self.result.summary["stopped_early"] = self.result.stop_reason
        self.result.summary["status"] = "interrupted" if interrupted else "finished"
        return self.result

    def _reports(self, round_number: int) -> bool:
        """Whether this round is evaluated and gets ε in its row: after every k-th round and the
        last (``training.eval_every``; k grows further for runs of more than EPSILON_ROWS rounds,
        :meth:`PrivacyPlan.report_every`, because each accountant call costs 0.01-0.2 s)."""
        every = self.plan.report_every(self.rounds_to_run, self.config.training.eval_every)
        return round_number % every == 0 or round_number >= self.rounds_to_run

    def _evaluate(self) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
        """Evaluate the current model per cohort and refresh the summary (ε included); the
        result's ``model`` is then the model the summary describes."""
        overall, per_cohort = self.task.evaluate(self.model)
        self.result.summary = self._summary(overall, per_cohort)
        self.result.model = self.model
        return overall, per_cohort

    def _summary(self, overall, per_cohort) -> dict[str, Any]:
        config, plan = self.config, self.plan
        finished = self.rounds_completed == self.rounds_to_run
        claim = (self._final_claim.result() if finished else plan.claim(self.rounds_completed)).as_dict()
        return {
            "status": "running",
            "scenario": config.scenario.name,
            "strategy": config.strategy.name,
            "seed": config.seed,
            "rounds_completed": self.rounds_completed,
            "epsilon": claim["epsilon"],
            "delta": plan.delta,
            "privacy": claim,
            "privacy_budget": plan.budget,
            "noise_source": self.noise_source,
            "final_clip_bound": json_number(float(self.policy.clip_bound(self.state))),
            "cohorts": per_cohort,
            "overall": overall,
            **self.task.summary(self.model),
            "config": config.as_dict(),
            "provenance": provenance(self._started[0], time.perf_counter() - self._started[1]),
        }


def simulate(
    config: RunConfig,
    task: Task,
    executor_factory: Callable[[Task, Policy], ClientExecutor] = LocalExecutor,
    on_round: Callable[[dict[str, Any]], None] | None = None,
    result: RunResult | None = None,
) -> RunResult:
    """Run every round of ``config``. Rows are appended to ``result`` as rounds finish, so a
    caller that is interrupted still holds every finished round, and an interrupted run's summary
    describes its last finished round with ``status = "interrupted"``."""
    server = RunServer(config, task, result)
    execute = executor_factory(task, server.policy)
    try:
        for round_number in range(1, server.rounds_to_run + 1):
            client_ids = server.sample(round_number)
            sums = execute(server.model, client_ids, round_number, server.broadcast())
            row = server.finish_round(round_number, sums)
            if on_round is not None:
                on_round(row)
    except BaseException:
        with contextlib.suppress(Exception):  # the interruption, not this, is what the caller sees
            server.finish(interrupted=True)
        raise
    return server.finish()


NOISY_REPORT_COLUMNS = 16
"""A released noisy report sum of at most this many coordinates (the noisy counts of every
count-releasing policy) is written to the round's row as ``noisy_report_<j>``."""


def _round_row(
    round_number, server, sums: RoundSums, epsilon: float, overall, per_cohort, cohort_names
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(public, internal) values of one round.

    *Public*: what DP covers or what is public anyway -- the bound, the noise, ε, the policy's
    public state, the noisy report sums, and the server's evaluation of the released model on
    its own test data. *Internal*: exact counts and the simulation-only diagnostics, which only
    a trusted server (or a simulation) may keep.
    """
    public: dict[str, Any] = {
        "round": round_number,
        "clip_bound": server.clip_bound,
        "noise_std": server.noise_std,
        "sensitivity": server.sensitivity,
        "epsilon": epsilon,
        "server_lr_factor": server.server_lr_factor,
        **server.info,
    }
    if server.noisy_reports is not None and server.noisy_reports.size <= NOISY_REPORT_COLUMNS:
        for index, value in enumerate(server.noisy_reports):
            public[f"noisy_report_{index}"] = float(value)
    public.update(overall)
    diagnostics = sums.diagnostics
    internal: dict[str, Any] = {
        "clipped_fraction": float(diagnostics.exceeded.sum() / max(sums.num_reports, 1)),
        "sampled_clients": sums.num_reports,
        "nonfinite_updates": _count(diagnostics.nonfinite.sum()),
    }
    for index, name in enumerate(cohort_names):
        count = diagnostics.sampled[index]
        internal[f"{name}/sampled"] = _count(count)
        internal[f"{name}/clipped_fraction"] = _ratio(diagnostics.exceeded[index], count)
        internal[f"{name}/norm_before"] = _ratio(diagnostics.norm_before[index], count)
        internal[f"{name}/norm_after"] = _ratio(diagnostics.norm_after[index], count)
        internal[f"{name}/median_norm"] = diagnostics.median_norm(index)
        for metric, value in per_cohort.get(name, {}).items():
            public[f"{name}/{metric}"] = value
    return public, internal


def _count(total: float) -> int | float:
    """A count as an integer; NaN where the server does not know it (no diagnostics sent)."""
    return int(total) if math.isfinite(total) else math.nan


def _ratio(total: float, count: float) -> float:
    return float(total / count) if count > 0 else math.nan
