"""The privacy side of a run: noise multipliers, ε per round and the budget that stops it.

Resolution of ``[privacy]`` (docs/design.md, section 5): ``target_epsilon`` (when set)
calibrates σ_Δ and σ_b = k σ_Δ for the configured number of rounds; otherwise
σ_Δ = ``noise_multiplier`` and σ_b = ``count_noise_multiplier``, or k σ_Δ. k is
``count_noise_ratio`` (default 10). The budget is ``epsilon_budget``, or the target when
calibrating; a run stops before the first round whose ε would exceed it. The non-private
``none`` policy adds no noise and has ε = ∞.

A policy that noises below its sensitivity (:attr:`Policy.noises_below_sensitivity`:
``per-cohort`` with ``noise_bound = "initial"``) runs each round with its own multiplier
σ_Δ · n_t / s_t, known only once that round's state is (for a same-round ``per-cohort``, after
its own noisy counts). Its ε is the accountant's over the multipliers that ran; a budget or a
target ε, which this plan turns into a number of rounds or a σ assuming every round has the
planned multiplier, cannot be kept for it, and no check before a round can know what the round
will cost. So such a plan is refused (:class:`ConfigError`), as is the PRV accountant, which
would compose thousands of different mechanisms; its ε comes from the RDP accountant.

With ``[evaluation] clients`` on, every reporting round is followed by a release of the
clients' noisy evaluation sums (a sampled Gaussian mechanism of multiplier
``evaluation.noise_multiplier`` at rate q, :mod:`fairclip.strategies.evaluation`), one more step
of the same accountant. The plan's ε after T rounds composes T training rounds with the most
evaluations a run stopping after T rounds can release (:func:`evaluation_steps`: ⌈T / eval_every⌉
up to :data:`EPSILON_ROWS` reporting rounds, where the schedule is exact; an upper bound beyond,
where the reporting interval grows with the run's length), so the budget stop and the
calibration to a target ε charge at least what runs -- never less; the summary's ε is the
accountant's, of what did run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fairclip.scenarios.config import RunConfig
from fairclip.scenarios.errors import ConfigError
from fairclip.strategies import NoiseMultipliers, Policy, PolicyConfigError
from fairclip.strategies.accounting import (
    DEFAULT_COUNT_RATIO,
    calibrate,
    check_privacy_parameters,
    effective_noise_multiplier,
    epsilon,
    evaluation_steps,
    history_epsilon,
    rounds_within_budget,
    with_evaluation,
)

EPSILON_ROWS = 100
"""Runs up to this many rounds get ε in every row of ``rounds.csv``; longer ones about this many."""


@dataclass(frozen=True)
class PrivacyPlan:
    """Noise of every round and the accounting parameters of one run."""

    noise: NoiseMultipliers
    releases_reports: bool
    sample_rate: float
    delta: float
    accountant: str
    budget: float | None
    rounds_allowed: int
    evaluation: tuple[float, int, int] | None = None
    """(σ_E, eval_every, :data:`EPSILON_ROWS`) of a run whose clients evaluate the model
    (``[evaluation] clients``), else ``None``."""

    @property
    def effective_noise_multiplier(self) -> float:
        return effective_noise_multiplier(self.noise, self.releases_reports)

    def epsilon_after(self, rounds: int) -> float:
        """ε spent after ``rounds`` rounds, with the client evaluations they may release (at their
        upper bound, :func:`evaluation_steps`)."""
        if self.evaluation is None:
            return epsilon(
                self.effective_noise_multiplier, self.sample_rate, rounds, self.delta, self.accountant
            )
        entry = (self.effective_noise_multiplier, self.sample_rate, rounds)
        return history_epsilon(with_evaluation(entry, self.evaluation), self.delta, self.accountant)

    def evaluations_after(self, rounds: int) -> int:
        """How many client evaluations the plan charges to ``rounds`` rounds (0 without them)."""
        return 0 if self.evaluation is None else evaluation_steps(rounds, *self.evaluation[1:])

    @staticmethod
    def report_every(last_round: int, eval_every: int = 1) -> int:
        """k: a run is evaluated, and ε is computed for ``rounds.csv``, after every k-th round
        (and the last).

        One accountant call costs 0.01-0.2 s (PRV; more for larger T), which dominated
        sample-level runs of thousands of cheap rounds. So k is the smallest multiple of
        ``eval_every`` (the configured ``training.eval_every``) with at most
        :data:`EPSILON_ROWS` reporting rounds; the other rows hold NaN (not computed). The
        summary's ε and the budget stop are exact and do not depend on this.
        """
        multiple = max(1, math.ceil(math.ceil(last_round / EPSILON_ROWS) / eval_every))
        return eval_every * multiple

    def budget_message(self, completed: int, released_again: int = 0) -> str:
        """Why a run stopped after ``completed`` rounds (``released_again`` more accounted: rounds
        released twice across an interruption, :mod:`fairclip.server.checkpoint`)."""
        accounted = completed + released_again + 1
        again = f", {accounted} rounds accounted, {released_again} released twice" if released_again else ""
        return (
            f"privacy budget reached: round {completed + 1} would spend epsilon="
            f"{self.epsilon_after(accounted):.4g} > budget {self.budget:g} "
            f"(delta={self.delta:g}, {self.accountant}, q={self.sample_rate:g}, "
            f"sigma_eff={self.effective_noise_multiplier:.4g}{again}); stopped after {completed} rounds"
        )


def check_accountable(config: RunConfig) -> None:
    """Refuse, before any work, privacy parameters that no accountant can take or compute (for
    example PRV beyond :data:`PRV_MAX_ROUNDS` rounds): one :class:`ConfigError` line."""
    privacy = config.privacy
    try:
        check_privacy_parameters(
            config.federation.sample_rate, config.training.rounds, privacy.delta, privacy.accountant
        )
    except PolicyConfigError as error:
        raise ConfigError(f"privacy: {error}") from None


def check_noise_follows_sensitivity(config: RunConfig, policy: Policy) -> None:
    """Refuse (one :class:`ConfigError` line) a budget, a target ε or the PRV accountant for a
    policy whose rounds may noise below their sensitivity (module docstring)."""
    if not policy.noises_below_sensitivity:
        return
    privacy = config.privacy
    why = f"policy {policy.name!r} noises below its sensitivity (each round with its own multiplier)"
    if privacy.target_epsilon is not None or privacy.epsilon_budget is not None:
        key = "target_epsilon" if privacy.target_epsilon is not None else "epsilon_budget"
        raise ConfigError(
            f"privacy.{key}: {why}, so no plan of rounds or sigma can keep an epsilon; "
            "set privacy.noise_multiplier and read epsilon from the run"
        )
    if privacy.accountant == "prv":
        raise ConfigError(
            f"privacy.accountant: {why}; account it with rdp (privacy.accountant = rdp), "
            "PRV would compose one mechanism per round"
        )


def plan_privacy(config: RunConfig, policy: Policy, dimension: int) -> PrivacyPlan:
    """Resolve the noise multipliers and the budget of a run."""
    privacy = config.privacy
    rounds = config.training.rounds
    q = config.federation.sample_rate
    releases_reports = policy.report_size(dimension) > 0
    clients = config.evaluation
    every = config.training.eval_every
    evaluation = (clients.noise_multiplier, every, EPSILON_ROWS) if clients.clients else None
    if policy.private:
        check_accountable(config)
        check_noise_follows_sensitivity(config, policy)
    try:
        ratio = DEFAULT_COUNT_RATIO if privacy.count_noise_ratio is None else privacy.count_noise_ratio
        if not policy.private:
            noise = NoiseMultipliers(0.0, 0.0)
        elif privacy.target_epsilon is not None:
            noise = calibrate(
                privacy.target_epsilon,
                q,
                rounds,
                privacy.delta,
                privacy.accountant,
                releases_reports=releases_reports,
                count_ratio=ratio,
                evaluation=evaluation,
            )
        else:
            count = privacy.count_noise_multiplier
            noise = NoiseMultipliers(
                privacy.noise_multiplier,
                ratio * privacy.noise_multiplier if count is None else count,
            )
    except PolicyConfigError as error:
        raise ConfigError(f"privacy: {error}") from None
    budget = privacy.epsilon_budget if privacy.epsilon_budget is not None else privacy.target_epsilon
    plan = PrivacyPlan(
        noise, releases_reports, q, privacy.delta, privacy.accountant, budget, rounds, evaluation
    )
    if budget is not None and policy.private:
        sigma_eff = plan.effective_noise_multiplier
        allowed = (
            0
            if sigma_eff == 0
            else rounds_within_budget(
                budget, sigma_eff, q, privacy.delta, privacy.accountant, rounds, evaluation
            )
        )
        plan = PrivacyPlan(
            noise, releases_reports, q, privacy.delta, privacy.accountant, budget, allowed, evaluation
        )
    return plan


def json_number(value: float) -> float | str:
    """JSON has no infinity: write it as the string "inf"."""
    return "inf" if math.isinf(value) else value
