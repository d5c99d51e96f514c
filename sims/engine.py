"""The round loop of a simulation (DESIGN section 2), shared by every backend.

One round t:

1. Poisson sampling of clients with rate q (:func:`fairclip.sims.randomness.poisson_sample`).
2. The policy broadcasts its public parameters; the sampled clients train and their updates
   go through the policy's client side. *Where* that happens is the backend's only job
   (:class:`ClientExecutor`): in this process, or in Ray actors.
3. The policy's server side noises the sums with the sensitivity of this round, forms Δ̂ and
   moves its state; the server optimizer steps the model.
4. ε after t rounds is recorded; the run stops before a round that would exceed the budget.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from fairclip.client.contributions import RoundSums, contribute
from fairclip.server.optimizer import ServerSGD
from fairclip.sims.config import RunConfig
from fairclip.sims.errors import ConfigError
from fairclip.sims.privacy_plan import PrivacyPlan, json_number, plan_privacy
from fairclip.sims.randomness import Stream, poisson_sample, rng
from fairclip.sims.tasks import Task
from fairclip.strategies import Policy, build_policy
from fairclip.strategies.base import Broadcast


class ClientExecutor(Protocol):
    """Runs the client side of a round for the sampled clients and returns their sums."""

    def __call__(
        self, model: np.ndarray, client_ids: np.ndarray, round_number: int, params: Broadcast
    ) -> RoundSums: ...


SUM_SHARDS = 8
"""Clients are summed in this many fixed blocks of ids, in block order, on every backend, so that
the floating-point sum -- and with it the whole run -- is the same whether the blocks are
computed here or in Ray actors."""


def shard_ids(client_ids: np.ndarray, num_clients: int, num_shards: int = SUM_SHARDS) -> list[np.ndarray]:
    """Split sorted client ids into the contiguous id blocks ``[s·N/S, (s+1)·N/S)``."""
    owners = client_ids * num_shards // num_clients
    return [client_ids[owners == shard] for shard in range(num_shards)]


def shard_sums(task: Task, policy: Policy, model, client_ids, round_number, params) -> RoundSums:
    """Train and clip the clients of one block; return their sums."""
    updates = task.local_updates(model, client_ids, round_number)
    cohorts = task.client_cohorts[client_ids]
    return contribute(policy, params, updates, cohorts, len(task.cohort_names))


def add_in_order(sums: list[RoundSums]) -> RoundSums:
    """Σ of block sums, always in block order."""
    total = sums[0]
    for part in sums[1:]:
        total = total + part
    return total


@dataclass
class LocalExecutor:
    """Every block of sampled clients in this process, one after the other."""

    task: Task
    policy: Policy

    def __call__(self, model, client_ids, round_number, params) -> RoundSums:
        blocks = shard_ids(client_ids, len(self.task.client_cohorts))
        return add_in_order(
            [shard_sums(self.task, self.policy, model, ids, round_number, params) for ids in blocks]
        )


@dataclass
class RunResult:
    """Rows of ``rounds.csv`` and the content of ``summary.json``."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    stop_reason: str | None = None


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
        from fairclip.sims.classification import ClassificationTask

        return ClassificationTask(
            config.scenario, config.training, config.federation.num_clients, config.seed, data_dir
        )
    except DataError:
        raise
    except ValueError as error:
        raise ConfigError(f"scenario {config.scenario.name!r}: {error}") from None


def simulate(
    config: RunConfig,
    task: Task,
    executor_factory: Callable[[Task, Policy], ClientExecutor] = LocalExecutor,
    on_round: Callable[[dict[str, Any]], None] | None = None,
    result: RunResult | None = None,
) -> RunResult:
    """Run every round of ``config``. Rows are appended to ``result`` as rounds finish, so a
    caller that is interrupted still holds every finished round."""
    result = result if result is not None else RunResult()
    cohort_names = task.cohort_names
    policy = build_policy(config.strategy.name, config.strategy.params, num_cohorts=len(cohort_names))
    model = task.initial_model()
    plan = plan_privacy(config, policy, model.shape[0])
    state = policy.initial_state(model.shape[0])
    optimizer = ServerSGD(config.training.server_lr, config.training.server_momentum)
    execute = executor_factory(task, policy)
    expected = config.expected_clients
    num_clients = config.federation.num_clients

    result.summary = _summary(config, plan, policy, state, task, model, 0, {}, {})
    for round_number in range(1, config.training.rounds + 1):
        if round_number > plan.rounds_allowed:
            result.stop_reason = plan.budget_message(round_number - 1)
            break
        client_ids = poisson_sample(config.seed, round_number, num_clients, config.federation.sample_rate)
        sums = execute(model, client_ids, round_number, policy.broadcast(state))
        server = policy.server_side(
            state,
            sums.contribution_sum,
            sums.report_sum,
            expected_clients=expected,
            num_reports=sums.num_reports,
            noise=plan.noise,
            rng=rng(config.seed, Stream.NOISE, round_number),
        )
        model = optimizer.step(model, server.estimate, server.server_lr_factor)
        state = server.state
        overall, per_cohort = task.evaluate(model)
        row = _round_row(round_number, server, sums, plan, overall, per_cohort, cohort_names)
        result.rows.append(row)
        result.summary = _summary(config, plan, policy, state, task, model, round_number, overall, per_cohort)
        if on_round is not None:
            on_round(row)
    result.summary["stopped_early"] = result.stop_reason
    return result


def _round_row(round_number, server, sums: RoundSums, plan: PrivacyPlan, overall, per_cohort, cohort_names):
    diagnostics = sums.diagnostics
    sampled = max(sums.num_reports, 1)
    row: dict[str, Any] = {
        "round": round_number,
        "clip_bound": server.clip_bound,
        "noise_std": server.noise_std,
        "sensitivity": server.sensitivity,
        "clipped_fraction": float(diagnostics.exceeded.sum() / sampled),
        "epsilon": plan.epsilon_after(round_number),
        "sampled_clients": sums.num_reports,
        "nonfinite_updates": int(diagnostics.nonfinite.sum()),
        "server_lr_factor": server.server_lr_factor,
        **server.info,
        **overall,
    }
    for index, name in enumerate(cohort_names):
        count = diagnostics.sampled[index]
        row[f"{name}/sampled"] = int(count)
        row[f"{name}/clipped_fraction"] = _ratio(diagnostics.exceeded[index], count)
        row[f"{name}/norm_before"] = _ratio(diagnostics.norm_before[index], count)
        row[f"{name}/norm_after"] = _ratio(diagnostics.norm_after[index], count)
        for metric, value in per_cohort[name].items():
            row[f"{name}/{metric}"] = value
    return row


def _ratio(total: float, count: float) -> float:
    return float(total / count) if count > 0 else math.nan


def _summary(
    config, plan: PrivacyPlan, policy, state, task, model, completed, overall, per_cohort
) -> dict[str, Any]:
    claim = plan.claim(completed).as_dict()
    return {
        "scenario": config.scenario.name,
        "strategy": config.strategy.name,
        "seed": config.seed,
        "rounds_completed": completed,
        "epsilon": claim["epsilon"],
        "delta": plan.delta,
        "privacy": claim,
        "privacy_budget": plan.budget,
        "final_clip_bound": json_number(float(policy.clip_bound(state))),
        "cohorts": per_cohort,
        "overall": overall,
        **task.summary(model),
        "config": config.as_dict(),
    }
